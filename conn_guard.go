package advisorylock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	p     *pinned
	armed bool
}

// checkout takes a connection from db's pool for an acquire. A done
// context returns its error before touching the pool. Where the driver
// may not end a connection's startup when ctx ends (bounded), the checkout
// goes through within; a connection that arrives after ctx ended goes back
// to the pool.
func checkout(ctx context.Context, db DB, bounded bool) (*connGuard, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	var conn *sql.Conn
	var err error
	if bounded {
		conn, err = within(ctx, func() (*sql.Conn, error) { return db.Conn(ctx) }, nil, func(late *sql.Conn) {
			if late != nil {
				recycle(late)
			}
		})
	} else {
		conn, err = db.Conn(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("%w: %w", ErrPoolUnavailable, err)
	}
	return &connGuard{p: &pinned{conn: conn, bounded: bounded}, armed: true}, nil
}

// settle discards the connection unless the outcome was made definite by
// recycle or take. Defer it right after checkout: it also runs on panic.
func (g *connGuard) settle() {
	if g.armed {
		g.armed = false
		g.p.discard()
	}
}

// recycle returns the connection to the pool after a definite miss.
func (g *connGuard) recycle() {
	g.armed = false
	recycle(g.p.conn)
}

// take disarms the guard and hands the connection to a lock holder, which
// must later recycle or discard it.
func (g *connGuard) take() *pinned {
	g.armed = false
	return g.p
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
func (l *Lock) holdSession(p *pinned, session int64) *Guard {
	h := &hold{
		name:  l.name,
		key:   l.key,
		log:   l.cfg.log().Warn,
		lost:  make(chan struct{}),
		relTO: l.cfg.releaseTimeout,
	}
	stopWatch := func() {}
	if l.cfg.keepAlive > 0 {
		stopWatch = watchSession(h, l.session, p, l.cfg.keepAlive, l.cfg.releaseTimeout)
	}
	h.release = func(ctx context.Context) error {
		stopWatch()
		if h.isLost() {
			p.discard()
			return nil
		}
		res, err := ask(ctx, p, func() (SessionResult, error) { return l.session.UnlockSession(p.stmtCtx(ctx), p.conn, l.key) })
		switch {
		case err != nil:
			p.discard()
			return err
		case session != 0 && res.Session != 0 && res.Session != session:
			p.discard()
			return fmt.Errorf("%w: acquired on server session %d, released on %d", ErrTransactionPooler, session, res.Session)
		case !res.OK:
			h.log("advisorylock: unlock found the lock not held by its session", "lock", l.name, "key", l.key)
		}
		recycle(p.conn)
		return nil
	}
	h.forget = func() {
		stopWatch()
		p.discard()
	}
	return newGuard(h)
}

// pinned is the connection of a held Guard. Its statements go through
// ask; once ask has abandoned one, the connection is discarded in the
// background when the driver lets go of it, and must not be discarded
// again meanwhile (that would wait for the driver).
type pinned struct {
	conn      *sql.Conn
	bounded   bool // statements go through within (see endsWithContext)
	abandoned atomic.Bool
}

// endsWithContext reports whether b's driver ends a statement promptly
// when its context ends, also on a dead network (pgx closes its socket).
// Statements of other drivers go through within: lib/pq, for one, waits
// for a cancel request that a dead network never delivers (lib/pq#620).
func endsWithContext(b Backend) bool {
	e, ok := b.(interface{ endsWithContext() bool })
	return ok && e.endsWithContext()
}

// stmtCtx is the context for a statement that answers in one round trip.
// Under within, the wait is bounded already, and a context that cannot end
// spares the driver and database/sql a watcher goroutine each.
func (p *pinned) stmtCtx(ctx context.Context) context.Context {
	if p.bounded {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// discard discards the connection unless ask already does.
func (p *pinned) discard() {
	if !p.abandoned.Load() {
		discard(p.conn)
	}
}

// ask runs stmt, a statement on p's connection. Where the driver may not
// end it with ctx, it waits for the answer only until ctx ends (see
// within), and an abandoned statement's connection is discarded when the
// statement returns.
func ask[T any](ctx context.Context, p *pinned, stmt func() (T, error)) (T, error) {
	if !p.bounded {
		return stmt()
	}
	return within(ctx, stmt, func() {
		p.abandoned.Store(true)
	}, func(T) { discard(p.conn) })
}

// answerGrace is how long within still waits, once ctx ended, for a
// driver that honours ctx to return (pgx closes its socket, lib/pq gets
// its cancel request through): on a live network that takes about one
// round trip.
const answerGrace = 250 * time.Millisecond

// within runs f, which talks to the database, and waits for it until ctx
// ends (and answerGrace more). Some drivers do not give up a read (or a
// connection's startup) on a dead network when ctx ends: lib/pq sends a
// cancel request over a new connection, which cannot get through either,
// and keeps reading (lib/pq#620). A network cut would then hold the caller
// until the network heals or TCP gives up, many minutes later. When f has
// not returned by then, within calls abandon, returns ctx's cause, and
// leaves f to finish on its own, calling late (if not nil) with its value
// once it has.
func within[T any](ctx context.Context, f func() (T, error), abandon func(), late func(T)) (T, error) {
	if ctx.Done() == nil { // ctx never ends: nothing to bound
		return f()
	}
	type answer struct {
		v   T
		err error
	}
	out := make(chan answer, 1)
	go func() {
		v, err := f()
		out <- answer{v, err}
	}()
	select {
	case a := <-out:
		return a.v, a.err
	case <-ctx.Done():
	}
	grace := time.NewTimer(answerGrace)
	defer grace.Stop()
	select {
	case a := <-out:
		return a.v, a.err
	case <-grace.C:
	}
	if abandon != nil {
		abandon()
	}
	go func() {
		a := <-out
		if late != nil {
			late(a.v)
		}
	}()
	var zero T
	return zero, fmt.Errorf("no answer from the database: %w", context.Cause(ctx))
}

// watchSession checks every interval that the pinned connection's session
// still holds the lock and marks h lost when it does not, or when a check
// gets no answer within timeout (a dead network: see ask). The check runs
// on a timer, so a held lock costs no goroutine between checks. The
// returned stop ends the watcher; a check in flight is answered or
// abandoned first (within timeout plus answerGrace), so the connection is
// never left mid-statement.
func watchSession(h *hold, s SessionLocker, p *pinned, every, timeout time.Duration) (stop func()) {
	var mu sync.Mutex // held by a check in flight
	stopped := false
	var t *time.Timer
	check := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		held, err := ask(ctx, p, func() (bool, error) { return s.HoldsSession(ctx, p.conn, h.key) })
		cancel()
		if err == nil && held {
			t.Reset(every)
			return
		}
		if err == nil {
			err = errors.New("session no longer holds it")
		}
		h.log("advisorylock: lock lost", "lock", h.name, "key", h.key, "err", err)
		h.markLost(fmt.Errorf("%w: %w", ErrLockLost, err))
	}
	mu.Lock()
	t = time.AfterFunc(every, check)
	mu.Unlock()
	return func() {
		mu.Lock() // waits for a check in flight, which may re-arm t
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}
