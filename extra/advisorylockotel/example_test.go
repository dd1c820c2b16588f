package advisorylockotel_test

import (
	"database/sql"
	"fmt"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockotel"
)

// The wiring docs/observability.md shows: the global providers, no lock names.
func ExampleNewObserver() {
	db, err := sql.Open("pgx", "postgres://app@db.internal/app") // New does no I/O
	if err != nil {
		panic(err)
	}
	defer db.Close()

	lock, err := advisorylock.New(db, "nightly-report", advisorylock.WithObserver(advisorylockotel.NewObserver()))
	fmt.Println(lock.Name(), err)
	// Output: nightly-report <nil>
}

// A service with a few named jobs adds the lock's name to every series
// and span, under the key AttrName.
func ExampleWithLockNames() {
	db, err := sql.Open("pgx", "postgres://app@db.internal/app") // New does no I/O
	if err != nil {
		panic(err)
	}
	defer db.Close()

	obs := advisorylockotel.NewObserver(advisorylockotel.WithLockNames(true))
	lock, err := advisorylock.New(db, "nightly-report", advisorylock.WithObserver(obs))
	fmt.Println(lock.Name(), err, advisorylockotel.AttrName)
	// Output: nightly-report <nil> advisorylock.name
}
