package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// connGuard owns a checked-out connection until the outcome of an
// acquire is definite. A connection goes back to the pool only when its
// session is known to hold no lock of ours (a definite miss, a clean
// unlock); anything else (an error, a cancelled context, a panic)
// discards it, so the server frees whatever it might have granted.
type connGuard struct {
	p     *pinned
	ctx   context.Context // the acquire's: ended means a discard is for "canceled"
	armed bool
}

// checkout takes a connection from db's pool into p for an acquire (see
// dbutil.Checkout).
func checkout(ctx context.Context, db DB, p *pinned, poolWait time.Duration) (connGuard, error) {
	conn, err := dbutil.Checkout(ctx, db, p.bounded, poolWait)
	if err != nil {
		return connGuard{}, err
	}
	p.conn = conn
	if p.bounded {
		p.sever = interruptible(conn)
	}
	return connGuard{p: p, ctx: ctx, armed: true}, nil
}

// settle discards the connection unless recycle or take ran (defer it).
func (g *connGuard) settle() {
	if g.armed {
		g.armed = false
		if g.ctx.Err() != nil {
			g.p.discard(CauseCanceled, context.Cause(g.ctx))
		} else {
			g.p.discard(CauseError, nil)
		}
	}
}

// recycle returns the connection to the pool after a definite miss.
func (g *connGuard) recycle() {
	g.armed = false
	dbutil.Recycle(g.p.conn)
}

// take hands the connection to a holder, which recycles or discards it.
func (g *connGuard) take() { g.armed = false }

// sessionHold is a held session lock, in one allocation: the Guard's
// hold, the connection whose session holds the lock, and its keep-alive.
// From the grant on it owns the connection.
type sessionHold struct {
	hold
	l       *Lock
	locker  backend.SessionLocker
	p       pinned
	session int64   // the server session that granted it; 0 if unknown
	keys    []int64 // what it holds: l's key, or its set's keys
	one     [1]int64

	watchMu sync.Mutex // held by a keep-alive check in flight
	stopped bool
	timer   *time.Timer
	lent    *lentConn // WithConn's while its fn runs, Guard.Conn's until the release (under watchMu)
}

// grant turns s, whose session now holds l's lock, into a Guard.
func (s *sessionHold) grant(session int64) *Guard {
	l := s.l
	s.hold = hold{name: l.name, key: l.key, logger: l.cfg.log(), relTO: l.cfg.releaseTimeout, end: s}
	s.session = session
	s.keys = l.set
	if s.keys == nil {
		s.one[0] = l.key
		s.keys = s.one[:]
	}
	if l.cfg.keepAlive > 0 {
		s.watchMu.Lock()
		s.timer = time.AfterFunc(l.cfg.keepAlive, s.check)
		s.watchMu.Unlock()
	}
	return newGuard(&s.hold)
}

// release ends the hold within timeout (ctx never ends: see doRelease):
// it takes the lent connection back (see waitLent), unlocks and recycles
// it, or discards it where that is not clean.
func (s *sessionHold) release(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	s.stopWatch()
	if ok, err := s.waitLent(deadline); !ok {
		return err
	}
	if gone, why := s.isLost(); gone {
		s.p.discard(s.discardCause(), why)
		return nil
	}
	if len(s.keys) > 1 {
		if err := unlockKeys(ctx, s.locker, &s.p, s.keys, time.Until(deadline)); err != nil {
			s.p.discard(CauseError, err)
			return err
		}
		dbutil.Recycle(s.p.conn)
		return nil
	}
	res, err := askUntil(ctx, deadline, &s.p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
		return unlockHeld(ctx, s.locker, conn, s.l)
	})
	switch {
	case err != nil:
		s.p.discard(CauseError, err)
		return err
	case s.session != 0 && res.Session != 0 && res.Session != s.session:
		s.p.discard(CauseError, ErrTransactionPooler)
		return fmt.Errorf("%w: acquired on server session %d, released on %d", ErrTransactionPooler, s.session, res.Session)
	case !res.OK:
		s.warn("advisorylock: unlock found the lock not held by its session", "lock", s.name, "key", s.key)
	}
	dbutil.Recycle(s.p.conn)
	return nil
}

// discardCause is why the connection of a hold found lost is discarded:
// the loss's cause, or CauseError for a loss told without one (a term
// statement of an Election failed on it).
func (s *sessionHold) discardCause() Cause {
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	if s.lostCause == "" {
		return CauseError
	}
	return s.lostCause
}

// forget runs in the runtime's single cleanup goroutine, which must not
// wait on I/O (stopping the keep-alive waits for a check in flight), so
// it stops and discards in a goroutine of its own. No WithConn runs then:
// it keeps its Guard reachable.
func (s *sessionHold) forget() {
	go func() {
		s.stopWatch()
		s.p.discard(CauseForgotten, nil)
	}()
}

// check is the keep-alive, every keepAlive on a timer (no goroutine
// between checks): the hold is lost when its session no longer holds its
// keys, or the check gets no answer within the release timeout.
func (s *sessionHold) check() {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.stopped {
		return
	}
	if s.lent != nil { // the connection is lent (WithConn, Guard.Conn): step aside
		s.timer.Reset(s.l.cfg.keepAlive)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.relTO)
	held, err := heldOn(ctx, s.locker, &s.p, s.keys)
	timedOut := ctx.Err() != nil
	cancel()
	if err == nil && held {
		s.timer.Reset(s.l.cfg.keepAlive)
		return
	}
	cause := CauseSessionEnded
	switch {
	case err == nil:
		cause, err = CauseNotHeld, errors.New("session no longer holds it")
	case timedOut:
		cause = CauseNoAnswer
	}
	s.warn("advisorylock: lock lost", "lock", s.name, "key", s.key, "err", err)
	s.lose(cause, fmt.Errorf("%w: %w", ErrLockLost, err))
}

// onPinned runs stmt through ask on the pinned connection of g, a held
// session lock, never beside a keep-alive check or WithConn's fn (it
// waits for fn until ctx ends). A released guard, one of another kind,
// or one lent until the release (Guard.Conn) is ErrLockLost.
func onPinned[T any](ctx context.Context, g *Guard, stmt func(ctx context.Context, conn *sql.Conn) (T, error)) (T, error) {
	var zero T
	s, ok := g.h.end.(*sessionHold)
	if !ok {
		return zero, fmt.Errorf("%w: not a session lock", ErrLockLost)
	}
	if err := s.lockIdle(ctx); err != nil {
		return zero, err
	}
	defer s.watchMu.Unlock()
	switch {
	case s.stopped:
		return zero, fmt.Errorf("%w: released", ErrLockLost)
	case s.lent != nil:
		return zero, fmt.Errorf("%w: its connection is lent to Guard.Conn until the release", ErrLockLost)
	}
	return ask(ctx, &s.p, stmt)
}

// stopWatch ends the keep-alive, after a check in flight: the
// connection is never left mid-statement.
func (s *sessionHold) stopWatch() {
	s.watchMu.Lock() // waits for a check in flight, which may re-arm the timer
	defer s.watchMu.Unlock()
	s.stopped = true
	if s.timer != nil {
		s.timer.Stop()
	}
}

// pinned is the connection of a held Guard; its statements go through
// ask. Once ask has abandoned one (abandoned), it discards the
// connection itself, and nothing else may (that could wait for the driver).
type pinned struct {
	conn      *sql.Conn
	bounded   bool      // statements are bounded by ask (no backend.Traits.CancelsPromptly; lib/pq#620)
	sever     func()    // closes the driver connection under a statement (see interruptible); nil: ask uses within
	obs       *observed // told of discards; nil without an Observer
	abandoned atomic.Bool
}

// discard discards the connection, for cause, unless ask already does.
func (p *pinned) discard(cause Cause, err error) {
	if !p.abandoned.Load() {
		dbutil.Discard(p.conn)
		p.obs.discarded(cause, err)
	}
}

// ask runs stmt, a statement on p's connection that never waits in the
// server (a try, an unlock, a keep-alive check), under ctx; stmt gets
// p.quiet(ctx) for the driver. Where the driver may not end it with ctx
// (p.bounded), the answer is awaited until ctx ends and
// dbutil.AnswerGrace more; then the driver connection is cut (watched),
// or the statement left to finish on its own (dbutil.Within), and the
// connection discarded.
func ask[T any](ctx context.Context, p *pinned, stmt func(ctx context.Context, conn *sql.Conn) (T, error)) (T, error) {
	driverCtx := p.quiet(ctx)
	switch {
	case !p.bounded:
		return stmt(driverCtx, p.conn)
	case p.sever != nil:
		return watched(ctx, p, func() (T, error) { return stmt(driverCtx, p.conn) })
	}
	return dbutil.Within(ctx, func() (T, error) { return stmt(driverCtx, p.conn) }, func() {
		p.abandoned.Store(true)
		p.obs.discarded(CauseNoAnswer, context.Cause(ctx))
	}, func(T) { dbutil.Discard(p.conn) })
}

// askWaiting runs stmt, a statement that waits in the server's lock
// queue, as ask does, but hands the driver ctx itself, end included: a
// cancelled wait must leave the queue at once, which takes the driver
// seeing ctx end (see quiet), not ask abandoning the statement later.
func askWaiting[T any](ctx context.Context, p *pinned, stmt func(ctx context.Context, conn *sql.Conn) (T, error)) (T, error) {
	return ask(ctx, p, func(_ context.Context, conn *sql.Conn) (T, error) { return stmt(ctx, conn) })
}

// askUntil runs stmt as ask does, bounded by deadline as well as ctx:
// statements that no caller's context ends (a release's) and those
// between a wait's slices (see waitBound). Where ctx never ends and the
// connection can be cut (lib/pq), a timer makes the bound (watchedUntil).
func askUntil[T any](ctx context.Context, deadline time.Time, p *pinned, stmt func(ctx context.Context, conn *sql.Conn) (T, error)) (T, error) {
	if p.sever != nil && ctx.Done() == nil {
		return watchedUntil(deadline, p, func() (T, error) { return stmt(ctx, p.conn) })
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return ask(ctx, p, stmt)
}

// watched runs stmt on the caller's goroutine; should ctx end, and
// dbutil.AnswerGrace pass, first, it cuts the driver connection under
// the statement, whose read then fails at once, also on a dead network.
// No goroutine while ctx lasts (dbutil.Within costs one per statement).
// What stmt returns after a cut is no answer: the connection is discarded.
func watched[T any](ctx context.Context, p *pinned, stmt func() (T, error)) (T, error) {
	if ctx.Done() == nil { // ctx never ends: nothing to bound
		return stmt()
	}
	c := newCut(p)
	stop := context.AfterFunc(ctx, func() {
		grace := time.NewTimer(dbutil.AnswerGrace)
		defer grace.Stop()
		select {
		case <-c.signal:
		case <-grace.C:
			c.now()
		}
	})
	v, err := stmt()
	wasCut := c.answer()
	stop()
	return cutShort(p, wasCut, context.Cause(ctx), v, err)
}

// watchedUntil is watched bounded by a deadline, not a context: a timer
// (cheaper than a context with the deadline) cuts once deadline and
// dbutil.AnswerGrace have passed.
func watchedUntil[T any](deadline time.Time, p *pinned, stmt func() (T, error)) (T, error) {
	c := newCut(p)
	t := time.AfterFunc(time.Until(deadline)+dbutil.AnswerGrace, c.now)
	v, err := stmt()
	wasCut := c.answer()
	t.Stop()
	return cutShort(p, wasCut, context.DeadlineExceeded, v, err)
}

// cut closes a pinned connection's driver connection under a statement
// (see watched), unless the statement was answered first.
type cut struct {
	p        *pinned
	mu       sync.Mutex // orders the cut and the answer
	answered bool
	made     bool          // the cut
	signal   chan struct{} // closed by answer
}

func newCut(p *pinned) *cut { return &cut{p: p, signal: make(chan struct{})} }

// now makes the cut, unless the statement has been answered.
func (c *cut) now() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.answered {
		c.made = true
		c.p.sever()
	}
}

// answer records the statement's return, and whether it was cut first.
func (c *cut) answer() (wasCut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answered = true
	close(c.signal)
	return c.made
}

// cutShort returns what a watched statement returned, or, where it was
// cut, discards its connection and returns why: the bound's cause.
func cutShort[T any](p *pinned, wasCut bool, cause error, v T, err error) (T, error) {
	if !wasCut {
		return v, err
	}
	p.abandoned.Store(true)
	dbutil.Discard(p.conn)
	p.obs.discarded(CauseNoAnswer, cause)
	var zero T
	return zero, fmt.Errorf("no answer from the database: %w", cause)
}

// interruptible returns, for lib/pq's connections, a function that
// closes conn's driver connection from outside the statement running on
// it; nil for any other driver, wrapped ones included (their statements
// go through within). It is the one place where the library uses a driver
// connection outside Conn.Raw (SPEC 11.1): taken inside Raw while no
// statement runs, closed later by watched's timer while ask's statement
// holds it; lib/pq's Close is safe from another goroutine (it writes one
// message and closes the socket), and the read then fails at once.
//
// Nothing database/sql sanctions ends lib/pq's read on a dead network: a
// cancelled context sends a cancel request over a new connection and
// keeps reading, with no read deadline and only Go's TCP keepalives.
// Measured on a blackholed loopback connection (iptables, lib/pq v1.12.3,
// a 1s context): a lost answer returned after 2m31s, an unacknowledged
// query was still blocked after 3m20s (about 15 minutes at tcp_retries2 =
// 15), holding its pool slot (TestReleaseDuringACutGivesBackItsPoolSlot)
// and a goroutine per statement under within. A dialer that sets
// TCP_USER_TIMEOUT would bound it too, but only on handles opened so.
func interruptible(conn *sql.Conn) (sever func()) {
	var c io.Closer
	_ = conn.Raw(func(dc any) error {
		if dbutil.IsLibPQConn(dc) {
			c, _ = dc.(io.Closer)
		}
		return nil
	})
	if c == nil {
		return nil
	}
	return func() { _ = c.Close() }
}

// quiet returns the context to give the driver for a statement that ask
// runs under ctx: where ask bounds it itself (p.bounded), ctx without its
// end, since lib/pq would start a goroutine for every statement whose
// context can end (up to a quarter of a round trip on a loaded machine).
// Waits keep ctx (askWaiting): a cancelled wait must leave the queue.
func (p *pinned) quiet(ctx context.Context) context.Context {
	if p.bounded {
		return context.WithoutCancel(ctx)
	}
	return ctx
}
