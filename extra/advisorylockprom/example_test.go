package advisorylockprom_test

import (
	"database/sql"
	"fmt"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockprom"
	"github.com/prometheus/client_golang/prometheus"
)

// The wiring docs/observability.md shows: one observer per registry, any number of
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

// A service with a few named jobs labels its series by lock name. Every
// observer on the registry must then ask for names too: one that does not
// is refused.
func ExampleWithLockNames() {
	reg := prometheus.NewRegistry()
	if _, err := advisorylockprom.NewObserver(reg, advisorylockprom.WithLockNames(true)); err != nil {
		panic(err)
	}
	_, err := advisorylockprom.NewObserver(reg)
	fmt.Println(err)
	// Output: advisorylock: prometheus observer: the registry has the advisorylock_ metrics with the name label, by an observer with WithLockNames(true): observers on one registry must agree on WithLockNames
}
