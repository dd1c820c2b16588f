package advisorylocktest_test

import (
	"context"
	"fmt"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylocktest"
)

// sendDigest is the code under test: it runs the digest on one replica.
func sendDigest(ctx context.Context, lock *advisorylock.Lock) (bool, error) {
	return lock.TryDo(ctx, func(context.Context) error {
		fmt.Println("sending the digest")
		return nil
	})
}

// A unit test of code that runs a job once across the fleet, on a
// go-sqlmock handle: one replica wins the try, the next loses it.
func ExamplePostgres() {
	db, mock, err := sqlmock.New()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	pg := advisorylocktest.Postgres(mock)
	lock, err := advisorylock.New(db, "daily-digest", pg.Options()...)
	if err != nil {
		panic(err)
	}

	pg.ExpectTryWins()
	pg.ExpectRelease()
	fmt.Println(sendDigest(context.Background(), lock))

	pg.ExpectTryLoses()
	fmt.Println(sendDigest(context.Background(), lock))

	fmt.Println(mock.ExpectationsWereMet())
	// Output:
	// sending the digest
	// true <nil>
	// false <nil>
	// <nil>
}

// MySQL's lock statements are queries of one row of four columns; the
// expectations answer them. Do waits for the lock held elsewhere.
func ExampleMySQL() {
	db, mock, err := sqlmock.New()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	my := advisorylocktest.MySQL(mock)
	lock, err := advisorylock.New(db, "migrations", my.Options()...)
	if err != nil {
		panic(err)
	}

	my.ExpectWaitGranted()
	my.ExpectRelease()
	err = lock.Do(context.Background(), func(context.Context) error {
		fmt.Println("migrating")
		return nil
	})
	fmt.Println(err, mock.ExpectationsWereMet())
	// Output:
	// migrating
	// <nil> <nil>
}

// A lease's fencing token is the one the expectation grants.
func ExampleMock_ExpectLeaseWins() {
	db, mock, err := sqlmock.New()
	if err != nil {
		panic(err)
	}
	defer db.Close()
	sq := advisorylocktest.SQLite(mock)
	lease, err := advisorylock.NewLeaseLock(db, "invoice-run", sq.Options()...)
	if err != nil {
		panic(err)
	}

	sq.ExpectLeaseWins(7)
	sq.ExpectLeaseRelease()
	ran, err := lease.TryDo(context.Background(), func(_ context.Context, l advisorylock.Lease) error {
		fmt.Println("token", l.Token())
		return nil
	})
	fmt.Println(ran, err, mock.ExpectationsWereMet())
	// Output:
	// token 7
	// true <nil> <nil>
}

// Two replicas' locks on one Memory exclude each other, with no database
// and no mock.
func ExampleMemory() {
	mem := advisorylocktest.NewMemory()
	db := mem.OpenDB()
	defer db.Close()
	replicaA, err := advisorylock.New(db, "daily-digest", mem.Options()...)
	if err != nil {
		panic(err)
	}
	replicaB, err := advisorylock.New(db, "daily-digest", mem.Options()...)
	if err != nil {
		panic(err)
	}

	ctx := context.Background()
	g, err := replicaA.TryLock(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(sendDigest(ctx, replicaB)) // A holds it
	if err := g.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println(sendDigest(ctx, replicaB))
	// Output:
	// false <nil>
	// sending the digest
	// true <nil>
}
