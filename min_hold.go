package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// Once per window (WithMinHold): a grant keeps the name taken until the
// window after it ends, whatever the holder does. The window is recorded
// at the grant, in the statement that takes the lock, so a holder that
// dies keeps it too; the release is unchanged. Row backends keep the
// window in the row's expiry (backend.LeaseRequest.MinHold); session backends,
// whose locks end with their session, keep it in a row of their own
// (backend.WindowedSessionLocker).

// errNoWindows is the first-use error of a Lock or LeaseLock with
// WithMinHold on a backend that cannot keep windows.
func errNoWindows(b backend.Backend) error {
	return fmt.Errorf("%w: backend %q cannot keep a name taken after a release (WithMinHold)", ErrUnsupported, b.Name())
}

// windowsFor returns the session locker's windows for a Lock with
// WithMinHold, made ready; nil without the option.
func (l *Lock) windowsFor(ctx context.Context, b backend.SessionLocker) (backend.WindowedSessionLocker, error) {
	if l.cfg.minHold <= 0 {
		return nil, nil
	}
	w, ok := b.(backend.WindowedSessionLocker)
	if !ok {
		return nil, errNoWindows(b)
	}
	if err := storableName(l.name); err != nil {
		return nil, fmt.Errorf("%w: WithMinHold records the name: %w", ErrUnsupported, err)
	}
	return w, w.PrepareWindows(ctx, l.db)
}

// checkRowWindows refuses WithMinHold on a row backend that ignores it.
func checkRowWindows(cfg *config, s backend.LeaseStore) error {
	if cfg.minHold > 0 && !s.Traits().KeepsWindows {
		return errNoWindows(s)
	}
	return nil
}

// windowClaim is the claim (see claim) of a Lock with WithMinHold on a
// session backend: its key, and the window after each grant.
type windowClaim struct {
	l *Lock
	w backend.WindowedSessionLocker
}

// try is the one statement that checks the window, takes the lock and
// records the new window.
func (c windowClaim) try(ctx context.Context, p *pinned) (int, backend.SessionResult, error) {
	res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
		return c.w.TryLockSessionFor(ctx, conn, c.l.key, c.l.name, c.l.cfg.minHold)
	})
	return 0, res, err
}

func (c windowClaim) wait(ctx, budget context.Context, p *pinned) (int, backend.SessionResult, error) {
	res, err := c.l.waitWindowed(ctx, budget, c.w, p)
	return 0, res, err
}

func (c windowClaim) leave(ctx context.Context, p *pinned) error {
	return endWait(ctx, c.w, p, c.l.key, c.l.cfg.releaseTimeout)
}

func (c windowClaim) held(int) *Lock { return c.l }

// waitWindowed is waitSession for a Lock with a window: while one is
// open (the database's clock says, once a slice) it sleeps, then tries;
// otherwise it waits a slice server-side and a grant claims its window
// (letting go if one opened meanwhile). OK false, nil: budget ended.
func (l *Lock) waitWindowed(ctx, budget context.Context, w backend.WindowedSessionLocker, p *pinned) (backend.SessionResult, error) {
	for {
		left, err := askUntil(ctx, waitBound(budget), p, func(ctx context.Context, conn *sql.Conn) (time.Duration, error) {
			return w.WindowLeft(ctx, conn, l.key)
		})
		if err != nil {
			return backend.SessionResult{}, err
		}
		var res backend.SessionResult
		if left > 0 {
			// In steps of at most a slice, each followed by a statement: a
			// connection idle for a whole window could be cut by a proxy or
			// idle_session_timeout.
			if !sleepWithin(budget, min(left, maxSlice)) {
				return backend.SessionResult{}, nil
			}
			if left > maxSlice {
				continue
			}
			res, err = askUntil(ctx, waitBound(budget), p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
				return w.TryLockSessionFor(ctx, conn, l.key, l.name, l.cfg.minHold)
			})
		} else {
			slice, cancel := context.WithTimeout(budget, maxSlice) // one server-side slice
			res, err = waitSession(ctx, slice, w, p, l.key)
			cancel()
			if err == nil && !res.OK && budget.Err() != nil {
				return backend.SessionResult{}, nil
			}
			if err == nil && res.OK {
				res, err = askUntil(ctx, waitBound(budget), p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
					return w.ClaimWindow(ctx, conn, l.key, l.name, l.cfg.minHold)
				})
			}
		}
		if err != nil || res.OK {
			return res, err
		}
	}
}

// waitBound is the deadline of a statement between a wait's slices,
// bounded as a slice is: budget's deadline and budgetGrace, else
// sliceGrace from now.
func waitBound(budget context.Context) time.Time {
	if dl, ok := budget.Deadline(); ok {
		return dl.Add(budgetGrace)
	}
	return time.Now().Add(sliceGrace)
}

// sleepWithin sleeps for d, or until budget ends (then false).
func sleepWithin(budget context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-budget.Done():
		return false
	}
}

// windowHolder reports the holder of an open window of a Lock with
// WithMinHold, nil without the option or when no window is open.
func (l *Lock) windowHolder(ctx context.Context, b *lockBackend) (*backend.Holder, error) {
	if b.windows == nil {
		return nil, nil
	}
	return b.windows.WindowHolder(ctx, l.db, l.key)
}
