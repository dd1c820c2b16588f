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
