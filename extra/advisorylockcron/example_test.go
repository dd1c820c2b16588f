package advisorylockcron_test

import (
	"database/sql"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/advisorylock/advisorylock/extra/advisorylockcron"
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

// Three replicas' crons fire the hourly report, 100 ms apart; it runs once.
func ExampleOnOneReplica() {
	var runs atomic.Int32
	report := cron.FuncJob(func() { runs.Add(1) })
	var wg sync.WaitGroup
	for replica := range 3 {
		db := exampleDB() // each replica has its own pool
		defer db.Close()
		job := cron.NewChain(
			cron.Recover(cron.DefaultLogger),
			advisorylockcron.OnOneReplica(cron.DefaultLogger, db, "example-cron-hourly-report"),
		).Then(report)
		c := cron.New()
		if _, err := c.AddJob("@hourly", job); err != nil {
			log.Fatal(err)
		}
		// Rather than wait for the hour, fire this replica's tick now: its
		// clock is replica*100 ms behind.
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(replica) * 100 * time.Millisecond)
			job.Run() // what c does every hour
		}()
	}
	wg.Wait()
	fmt.Println("runs this tick:", runs.Load())
	// Output: runs this tick: 1
}

// Three replicas' crons fire the hourly report, up to 400 ms apart: it
// runs once for the hour's tick, and the job knows which tick it runs.
func ExampleOncePerTick() {
	// The report runs hourly at this minute past the hour, so that the
	// example can fire the tick it is in rather than wait for one: the
	// tick's nearest neighbours are half an hour away.
	minute := time.Now().Minute()
	schedule, err := cron.ParseStandard(fmt.Sprintf("%d * * * *", minute))
	if err != nil {
		log.Fatal(err)
	}
	name := fmt.Sprintf("example-cron-hourly-report-%d", time.Now().UnixNano()) // a fresh lock for the example
	var runs atomic.Int32
	report := advisorylockcron.TickFunc(func(tick time.Time) {
		runs.Add(1)
		fmt.Println("report for this hour's tick:", tick.Minute() == minute && tick.Second() == 0)
	})
	var wg sync.WaitGroup
	for replica := range 3 {
		db := exampleDB() // each replica has its own pool
		defer db.Close()
		job := cron.NewChain(
			cron.Recover(cron.DefaultLogger),
			advisorylockcron.OncePerTick(cron.DefaultLogger, db, name, schedule),
		).Then(report)
		// Fire this replica's tick now, replica*200 ms late.
		wg.Go(func() {
			time.Sleep(time.Duration(replica) * 200 * time.Millisecond)
			job.Run() // what cron does every hour
		})
	}
	wg.Wait()
	fmt.Println("runs this tick:", runs.Load())
	// Output:
	// report for this hour's tick: true
	// runs this tick: 1
}
