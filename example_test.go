package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
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

// Run-once across the fleet: every replica calls this at 02:00, and
// exactly one of them sends the digest; the others skip.
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
	var te *advisorylock.TimeoutError
	fmt.Println(errors.Is(err, advisorylock.ErrTimeout), errors.As(err, &te))
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
