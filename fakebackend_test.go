package advisorylock_test

// A fake backend for the engine tests (engine_test.go): an in-process
// "server" that keeps which session holds which key, reached through a
// database/sql driver of its own, so that the library's acquire, wait,
// keep-alive and release run unchanged against it in microseconds. A test
// makes a try miss (another session holds the key), a wait block until a
// release, a statement fail with a chosen error, a session be killed or
// lose a key, and sees which connections were discarded.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
)

// fakeServer is the fake database: its sessions (one per driver
// connection), the keys they hold, and what the test asked of it.
type fakeServer struct {
	mu      sync.Mutex
	nextID  int64
	open    map[int64]bool  // live sessions
	killed  map[int64]bool  // sessions killed: their statements fail
	holders map[int64]int64 // key -> holding session
	waiting map[int64]int   // key -> sessions waiting for it
	closed  int             // driver connections closed (discarded, not pooled)
	stmts   map[string]int  // statements run, by operation
	before  func(op string, session, key int64) error
	stall   func(op string, key int64) // called outside mu: may block
	changed chan struct{}              // closed and replaced on every change
	terms   map[string]fakeTerm        // each election's latest term
	tokens  uint64                     // the last term's token
}

func newFakeServer() *fakeServer {
	return &fakeServer{
		open:    map[int64]bool{},
		killed:  map[int64]bool{},
		holders: map[int64]int64{},
		waiting: map[int64]int{},
		stmts:   map[string]int{},
		terms:   map[string]fakeTerm{},
		changed: make(chan struct{}),
	}
}

// openFake returns a fresh fake server and a *sql.DB on it whose idle
// connections stay pooled (so that a close is always a discard).
func openFake(t *testing.T) (*fakeServer, *sql.DB) {
	t.Helper()
	s := newFakeServer()
	db := sql.OpenDB(fakeConnector{s})
	db.SetMaxIdleConns(100)
	t.Cleanup(func() { _ = db.Close() })
	return s, db
}

// notifyLocked wakes whoever waits for a change; s.mu is held.
func (s *fakeServer) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// await waits until cond (called under s.mu) holds, woken by changes.
func (s *fakeServer) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		ok, ch := cond(), s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// onStatement makes f run before each backend statement; a non-nil error
// from f is the statement's error.
func (s *fakeServer) onStatement(f func(op string, session, key int64) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.before = f
}

// onStatementStall makes f run before each backend statement, outside
// the server's lock, so that f may block the statement.
func (s *fakeServer) onStatementStall(f func(op string, key int64)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stall = f
}

// failNext makes the next statement op fail with err.
func (s *fakeServer) failNext(op string, err error) {
	s.onStatement(func(o string, _, _ int64) error {
		if o != op {
			return nil
		}
		s.before = nil // called under s.mu
		return err
	})
}

// stalledTry starts l.TryLock in a goroutine whose try statement stalls
// on s until resume is called, and returns once it has stalled; first
// gets the try's Guard (nil, the test told, on an error).
func stalledTry(t *testing.T, s *fakeServer, l *advisorylock.Lock) (first <-chan *advisorylock.Guard, resume func()) {
	stalled, release := make(chan struct{}), make(chan struct{})
	s.onStatementStall(func(op string, key int64) {
		if op == "try" && key == advisorylock.Key(l.Name()) {
			close(stalled)
			<-release
		}
	})
	out := make(chan *advisorylock.Guard, 1)
	go func() {
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Error(err)
		}
		out <- g
	}()
	<-stalled
	s.onStatementStall(nil)
	return out, func() { close(release) }
}

// holder returns the session holding key, 0 when free.
func (s *fakeServer) holder(key int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holders[key]
}

// take makes a session of its own (not a connection of any pool) hold
// key, as another process would; it returns that session.
func (s *fakeServer) take(key int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	s.open[s.nextID] = true
	s.holders[key] = s.nextID
	s.notifyLocked()
	return s.nextID
}

// free lets key go, whoever holds it: a release by the other process, or
// (for a key of ours) the lock gone from a session that lives on.
func (s *fakeServer) free(key int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.holders, key)
	s.notifyLocked()
}

// kill ends session: its keys are freed and its statements fail.
func (s *fakeServer) kill(session int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killed[session] = true
	s.endLocked(session)
}

func (s *fakeServer) endLocked(session int64) {
	for k, h := range s.holders {
		if h == session {
			delete(s.holders, k)
		}
	}
	delete(s.open, session)
	s.notifyLocked()
}

// discards returns how many driver connections were closed.
func (s *fakeServer) discards() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// count returns how many statements op ran.
func (s *fakeServer) count(op string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stmts[op]
}

// errKilled is what a killed session's statements get.
var errKilled = errors.New("fake: terminating connection due to administrator command")

// fakeConnector opens driver connections, each a session of its own.
type fakeConnector struct{ s *fakeServer }

func (c fakeConnector) Connect(context.Context) (driver.Conn, error) {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.s.nextID++
	c.s.open[c.s.nextID] = true
	return &fakeConn{s: c.s, id: c.s.nextID}, nil
}

func (c fakeConnector) Driver() driver.Driver { return fakeDriver{} }

type fakeDriver struct{}

func (fakeDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("fake: use the connector")
}

// fakeConn is one session. It accepts any statement the library sends on
// its own (counted as "exec" or "query") and answers it with nothing.
type fakeConn struct {
	s  *fakeServer
	id int64
}

func (c *fakeConn) Prepare(string) (driver.Stmt, error) {
	return nil, errors.New("fake: no prepared statements")
}

func (c *fakeConn) Close() error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	c.s.closed++
	c.s.endLocked(c.id)
	return nil
}

func (c *fakeConn) Begin() (driver.Tx, error) { return nil, errors.New("fake: no transactions") }

func (c *fakeConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	if err := c.s.statement("exec", c.id, 0); err != nil {
		return nil, err
	}
	return driver.RowsAffected(0), nil
}

func (c *fakeConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	if err := c.s.statement("query", c.id, 0); err != nil {
		return nil, err
	}
	return noRows{}, nil
}

func (c *fakeConn) Ping(context.Context) error {
	return c.s.statement("ping", c.id, 0)
}

// ResetSession refuses a killed session back into use, as drivers do.
func (c *fakeConn) ResetSession(context.Context) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.killed[c.id] {
		return driver.ErrBadConn
	}
	return nil
}

type noRows struct{}

func (noRows) Columns() []string         { return nil }
func (noRows) Close() error              { return nil }
func (noRows) Next([]driver.Value) error { return io.EOF }

// statement counts op on session and returns the error the test chose
// for it, or a killed session's.
func (s *fakeServer) statement(op string, session, key int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statementLocked(op, session, key)
}

func (s *fakeServer) statementLocked(op string, session, key int64) error {
	s.stmts[op]++
	s.notifyLocked() // a count is a change: await may wait for one
	if s.before != nil {
		if err := s.before(op, session, key); err != nil {
			return err
		}
	}
	if s.killed[session] {
		return errKilled
	}
	return nil
}

// fakeBackend is the backend contract (a SessionLocker with terms and
// many keys per session) over a fakeServer.
type fakeBackend struct{ s *fakeServer }

func (b fakeBackend) Name() string { return "fake" }
func (b fakeBackend) Traits() backend.Traits {
	return backend.Traits{CancelsPromptly: true}
}

// sessionOf is the session behind conn: its driver connection's.
func sessionOf(conn *sql.Conn) (int64, error) {
	var id int64
	err := conn.Raw(func(dc any) error {
		fc, ok := dc.(*fakeConn)
		if !ok {
			return fmt.Errorf("fake: driver connection %T", dc)
		}
		id = fc.id
		return nil
	})
	return id, err
}

// run runs one statement of op on conn's session under s.mu.
func (b fakeBackend) run(ctx context.Context, op string, conn *sql.Conn, key int64, f func(session int64) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.s.mu.Lock()
	stall := b.s.stall
	b.s.mu.Unlock()
	if stall != nil {
		stall(op, key)
	}
	session, err := sessionOf(conn)
	if err != nil {
		return err
	}
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	if err := b.s.statementLocked(op, session, key); err != nil {
		return err
	}
	return f(session)
}

func (b fakeBackend) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	var res backend.SessionResult
	err := b.run(ctx, "try", conn, key, func(session int64) error {
		res = b.s.tryLocked(session, key)
		return nil
	})
	return res, err
}

func (s *fakeServer) tryLocked(session, key int64) backend.SessionResult {
	res := backend.SessionResult{Session: session}
	if h, ok := s.holders[key]; !ok || h == session {
		s.holders[key] = session
		res.OK = true
		s.notifyLocked()
	}
	return res
}

// WaitLockSession waits for key until slice ends, the key comes free, or
// ctx ends (the statement is then cancelled, as a driver does).
func (b fakeBackend) WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (backend.SessionResult, error) {
	var ch chan struct{}
	var res backend.SessionResult
	err := b.run(ctx, "wait", conn, key, func(session int64) error {
		res = b.s.tryLocked(session, key)
		if !res.OK {
			b.s.waiting[key]++
			b.s.notifyLocked()
			ch = b.s.changed
		}
		return nil
	})
	if err != nil || res.OK {
		return res, err
	}
	session := res.Session
	defer func() {
		b.s.mu.Lock()
		b.s.waiting[key]--
		b.s.notifyLocked()
		b.s.mu.Unlock()
	}()
	timer := time.NewTimer(slice)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-timer.C:
			return res, nil
		case <-ch:
		}
		b.s.mu.Lock()
		if b.s.killed[session] {
			b.s.mu.Unlock()
			return res, errKilled
		}
		res = b.s.tryLocked(session, key)
		ch = b.s.changed
		b.s.mu.Unlock()
		if res.OK {
			return res, nil
		}
	}
}

func (b fakeBackend) UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	var res backend.SessionResult
	err := b.run(ctx, "unlock", conn, key, func(session int64) error {
		res = b.s.unlockLocked(session, key)
		return nil
	})
	return res, err
}

func (s *fakeServer) unlockLocked(session, key int64) backend.SessionResult {
	res := backend.SessionResult{Session: session}
	if s.holders[key] == session {
		delete(s.holders, key)
		res.OK = true
		s.notifyLocked()
	}
	return res
}

func (b fakeBackend) HoldsSession(ctx context.Context, conn *sql.Conn, key int64) (bool, error) {
	var held bool
	err := b.run(ctx, "holds", conn, key, func(session int64) error {
		held = b.s.holders[key] == session
		return nil
	})
	return held, err
}

func (b fakeBackend) SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error) {
	session, err := sessionOf(conn)
	return fmt.Sprint(session), err
}

func (b fakeBackend) SessionHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	hs, err := b.KeyHolders(ctx, db, []int64{key})
	if err != nil {
		return nil, err
	}
	return hs[0], nil
}

// Elections: each term a row (name, session, owner, token), the token
// from one counter.

type fakeTerm struct {
	session int64
	owner   string
	token   uint64
	since   time.Time
	ended   bool
	key     int64
}

func (b fakeBackend) PrepareElections(context.Context, backend.DB) error { return nil }

func (b fakeBackend) BeginTerm(ctx context.Context, conn *sql.Conn, key int64, name, owner string) (uint64, error) {
	var token uint64
	err := b.run(ctx, "begin term", conn, key, func(session int64) error {
		b.s.tokens++
		token = b.s.tokens
		b.s.terms[name] = fakeTerm{session: session, owner: owner, token: token, since: time.Now(), key: key}
		b.s.notifyLocked()
		return nil
	})
	return token, err
}

func (b fakeBackend) TermHolder(ctx context.Context, db backend.DB, key int64, name string) (*backend.Holder, error) {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	b.s.stmts["term holder"]++
	t, ok := b.s.terms[name]
	if !ok || t.ended || b.s.holders[key] != t.session {
		return nil, nil
	}
	return &backend.Holder{Name: name, Backend: "fake", Key: key, PID: int(t.session), Owner: t.owner, Token: t.token, Since: t.since}, nil
}

func (b fakeBackend) EndTerm(ctx context.Context, conn *sql.Conn, name string, term uint64) error {
	return b.run(ctx, "end term", conn, 0, func(int64) error {
		if t, ok := b.s.terms[name]; ok && t.token == term {
			t.ended = true
			b.s.terms[name] = t
			b.s.notifyLocked()
		}
		return nil
	})
}

// SlotLocker, SetLocker, MultiplexLocker: semaphores, sets, multiplexed
// sessions.

func (b fakeBackend) TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, backend.SessionResult, error) {
	var i int
	var res backend.SessionResult
	err := b.run(ctx, "try any", conn, keys[0], func(session int64) error {
		res.Session = session
		for i = range keys {
			if res = b.s.tryLocked(session, keys[i]); res.OK {
				return nil
			}
		}
		return nil
	})
	return i, res, err
}

func (b fakeBackend) KeyHolders(ctx context.Context, db backend.DB, keys []int64) ([]*backend.Holder, error) {
	b.s.mu.Lock()
	defer b.s.mu.Unlock()
	b.s.stmts["holders"]++
	hs := make([]*backend.Holder, len(keys))
	for i, k := range keys {
		if h, ok := b.s.holders[k]; ok {
			hs[i] = &backend.Holder{Backend: "fake", Key: k, PID: int(h)}
		}
	}
	return hs, nil
}

func (b fakeBackend) TryLockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	var res backend.SessionResult
	err := b.run(ctx, "try all", conn, keys[0], func(session int64) error {
		res.Session = session
		for _, k := range keys {
			if h, ok := b.s.holders[k]; ok && h != session {
				return nil
			}
		}
		for _, k := range keys {
			b.s.holders[k] = session
		}
		res.OK = true
		b.s.notifyLocked()
		return nil
	})
	return res, err
}

func (b fakeBackend) UnlockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	var res backend.SessionResult
	err := b.run(ctx, "unlock all", conn, keys[0], func(session int64) error {
		res = backend.SessionResult{Session: session, OK: true}
		for _, k := range keys {
			if !b.s.unlockLocked(session, k).OK {
				res.OK = false
			}
		}
		return nil
	})
	return res, err
}

func (b fakeBackend) HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error) {
	held := make([]bool, len(keys))
	err := b.run(ctx, "held keys", conn, 0, func(session int64) error {
		for i, k := range keys {
			held[i] = b.s.holders[k] == session
		}
		return nil
	})
	return held, err
}

// TryUnlock runs a shared session's batch in one statement ("try
// unlock"): each try as TryLockSession, each unlock as UnlockSession.
func (b fakeBackend) TryUnlock(ctx context.Context, conn *sql.Conn, try, unlock []int64) (granted, freed []bool, err error) {
	granted, freed = make([]bool, len(try)), make([]bool, len(unlock))
	err = b.run(ctx, "try unlock", conn, 0, func(session int64) error {
		for i, k := range try {
			granted[i] = b.s.tryLocked(session, k).OK
		}
		for i, k := range unlock {
			freed[i] = b.s.unlockLocked(session, k).OK
		}
		return nil
	})
	return granted, freed, err
}

var (
	_ backend.BatchLocker       = fakeBackend{}
	_ backend.SessionIdentifier = fakeBackend{}
	_ backend.TermKeeper        = fakeBackend{}
	_ backend.SlotLocker        = fakeBackend{}
	_ backend.SetLocker         = fakeBackend{}
	_ backend.MultiplexLocker   = fakeBackend{}
)
