package advisorylock_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestSQLiteWritersOfOnePoolTakeTurns: 32 goroutines of one pool lock
// and release names at random on one SQLite file (the drivers' usual 5s
// busy_timeout). The pool's acquires take turns, so none sleeps in the
// driver's busy handler while others barge in: every step gets its turn
// within its bounds, and no release is still busy when its release
// timeout ends.
func TestSQLiteWritersOfOnePoolTakeTurns(t *testing.T) {
	testdb.Slow(t, "32 goroutines over 256 names")
	t.Parallel() // a file of its own
	const goroutines, names, rounds = 32, 256, 10
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
	locks := make([]*advisorylock.Lock, names)
	base := testdb.UniqueName(t)
	for i := range locks {
		locks[i] = newLock(t, db, base+strconv.Itoa(i), quiet)
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), leaseWait) // a bound for a loaded machine
				g, err := locks[rand.N(names)].Lock(ctx)
				if err == nil {
					err = g.Release(ctx)
				}
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
