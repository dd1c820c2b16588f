package advisorylock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// This file lends a held lock's connection to the caller for the length
// of a callback (Guard.WithConn), as (*sql.Conn).Raw lends its driver
// connection; conn_guard.go owns the connection itself.

// Conn runs statements on the connection whose session holds a lock, for
// the length of a Guard.WithConn callback (or, deprecated, until the
// release: Guard.Conn). Its methods are those of *sql.Conn; there is no
// Close and no Raw, so the Guard keeps sole ownership of the connection,
// and no PrepareContext: prepare on a transaction (BeginTx), whose
// statements end with it.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// WithConn runs fn with the connection whose session holds the lock, to
// run the section's own statements on it: with SetMaxOpenConns(1) a
// statement on the pool inside Do waits forever for the one connection,
// which the lock pins, while on conn it runs. conn behaves as a *sql.Conn
// does, one statement at a time, until fn returns; WithConn returns fn's
// error.
//
// The lock's keep-alive steps aside while fn runs (it cannot tell a loss
// then: keep fn to the few statements that need the lock's session), and
// WithConn waits for a keep-alive check in flight before it calls fn.
// Calls of WithConn on one Guard run one at a time (once the deprecated
// Guard.Conn was called they share its lending, and what fn leaves open
// stays open until Release: see there); fn must not call
// WithConn on the same Guard (it would wait for itself until ctx ends),
// nor its Release (which would wait for fn, see below). A statement
// whose own context ends while it runs may cost the connection (pgx
// closes it), and with it the lock: Lost closes once fn has returned.
//
// When fn returns, WithConn closes the rows it opened on conn and left
// open and rolls back its transactions left open (their writes are not
// kept, their statements are closed); a *sql.Row must be scanned within fn. If that
// fails, the session's state is unknown: the connection is discarded,
// which frees the lock, the lock is lost, and WithConn returns the error
// (unless fn returned one). From then on every statement on conn fails
// with sql.ErrConnDone, also one fn left running in a goroutine.
//
// Release while fn runs waits for fn to return, up to the release
// timeout (WithReleaseTimeout); then the contexts of the statements fn
// runs on conn are cancelled and the connection is discarded, which frees
// the lock. A statement that does not end when cancelled (statements on a
// Stmt or a Tx keep the context they were given; a dead network) cannot
// be cut short: Release then returns an error, and the connection is
// discarded, freeing the lock, when fn returns.
//
// A lock held on a session shared by several locks (see
// WithMultiplexing, the default of New and NewSet) lends that session:
// while fn runs, the statements of the session's other locks (their
// tries and releases, a Release of this Guard too) and its keep-alive
// wait for fn to return, so keep fn short. A try that fn makes on the
// same handle goes to another shared session while the pool has room
// for one, else it waits for fn, as does a Release in fn of another lock
// held on the lent session: fn must not wait for either. When fn
// returns, what it left open is ended as above, and then, before any
// other statement runs on the session, its keep-alive checks every lock
// it holds: a lock that fn
// freed (pg_advisory_unlock, RELEASE_LOCK) has its Lost closed before
// WithConn returns, and a session that fn left in a state that cannot be
// known (ending what it left open failed, or the check fails) is ended,
// and each of its locks is told it is lost.
//
// WithConn returns an error without calling fn where the lock pins no
// connection (a Lock on SQLite, a lease row), once the Guard was
// released or lost, and when ctx ends before fn's turn.
func (g *Guard) WithConn(ctx context.Context, fn func(conn Conn) error) (err error) {
	name := g.h.name // the deferred func below must not keep g reachable
	s, ok := g.h.end.(lender)
	if !ok {
		return fmt.Errorf("advisorylock: lock %s: %w", quoteName(name), errNoConn)
	}
	c, lendErr := s.lend(ctx)
	if lendErr != nil {
		return fmt.Errorf("advisorylock: lock %s: %w", quoteName(name), lendErr)
	}
	// The Guard stays reachable until fn has returned: a forgotten
	// Guard's cleanup must not discard a connection in use.
	defer runtime.KeepAlive(g)
	defer func() {
		if endErr := s.takeBack(c); endErr != nil && err == nil {
			err = fmt.Errorf("advisorylock: lock %s: ending what fn left open on its connection: %w", quoteName(name), endErr)
		}
	}()
	return fn(c)
}

// lender is a hold that lends its session to WithConn's fn: a pinned
// one (sessionHold) or a shared one (muxHold).
type lender interface {
	lend(ctx context.Context) (*lentConn, error)
	takeBack(c *lentConn) error
}

// Conn returns the connection whose session holds the lock, lent until
// the Guard's release, to run the section's own statements on it; nil
// where the lock pins no connection (a Lock on SQLite, a lease row, a
// session shared by several locks, which New and NewSet use by default:
// see WithMultiplexing; WithConn lends a shared session). It behaves as a
// *sql.Conn does, one statement at a time (close rows before the next
// statement), and every call returns a Conn on the same lending. Conn
// waits for a keep-alive check in flight.
//
// Deprecated: use WithConn, which lends the connection for the length of
// a callback. Conn cannot know when you are done with the rows and
// transactions it hands out, so once it was called the
// lock's keep-alive steps aside for the rest of the hold: a lost lock
// (its session ended, its lock freed) is told neither by Lost nor by
// Do's context until Release. Conn will be removed in a later minor
// release.
//
// Release (and Do's end) closes the rows left open on the Conn and rolls
// back its transactions left open (their writes are not kept, their
// statements are closed), then unlocks. A statement on the Conn still running when
// Release starts gets the release timeout (WithReleaseTimeout) to end;
// then its context is cancelled and the connection discarded, which frees
// the lock; a statement that does not end when cancelled (statements on a
// Stmt or a Tx keep the context they were given) makes Release return an
// error, and the connection is discarded when it returns. From the start
// of Release every statement on the Conn fails with sql.ErrConnDone, and
// what it returned is ended (Commit fails); so does every statement on a
// Conn asked for once the Guard was released or lost.
//
// WithConn on a Guard whose Conn was called runs fn on Conn's lending:
// what fn leaves open stays open until Release, and its calls do not wait
// for each other. Conn called while WithConn's fn runs makes that
// lending Conn's: it lasts until Release.
//
// The Conn keeps the Guard reachable; the rows and transactions it
// returned do not: a Guard dropped without Release is
// cleaned up under them (its connection closed, which frees the lock).
func (g *Guard) Conn() Conn {
	s, ok := g.h.end.(*sessionHold)
	if !ok {
		return nil
	}
	return guardConn{lentConn: s.lendUntilRelease(), g: g}
}

// guardConn is what the deprecated Guard.Conn returns: a lending until
// the release, and the Guard, kept reachable while the caller keeps the
// Conn (a forgotten Guard's cleanup must not discard a connection in use).
type guardConn struct {
	*lentConn
	g *Guard
}

// errNoConn is WithConn's error where the lock pins no connection.
var errNoConn = errors.New("the lock pins no connection of its own (WithConn needs a session lock on a connection of its own)")

// errConnReleased is the cause given to the statements on a lent
// connection that Release cuts short.
var errConnReleased = errors.New("advisorylock: the lock was released: its connection is no longer lent")

// guardKey is the context key of the Guard that Do's fn runs under.
type guardKey struct{}

// GuardFromContext returns the Guard that Do, DoTimeout or TryDo (of a
// Lock or a Semaphore) holds while it runs fn with ctx (or a context
// derived from it), or nil. Its WithConn runs the section's statements on
// the lock's own connection; a Semaphore's guard's Slot says which slot fn
// holds.
func GuardFromContext(ctx context.Context) *Guard {
	g, _ := ctx.Value(guardKey{}).(*Guard)
	return g
}

// lentConn is the Conn that WithConn gives fn: the hold's *sql.Conn, and
// the rows and transactions fn opened on it, which end when fn returns. A lending until release (Guard.Conn's, deprecated) ends
// instead when Release has started and its users (fns that joined it,
// statements in flight) are gone. Every statement's context is the
// caller's, also ended when the lending is cut short (cancel): that is
// how Release ends statements still running after its timeout. (The join
// of a statement that returns rows or a transaction lasts until the
// lending ends: database/sql ends rows and transactions whose context
// ends.)
type lentConn struct {
	ctx      context.Context // ends when the lending has ended, or when Release cuts it short
	cancel   context.CancelCauseFunc
	returned chan struct{} // closed once the lending has ended, leftovers included

	conn *sql.Conn // the hold's

	mu      sync.Mutex
	ended   bool          // fn has returned (or the lending until release has drained)
	users   int           // fns and statements in flight on the lending
	drained chan struct{} // made by Release for a lending until release; closed once users is 0
	rows    []*sql.Rows
	txs     []*sql.Tx

	err          error // from ending the leftovers; set before returned closes
	abandoned    bool  // Release gave up waiting for the lending (under the hold's watchMu)
	untilRelease bool  // Guard.Conn's: it lasts until Release (under the hold's watchMu)
}

func newLentConn(conn *sql.Conn) *lentConn {
	c := &lentConn{conn: conn, returned: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancelCause(context.Background())
	return c
}

// on returns the connection to run a statement on (closedConn, and ctx
// as it is, once the lending is over), and ctx joined with the lending's
// end; done ends the statement's turn as a user of the lending and,
// unless keepJoined, the join.
func (c *lentConn) on(ctx context.Context, keepJoined bool) (conn *sql.Conn, joined context.Context, done func()) {
	if !c.enter() {
		return closedConn(), ctx, func() {}
	}
	joined, cancel := context.WithCancelCause(ctx)
	unwatch := context.AfterFunc(c.ctx, func() { cancel(context.Cause(c.ctx)) })
	context.AfterFunc(joined, func() { unwatch() }) // a join kept past the call ends with ctx too
	return c.conn, joined, func() {
		if !keepJoined {
			unwatch()
			cancel(nil)
		}
		c.leave()
	}
}

func (c *lentConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	conn, ctx, done := c.on(ctx, false)
	defer done()
	return conn.ExecContext(ctx, query, args...)
}

// QueryContext keeps the joined context until the lending ends:
// database/sql closes rows whose context ends.
func (c *lentConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	conn, ctx, done := c.on(ctx, true)
	defer done()
	rows, err := conn.QueryContext(ctx, query, args...)
	if err == nil {
		c.track(func() { c.rows = append(c.rows, rows) }, rows.Close)
	}
	return rows, err
}

// QueryRowContext's rows end when the Row is scanned, or with the
// lending (its joined context then ends).
func (c *lentConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	conn, ctx, done := c.on(ctx, true)
	defer done()
	return conn.QueryRowContext(ctx, query, args...)
}

// BeginTx keeps the joined context until the lending ends: database/sql
// rolls back a transaction whose context ends.
func (c *lentConn) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error) {
	conn, ctx, done := c.on(ctx, true)
	defer done()
	tx, err := conn.BeginTx(ctx, opts)
	if err == nil {
		c.track(func() { c.txs = append(c.txs, tx) }, tx.Rollback)
	}
	return tx, err
}

// enter makes the caller a user of the lending (a statement in flight, a
// fn joining it), unless it is over.
func (c *lentConn) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isOver() {
		return false
	}
	c.users++
	return true
}

// leave ends a user's turn; the last one out of a lending that Release
// drains closes drained.
func (c *lentConn) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.users--
	if c.users == 0 && c.drained != nil {
		close(c.drained)
	}
}

// drain refuses new users from now on, and returns a channel that is
// closed once the users in flight are gone.
func (c *lentConn) drain() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drained = make(chan struct{})
	if c.users == 0 {
		close(c.drained)
	}
	return c.drained
}

// track records (add) what fn opened, to end when fn returns; it is
// ended at once if fn has returned already (a goroutine of fn's still
// running).
func (c *lentConn) track(add func(), end func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isOver() {
		_ = end()
		return
	}
	add()
}

// isOver reports, with c.mu held, whether the lending is over: fn has
// returned, Release is draining it, or Release cut it short.
func (c *lentConn) isOver() bool { return c.ended || c.drained != nil || c.ctx.Err() != nil }

// end ends what was left open, once the lending is over: its rows, then its
// transactions (rolled back, with their rows and statements). Later
// statements run on closedConn and fail; then the lending's context ends,
// which ends anything database/sql still watches (a Row never scanned,
// rows of a Tx or of its statements), and which on some drivers
// (lib/pq, pgx) costs the connection: the keep-alive then finds it gone.
// It returns the first error.
func (c *lentConn) end() error {
	c.mu.Lock()
	c.ended = true
	rows, txs := c.rows, c.txs
	c.rows, c.txs = nil, nil
	c.mu.Unlock()
	var errs []error
	for _, r := range rows {
		errs = append(errs, r.Close())
	}
	for _, tx := range txs {
		if err := tx.Rollback(); !errors.Is(err, sql.ErrTxDone) {
			errs = append(errs, err)
		}
	}
	c.cancel(errConnReleased)
	return errors.Join(errs...)
}

// closedConn returns a *sql.Conn that is closed: a statement on it fails
// with sql.ErrConnDone without reaching any server. A lent Conn runs its
// statements on it once the lending is over (a *sql.Row that carries an
// error can be made no other way). Its connector never dials.
var closedConn = sync.OnceValue(func() *sql.Conn {
	db := sql.OpenDB(noConnector{})
	conn, _ := db.Conn(context.Background()) // noConnector cannot fail
	_ = conn.Close()
	_ = db.Close()
	return conn
})

// noConnector makes closedConn's connection, which serves no statement.
type noConnector struct{}

func (noConnector) Connect(context.Context) (driver.Conn, error) { return noConn{}, nil }
func (noConnector) Driver() driver.Driver                        { return nil }

type noConn struct{}

func (noConn) Prepare(string) (driver.Stmt, error) { return nil, sql.ErrConnDone }
func (noConn) Close() error                        { return nil }
func (noConn) Begin() (driver.Tx, error)           { return nil, sql.ErrConnDone }

// lend makes the hold's connection fn's, once no keep-alive check and no
// other WithConn is on it (fn joins a lending until release, Guard.Conn's);
// it fails once the hold was released or lost, and when ctx ends first.
func (s *sessionHold) lend(ctx context.Context) (*lentConn, error) {
	if err := s.lockIdle(ctx); err != nil {
		return nil, err
	}
	defer s.watchMu.Unlock()
	if gone, why := s.isLost(); gone && why != nil {
		return nil, why
	}
	if gone, _ := s.isLost(); gone || s.stopped {
		return nil, fmt.Errorf("%w: released", ErrLockLost)
	}
	if s.lent == nil {
		s.lent = newLentConn(s.p.conn)
	}
	s.lent.enter() // cannot be over: Release has not started
	return s.lent, nil
}

// lendUntilRelease lends the hold's connection to Guard.Conn until the
// release: it starts that lending, or makes the lending of a WithConn
// whose fn runs last until then, and returns it; once the hold was
// released or lost, a lending that is over.
func (s *sessionHold) lendUntilRelease() *lentConn {
	s.watchMu.Lock()                        // after a keep-alive check in flight
	for s.lent != nil && s.lent.isEnded() { // a WithConn's, being taken back
		returned := s.lent.returned
		s.watchMu.Unlock()
		<-returned
		s.watchMu.Lock()
	}
	defer s.watchMu.Unlock()
	if gone, _ := s.isLost(); gone || s.stopped {
		c := newLentConn(nil)
		c.ended = true
		return c
	}
	if s.lent == nil {
		s.lent = newLentConn(s.p.conn)
	}
	s.lent.untilRelease = true
	return s.lent
}

// isEnded reports whether fn has returned (see takeBack).
func (c *lentConn) isEnded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended
}

// lockIdle locks watchMu (after a keep-alive check in flight) once no
// WithConn's fn has a lending of its own (there may be Guard.Conn's
// lending, which lasts until the release); it fails, unlocked, when ctx
// ends first.
func (s *sessionHold) lockIdle(ctx context.Context) error {
	s.watchMu.Lock()
	for s.lent != nil && !s.lent.untilRelease {
		returned := s.lent.returned
		s.watchMu.Unlock()
		select {
		case <-returned:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		s.watchMu.Lock()
	}
	return nil
}

// takeBack ends fn's turn on c, and then c's lending (see endLending),
// unless it lasts until the release (Guard.Conn's); it returns the error
// of ending what fn left open. c is first marked ended, so that no
// statement starts on it and Guard.Conn waits for it to end.
func (s *sessionHold) takeBack(c *lentConn) error {
	s.watchMu.Lock()
	c.leave()
	if c.untilRelease {
		s.watchMu.Unlock()
		return nil
	}
	c.mu.Lock()
	c.ended = true
	c.mu.Unlock()
	s.watchMu.Unlock()
	return s.endLending(c)
}

// endLending ends c's lending (see lentConn.end), and returns the error
// of ending what was left open. The session's settings may have changed
// (a RESET ALL in fn), so the facts remembered for it are dropped. If
// ending failed, the session's state is unknown: the connection is
// discarded and the hold lost (by Release instead, when it is waiting).
// If Release gave up waiting for the lending, the connection is discarded
// now, which frees the lock.
func (s *sessionHold) endLending(c *lentConn) error {
	err := c.end()
	dbutil.ForgetSession(s.p.conn)
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	c.err = err
	s.lent = nil
	close(c.returned)
	switch {
	case c.abandoned:
		s.p.discard(CauseNoAnswer, errStatementRunning)
	case err != nil && !s.stopped:
		s.stopped = true
		if s.timer != nil {
			s.timer.Stop()
		}
		s.p.discard(CauseError, err)
		s.p.abandoned.Store(true) // discarded: the release must not again
		s.lose(CauseSessionEnded, fmt.Errorf("%w: ending what WithConn's fn left open: %w", ErrLockLost, err))
	}
	return err
}

// errStatementRunning is the release's error when WithConn's fn (or a
// statement on Guard.Conn) did not return even when its statements were
// cancelled (a dead network, or a statement whose context the release
// cannot end).
var errStatementRunning = errors.New("the lock's connection was still in use at release (WithConn's fn, or a statement on Guard.Conn) and was not given back when its statements were cancelled; it is discarded once given back, which frees the lock")

// waitLent takes the lent connection back before the unlock: it waits for
// WithConn's fn to return (for a lending until release: for its users to
// be gone, and then ends it) until deadline, then cancels its statements
// and waits dbutil.AnswerGrace more. ok false means the connection was discarded
// instead (a statement was cut short, which a driver may answer by giving
// up on the connection, or ending what was left open failed), or is
// discarded once given back; the discard frees the lock.
func (s *sessionHold) waitLent(deadline time.Time) (ok bool, err error) {
	s.watchMu.Lock()
	c := s.lent
	untilRelease := c != nil && c.untilRelease
	s.watchMu.Unlock()
	if c == nil {
		return true, nil
	}
	if untilRelease {
		drained := c.drain()
		go func() { // ends once the users in flight are gone
			<-drained
			_ = s.endLending(c)
		}()
	}
	if !returnsBy(c, time.Until(deadline)) {
		c.cancel(errConnReleased)
		if !returnsBy(c, dbutil.AnswerGrace) {
			s.watchMu.Lock()
			if s.lent == c {
				c.abandoned = true
				s.watchMu.Unlock()
				return false, errStatementRunning
			}
			s.watchMu.Unlock()
		}
		s.p.discard(CauseCanceled, errConnReleased)
		return false, nil
	}
	if c.err != nil {
		s.p.discard(CauseError, c.err)
		return false, fmt.Errorf("ending what was left open on the lent connection: %w", c.err)
	}
	return true, nil
}

// returnsBy reports whether c's lending ends (its leftovers included)
// within d.
func returnsBy(c *lentConn, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-c.returned:
		return true
	case <-t.C:
		return false
	}
}
