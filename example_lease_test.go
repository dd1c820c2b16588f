package advisorylock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/advisorylock/advisorylock"
)

// exampleID makes the examples' names unique per run, so that their
// tokens start at 1.
func exampleID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func ExampleLeaseLock_Do() {
	db := exampleDB()
	defer db.Close()

	report, err := advisorylock.NewLeaseLock(db, "nightly-report/"+exampleID(), advisorylock.WithLeaseTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = report.Do(context.Background(), func(ctx context.Context, lease advisorylock.Lease) error {
		// ctx ends if the lease is lost. Pass lease.Token() to every
		// write that a Fence guards.
		// Tokens strictly increase per name; they are not consecutive.
		fmt.Println("writing the report with a fencing token:", lease.Token() > 0)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: writing the report with a fencing token: true
}

func ExampleFence_Admit() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	id := exampleID()

	// The resource: a row that only the lease holder may write.
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS advisorylock_example_reports (
		id text PRIMARY KEY, body text NOT NULL, token bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	defer db.ExecContext(ctx, "DELETE FROM advisorylock_example_reports WHERE id = $1", id)

	fence, err := advisorylock.NewFence(db, "report/"+id)
	if err != nil {
		log.Fatal(err)
	}
	// save writes the report in the same transaction that admits the
	// token, so a refused token writes nothing.
	save := func(token advisorylock.FencingToken, body string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := fence.Admit(ctx, tx, token); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO advisorylock_example_reports (id, body, token) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO UPDATE SET body = EXCLUDED.body, token = EXCLUDED.token`, id, body, token)
		if err != nil {
			return err
		}
		return tx.Commit()
	}

	lock, err := advisorylock.NewLeaseLock(db, "report/"+id)
	if err != nil {
		log.Fatal(err)
	}
	old, err := lock.TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// The first holder stalls (a long GC pause, a network partition) and
	// its lease ends; here it is released to keep the example quick.
	_ = old.Release(ctx)
	newer, err := lock.TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer newer.Release(ctx)

	fmt.Println("newer holder:", save(newer.Lease().Token(), "fresh"))
	err = save(old.Lease().Token(), "stale")        // the first holder wakes up and writes
	if errors.Is(err, advisorylock.ErrStaleToken) { // the message names the token and the highest admitted
		fmt.Println("old holder: its token refused, the report has seen a higher one")
	}
	var body string
	if err := db.QueryRowContext(ctx, "SELECT body FROM advisorylock_example_reports WHERE id = $1", id).Scan(&body); err != nil {
		log.Fatal(err)
	}
	fmt.Println("report:", body)
	// Output:
	// newer holder: <nil>
	// old holder: its token refused, the report has seen a higher one
	// report: fresh
}
