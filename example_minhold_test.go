package advisorylock_test

import (
	"context"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/advisorylock/advisorylock"
)

// Cron on every replica: three replicas fire the same tick 100 ms apart,
// and the report takes a few milliseconds. Plain TryDo would run it three
// times (each replica releases before the next one tries); with
// WithMinHold the name stays taken for a minute after the grant (longer
// than the replicas' clocks disagree), so the tick runs it once.
func ExampleWithMinHold() {
	var runs atomic.Int32
	report := func(ctx context.Context) error {
		runs.Add(1)
		return nil
	}
	name := "example-hourly-report/" + exampleID() // a window outlives the run: a name of its own
	var wg sync.WaitGroup
	for replica := range 3 {
		db := exampleDB() // each replica has its own pool
		defer db.Close()
		lock, err := advisorylock.New(db, name, advisorylock.WithMinHold(time.Minute))
		if err != nil {
			log.Fatal(err)
		}
		if err := lock.Check(context.Background()); err != nil {
			log.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(replica) * 100 * time.Millisecond) // this replica's clock is behind
			if _, err := lock.TryDo(context.Background(), report); err != nil {
				log.Print(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println("runs this tick:", runs.Load())
	// Output:
	// runs this tick: 1
}
