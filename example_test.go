package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/advisorylock/advisorylock"
	_ "github.com/jackc/pgx/v5/stdlib"
)

// exampleDB opens the PostgreSQL the examples run against.
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

// Run-once across the fleet, right now: every replica calls this at
// 02:00, and while one of them sends the digest the others skip. A job
// this short, fired on replicas whose clocks are apart, can still run on
// several one after another: see WithMinHold.
func ExampleLock_TryDo() {
	db := exampleDB()
	defer db.Close()
	lock, err := advisorylock.New(db, "example-daily-digest")
	if err != nil {
		log.Fatal(err)
	}
	ran, err := lock.TryDo(context.Background(), func(ctx context.Context) error {
		fmt.Println("sending the digest")
		return nil // ctx is cancelled if the lock is lost meanwhile
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ran:", ran)
	// Output:
	// sending the digest
	// ran: true
}

// Serialize a section across the fleet: every caller runs it, one at a
// time.
func ExampleLock_Do() {
	db := exampleDB()
	defer db.Close()
	lock, err := advisorylock.New(db, "example-rebuild-search-index")
	if err != nil {
		log.Fatal(err)
	}
	err = lock.Do(context.Background(), func(ctx context.Context) error {
		fmt.Println("rebuilding, alone")
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// rebuilding, alone
	// err: <nil>
}

// Wait at most a bounded time: the budget covers the pool checkout and the
// wait, and a timeout costs no connection.
func ExampleLock_LockTimeout() {
	db := exampleDB()
	defer db.Close()
	lock, err := advisorylock.New(db, "example-migrate")
	if err != nil {
		log.Fatal(err)
	}
	held, err := lock.TryLock(context.Background()) // someone else holds it
	if err != nil {
		log.Fatal(err)
	}
	defer held.Release(context.Background())

	_, err = lock.LockTimeout(context.Background(), 100*time.Millisecond)
	fmt.Println(errors.Is(err, advisorylock.ErrTimeout), strings.Contains(err.Error(), "within 100ms"))
	// Output: true true
}

// sendDigestOnce is application code that takes a lock. It accepts
// options so a unit test can run it on go-sqlmock.
func sendDigestOnce(ctx context.Context, db *sql.DB, send func(), opts ...advisorylock.Option) (bool, error) {
	lock, err := advisorylock.New(db, "daily-digest", opts...)
	if err != nil {
		return false, err
	}
	return lock.TryDo(ctx, func(context.Context) error { send(); return nil })
}

// Unit-testing code that takes a lock, with go-sqlmock: name the backend
// (sqlmock's driver cannot be detected), skip the server checks, and expect
// one statement per step: the try and the unlock are Execs that return
// one row when they succeed. Here another replica holds the lock.
// (extra/advisorylocktest says these steps as intents, so that a test
// does not spell the statements.)
func Example_sqlmock() {
	db, mock, err := sqlmock.New()
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	mock.ExpectExec("pg_try_advisory_lock").
		WillReturnResult(sqlmock.NewResult(0, 0)) // 0 rows: held elsewhere

	ran, err := sendDigestOnce(context.Background(), db, func() { fmt.Println("sent") },
		advisorylock.WithBackend(advisorylock.Postgres()),
		advisorylock.WithServerChecks(false))
	fmt.Println("ran:", ran, "err:", err, "met:", mock.ExpectationsWereMet())
	// Output: ran: false err: <nil> met: <nil>
}

// New does no I/O, as sql.Open; Check runs the first-use checks (which
// backend, the pooler probe) at start-up, so that a misconfigured service
// fails before its first job rather than at it.
func ExampleNew() {
	db := exampleDB()
	defer db.Close()
	lock, err := advisorylock.New(db, "example-nightly-report")
	if err != nil {
		log.Fatal(err) // only a nil db fails here
	}
	if err := lock.Check(context.Background()); err != nil {
		log.Fatal(err) // ErrUnsupported, ErrTransactionPooler, a dead server, …
	}
	fmt.Println(lock.Name())
	// Output: example-nightly-report
}

// Hold a lock across calls with a Guard, and watch for its loss.
func ExampleLock_TryLock() {
	db := exampleDB()
	defer db.Close()
	lock, err := advisorylock.New(db, "example-leader-tasks")
	if err != nil {
		log.Fatal(err)
	}
	g, err := lock.TryLock(context.Background())
	if errors.Is(err, advisorylock.ErrNotAcquired) {
		fmt.Println("another replica has it")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(context.Background())
	select {
	case <-g.Lost():
		fmt.Println("lost: stop working")
	default:
		fmt.Println("held")
	}
	// Output: held
}

// Who holds a lock: for operators and tools.
func ExampleLock_Holder() {
	db := exampleDB()
	defer db.Close()
	lock, err := advisorylock.New(db, "example-held-by-someone")
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	g, err := lock.TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Release(ctx)
	h, err := lock.Holder(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(h.Name, h.PID > 0)
	// Output: example-held-by-someone true
}

// Key is what a service in another language computes to take the same
// lock (see Key's documentation for Python).
func ExampleKey() {
	fmt.Println(advisorylock.Key("daily-digest"))
	fmt.Println(advisorylock.Key("daily-digest") == advisorylock.Key("Daily-Digest")) // names are case-sensitive
	// Output:
	// 6074357047860495937
	// false
}

// A tool that has the DSN can warn about a pooler before connecting.
func ExamplePoolerHint() {
	pooler, ok := advisorylock.PoolerHint("postgres://app@db.internal:6432/app")
	fmt.Println(pooler, ok)
	_, ok = advisorylock.PoolerHint("postgres://app@db.internal:5432/app")
	fmt.Println(ok)
	// Output:
	// pgbouncer true
	// false
}

// The live probe: does anything multiplex this pool's sessions?
func ExampleDetectPooler() {
	db := exampleDB()
	defer db.Close()
	transaction, err := advisorylock.DetectPooler(context.Background(), db)
	if err != nil {
		log.Fatal(err)
	}
	if transaction {
		fmt.Println("sessions are multiplexed: use LeaseLock or WithLeaseRows")
	} else {
		fmt.Println("no pooler seen")
	}
	// Output: no pooler seen
}

// The DDL of the lease and fence tables, for a migration tool.
func ExampleSchema() {
	ddl := advisorylock.Schema(advisorylock.Postgres())
	fmt.Println(strings.Contains(ddl, "CREATE TABLE IF NOT EXISTS advisorylock_leases"))
	// Output: true
}

// Once per scheduled run: every replica's cron fires the hourly report a
// little apart; the run key is the hour it was scheduled for, so the
// first replica runs it and every later call for that hour skips it.
func ExampleLock_TryDoOnce() {
	db := exampleDB()
	defer db.Close()
	lock, err := advisorylock.New(db, "example-hourly-report-"+exampleID())
	if err != nil {
		log.Fatal(err)
	}
	tick := time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC).Format(time.RFC3339)
	for replica := range 3 {
		ran, err := lock.TryDoOnce(context.Background(), tick, func(ctx context.Context) error {
			fmt.Println("replica", replica, "sends the report for", tick)
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("replica", replica, "ran:", ran)
	}
	// Output:
	// replica 0 sends the report for 2026-12-03T02:00:00Z
	// replica 0 ran: true
	// replica 1 ran: false
	// replica 2 ran: false
}
