package dbutil

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// ErrPoolUnavailable is advisorylock.ErrPoolUnavailable: no connection
// could be checked out of the pool, or, for a lease statement, none could
// be dialed; nothing was sent.
var ErrPoolUnavailable = errors.New("advisorylock: no connection available")

// ErrTransactionPooler is advisorylock.ErrTransactionPooler: session
// locks refused because a transaction-mode pooler multiplexes sessions
// (CheckPooler), or an unlock that ran on a session other than the one
// that took the lock.
var ErrTransactionPooler = errors.New("advisorylock: transaction-mode pooler in the way (session locks cannot work there; use LeaseLock, or WithLeaseRows for a Lock, a set, a Semaphore or an Election)")

// ErrPoolWait is the cause of a checkout that WithPoolWait ended.
var ErrPoolWait = errors.New("no connection came free within the pool wait (WithPoolWait)")

// Querier is what *sql.DB, *sql.Conn and *sql.Tx share: statements.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// StatementsOn returns where a statement that holds no lock runs (lease
// steps, holders): db itself when it runs statements (*sql.DB, *sqlx.DB),
// so that database/sql retries a dead pooled connection with another, as
// it does for any statement; else a connection checked out of db, which
// done returns; the kept connection of an OnConn.
//
// Under a pool wait (see WithPoolWait) a pool that can be exhausted gives
// a connection checked out within that bound instead. A failed checkout
// is ErrPoolUnavailable.
func StatementsOn(ctx context.Context, db backend.DB) (q Querier, done func(), err error) {
	if c, ok := db.(OnConn); ok {
		return c.Kept, func() {}, nil
	}
	if q, ok := db.(Querier); ok && (PoolWaitOf(ctx) == 0 || !MayWaitForPool(db)) {
		return q, func() {}, nil
	}
	conn, err := TakeConn(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	return conn, func() { _ = conn.Close() }, nil
}

// OnConn is a DB whose statements run on Kept, a connection of DB's that
// its caller keeps (a waiter sleeping in line: see backend.LeaseSleeper); what
// needs a connection of its own (a schema upgrade) takes one from DB.
type OnConn struct {
	Kept *sql.Conn
	backend.DB
}

// TakeConn checks a connection out of db, within ctx's pool wait if it
// has one (see WithPoolWait); a failure is ErrPoolUnavailable.
func TakeConn(ctx context.Context, db backend.DB) (*sql.Conn, error) {
	checkout := ctx
	if d := PoolWaitOf(ctx); d > 0 {
		var cancel context.CancelFunc
		checkout, cancel = context.WithTimeoutCause(ctx, d, ErrPoolWait)
		defer cancel()
	}
	conn, err := db.Conn(checkout)
	if err != nil {
		return nil, Unavailable(checkout, err)
	}
	return conn, nil
}

// Checkout checks a connection out of db's pool for ctx. A done context
// returns its cause before touching the pool. poolWait, if not 0, bounds
// the wait for a connection (WithPoolWait): an exhausted pool is then
// ErrPoolUnavailable, not a hang on a context that never ends. Where the
// driver may not end a connection's startup when ctx ends (bounded), the
// checkout goes through Within; a connection that arrives after ctx ended
// goes back to the pool. A checkout that ctx ended returns ctx's cause;
// another failure is ErrPoolUnavailable (see Unavailable).
func Checkout(ctx context.Context, db backend.DB, bounded bool, poolWait time.Duration) (*sql.Conn, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	caller := ctx
	if poolWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, poolWait, ErrPoolWait)
		defer cancel()
	}
	var conn *sql.Conn
	var err error
	if bounded && ctx.Done() != nil {
		conn, err = Within(ctx, func() (*sql.Conn, error) { return db.Conn(ctx) }, nil, func(late *sql.Conn) {
			if late != nil {
				Recycle(late)
			}
		})
	} else {
		conn, err = db.Conn(ctx)
	}
	if err != nil {
		if caller.Err() != nil {
			return nil, context.Cause(caller)
		}
		return nil, Unavailable(ctx, err)
	}
	return conn, nil
}

// poolWaitKey carries a try's advisorylock.WithPoolWait in its context to the places
// that take connections for it: the first-use checks and the lease
// statements, whose signatures (backend.Backend's, for one) have no room for it.
type poolWaitKey struct{}

// WithPoolWait bounds, by d, every pool checkout made for ctx.
func WithPoolWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, poolWaitKey{}, d)
}

// PoolWaitOf is the bound WithPoolWait put in ctx, or 0.
func PoolWaitOf(ctx context.Context) time.Duration {
	d, _ := ctx.Value(poolWaitKey{}).(time.Duration)
	return d
}

// MayWaitForPool reports whether a checkout from db can wait for a
// connection to come free: only a pool with a limit can be exhausted
// (other handles are assumed to be).
func MayWaitForPool(db backend.DB) bool {
	pool := SQLDBOf(db)
	return pool == nil || pool.Stats().MaxOpenConnections > 0
}

// Unavailable is the ErrPoolUnavailable of a checkout from ctx that
// failed with err: the checkout's cause when ctx ended it (the pool wait),
// else the driver's error, kept reachable with errors.As, and the limit
// named when the server refused the connection at its connection limit.
func Unavailable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		err = context.Cause(ctx)
	} else if limit := ConnectionLimit(err); limit != "" {
		return fmt.Errorf("%w: the server refused a new connection at %s: %w", ErrPoolUnavailable, limit, err)
	}
	return fmt.Errorf("%w: %w", ErrPoolUnavailable, err)
}

// Unreachable marks as ErrPoolUnavailable the error of a statement that
// never reached the server: dialing for it failed, or the server refused
// the new connection at its connection limit, so nothing was sent.
func Unreachable(err error) error {
	if err == nil || errors.Is(err, ErrPoolUnavailable) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" || ConnectionLimit(err) != "" {
		return Unavailable(context.Background(), err)
	}
	return err
}

// A new MySQL connection refused at a connection limit (see ConnectionLimit).
const (
	mysqlTooManyConnections     = 1040 // ER_CON_COUNT_ERROR: max_connections
	mysqlTooManyUserConnections = 1203 // ER_TOO_MANY_USER_CONNECTIONS: max_user_connections
	mysqlUserResourceExceeded   = 1226 // ER_USER_LIMIT_REACHED: a user's MAX_USER_CONNECTIONS
)

// ConnectionLimit names the server's connection limit that err reports
// was reached, or is "": PostgreSQL's SQLSTATE 53300 (max_connections
// less the reserved slots, or a role's or a database's CONNECTION LIMIT),
// MySQL's 1040 (max_connections), 1203 (max_user_connections) and 1226
// (a user's MAX_USER_CONNECTIONS).
func ConnectionLimit(err error) string {
	if SQLState(err) == "53300" {
		return "its connection limit (max_connections, or the role's or database's CONNECTION LIMIT)"
	}
	switch MySQLErrno(err) {
	case mysqlTooManyConnections:
		return "its connection limit (max_connections)"
	case mysqlTooManyUserConnections:
		return "its per-user connection limit (max_user_connections)"
	case mysqlUserResourceExceeded:
		return "the user's connection limit (MAX_USER_CONNECTIONS)"
	}
	return ""
}

// SQLState returns the SQLSTATE of a driver error (lib/pq and pgx both
// expose SQLState), or "".
func SQLState(err error) string {
	if err == nil {
		return ""
	}
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// MySQLErrno returns the server's error number carried by err (the Number
// field of go-sql-driver's *MySQLError, read without importing the
// driver), or 0.
func MySQLErrno(err error) uint16 {
	for ; err != nil; err = errors.Unwrap(err) {
		v := reflect.ValueOf(err)
		if v.Kind() == reflect.Pointer && !v.IsNil() {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			continue
		}
		if f := v.FieldByName("Number"); f.IsValid() && f.Kind() == reflect.Uint16 {
			return uint16(f.Uint())
		}
	}
	return 0
}

// DeniedByServer reports whether err is the server's refusal of a
// privilege the connecting role or user lacks (on a table, a sequence,
// a database, or the right to create the tables): PostgreSQL's
// insufficient_privilege (42501), MySQL's errors 1142, 1143 and 1044.
// Trying again does not heal it; an administrator's grant does.
func DeniedByServer(err error) bool {
	if SQLState(err) == "42501" {
		return true
	}
	switch MySQLErrno(err) {
	case 1142, 1143, 1044: // ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR
		return true
	}
	return false
}

// TTLMillis is a lease's TTL as whole milliseconds, at least 1.
func TTLMillis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// RowsQuerier is a Querier that also returns rows: *sql.DB, *sql.Conn and
// the handles that embed a *sql.DB (sqlx).
type RowsQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// ErrNoRowsQuerier makes KeyHolders fall back to one statement per slot
// on a handle that cannot return rows (see backend.SlotLocker).
var ErrNoRowsQuerier = fmt.Errorf("%w: the handle cannot return rows", backend.ErrUnsupported)

// EachRow runs q on on and calls f for each row.
func EachRow(ctx context.Context, on Querier, q string, f func(rows *sql.Rows) error) error {
	rq, ok := on.(RowsQuerier)
	if !ok {
		return ErrNoRowsQuerier
	}
	rows, err := rq.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// TermToken converts a stored fencing token or term (a BIGINT) to a
// token; v <= 0 is an error, as tokens start at 1. It is the check behind
// ParseFencingToken, and a backend's BeginTerm uses it.
func TermToken(v int64) (uint64, error) {
	if v <= 0 {
		return 0, fmt.Errorf("advisorylock: invalid fencing token %d (tokens start at 1)", v)
	}
	return uint64(v), nil
}

// SchemaScript writes a backend's Schema: versions (the DDL of the
// version table), then each upgrade step of steps (steps[0] is unused:
// version 0 has none) with the statement that records it (record, which
// the backend's own upgrade runs too), then grants (a comment for the
// administrator).
func SchemaScript(versions string, steps [][]string, record func(version int) string, grants string) string {
	var b strings.Builder
	b.WriteString(versions + ";\n")
	for v := 1; v < len(steps); v++ {
		fmt.Fprintf(&b, "\n-- version %d\n", v)
		for _, ddl := range steps[v] {
			b.WriteString(ddl + ";\n")
		}
		b.WriteString(record(v) + ";\n")
	}
	b.WriteString(grants)
	return b.String()
}
