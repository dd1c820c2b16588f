package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// Once per window (WithMinHold): a grant keeps the name taken until its
// window ends, recorded by the statement that takes the lock: in the
// row's expiry (backend.LeaseRequest.MinHold), or beside a session lock
// in a row of its own (backend.WindowedSessionLocker).

// errNoWindows refuses WithMinHold on a backend that keeps no windows.
func errNoWindows(b backend.Backend) error {
	return fmt.Errorf("%w: backend %q cannot keep a name taken after a release (WithMinHold)", ErrUnsupported, b.Name())
}

// windowsFor returns b's windows, made ready, with WithMinHold; else nil.
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

// windowClaim is a claim of a Lock with WithMinHold: key and window.
type windowClaim struct {
	l *Lock
	w backend.WindowedSessionLocker
}

// try checks the window, takes the lock and records a window, at once.
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

// windowHolder reports the grant of an open window, nil without one.
func (l *Lock) windowHolder(ctx context.Context, b *lockBackend) (*backend.Holder, error) {
	if b.windows == nil {
		return nil, nil
	}
	return b.windows.WindowHolder(ctx, l.db, l.key)
}
