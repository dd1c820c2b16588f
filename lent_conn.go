package advisorylock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"reflect"
	"slices"
	"sync"
)

// This file lends the held connection to the caller (Guard.Conn) through a
// driver wrapper that steps the keep-alive aside; conn_guard.go owns the
// connections themselves.

// Conn runs statements on the connection whose session holds a lock (see
// Guard.Conn). Its methods are those of *sql.Conn, which satisfies it;
// there is no Close and no Raw, so the Guard keeps sole ownership of the
// connection.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// Conn returns the connection whose session holds the lock, to run the
// section's own statements on it: with SetMaxOpenConns(1) a statement on
// the pool inside Do waits forever for the one connection, which the lock
// pins, while on Conn it runs. It returns nil where the lock pins no
// connection (a Lock on SQLite, a lease row). Every call returns the same
// connection; it behaves as a *sql.Conn does, and one statement at a time
// runs on it (open rows must be closed before the next statement).
//
// The lock's keep-alive shares the connection: it steps aside while a
// statement of yours runs or your rows or transaction are open on it (so
// it cannot tell a loss then: a long transaction on Conn defers loss
// detection until it ends), and your statements wait while a check runs.
//
// Release (and Do's end) closes rows left open and rolls back a
// transaction left open, before the unlock: its writes are not kept. A
// statement still running when Release starts gets the release timeout
// (WithReleaseTimeout) to end; then its context is cancelled and the
// connection discarded, which frees the lock. A statement whose context
// cannot end (context.Background()) cannot be cut short: Release then
// returns an error, and the connection is discarded (the lock freed) when
// the statement returns. After Release every statement on Conn, its
// rows, statements and transactions fails.
//
// A statement whose own context ends while it runs may cost the
// connection (pgx closes it), and with it the lock: Lost closes.
func (g *Guard) Conn() Conn {
	s, ok := g.h.end.(*sessionHold)
	if !ok {
		return nil
	}
	return lockConn{Conn: s.userConn(), g: g}
}

// lockConn is what Guard.Conn returns: the connection as database/sql
// gives it, and the Guard, kept reachable while the caller keeps the
// Conn (a forgotten Guard's cleanup must not take a connection in use).
type lockConn struct {
	*sql.Conn
	g *Guard
}

// Close is not offered (see Conn); a type assertion reaching for the
// embedded *sql.Conn's gets this no-op instead.
func (lockConn) Close() error { return nil }

// Raw is not offered (see Conn): it returns an error.
func (lockConn) Raw(func(any) error) error {
	return errors.New("advisorylock: the lock's connection has no Raw access")
}

// guardKey is the context key of the Guard that Do's fn runs under.
type guardKey struct{}

// GuardFromContext returns the Guard that Do, DoTimeout or TryDo (of a
// Lock or a Semaphore) holds while it runs fn with ctx (or a context
// derived from it), or nil. Its Conn runs the section's statements on the
// lock's own connection; a Semaphore's guard's Slot says which slot fn
// holds.
func GuardFromContext(ctx context.Context) *Guard {
	g, _ := ctx.Value(guardKey{}).(*Guard)
	return g
}

// errConnReleased is what a statement on Guard.Conn gets after the lock
// was released or lost its connection.
var errConnReleased = errors.New("advisorylock: the lock was released: its connection is no longer available to Guard.Conn")

// sharedConn is a held lock's connection as Guard.Conn's statements reach
// it: the physical driver connection, wrapped so that the gate sees every
// statement, rows and transaction of the user's (the hold's own
// statements keep going through the hold's *sql.Conn). database/sql gives
// it to the user through a pool of its own, of one connection, which
// never closes the physical one: the hold owns it, and conn_guard.go
// decides its fate.
//
// The physical connection is taken out of the hold's *sql.Conn with Raw
// and used after Raw returns, which database/sql does not expect; it is
// safe here because the hold's *sql.Conn is used by the hold alone, and
// the gate keeps the hold's statements and the user's apart.
type sharedConn struct {
	ci   driver.Conn
	gate *connGate
	pool *sql.DB
	conn *sql.Conn
}

// newSharedConn wraps ci, the physical connection of a hold.
func newSharedConn(ci driver.Conn) *sharedConn {
	s := &sharedConn{ci: ci, gate: newConnGate()}
	s.pool = sql.OpenDB(sharedConnector{s})
	s.pool.SetMaxOpenConns(1)
	s.pool.SetMaxIdleConns(1)
	// The pool's first checkout dials nothing (Connect returns s) and
	// cannot wait: nobody else uses the pool yet.
	s.conn, _ = s.pool.Conn(context.Background())
	return s
}

// sharedConnector hands the one connection to the pool.
type sharedConnector struct{ s *sharedConn }

func (c sharedConnector) Connect(context.Context) (driver.Conn, error) {
	if c.s.gate.isClosed() {
		return nil, errConnReleased
	}
	return c.s, nil
}

func (c sharedConnector) Driver() driver.Driver { return sharedDriver{} }

// sharedDriver is the connector's driver, for database/sql's sake: it
// opens nothing.
type sharedDriver struct{}

func (sharedDriver) Open(string) (driver.Conn, error) { return nil, errConnReleased }

// Close does not close the physical connection: the hold owns it.
func (s *sharedConn) Close() error { return nil }

func (s *sharedConn) Prepare(query string) (driver.Stmt, error) {
	return s.PrepareContext(context.Background(), query)
}

func (s *sharedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	si, err := through(s.gate, ctx, func(ctx context.Context) (driver.Stmt, error) {
		if p, ok := s.ci.(driver.ConnPrepareContext); ok {
			return p.PrepareContext(ctx, query)
		}
		return s.ci.Prepare(query)
	})
	if err != nil {
		return nil, err
	}
	return &sharedStmt{si: si, gate: s.gate}, nil
}

func (s *sharedConn) Begin() (driver.Tx, error) {
	return s.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx begins the transaction; the context stays with it until it
// ends (lib/pq watches it until then).
func (s *sharedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c, err := s.gate.enter(ctx, true)
	if err != nil {
		return nil, err
	}
	var ti driver.Tx
	if b, ok := s.ci.(driver.ConnBeginTx); ok {
		ti, err = b.BeginTx(c.ctx, opts)
	} else if opts == (driver.TxOptions{}) {
		//lint:ignore SA1019 the driver has no BeginTx
		ti, err = s.ci.Begin()
	} else {
		err = errors.New("advisorylock: the driver cannot begin a transaction with options")
	}
	if err != nil {
		s.gate.leave(c, true)
		return nil, s.gate.failed(err)
	}
	t := &sharedTx{ti: ti, gate: s.gate, call: c}
	s.gate.opened(c, t)
	return t, nil
}

func (s *sharedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := s.ci.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	return through(s.gate, ctx, func(ctx context.Context) (driver.Result, error) {
		return e.ExecContext(ctx, query, args)
	})
}

func (s *sharedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	q, ok := s.ci.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c, err := s.gate.enter(ctx, true)
	if err != nil {
		return nil, err
	}
	ri, err := q.QueryContext(c.ctx, query, args)
	return s.gate.openRows(c, ri, err)
}

func (s *sharedConn) Ping(ctx context.Context) error {
	p, ok := s.ci.(driver.Pinger)
	if !ok {
		return nil
	}
	_, err := through(s.gate, ctx, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, p.Ping(ctx)
	})
	return err
}

func (s *sharedConn) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := s.ci.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// ResetSession keeps the session as it is: it is the lock's, and resets
// nothing between the user's statements.
func (s *sharedConn) ResetSession(context.Context) error {
	if s.gate.isBroken() {
		return driver.ErrBadConn
	}
	return nil
}

func (s *sharedConn) IsValid() bool { return !s.gate.isBroken() }

// sharedStmt is a statement prepared on the shared connection.
type sharedStmt struct {
	si   driver.Stmt
	gate *connGate
}

// Close closes the statement; once the lock is released there is nothing
// to close (the connection is no longer the user's).
func (s *sharedStmt) Close() error {
	c, err := s.gate.step()
	if err != nil {
		return nil
	}
	defer s.gate.leave(c, true)
	return s.gate.failed(s.si.Close())
}

func (s *sharedStmt) NumInput() int { return s.si.NumInput() }

func (s *sharedStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *sharedStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

func (s *sharedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return through(s.gate, ctx, func(ctx context.Context) (driver.Result, error) {
		if e, ok := s.si.(driver.StmtExecContext); ok {
			return e.ExecContext(ctx, args)
		}
		//lint:ignore SA1019 the driver has no ExecContext
		return s.si.Exec(values(args))
	})
}

func (s *sharedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	c, err := s.gate.enter(ctx, true)
	if err != nil {
		return nil, err
	}
	var ri driver.Rows
	if q, ok := s.si.(driver.StmtQueryContext); ok {
		ri, err = q.QueryContext(c.ctx, args)
	} else {
		//lint:ignore SA1019 the driver has no QueryContext
		ri, err = s.si.Query(values(args))
	}
	return s.gate.openRows(c, ri, err)
}

func (s *sharedStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := s.si.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

func named(args []driver.Value) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}

func values(args []driver.NamedValue) []driver.Value {
	v := make([]driver.Value, len(args))
	for i, a := range args {
		v[i] = a.Value
	}
	return v
}

// handle is a result set or a transaction open on the shared connection:
// release ends it (closes, rolls back) before the unlock.
type handle interface {
	// end ends it on the driver; the gate holds the connection.
	end() error
}

// sharedRows is a result set open on the shared connection.
type sharedRows struct {
	ri   driver.Rows
	gate *connGate
	call gateCall // the query's, ended with the rows
}

func (r *sharedRows) Columns() []string { return r.ri.Columns() }

func (r *sharedRows) Next(dest []driver.Value) error {
	return r.gate.stepThrough(func() error {
		if !r.gate.isOpen(r) {
			return errConnReleased
		}
		return r.ri.Next(dest)
	})
}

func (r *sharedRows) Close() error {
	_, err := r.gate.endOwn(r, r.call, r.ri.Close) // not open: ended already, by release
	return err
}

func (r *sharedRows) end() error {
	err := r.ri.Close()
	r.call.done()
	return err
}

func (r *sharedRows) HasNextResultSet() bool {
	n, ok := r.ri.(driver.RowsNextResultSet)
	return ok && n.HasNextResultSet()
}

func (r *sharedRows) NextResultSet() error {
	n, ok := r.ri.(driver.RowsNextResultSet)
	if !ok {
		return io.EOF
	}
	return r.gate.stepThrough(n.NextResultSet)
}

func (r *sharedRows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.ri.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

func (r *sharedRows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.ri.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *sharedRows) ColumnTypeLength(i int) (int64, bool) {
	if t, ok := r.ri.(driver.RowsColumnTypeLength); ok {
		return t.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *sharedRows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if t, ok := r.ri.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *sharedRows) ColumnTypePrecisionScale(i int) (precision, scale int64, ok bool) {
	if t, ok := r.ri.(driver.RowsColumnTypePrecisionScale); ok {
		return t.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}

// sharedTx is a transaction open on the shared connection.
type sharedTx struct {
	ti   driver.Tx
	gate *connGate
	call gateCall // BeginTx's, ended with the transaction
}

// Commit commits; after the lock's release the transaction was rolled
// back, and Commit says so.
func (t *sharedTx) Commit() error {
	open, err := t.gate.endOwn(t, t.call, t.ti.Commit)
	if !open {
		return errConnReleased
	}
	return err
}

func (t *sharedTx) Rollback() error {
	_, err := t.gate.endOwn(t, t.call, t.ti.Rollback) // not open: rolled back by release
	return err
}

func (t *sharedTx) end() error {
	err := t.ti.Rollback()
	t.call.done()
	return err
}

// connGate keeps the user's statements on a shared connection and the
// hold's own (the keep-alive, the release) apart. The user's calls into
// the driver run one at a time (running), and while a result set or a
// transaction of theirs is open (handles) the hold does not use the
// connection: the keep-alive steps aside (tryOwn), and the release waits
// for the calls in flight, then ends the handles itself (shut).
type connGate struct {
	mu      sync.Mutex
	turn    *sync.Cond // signalled when ours or running drop
	running int        // the user's calls into the driver in flight
	handles []handle   // open rows and transactions, oldest first
	ours    bool       // the hold is using the connection
	shut    bool       // released (or lost): the user's calls fail
	broken  bool       // the driver said the connection is bad

	stop   context.Context // ends the user's calls in flight (release)
	cancel context.CancelCauseFunc
	last   func() // run by the last call to leave once shut (see abandon)
}

func newConnGate() *connGate {
	g := &connGate{}
	g.turn = sync.NewCond(&g.mu)
	g.stop, g.cancel = context.WithCancelCause(context.Background())
	return g
}

// gateCall is one user call in flight: its context ends when the call's
// own does, or when the release cancels the calls in flight.
type gateCall struct {
	ctx  context.Context
	done func()
}

// enter starts a user call, waiting while the hold uses the connection.
// A statement (stmt) is refused while a result set is open: the
// connection runs one at a time. The call's context is ctx, also ended by
// a release that gives up waiting for it; a ctx that never ends is given
// as it is, since lib/pq starts a goroutine of its own per statement
// whose context can end, which would slow every statement on the lent
// connection; a release then cannot cut such a statement short.
func (g *connGate) enter(ctx context.Context, stmt bool) (gateCall, error) {
	if err := g.admit(stmt); err != nil {
		return gateCall{}, err
	}
	if ctx.Done() == nil {
		return gateCall{ctx: ctx, done: nop}, nil
	}
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(g.stop, func() { cancel(context.Cause(g.stop)) })
	return gateCall{ctx: cctx, done: func() { stop(); cancel(nil) }}, nil
}

// step is enter for a call that gives the driver no context (Next, a
// statement's Close).
func (g *connGate) step() (gateCall, error) {
	return gateCall{done: nop}, g.admit(false)
}

func nop() {}

// through runs f, a user call into the driver, through the gate (see
// enter): f gets the call's context, and the call leaves when f returns.
// An error that says the connection is bad is noted (see failed).
func through[T any](g *connGate, ctx context.Context, f func(ctx context.Context) (T, error)) (T, error) {
	c, err := g.enter(ctx, true)
	if err != nil {
		var zero T
		return zero, err
	}
	defer g.leave(c, true)
	v, err := f(c.ctx)
	return v, g.failed(err)
}

// stepThrough is through for a call that gives the driver no context
// (see step).
func (g *connGate) stepThrough(f func() error) error {
	c, err := g.step()
	if err != nil {
		return err
	}
	defer g.leave(c, true)
	return g.failed(f())
}

// openRows ends query call c, which returned ri and err: the rows stay
// open with the call in flight until they close (see opened); with err,
// the call leaves.
func (g *connGate) openRows(c gateCall, ri driver.Rows, err error) (driver.Rows, error) {
	if err != nil {
		g.leave(c, true)
		return nil, g.failed(err)
	}
	r := &sharedRows{ri: ri, gate: g, call: c}
	g.opened(c, r)
	return r, nil
}

// admit counts a user call in, once the hold is not using the connection.
func (g *connGate) admit(stmt bool) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.ours && !g.shut {
		g.turn.Wait()
	}
	switch {
	case g.shut:
		return errConnReleased
	case stmt && g.rowsOpen():
		return errors.New("advisorylock: a statement on Guard.Conn while a result set is open on it (close the rows first)")
	}
	g.running++
	return nil
}

// leave ends a user call; with end, its context too (a query's ends with
// its rows instead).
func (g *connGate) leave(c gateCall, end bool) {
	if end {
		c.done()
	}
	g.mu.Lock()
	g.running--
	last := g.running == 0 && g.last != nil
	f := g.last
	if last {
		g.last = nil
	}
	g.turn.Broadcast()
	g.mu.Unlock()
	if last {
		f()
	}
}

// opened records h, opened by call c, which leaves without ending.
func (g *connGate) opened(c gateCall, h handle) {
	g.mu.Lock()
	g.handles = append(g.handles, h)
	g.mu.Unlock()
	g.leave(c, false)
}

// endOwn ends h, opened by call c, for its owner: it takes h out of the
// open handles, runs f (Close, Commit, Rollback) as a call in flight, and
// ends c. It reports open false, and runs nothing, when h is not open
// (the release ended it).
func (g *connGate) endOwn(h handle, c gateCall, f func() error) (open bool, err error) {
	if !g.take(h) {
		return false, nil
	}
	err = f()
	_ = g.failed(err)
	g.leave(c, true)
	return true, err
}

// take removes h from the open handles, counting its owner's end of it
// as a call in flight; false when it is not open.
func (g *connGate) take(h handle) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := slices.Index(g.handles, h)
	if i < 0 {
		return false
	}
	g.handles = slices.Delete(g.handles, i, i+1)
	g.running++
	return true
}

func (g *connGate) isOpen(h handle) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Contains(g.handles, h)
}

func (g *connGate) rowsOpen() bool {
	for _, h := range g.handles {
		if _, ok := h.(*sharedRows); ok {
			return true
		}
	}
	return false
}

// failed notes a driver error that says the connection is bad.
func (g *connGate) failed(err error) error {
	if errors.Is(err, driver.ErrBadConn) {
		g.mu.Lock()
		g.broken = true
		g.mu.Unlock()
	}
	return err
}

func (g *connGate) isBroken() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.broken
}

func (g *connGate) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shut || g.broken
}

// tryOwn gives the connection to the hold (a keep-alive check) if the
// user has nothing running or open on it; false means step aside.
func (g *connGate) tryOwn() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ours || g.shut || g.running > 0 || len(g.handles) > 0 {
		return false
	}
	g.ours = true
	return true
}

// shutNow fails the user's calls from now on, without waiting for any:
// the lock is lost, and its connection protects nothing.
func (g *connGate) shutNow() {
	g.mu.Lock()
	g.shut = true
	g.turn.Broadcast()
	g.mu.Unlock()
}

// disown gives the connection back to the user.
func (g *connGate) disown() {
	g.mu.Lock()
	g.ours = false
	g.turn.Broadcast()
	g.mu.Unlock()
}

// close shuts the gate for good: the user's calls fail from now on. It
// waits for the calls in flight until ctx ends, then cancels them and
// waits answerGrace more. It returns the handles left open, to end, and
// whether the calls in flight all ended (running false) or had to be
// cancelled (cancelled true: the driver may have given up on the
// connection).
func (g *connGate) close(ctx context.Context) (open []handle, cancelled, running bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.shut = true
	g.turn.Broadcast()
	if !g.waitIdle(ctx) {
		cancelled = true
		g.cancel(errConnReleased)
		grace, stop := context.WithTimeout(context.Background(), answerGrace)
		g.waitIdle(grace)
		stop()
	}
	open, g.handles = g.handles, nil
	return open, cancelled, g.running > 0
}

// waitIdle waits, with g.mu held, until no user call is in flight or ctx
// ends; it reports whether none is.
func (g *connGate) waitIdle(ctx context.Context) bool {
	wake := context.AfterFunc(ctx, func() {
		g.mu.Lock()
		g.turn.Broadcast()
		g.mu.Unlock()
	})
	defer wake()
	for g.running > 0 && ctx.Err() == nil {
		g.turn.Wait()
	}
	return g.running == 0
}

// abandon runs f once the last user call in flight leaves (at once if
// none is): the connection of a call that did not end when cancelled is
// discarded only when the driver lets go of it.
func (g *connGate) abandon(f func()) {
	g.mu.Lock()
	if g.running > 0 {
		g.last = f
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	f()
}

// endHandles ends rows and transactions left open, newest first (rows
// inside a transaction before it), and returns the first error.
func endHandles(open []handle) error {
	var first error
	for i := len(open) - 1; i >= 0; i-- {
		if err := open[i].end(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
