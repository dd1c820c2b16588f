package advisorylock_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"

	"github.com/advisorylock/advisorylock"
)

// A lock that lives in your transaction: its commit (or rollback)
// releases it. It needs no connection of its own, so it also works behind
// PgBouncer in transaction mode.
func ExampleLock_LockTx() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	lock, err := advisorylock.New(db, "example-locktx-invoice-run")
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if err := lock.LockTx(ctx, tx); err != nil {
		log.Fatal(err) // a ctx that ended leaves tx usable, without the lock
	}
	var n int
	if err := tx.QueryRowContext(ctx, "SELECT 41 + 1").Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("computed under the lock:", n)
	fmt.Println("commit:", tx.Commit()) // releases the lock
	// Output:
	// computed under the lock: 42
	// commit: <nil>
}

// TryLockTx makes one attempt: a miss leaves the transaction as it was.
func ExampleLock_TryLockTx() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	lock, err := advisorylock.New(db, "example-trylocktx-report")
	if err != nil {
		log.Fatal(err)
	}
	holder, err := lock.TryLock(ctx) // someone else holds it
	if err != nil {
		log.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	ok, err := lock.TryLockTx(ctx, tx)
	fmt.Println("taken while held elsewhere:", ok, err)
	if err := holder.Release(ctx); err != nil {
		log.Fatal(err)
	}
	ok, err = lock.TryLockTx(ctx, tx)
	fmt.Println("taken once released:", ok, err)
	// Output:
	// taken while held elsewhere: false <nil>
	// taken once released: true <nil>
}

// Run the section's queries on the lock's own connection: with a pool of
// one, a query on the pool inside Do would wait forever for the
// connection that the lock pins.
func ExampleGuardFromContext() {
	db := exampleDB()
	defer db.Close()
	db.SetMaxOpenConns(1)
	lock, err := advisorylock.New(db, "example-guard-conn-ledger")
	if err != nil {
		log.Fatal(err)
	}
	err = lock.Do(context.Background(), func(ctx context.Context) error {
		return advisorylock.GuardFromContext(ctx).WithConn(ctx, func(conn advisorylock.Conn) error {
			var holds bool
			err := conn.QueryRowContext(ctx, "SELECT count(*) = 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").Scan(&holds)
			fmt.Println("this session holds the lock:", holds)
			return err
		})
	})
	fmt.Println("err:", err)
	// Output:
	// this session holds the lock: true
	// err: <nil>
}

// A transaction that fn leaves open on the lock's connection is rolled
// back when fn returns: none of its writes are kept.
func ExampleGuard_WithConn() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	lock, err := advisorylock.New(db, "example-guard-conn-rollback")
	if err != nil {
		log.Fatal(err)
	}
	g, err := lock.TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)
	var tx *sql.Tx
	err = g.WithConn(ctx, func(conn advisorylock.Conn) error {
		if tx, err = conn.BeginTx(ctx, nil); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "CREATE TEMP TABLE example_guard_conn (v int)")
		return err
	})
	fmt.Println("WithConn:", err)
	fmt.Println("commit after fn returned fails:", tx.Commit() != nil)
	// Output:
	// WithConn: <nil>
	// commit after fn returned fails: true
}
