package advisorylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestLeaseLockTryLockAndReleaseAreOneRoundTripEach counts the round
// trips of a LeaseLock's TryLock and Release through a proxy, after a
// warm-up: one each, as for the backend's lease steps alone (see
// TestLeaseStepsAreOneRoundTrip in internal/postgresbackend): the front
// end adds no statement of its own.
func TestLeaseLockTryLockAndReleaseAreOneRoundTripEach(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1)
			l, err := advisorylock.NewLeaseLock(db, testdb.UniqueName(t))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var g *advisorylock.LeaseGuard
			lock := func() (int64, error) {
				return proxy.Counted(func() error {
					var err error
					g, err = l.TryLock(ctx)
					return err
				})
			}
			release := func() (int64, error) {
				return proxy.Counted(func() error { return g.Release(ctx) })
			}
			for _, step := range []func() (int64, error){lock, release} { // warm-up
				if _, err := step(); err != nil {
					t.Fatal(err)
				}
			}
			last := time.Now()
			testdb.MeasureOneRoundTrip(t, "TryLock", &last, lock)
			testdb.MeasureOneRoundTrip(t, "Release", &last, release)
		})
	}
}
