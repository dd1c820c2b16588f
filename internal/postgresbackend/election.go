package postgresbackend

import (
	"context"
	"database/sql"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Elections on PostgreSQL. The leader holds the session lock of the
// election's name; right after the grant its session records the term in
// a row of advisorylock_elections, in one statement that takes the token
// from the lease token source (see pgNextToken), so terms exceed every
// token issued before them. Leader reads the row, and trusts it only
// while the session that wrote it still holds the lock (pg_locks, which
// every role may read).

// postgresElectionsTable is the DDL of advisorylock_elections.
const postgresElectionsTable = `CREATE TABLE IF NOT EXISTS advisorylock_elections (
	name        text        PRIMARY KEY,
	owner       text        NOT NULL,    -- the leader's label (WithOwner)
	term        bigint      NOT NULL,    -- the fencing token of the latest term
	pid         integer     NOT NULL,    -- the leader's pg_backend_pid()
	application text        NOT NULL,    -- its application_name
	client_addr inet,                    -- its address; NULL over a Unix socket
	since       timestamptz NOT NULL     -- the term's start
)`

// The election statements. $1 is the name; $2 the owner (BeginTerm) or
// the key (TermHolder).
const (
	// pgBeginTerm records a new term; the term never goes below the
	// row's own plus one, should the timeline ever restart (pg_upgrade).
	pgBeginTerm = `INSERT INTO advisorylock_elections AS e (name, owner, term, pid, application, client_addr, since)
VALUES ($1::text, $2::text, ` + pgNextToken + `, pg_backend_pid(), current_setting('application_name'), inet_client_addr(), now())
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, term = greatest(e.term + 1, EXCLUDED.term), pid = EXCLUDED.pid,
	application = EXCLUDED.application, client_addr = EXCLUDED.client_addr, since = EXCLUDED.since
RETURNING term`
	pgTermHolder = `SELECT e.owner, e.term, e.pid, e.application, coalesce(host(e.client_addr), ''), e.since
FROM advisorylock_elections e
WHERE e.name = $1::text AND EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = e.pid
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = (($2::bigint >> 32) & 4294967295)::oid AND l.objid = ($2::bigint & 4294967295)::oid AND l.objsubid = 1)`
	// pgEndTerm marks a resigning leader's term ended (see EndTerm).
	pgEndTerm        = `UPDATE advisorylock_elections SET pid = 0 WHERE name = $1::text AND term = $2::bigint AND pid = pg_backend_pid()`
	pgElectionsExist = `SELECT to_regclass('advisorylock_elections') IS NOT NULL AND to_regclass('advisorylock_token_seq') IS NOT NULL`
)

// PrepareElections creates the tables (advisorylock_elections among
// them) unless advisorylock_elections and the token sequence exist, once
// per *sql.DB. Where they exist (say, created by an administrator from
// Schema) it writes nothing.
func (p *postgres) PrepareElections(ctx context.Context, db backend.DB) error {
	_, err := dbutil.CachedVerdict(ctx, db, "postgres elections", func(ctx context.Context) (struct{}, error) {
		var exist bool
		if _, err := p.queryRow(ctx, db, pgElectionsExist, nil, &exist); err != nil || exist {
			return struct{}{}, err
		}
		return struct{}{}, p.bound(ctx, func() error { return upgradePostgresSchema(ctx, db) })
	})
	return err
}

// BeginTerm records a new term of name, led by owner, on conn, whose
// session holds the election's lock (see pgBeginTerm). On a hot standby
// the write fails: that is an error matching backend.ErrUnsupported.
func (p *postgres) BeginTerm(ctx context.Context, conn *sql.Conn, key int64, name, owner string) (uint64, error) {
	q, args, err := p.statement(pgBeginTerm, name, owner)
	if err != nil {
		return 0, err
	}
	var term int64
	if err := conn.QueryRowContext(ctx, q, args...).Scan(&term); err != nil {
		return 0, p.explain(ctx, p.onStandby(ctx, conn, err))
	}
	return dbutil.TermToken(term)
}

// TermHolder reports name's latest term while the session that began it
// still holds key's lock, or nil.
func (p *postgres) TermHolder(ctx context.Context, db backend.DB, key int64, name string) (*backend.Holder, error) {
	h := &backend.Holder{Backend: p.Name()}
	var term int64
	found, err := p.queryRow(ctx, db, pgTermHolder, []any{name, key}, &h.Owner, &term, &h.PID, &h.Application, &h.ClientAddr, &h.Since)
	if !found || err != nil {
		return nil, err
	}
	h.Token = uint64(term)
	return h, nil
}

// EndTerm marks term of name ended in its row, on conn, the resigning
// leader's (see termEnder).
func (p *postgres) EndTerm(ctx context.Context, conn *sql.Conn, name string, term uint64) error {
	q, args, err := p.statement(pgEndTerm, name, int64(term))
	if err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, q, args...)
	return err
}
