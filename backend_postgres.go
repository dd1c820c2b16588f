package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Postgres returns the PostgreSQL backend: Lock is a session advisory lock
// on a pinned connection, LeaseLock a row in advisorylock_leases. It works
// with lib/pq, pgx's stdlib driver and any driver that speaks to
// PostgreSQL.
//
// Every lock step is one round trip. lib/pq sends a query with arguments
// as two round trips, so keys go into the SQL text as integer literals
// there; pgx sends arguments in one round trip and caches statements, so
// there the SQL text stays constant and keys go as arguments.
func Postgres() Backend { return &postgres{} }

type postgres struct {
	// params sends keys as arguments (pgx) instead of literals (lib/pq and
	// unknown drivers).
	params bool
}

func (p *postgres) Name() string { return "postgres" }

func (p *postgres) forDriver(db DB) Backend {
	return &postgres{params: strings.HasPrefix(driverPkg(db), "github.com/jackc/pgx/")}
}

func (p *postgres) Validate(context.Context, DB) error { return nil }

func (p *postgres) isServedBy(ctx context.Context, conn *sql.Conn) bool {
	var v string
	return conn.QueryRowContext(ctx, "SELECT version()").Scan(&v) == nil && strings.Contains(v, "PostgreSQL")
}

// stmt returns the statement and its arguments: with literals, each %d in
// form takes the next value; with parameters, each %d becomes $n.
func (p *postgres) stmt(form string, vals ...any) (string, []any) {
	if !p.params {
		return fmt.Sprintf(form, vals...), nil
	}
	marks := make([]any, len(vals))
	for i := range vals {
		marks[i] = fmt.Sprintf("$%d", i+1)
	}
	return fmt.Sprintf(strings.ReplaceAll(form, "%d", "%s"), marks...), vals
}

func (p *postgres) sessionStatement(ctx context.Context, conn *sql.Conn, form string, vals ...any) (SessionResult, error) {
	q, args := p.stmt(form, vals...)
	var r SessionResult
	err := conn.QueryRowContext(ctx, q, args...).Scan(&r.OK, &r.Session)
	return r, err
}

func (p *postgres) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error) {
	return p.sessionStatement(ctx, conn, "SELECT pg_try_advisory_lock(%d), pg_backend_pid()", key)
}

// WaitLockSession waits in pg_advisory_lock bounded by a transaction-local
// lock_timeout, set in a subquery that runs first: one statement, one round
// trip, and the setting ends with the statement's implicit transaction
// while the session-level lock, if granted, stays. A lock_timeout (55P03)
// is a definite miss on a healthy connection.
func (p *postgres) WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (SessionResult, error) {
	ms := max(slice.Milliseconds(), 1)
	q, args := p.stmt("SELECT pg_advisory_lock(%d) IS NULL, pg_backend_pid() FROM (SELECT set_config('lock_timeout', (%d)::int::text, true)) AS bounded", key, ms)
	var r SessionResult
	var void bool
	err := conn.QueryRowContext(ctx, q, args...).Scan(&void, &r.Session)
	if err != nil {
		if sqlState(err) == "55P03" {
			return SessionResult{}, nil
		}
		return SessionResult{}, err
	}
	r.OK = true
	return r, nil
}

func (p *postgres) UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error) {
	return p.sessionStatement(ctx, conn, "SELECT pg_advisory_unlock(%d), pg_backend_pid()", key)
}

// advisoryWhere matches a granted advisory lock on a bigint key in pg_locks:
// classid holds the high 32 bits, objid the low 32 bits, objsubid is 1.
func advisoryWhere(key int64) string {
	return fmt.Sprintf("l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.classid = %d AND l.objid = %d AND l.objsubid = 1",
		uint32(uint64(key)>>32), uint32(uint64(key)))
}

func (p *postgres) HoldsSession(ctx context.Context, conn *sql.Conn, key int64) (bool, error) {
	var held bool
	err := conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "+advisoryWhere(key)+" AND l.pid = pg_backend_pid())").Scan(&held)
	return held, err
}

func (p *postgres) SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error) {
	var pid, port int64
	var addr, started string
	err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid(), coalesce(host(inet_server_addr()), ''), coalesce(inet_server_port(), 0), pg_postmaster_start_time()::text").Scan(&pid, &addr, &port, &started)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d@%s:%d/%s", pid, addr, port, started), nil
}

// SessionHolder reads pg_locks joined with pg_stat_activity. Since is when
// the holder's acquire statement started while that is still its latest
// statement, and otherwise its session's start (an earlier bound).
func (p *postgres) SessionHolder(ctx context.Context, db DB, key int64) (*Holder, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPoolUnavailable, err)
	}
	defer conn.Close()
	h := Holder{Backend: p.Name(), Key: key}
	var since sql.NullTime
	err = conn.QueryRowContext(ctx, `SELECT l.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  CASE WHEN a.query LIKE 'SELECT pg\_%advisory\_lock(%' THEN a.query_start ELSE a.backend_start END
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE `+advisoryWhere(key)+` ORDER BY l.pid LIMIT 1`).Scan(&h.PID, &h.Application, &h.ClientAddr, &since)
	if err == sql.ErrNoRows {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	h.Since = since.Time
	return &h, nil
}
