package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Backend is a database dialect. PostgreSQL and SQLite are the two built
// in; another can be plugged in with WithBackend. A Backend is used through
// the capability interfaces SessionLocker (locks tied to a pinned
// connection) and LeaseStore (locks and leases kept as rows); it implements
// at least one of them. Its methods may be called concurrently.
type Backend interface {
	// Name is a short label, such as "postgres"; it shows in Holder.Backend.
	Name() string
	// Validate is called once by New, NewLeaseLock and NewFence and refuses
	// a handle the backend cannot lock safely (wrap ErrUnsupported).
	Validate(ctx context.Context, db DB) error
}

// SessionLocker is a Backend whose locks live as long as a database
// session: the lock is taken on a pinned connection and ends with it.
// Every method is one round trip and must leave conn usable when it
// returns a nil error.
type SessionLocker interface {
	Backend
	// TryLockSession makes one attempt; OK false is a definite miss.
	TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error)
	// WaitLockSession waits server-side for at most slice; OK false means
	// the slice ended without the lock, and the connection is healthy.
	WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (SessionResult, error)
	// UnlockSession releases; OK false means the session did not hold it.
	UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error)
	// HoldsSession reports whether the connection's session still holds key.
	HoldsSession(ctx context.Context, conn *sql.Conn, key int64) (bool, error)
	// SessionIdentity identifies the server session behind conn, so that
	// two connections that report the same identity share one session.
	SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error)
	// SessionHolder reports who holds key, or nil when it is free.
	SessionHolder(ctx context.Context, db DB, key int64) (*Holder, error)
}

// SessionResult is the outcome of one session-lock statement.
type SessionResult struct {
	OK      bool  // acquired, or released
	Session int64 // the server session that ran it (PostgreSQL backend pid); 0 if unknown
}

// LeaseStore is a Backend that keeps leases as rows. Every method is one
// statement (one round trip), committed on its own.
type LeaseStore interface {
	Backend
	// AcquireLease takes the row if it is free or expired, in one atomic
	// statement, and returns the new grant; ErrNotAcquired if held.
	AcquireLease(ctx context.Context, db DB, r LeaseRequest) (LeaseGrant, error)
	// RenewLease extends the lease if r.Owner and r.Token still hold it and
	// it has not expired; ErrLeaseLost otherwise.
	RenewLease(ctx context.Context, db DB, r LeaseRequest) (LeaseGrant, error)
	// ReleaseLease frees the lease if r.Owner and r.Token still hold it;
	// a lease held by someone else is left alone and nil returned.
	ReleaseLease(ctx context.Context, db DB, r LeaseRequest) error
	// LeaseHolder reports the live holder, or nil when free or expired.
	LeaseHolder(ctx context.Context, db DB, r LeaseRequest) (*Holder, error)
	// AdmitToken stores token as the resource's highest if it is not lower
	// than the stored one, in tx; a lower token gets *StaleTokenError.
	AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token FencingToken) error
	// Schema returns the DDL of the backend's tables, for migration tools.
	Schema() string
}

// LeaseKind says which table a lease row lives in.
type LeaseKind int

const (
	// KindLock is the row behind a Lock on a backend without session locks
	// (advisorylock_locks, keyed by Key).
	KindLock LeaseKind = iota
	// KindLease is the row of a LeaseLock (advisorylock_leases, keyed by
	// name, with a generation that is the fencing token).
	KindLease
)

// LeaseRequest describes one lease statement.
type LeaseRequest struct {
	Kind  LeaseKind
	Name  string
	Key   int64
	Owner string        // unique per acquire
	Token FencingToken  // the grant being renewed or released (0 to acquire)
	TTL   time.Duration // lease length
	Now   time.Time     // the Clock's time, for backends that keep time in the application
}

// LeaseGrant is what an acquire or renew granted.
type LeaseGrant struct {
	Token     FencingToken // the generation; for KindLock any value >= 1
	ExpiresAt time.Time    // r.Now + r.TTL; where the database's clock decides (PostgreSQL), an estimate
}

// driverBound is implemented by built-in backends that choose statement
// forms per driver (see backend_postgres.go).
type driverBound interface {
	forDriver(db DB) Backend
}

// resolveBackend picks the backend: the configured one, else one detected
// from the driver's type, else one detected by asking the database.
func resolveBackend(ctx context.Context, db DB, c *config) (Backend, error) {
	if db == nil || reflect.ValueOf(db).Kind() == reflect.Pointer && reflect.ValueOf(db).IsNil() {
		return nil, fmt.Errorf("%w: nil DB", ErrUnsupported)
	}
	b := c.backend
	if b == nil {
		b = backendForDriver(db)
	}
	if b == nil {
		b = backendByAsking(ctx, db)
	}
	if b == nil {
		return nil, fmt.Errorf("%w: cannot tell which database driver %T talks to; pass WithBackend(Postgres()), WithBackend(SQLite()) or WithBackend(MySQL())", ErrUnsupported, db.Driver())
	}
	if d, ok := b.(driverBound); ok {
		b = d.forDriver(db)
	}
	if err := b.Validate(ctx, db); err != nil {
		return nil, err
	}
	return b, nil
}

// backendForDriver detects the backend from the driver's package path,
// without importing any driver.
func backendForDriver(db DB) Backend {
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
func backendByAsking(ctx context.Context, db DB) Backend {
	for _, b := range []Backend{Postgres(), SQLite(), MySQL()} {
		if identifies(ctx, db, b) {
			return b
		}
	}
	return nil
}

// identifies asks db whether it is what b serves.
func identifies(ctx context.Context, db DB, b Backend) bool {
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
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// handle is where a statement runs: a *sql.DB, *sql.Conn or *sql.Tx,
// called as such so that the statement's arguments stay on the stack, or
// any other querier (an sqlx.DB, a wrapper).
type handle struct {
	db    *sql.DB
	conn  *sql.Conn
	tx    *sql.Tx
	other querier
}

func handleOf(q querier) handle {
	switch q := q.(type) {
	case *sql.DB:
		return handle{db: q}
	case *sql.Conn:
		return handle{conn: q}
	case *sql.Tx:
		return handle{tx: q}
	}
	return handle{other: q}
}

// ExecContext runs a statement that returns no rows.
func (h handle) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	switch {
	case h.db != nil:
		return h.db.ExecContext(ctx, query, args...)
	case h.conn != nil:
		return h.conn.ExecContext(ctx, query, args...)
	case h.tx != nil:
		return h.tx.ExecContext(ctx, query, args...)
	}
	// A copy: args handed to an interface would move every caller's
	// arguments to the heap.
	return h.other.ExecContext(ctx, query, slices.Clone(args)...)
}

// QueryRowContext runs a statement that returns at most one row.
func (h handle) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	switch {
	case h.db != nil:
		return h.db.QueryRowContext(ctx, query, args...)
	case h.conn != nil:
		return h.conn.QueryRowContext(ctx, query, args...)
	case h.tx != nil:
		return h.tx.QueryRowContext(ctx, query, args...)
	}
	return h.other.QueryRowContext(ctx, query, slices.Clone(args)...)
}

// onHandle returns where a lease statement runs: db itself when it runs
// statements (*sql.DB, *sqlx.DB), which takes a pooled connection for each
// statement as database/sql does for any, and costs less than a checkout;
// else a connection checked out of db, which done returns.
func onHandle(ctx context.Context, db DB) (h handle, done func(), err error) {
	if q, ok := db.(querier); ok {
		return handleOf(q), func() {}, nil
	}
	conn, err := takeConn(ctx, db)
	if err != nil {
		return handle{}, nil, err
	}
	return handle{conn: conn}, func() { _ = conn.Close() }, nil
}

// takeConn checks a connection out of db; a failure is ErrPoolUnavailable.
func takeConn(ctx context.Context, db DB) (*sql.Conn, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("%w: %w", ErrPoolUnavailable, err)
	}
	return conn, nil
}

// unreachable marks as ErrPoolUnavailable the error of a statement run on
// a handle that never reached the server: dialing it failed, so nothing
// was sent.
func unreachable(err error) error {
	if err == nil || errors.Is(err, ErrPoolUnavailable) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("%w: %w", ErrPoolUnavailable, err)
	}
	return err
}
