package advisorylockgocron_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockgocron"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/robfig/cron/v3"
)

// exampleDB opens the test server, as the core's examples do.
func exampleDB() *sql.DB {
	dsn := os.Getenv("ADVISORYLOCK_TEST_POSTGRES")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		log.Fatal(err)
	}
	return db
}

// Three replicas' schedulers fire the hourly report, up to 400 ms apart:
// it runs once for the hour's tick, and the job knows which tick it runs.
func ExampleOncePerTick() {
	// The report runs hourly at this minute past the hour, so that the
	// example can fire the tick it is in rather than wait for one: the
	// schedulers' own next run is an hour away, and the tick's nearest
	// neighbours half an hour.
	minute := time.Now().Minute()
	crontab := fmt.Sprintf("%d * * * *", minute)
	schedule, err := cron.ParseStandard(crontab)
	if err != nil {
		log.Fatal(err)
	}
	name := fmt.Sprintf("example-gocron-hourly-report-%d", time.Now().UnixNano()) // a fresh lock for the example
	var runs atomic.Int32
	report := func(ctx context.Context, tick time.Time) error {
		runs.Add(1)
		fmt.Println("report for this hour's tick:", tick.Minute() == minute && tick.Second() == 0)
		return nil
	}
	var fired sync.WaitGroup // every replica's job returned
	for replica := range 3 {
		db := exampleDB() // each replica has its own pool
		defer db.Close()
		task, err := advisorylockgocron.OncePerTick(db, name, schedule, report)
		if err != nil {
			log.Fatal(err)
		}
		s, err := gocron.NewScheduler()
		if err != nil {
			log.Fatal(err)
		}
		defer s.Shutdown()
		job, err := s.NewJob(gocron.CronJob(crontab, false), task,
			gocron.WithEventListeners(
				gocron.AfterJobRuns(func(uuid.UUID, string) { fired.Done() }),
				gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) { log.Print(err); fired.Done() })))
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
		// Fire this replica's tick now, replica*200 ms late.
		fired.Add(1)
		time.Sleep(time.Duration(replica) * 200 * time.Millisecond)
		if err := job.RunNow(); err != nil {
			log.Fatal(err)
		}
	}
	fired.Wait()
	fmt.Println("runs this tick:", runs.Load())
	// Output:
	// report for this hour's tick: true
	// runs this tick: 1
}

// Three replicas schedule the same job every minute; their clocks are
// 100 ms apart. With the Locker the job runs once per tick, on the replica
// that fires first: the others find its lock taken (gocron reports that to
// AfterLockError listeners and skips the run).
func ExampleNewLocker() {
	var runs atomic.Int32
	var fired sync.WaitGroup // every replica's scheduler fired the first tick
	fired.Add(3)
	start := time.Now().Add(500 * time.Millisecond)
	for replica := range 3 {
		db := exampleDB() // each replica has its own pool
		defer db.Close()
		locker, err := advisorylockgocron.NewLocker(db) // a one-second window (DefaultMinHold)
		if err != nil {
			log.Fatal(err)
		}
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
		if err != nil {
			log.Fatal(err)
		}
		defer s.Shutdown()
		_, err = s.NewJob(gocron.DurationJob(time.Minute),
			gocron.NewTask(func() { runs.Add(1) }),
			gocron.WithName("example-gocron-report"),
			gocron.WithStartAt(gocron.WithStartDateTime(start.Add(time.Duration(replica)*100*time.Millisecond))),
			gocron.WithEventListeners(
				gocron.AfterJobRuns(func(uuid.UUID, string) { fired.Done() }),
				gocron.AfterLockError(func(uuid.UUID, string, error) { fired.Done() })))
		if err != nil {
			log.Fatal(err)
		}
		s.Start()
	}
	fired.Wait()
	fmt.Println("runs this tick:", runs.Load())
	// Output: runs this tick: 1
}

// One replica leads and runs every job; the others skip them until it
// stops leading (Close resigns, and another takes over within a round
// trip or two).
func ExampleNewElector() {
	db := exampleDB()
	defer db.Close()
	election, err := advisorylock.NewElection(db, "example-gocron-leader")
	if err != nil {
		log.Fatal(err)
	}
	elector, err := advisorylockgocron.NewElector(context.Background(), election)
	if err != nil {
		log.Fatal(err)
	}
	defer elector.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		log.Fatal(err)
	}
	defer s.Shutdown()
	done := make(chan struct{})
	_, err = s.NewJob(gocron.DurationJob(time.Minute), gocron.NewTask(func() {
		term, ok := elector.Term() // for a Fence: a replaced leader's writes are refused
		fmt.Println("the leader runs the job:", ok && term > 0)
		close(done)
	}), gocron.WithName("example-gocron-cleanup"))
	if err != nil {
		log.Fatal(err)
	}

	for elector.IsLeader(context.Background()) != nil { // alone, this replica soon leads
		time.Sleep(10 * time.Millisecond)
	}
	s.Start()
	if err := s.Jobs()[0].RunNow(); err != nil {
		log.Fatal(err)
	}
	<-done
	// Output: the leader runs the job: true
}
