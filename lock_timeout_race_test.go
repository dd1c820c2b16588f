package advisorylock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestLockTimeoutRacingAGrantIsAGrantOnARealServer reproduces, on a real
// server, the race docs/semantics.md describes: PostgreSQL grants
// the lock at the instant the slice's lock_timeout fires, keeps the grant
// and still fails the statement with 55P03. A driver wrapper lets the real
// wait statement run to its grant and then reports 55P03, every time. The
// library must ask the session, take the lock as granted, and leave
// nothing held after the release; code that takes 55P03 for a miss pools
// a connection holding the lock (or, slicing on, stacks a second grant on
// the same session and times out).
func TestLockTimeoutRacingAGrantIsAGrantOnARealServer(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			name := testdb.UniqueName(t)
			admin := testdb.OpenPostgres(t, drv)
			var raced atomic.Int64
			db := testdb.OpenHooked(t, drv, testdb.PostgresDSN(t), testdb.Hooks{
				After: func(q string, err error) error {
					if err == nil && strings.Contains(q, "pg_advisory_lock(") {
						raced.Add(1)
						return testdb.SQLStateError("55P03")
					}
					return err
				},
			})
			holder, err := newLock(t, admin, name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l := newLock(t, db, name, quiet, advisorylock.WithBackend(advisorylock.Postgres()), advisorylock.WithKeepAlive(0))
			got := make(chan error, 1)
			var g *advisorylock.Guard
			go func() {
				var err error
				g, err = l.LockTimeout(ctx, 3*timeoutSlack)
				got <- err
			}()
			testdb.WaitFor(t, wait, func() bool { return waitingOn(t, admin, name) == 1 }, "waiter never queued")
			mustRelease(t, holder)
			if err := <-got; err != nil {
				t.Fatalf("LockTimeout whose slice was granted as its lock_timeout fired = %v, want the lock", err)
			}
			if raced.Load() == 0 {
				t.Fatal("the wait statement never ran: nothing was tested")
			}
			if n := locksHeld(t, admin, name); n != 1 {
				t.Fatalf("%d sessions hold the lock while the guard is held, want 1", n)
			}
			mustRelease(t, g)
			if n := locksHeld(t, admin, name); n != 0 {
				t.Fatalf("after the release %d sessions still hold the lock: a grant leaked into the pool", n)
			}
			if h, err := l.Holder(ctx); err != nil || h != nil {
				t.Fatalf("Holder after the release = %+v, %v; want nobody", h, err)
			}
		})
	}
}
