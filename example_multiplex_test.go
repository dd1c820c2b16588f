package advisorylock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/advisorylock/advisorylock"
)

// Per-entity locks on few connections: each order's lock is its own name,
// and every held name shares one of four sessions of the pool (New's
// default, said here) instead of pinning a connection each, as
// WithMultiplexing(0) would.
func ExampleWithMultiplexing() {
	db := exampleDB()
	defer db.Close()
	db.SetMaxOpenConns(8)
	ctx := context.Background()
	var held []*advisorylock.Guard
	for i := range 100 {
		l, err := advisorylock.New(db, fmt.Sprintf("example-order/%d", i), advisorylock.WithMultiplexing(4))
		if err != nil {
			log.Fatal(err)
		}
		g, err := l.TryLock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		held = append(held, g)
	}
	fmt.Println("held:", len(held), "open connections <= 8:", db.Stats().OpenConnections <= 8)
	for _, g := range held {
		if err := g.Release(ctx); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// held: 100 open connections <= 8: true
}

// A transfer between two accounts locks both, in whichever order the
// caller names them: sets take their names in key order, so two opposite
// transfers never deadlock.
func ExampleNewSet() {
	db := exampleDB()
	defer db.Close()
	ctx := context.Background()
	set, err := advisorylock.NewSet(db, []string{"example-account/b", "example-account/a"})
	if err != nil {
		log.Fatal(err)
	}
	err = set.Do(ctx, func(ctx context.Context) error {
		one, err := advisorylock.New(db, "example-account/a")
		if err != nil {
			return err
		}
		_, err = one.TryLock(ctx)
		fmt.Println("account a is taken:", errors.Is(err, advisorylock.ErrNotAcquired))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// account a is taken: true
}
