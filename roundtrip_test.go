package advisorylock_test

import (
	"context"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// Every lock step is one round trip on both drivers (SPEC 4.6a), shared
// ones too (issue 18): counted on the wire, as ReadyForQuery messages
// through a proxy.
func TestEachLockStepIsOneRoundTrip(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1)
			l := newLock(t, db, testdb.UniqueName(t))
			// Warm up: pgx prepares each statement text once per connection.
			for _, acquire := range []func(context.Context) (*advisorylock.Guard, error){l.TryLock, l.Lock, l.TryRLock, l.RLock} {
				g, err := acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				mustRelease(t, g)
			}
			for _, step := range []struct {
				name    string
				acquire func(context.Context) (*advisorylock.Guard, error)
			}{{"TryLock", l.TryLock}, {"Lock", l.Lock}, {"TryRLock", l.TryRLock}, {"RLock", l.RLock}} {
				proxy.ResetCount()
				g, err := step.acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if n := proxy.RoundTrips(); n != 1 {
					t.Errorf("%s took %d round trips, want 1", step.name, n)
				}
				proxy.ResetCount()
				mustRelease(t, g)
				if n := proxy.RoundTrips(); n != 1 {
					t.Errorf("Release after %s took %d round trips, want 1", step.name, n)
				}
			}
		})
	}
}
