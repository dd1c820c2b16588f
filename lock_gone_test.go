package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestKeepAliveReportsALockGoneFromItsLiveSession: a holder whose session
// lives on but no longer holds the lock is told it lost it
// (not_held), whether nobody holds the lock now (MySQL's IS_USED_LOCK
// answers NULL) or another session took it (IS_USED_LOCK names another
// connection; pg_locks shows another pid). The lock is freed on the
// holder's own session, in a transaction in WithConn, during which the
// keep-alive steps aside: the other session's grant comes before the next
// check. Releasing the lost Guard then leaves the other session's lock
// alone. A shared holder (RLock) is read the same way: PostgreSQL's
// ShareLock gone from pg_locks; on MySQL its holder lock gone, which
// leaves its advisorylock_shared row stale, so a writer gets in.
func TestKeepAliveReportsALockGoneFromItsLiveSession(t *testing.T) {
	t.Parallel()
	type backend struct {
		name      string
		open      func(t *testing.T) *sql.DB
		unlockAll string // frees every lock of the session
	}
	var backends []backend
	for _, drv := range testdb.Drivers {
		backends = append(backends, backend{"postgres/" + drv, func(t *testing.T) *sql.DB { return testdb.OpenPostgres(t, drv) }, "SELECT pg_advisory_unlock_all()"})
	}
	backends = append(backends, backend{"mysql", func(t *testing.T) *sql.DB { return testdb.OpenMySQL(t) }, "DO RELEASE_ALL_LOCKS()"})
	// A pinned lock's keep-alive and a shared session's are separate
	// statements: both run. The cases wait on names and handles of their
	// own, side by side; the goroutine check covers them together.
	testdb.CheckGoroutines(t)
	for _, b := range backends {
		for _, mode := range sessionModes() {
			for _, c := range goneCases() {
				shared, taken := c.shared, c.taken
				t.Run(b.name+"/"+mode.name+"/"+c.name, func(t *testing.T) {
					t.Parallel()
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					defer cancel()
					name := testdb.UniqueName(t)
					rec := &observetest.Recorder{}
					l := newLock(t, b.open(t), name, append([]advisorylock.Option{advisorylock.WithKeepAlive(50 * time.Millisecond), advisorylock.WithObserver(rec)}, mode.opts...)...)
					try := l.TryLock
					if shared {
						try = l.TryRLock
					}
					g, err := try(ctx)
					if err != nil {
						t.Fatal(err)
					}
					defer func() { _ = g.Release(context.Background()) }() // on a failure; releasing twice is harmless
					other := newLock(t, b.open(t), name)
					var og *advisorylock.Guard
					err = g.WithConn(ctx, func(c advisorylock.Conn) error {
						tx, err := c.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						if _, err := tx.ExecContext(ctx, b.unlockAll); err != nil {
							return fmt.Errorf("freeing the lock on its own session: %w", err)
						}
						if taken {
							if og, err = other.TryLock(ctx); err != nil {
								return fmt.Errorf("TryLock from another session after the holder's session freed the lock: %w", err)
							}
						}
						return tx.Commit()
					})
					if og != nil {
						defer mustRelease(t, og)
					}
					if err != nil {
						t.Fatal(err)
					}
					select {
					case <-g.Lost():
					case <-time.After(wait):
						t.Fatalf("the keep-alive (every 50ms) never reported the lock lost after its session freed it (shared: %v, taken by another session: %v)", shared, taken)
					}
					testdb.WaitFor(t, wait, func() bool { return len(rec.Events("loss")) > 0 }, "no loss event after Lost closed")
					_ = g.Release(ctx) // lost: its error says so
					if n := rec.Count("loss", "not_held"); n != 1 {
						t.Fatalf("loss events %+v, want one with cause not_held", rec.Events("loss"))
					}
					if !taken {
						return
					}
					select {
					case <-og.Lost():
						t.Fatal("the other session's lock was lost after the first holder's release")
					default:
					}
					if _, err := newLock(t, b.open(t), name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
						t.Fatalf("TryLock after the lost Guard's release = %v, want ErrNotAcquired (the other session holds it)", err)
					}
				})
			}
		}
	}
}

// goneCase is how TestKeepAliveReportsALockGoneFromItsLiveSession's
// holder holds, and whether another session takes the lock once it is gone.
type goneCase struct {
	name          string
	shared, taken bool
}

func goneCases() []goneCase {
	return []goneCase{
		{"freed", false, false},
		{"taken-by-another-session", false, true},
		{"rlock/freed", true, false},
		{"rlock/taken-by-another-session", true, true},
	}
}
