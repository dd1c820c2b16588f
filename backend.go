package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/advisorylock/advisorylock/backend"
)

// localBackend returns the backend that needs no I/O to pick: the
// configured one, else the one the driver's type names; nil when neither
// tells (a wrapped driver: firstUse asks the database).
func localBackend(db DB, c *config) backend.Backend {
	b := c.backend
	if b == nil {
		b = backendForDriver(db)
	}
	return configured(b, db, c)
}

// configured returns b adjusted to db (see backend.Configurer), or b itself.
func configured(b backend.Backend, db DB, c *config) backend.Backend {
	if cf, ok := b.(backend.Configurer); ok {
		return cf.Configure(db, 0, c.serverChecks)
	}
	return b
}

// isNil reports a nil db, also a typed nil pointer in the interface.
func isNil(db DB) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// errNilDB is what the constructors return for a nil db.
var errNilDB = fmt.Errorf("%w: nil DB", ErrUnsupported)

// resolveBackend picks the backend at an operation that may talk to the
// database: the local one (see localBackend), else the one the database
// says it is, asked once per *sql.DB. Unless the server checks are off it
// then runs the backend's Validate, once per *sql.DB.
func resolveBackend(ctx context.Context, db DB, c *config) (backend.Backend, error) {
	if isNil(db) {
		return nil, errNilDB
	}
	b := localBackend(db, c)
	if b == nil {
		var err error
		b, err = cachedVerdict(ctx, db, "backend", func(ctx context.Context) (backend.Backend, error) {
			if b := backendByAsking(ctx, db); b != nil {
				return b, nil
			}
			return nil, fmt.Errorf("%w: cannot tell which database driver %T talks to; pass WithBackend(Postgres()), WithBackend(SQLite()) or WithBackend(MySQL())", ErrUnsupported, db.Driver())
		})
		if err != nil {
			return nil, err
		}
		b = configured(b, db, c)
	}
	if !c.serverChecks {
		return b, nil
	}
	v, ok := b.(backend.Validator)
	if !ok {
		return b, nil
	}
	_, err := cachedVerdict(ctx, db, "validate "+b.Name(), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, v.Validate(ctx, db)
	})
	return b, err
}

// firstUse runs a lock's first-use work once, under the context of the
// first operation that needs it: whatever needs the database (see
// resolveBackend), so that constructors do no I/O, as sql.Open. A failure
// is not kept: the next operation tries again. Operations that arrive
// while it runs wait for it, as long as their own context allows.
type firstUse[T any] struct {
	turn chan struct{} // a token: whoever holds it runs the work
	v    atomic.Pointer[T]
}

func newFirstUse[T any]() firstUse[T] { return firstUse[T]{turn: make(chan struct{}, 1)} }

// get returns the work's result, running it first if no run succeeded yet.
func (f *firstUse[T]) get(ctx context.Context, work func(ctx context.Context) (*T, error)) (*T, error) {
	if v := f.v.Load(); v != nil {
		return v, nil
	}
	select {
	case f.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-f.turn }()
	if v := f.v.Load(); v != nil {
		return v, nil
	}
	v, err := work(ctx)
	if err != nil {
		return nil, err
	}
	f.v.Store(v)
	return v, nil
}

// verdicts caches, per *sql.DB, what first uses learn about it (the
// backend a wrapped driver talks to, Validate's verdict, the pooler
// probe's), and lib/pq's prepared statements (see preparedStatements),
// guarded by mu. Entries are keyed by weak pointers and removed when
// their *sql.DB is garbage collected, so the cache keeps no pool alive. A verdict in
// flight is shared: callers that arrive meanwhile wait for it. A failed
// one is not kept: the next caller decides again.
//
// What it buys: round trips at first use. Lock values are cheap and made
// per entity or per request; without it each new one would run again the
// statements its handle already answered (which backend, Validate's
// version, standby and pooler checks, whether the tables exist) before
// its first step: a new Lock's TryLock+Release on a warm PostgreSQL
// handle takes 2 round trips with it and 20 to 27 without (lib/pq and
// pgx, counted through testdb's proxy, 2026-12-06; see
// TestNewLockOnAWarmHandleTakesTwoRoundTrips), a new LeaseLock's 2 and 3.
var verdicts = struct {
	mu sync.Mutex
	m  map[weak.Pointer[sql.DB]]map[string]*verdict
}{m: map[weak.Pointer[sql.DB]]map[string]*verdict{}}

type verdict struct {
	done chan struct{} // closed when val and err are set
	val  any
	err  error
}

// cachedVerdict returns what decide says about db, deciding once per
// *sql.DB and per what. A handle that is not a *sql.DB and embeds none is
// decided on every call.
func cachedVerdict[T any](ctx context.Context, db DB, what string, decide func(ctx context.Context) (T, error)) (T, error) {
	pool := sqlDBOf(db)
	if pool == nil {
		return decide(ctx)
	}
	key := weak.Make(pool)
	for {
		v, mine := verdictFor(pool, key, what)
		if !mine {
			select {
			case <-v.done:
			case <-ctx.Done():
				var zero T
				return zero, context.Cause(ctx)
			}
			if v.err != nil {
				continue // decided under someone else's context: decide again
			}
			return v.val.(T), nil
		}
		val, err := decide(ctx)
		v.val, v.err = val, err
		if err != nil {
			forgetVerdict(key, what, v)
		}
		close(v.done)
		return val, err
	}
}

// verdictFor returns the verdict of what for pool, and mine true when the
// caller made it and must decide it.
func verdictFor(pool *sql.DB, key weak.Pointer[sql.DB], what string) (v *verdict, mine bool) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	byWhat := verdicts.m[key]
	if byWhat == nil {
		byWhat = map[string]*verdict{}
		verdicts.m[key] = byWhat
		runtime.AddCleanup(pool, forgetPool, key)
	}
	if v := byWhat[what]; v != nil {
		return v, false
	}
	v = &verdict{done: make(chan struct{})}
	byWhat[what] = v
	return v, true
}

func forgetVerdict(key weak.Pointer[sql.DB], what string, v *verdict) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	if byWhat := verdicts.m[key]; byWhat[what] == v {
		delete(byWhat, what)
	}
}

func forgetPool(key weak.Pointer[sql.DB]) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	delete(verdicts.m, key)
}

// sqlDBOf returns the *sql.DB behind db: db itself, or the exported
// *sql.DB that a struct such as sqlx.DB embeds; nil if there is none.
func sqlDBOf(db DB) *sql.DB {
	if p, ok := db.(*sql.DB); ok {
		return p
	}
	v := reflect.ValueOf(db)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	v = v.Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Anonymous && f.IsExported() && f.Type == reflect.TypeFor[*sql.DB]() {
			p, _ := v.Field(i).Interface().(*sql.DB)
			return p
		}
	}
	return nil
}

// backendForDriver detects the backend from the driver's package path,
// without importing any driver.
func backendForDriver(db DB) backend.Backend {
	switch pkg := driverPkg(db); {
	case pkg == "github.com/lib/pq", strings.HasPrefix(pkg, "github.com/jackc/pgx/"):
		return Postgres()
	case pkg == "github.com/glebarez/go-sqlite", pkg == "modernc.org/sqlite", pkg == "github.com/mattn/go-sqlite3", pkg == "github.com/ncruces/go-sqlite3/driver":
		return SQLite()
	case pkg == "github.com/go-sql-driver/mysql":
		return MySQL()
	}
	return nil
}

// driverPkg returns the import path of the package that defines db's
// driver type, or "".
func driverPkg(db DB) string {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// backendByAsking detects the backend of a wrapped driver (otelsql and
// the like) by asking the database what it is.
func backendByAsking(ctx context.Context, db DB) backend.Backend {
	for _, b := range []backend.Backend{Postgres(), SQLite(), MySQL()} {
		if identifies(ctx, db, b) {
			return b
		}
	}
	return nil
}

// identifies asks db whether it is what b serves.
func identifies(ctx context.Context, db DB, b backend.Backend) bool {
	probe, ok := b.(interface {
		isServedBy(ctx context.Context, conn *sql.Conn) bool
	})
	if !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, defaultReleaseTimeout)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		return false
	}
	defer conn.Close()
	return probe.isServedBy(ctx, conn)
}

// querier is what *sql.DB, *sql.Conn and *sql.Tx share: statements.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// statementsOn returns where a statement that holds no lock runs (lease
// steps, holders): db itself when it runs statements (*sql.DB, *sqlx.DB),
// so that database/sql retries a dead pooled connection with another, as
// it does for any statement; else a connection checked out of db, which
// done returns; the kept connection of an onConn.
//
// Under a pool wait (see withPoolWait) a pool that can be exhausted gives
// a connection checked out within that bound instead.
func statementsOn(ctx context.Context, db DB) (q querier, done func(), err error) {
	if c, ok := db.(onConn); ok {
		return c.conn, func() {}, nil
	}
	if q, ok := db.(querier); ok && (poolWaitOf(ctx) == 0 || !mayWaitForPool(db)) {
		return q, func() {}, nil
	}
	conn, err := takeConn(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close() }, nil
}

// onConn is a DB whose statements run on conn, a connection of DB's that
// its caller keeps (a waiter sleeping in line: see backend.LeaseSleeper); what
// needs a connection of its own (a schema upgrade) takes one from DB.
type onConn struct {
	conn *sql.Conn
	DB
}

// unreachable marks as ErrPoolUnavailable the error of a statement that
// never reached the server: dialing for it failed, or the server refused
// the new connection at its connection limit, so nothing was sent.
func unreachable(err error) error {
	if err == nil || errors.Is(err, ErrPoolUnavailable) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || connectionLimit(err) != "" {
		return unavailable(context.Background(), err)
	}
	return err
}

// takeConn checks a connection out of db, within ctx's pool wait if it
// has one (see withPoolWait); a failure is ErrPoolUnavailable.
func takeConn(ctx context.Context, db DB) (*sql.Conn, error) {
	checkout := ctx
	if d := poolWaitOf(ctx); d > 0 {
		var cancel context.CancelFunc
		checkout, cancel = context.WithTimeoutCause(ctx, d, errPoolWait)
		defer cancel()
	}
	conn, err := db.Conn(checkout)
	if err != nil {
		return nil, unavailable(checkout, err)
	}
	return conn, nil
}
