package postgresbackend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Windows (WithMinHold) on PostgreSQL. A session lock ends with its
// session, so the window of a Lock lives in a row of advisorylock_windows,
// keyed by the lock's key and written by the statement that takes the
// lock: the release stays a plain unlock, and a holder that dies leaves
// its window behind. A lease keeps its window in its own row's expires_at.
// Every time is the database's now(). Locks without the option never read
// or write the table.

// postgresWindowsTable is the DDL of advisorylock_windows.
const postgresWindowsTable = `CREATE TABLE IF NOT EXISTS advisorylock_windows (
	key         bigint      PRIMARY KEY, -- Key(name)
	name        text        NOT NULL,
	pid         integer     NOT NULL,    -- the granting session's pg_backend_pid()
	application text        NOT NULL,    -- its application_name
	client_addr inet,                    -- its address; NULL over a Unix socket
	acquired_at timestamptz NOT NULL,    -- the grant
	taken_until timestamptz NOT NULL     -- the name stays taken until then
)`

// The window statements. $1 is the key, $2 the name, $3 the window in
// milliseconds.
const (
	// pgRecordWindow writes the window of a grant made now, unless an
	// earlier grant's window is still open: the conflict clause reads the
	// row's latest committed version, also one committed after the
	// statement's snapshot. It yields a row when it wrote.
	pgRecordWindow = `INSERT INTO advisorylock_windows AS w (key, name, pid, application, client_addr, acquired_at, taken_until)
	SELECT $1::bigint, $2::text, pg_backend_pid(), current_setting('application_name'), inet_client_addr(),
		now(), now() + $3::bigint * interval '1 millisecond'
	FROM taken WHERE taken.ok
	ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, pid = EXCLUDED.pid, application = EXCLUDED.application,
		client_addr = EXCLUDED.client_addr, acquired_at = EXCLUDED.acquired_at, taken_until = EXCLUDED.taken_until
	WHERE w.taken_until <= now()
	RETURNING true`

	// pgTryLockWindow is the try of a Lock with a window, one statement:
	// CASE orders the steps, so pg_try_advisory_lock is never called
	// while a window is open; a grant records its window; and a grant
	// whose window cannot be recorded (a window committed meanwhile) is
	// unlocked again before the statement returns. A row means acquired;
	// it holds the session's dead-holder marker (see forLock).
	pgTryLockWindow = `WITH win AS (
	SELECT EXISTS (SELECT FROM advisorylock_windows WHERE key = $1::bigint AND taken_until > now()) AS open
), taken AS (
	SELECT CASE WHEN win.open THEN false ELSE pg_try_advisory_lock($1::bigint) END AS ok FROM win
), recorded AS (` + pgRecordWindow + `)
SELECT coalesce(current_setting('advisorylock.dead_holder', true), '') FROM taken
WHERE CASE WHEN NOT taken.ok THEN false WHEN EXISTS (SELECT FROM recorded) THEN true ELSE NOT pg_advisory_unlock($1::bigint) END`

	// pgClaimWindow records the window of a lock the session holds (a
	// wait was granted), or unlocks it when an earlier window is open. A
	// row (the session's pid) means it is ours.
	pgClaimWindow = `WITH taken AS (SELECT true AS ok), recorded AS (` + pgRecordWindow + `)
SELECT pg_backend_pid()
WHERE CASE WHEN EXISTS (SELECT FROM recorded) THEN true ELSE NOT pg_advisory_unlock($1::bigint) END`

	pgWindowLeft = `SELECT coalesce((SELECT ceil(extract(epoch FROM taken_until - now()) * 1000)::bigint
	FROM advisorylock_windows WHERE key = $1::bigint AND taken_until > now()), 0)`

	pgWindowHolder = `SELECT name, pid, application, coalesce(host(client_addr), ''), acquired_at, taken_until
FROM advisorylock_windows WHERE key = $1::bigint AND taken_until > now()`

	pgWindowsExist = `SELECT to_regclass('advisorylock_windows') IS NOT NULL`

	// A lease renewal or release with a window never moves expires_at
	// before the window's end: a holder that dies or releases keeps the
	// name until then, and a release keeps the owner for Holder to show.
	pgRenewLeaseWindow = `UPDATE advisorylock_leases
SET expires_at = greatest(now() + $1::bigint * interval '1 millisecond', acquired_at + $5::bigint * interval '1 millisecond')
WHERE name = $2::text AND owner = $3::text AND generation = $4::bigint AND expires_at > now()
RETURNING generation`
	pgReleaseLeaseWindow = `UPDATE advisorylock_leases
SET owner = CASE WHEN acquired_at + $3::bigint * interval '1 millisecond' > now() THEN owner END,
	expires_at = least(expires_at, greatest(now(), acquired_at + $3::bigint * interval '1 millisecond'))
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = $1::text AND generation = $2::bigint AND owner IS NOT NULL`
)

// PrepareWindows creates the tables (advisorylock_windows among them)
// unless advisorylock_windows exists, once per *sql.DB. Where it exists
// (say, created by an administrator from Schema) it writes nothing.
func (p *postgres) PrepareWindows(ctx context.Context, db backend.DB) error {
	_, err := dbutil.CachedVerdict(ctx, db, "postgres windows", func(ctx context.Context) (struct{}, error) {
		var exist bool
		if _, err := p.queryRow(ctx, db, pgWindowsExist, nil, &exist); err != nil || exist {
			return struct{}{}, err
		}
		err := p.bound(ctx, func() error { return upgradePostgresSchema(ctx, db) })
		if err == nil {
			return struct{}{}, nil
		}
		on, done, cerr := dbutil.StatementsOn(ctx, db)
		if cerr != nil {
			return struct{}{}, err
		}
		defer done()
		return struct{}{}, p.onStandby(ctx, on, err) // a standby cannot create it
	})
	return err
}

// TryLockSessionFor takes key unless a window is open, and records the
// grant's window, in one statement (see pgTryLockWindow). A grant on a
// session that lacks the Lock's dead-holder settings (see forLock) sends
// them, one more round trip, once per session. On a hot standby the
// window's write fails: that is an error matching backend.ErrUnsupported.
func (p *postgres) TryLockSessionFor(ctx context.Context, conn *sql.Conn, key int64, name string, window time.Duration) (backend.SessionResult, error) {
	q, args, err := p.statement(pgTryLockWindow, key, name, dbutil.TTLMillis(window))
	if err != nil {
		return backend.SessionResult{}, err
	}
	var marker string
	err = conn.QueryRowContext(ctx, q, args...).Scan(&marker)
	if errors.Is(err, sql.ErrNoRows) {
		return backend.SessionResult{}, p.noRowAnswers(ctx)
	}
	if err != nil {
		return backend.SessionResult{}, p.onStandby(ctx, conn, err)
	}
	if p.deadHolder != "" && (marker == "" || !strings.Contains(p.deadHolder, "'advisorylock.dead_holder', '"+marker+"'")) {
		if _, err := conn.ExecContext(ctx, p.deadHolder); err != nil {
			return backend.SessionResult{}, fmt.Errorf("advisorylock: applying the dead-holder settings: %w", err)
		}
	}
	return backend.SessionResult{OK: true}, nil
}

// noRowAnswers is nil when no row from a session statement is its answer
// (a miss); when ctx ended it is no answer (see explain), and the guard
// then discards the connection, which frees whatever was granted.
func (p *postgres) noRowAnswers(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return p.explain(ctx, sql.ErrNoRows)
}

// ClaimWindow records the window of a lock the session was just granted,
// or unlocks it when an earlier window is open (see pgClaimWindow).
func (p *postgres) ClaimWindow(ctx context.Context, conn *sql.Conn, key int64, name string, window time.Duration) (backend.SessionResult, error) {
	q, args, err := p.statement(pgClaimWindow, key, name, dbutil.TTLMillis(window))
	if err != nil {
		return backend.SessionResult{}, err
	}
	var r backend.SessionResult
	err = conn.QueryRowContext(ctx, q, args...).Scan(&r.Session)
	if errors.Is(err, sql.ErrNoRows) {
		return backend.SessionResult{}, p.noRowAnswers(ctx)
	}
	r.OK = err == nil
	return r, err
}

// WindowLeft asks the database how long key's window stays open.
func (p *postgres) WindowLeft(ctx context.Context, conn *sql.Conn, key int64) (time.Duration, error) {
	q, args, err := p.statement(pgWindowLeft, key)
	if err != nil {
		return 0, err
	}
	var ms int64
	err = conn.QueryRowContext(ctx, q, args...).Scan(&ms)
	return time.Duration(ms) * time.Millisecond, err
}

// WindowHolder reports the grant whose window on key is open, or nil.
func (p *postgres) WindowHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	h := &backend.Holder{Backend: p.Name(), Key: key}
	found, err := p.queryRow(ctx, db, pgWindowHolder, []any{key}, &h.Name, &h.PID, &h.Application, &h.ClientAddr, &h.Since, &h.ExpiresAt)
	if !found || err != nil {
		return nil, err
	}
	return h, nil
}

// renewLeaseWindow and releaseLeaseWindow are RenewLease's and
// ReleaseLease's statements for a lease with a window.
func (p *postgres) renewLeaseWindow(ctx context.Context, db backend.DB, r backend.LeaseRequest, gen *int64) (bool, error) {
	return p.queryRow(ctx, db, pgRenewLeaseWindow, []any{dbutil.TTLMillis(r.TTL), r.Name, r.Owner, int64(r.Token), dbutil.TTLMillis(r.MinHold)}, gen)
}

func (p *postgres) releaseLeaseWindow(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	return p.exec(ctx, db, pgReleaseLeaseWindow, r.Name, int64(r.Token), dbutil.TTLMillis(r.MinHold))
}
