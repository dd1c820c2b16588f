package advisorylockprom_test

import (
	"database/sql"
	"fmt"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockprom"
	"github.com/prometheus/client_golang/prometheus"
)

// The wiring the README shows: one observer per registry, any number of
// locks.
func ExampleNewObserver() {
	db, err := sql.Open("pgx", "postgres://app@db.internal/app") // New does no I/O
	if err != nil {
		panic(err)
	}
	defer db.Close()
	reg := prometheus.NewRegistry() // or prometheus.DefaultRegisterer

	obs, err := advisorylockprom.NewObserver(reg)
	if err != nil {
		panic(err)
	}
	lock, err := advisorylock.New(db, "nightly-report", advisorylock.WithObserver(obs))
	fmt.Println(lock.Name(), err)
	// Output: nightly-report <nil>
}
