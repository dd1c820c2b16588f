package advisorylock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"
)

// connGuard owns a checked-out connection from checkout until the outcome
// of an acquire is definite. This file alone decides whether a connection
// goes back to the pool (recycle) or is closed for good (discard).
//
// The rule: a connection goes back to the pool only when its session is
// known to hold no lock of ours. A definite miss or a clean unlock
// recycles; anything else (an error, a cancelled context, a panic)
// discards, so the server ends the session and frees whatever it might
// have granted.
type connGuard struct {
	conn  *sql.Conn
	armed bool
}

// checkout takes a connection from db's pool for an acquire. A done
// context returns its error before touching the pool.
func checkout(ctx context.Context, db DB) (*connGuard, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("%w: %w", ErrPoolUnavailable, err)
	}
	return &connGuard{conn: conn, armed: true}, nil
}

// settle discards the connection unless the outcome was made definite by
// recycle or take. Defer it right after checkout: it also runs on panic.
func (g *connGuard) settle() {
	if g.armed {
		g.armed = false
		discard(g.conn)
	}
}

// recycle returns the connection to the pool after a definite miss.
func (g *connGuard) recycle() {
	g.armed = false
	recycle(g.conn)
}

// take disarms the guard and hands the connection to a lock holder, which
// must later call recycle or discard.
func (g *connGuard) take() *sql.Conn {
	g.armed = false
	return g.conn
}

// recycle returns a connection whose session holds none of our locks.
func recycle(conn *sql.Conn) { _ = conn.Close() }

// discard closes the physical connection instead of pooling it, which ends
// the server session and with it every session lock it held.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close() // sql.ErrConnDone: Raw has closed it already
}

// holdSession hands a connection whose session now holds l's lock to a new
// Guard. From here on the Guard owns the connection: Release unlocks and
// recycles it (or discards it when the unlock is not clean), the keep-alive
// watcher marks the Guard lost when the session no longer holds the lock,
// and a forgotten Guard discards it.
func (l *Lock) holdSession(conn *sql.Conn, session int64) *Guard {
	h := &hold{
		name:  l.name,
		key:   l.key,
		log:   l.cfg.log().Warn,
		lost:  make(chan struct{}),
		relTO: l.cfg.releaseTimeout,
	}
	stopWatch := func() {}
	if l.cfg.keepAlive > 0 {
		stopWatch = watchSession(h, l.session, conn, l.cfg.keepAlive, l.cfg.releaseTimeout)
	}
	h.release = func(ctx context.Context) error {
		stopWatch()
		if h.isLost() {
			discard(conn)
			return nil
		}
		res, err := l.session.UnlockSession(ctx, conn, l.key)
		switch {
		case err != nil:
			discard(conn)
			return err
		case session != 0 && res.Session != 0 && res.Session != session:
			discard(conn)
			return fmt.Errorf("%w: acquired on server session %d, released on %d", ErrTransactionPooler, session, res.Session)
		case !res.OK:
			h.log("advisorylock: unlock found the lock not held by its session", "lock", l.name, "key", l.key)
		}
		recycle(conn)
		return nil
	}
	h.forget = func() {
		stopWatch()
		discard(conn)
	}
	return newGuard(h)
}

// watchSession checks every interval that conn's session still holds the
// lock and marks h lost when it does not. The returned stop ends the
// watcher and waits for it; a check in flight finishes first (it is
// bounded by timeout), so the connection is never left mid-statement.
func watchSession(h *hold, s SessionLocker, conn *sql.Conn, every, timeout time.Duration) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			held, err := s.HoldsSession(ctx, conn, h.key)
			cancel()
			select {
			case <-quit:
				return
			default:
			}
			if err == nil && held {
				continue
			}
			if err == nil {
				err = errors.New("session no longer holds it")
			}
			h.log("advisorylock: lock lost", "lock", h.name, "key", h.key, "err", err)
			h.markLost(fmt.Errorf("%w: %w", ErrLockLost, err))
			return
		}
	}()
	return sync.OnceFunc(func() {
		close(quit)
		<-done
	})
}
