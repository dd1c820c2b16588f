package advisorylockpq_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockpq"
)

// A lib/pq handle, wrapped, so that a LeaseLock waiter is woken by the
// release it waits for.
func ExampleWrap() {
	dsn := "postgres://app@db.internal/app?sslmode=verify-full"
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := advisorylock.NewLeaseLock(advisorylockpq.Wrap(db, dsn), "nightly-report")
	if err != nil {
		log.Fatal(err)
	}
	err = lease.Do(context.Background(), func(ctx context.Context, l advisorylock.Lease) error {
		log.Printf("holding with token %v", l.Token())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
