package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Postgres returns the PostgreSQL backend: Lock is a session advisory lock
// on a pinned connection, LeaseLock a row in advisorylock_leases. It works
// with lib/pq, pgx's stdlib driver and any driver that speaks to
// PostgreSQL.
//
// Every lock step is one round trip. lib/pq sends a query with arguments
// as two round trips, so keys go into the SQL text as integer literals
// there; pgx sends arguments in one round trip and caches statements, so
// there the SQL text stays constant and keys go as arguments (with none,
// pgx would send the text over the simple protocol, parsed and planned
// anew each time: measured about 8% slower per lock step).
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

// endsWithContext: pgx closes its socket when a statement's context ends,
// so its statements need no bounding (see within in conn_guard.go).
func (p *postgres) endsWithContext() bool { return p.params }

func (p *postgres) isServedBy(ctx context.Context, conn *sql.Conn) bool {
	var v string
	return conn.QueryRowContext(ctx, "SELECT version()").Scan(&v) == nil && strings.Contains(v, "PostgreSQL")
}

// The session statements. Texts are constant: with pgx the key goes as an
// argument (pgx caches one prepared statement per text), with lib/pq
// statement writes it into the text as a literal (see statement).
//
// The try and the unlock are sent with Exec: the row count is the answer
// (1: granted, or released), which spares database/sql and the driver a
// result set.
const (
	pgTryLock = `SELECT WHERE pg_try_advisory_lock($1::bigint)`
	pgUnlock  = `SELECT WHERE pg_advisory_unlock($1::bigint)`
	pgWait    = `SELECT pg_advisory_lock($1::bigint) IS NULL, pg_backend_pid() FROM (SELECT set_config('lock_timeout', $2::bigint::text, true)) AS bounded`
)

// statement returns text and its arguments in the form the driver sends
// in one round trip: pgx sends arguments with the statement and caches it
// by its text, so they stay arguments; lib/pq (and unknown drivers) send a
// statement with arguments as two round trips, so they are written into
// the text as literals.
func (p *postgres) statement(text string, args ...any) (string, []any, error) {
	if p.params {
		return text, args, nil
	}
	q, err := inline(text, args)
	return q, nil, err
}

// inline writes args into text's $n placeholders as SQL literals: an
// int64 in decimal (in parentheses when negative, so that a cast binds to
// the whole number), a string through quoteLiteral. The statement texts
// hold no other '$'.
func inline(text string, args []any) (string, error) {
	var b strings.Builder
	for {
		i := strings.IndexByte(text, '$')
		if i < 0 {
			b.WriteString(text)
			return b.String(), nil
		}
		j := i + 1
		for j < len(text) && '0' <= text[j] && text[j] <= '9' {
			j++
		}
		n, _ := strconv.Atoi(text[i+1 : j])
		if n < 1 || n > len(args) {
			return "", fmt.Errorf("advisorylock: statement placeholder %q has no argument", text[i:j])
		}
		lit, err := literal(args[n-1])
		if err != nil {
			return "", err
		}
		b.WriteString(text[:i])
		b.WriteString(lit)
		text = text[j:]
	}
}

// literal writes one statement argument as SQL text.
func literal(v any) (string, error) {
	switch v := v.(type) {
	case int64:
		if v < 0 {
			return "(" + strconv.FormatInt(v, 10) + ")", nil
		}
		return strconv.FormatInt(v, 10), nil
	case string:
		return quoteLiteral(v)
	}
	return "", fmt.Errorf("advisorylock: cannot write a %T into SQL text", v)
}

// rowStatement runs text on conn and reports whether it returned a row.
func (p *postgres) rowStatement(ctx context.Context, conn *sql.Conn, text string, key int64) (bool, error) {
	q, args, err := p.statement(text, key)
	if err != nil {
		return false, err
	}
	res, err := conn.ExecContext(ctx, q, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// TryLockSession reports no session: the statement asks only for the
// lock, and UnlockSession finds out by itself when a pooler moved the
// connection to another server session.
func (p *postgres) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error) {
	ok, err := p.rowStatement(ctx, conn, pgTryLock, key)
	return SessionResult{OK: ok}, err
}

// WaitLockSession waits in pg_advisory_lock bounded by a transaction-local
// lock_timeout, set in a subquery that runs first: one statement, one round
// trip, and the setting ends with the statement's implicit transaction
// while the session-level lock, if granted, stays.
//
// A lock_timeout (55P03) leaves the connection healthy, but it is not by
// itself a miss: when the lock is granted at the moment the timeout fires,
// PostgreSQL keeps the grant and still fails the statement (its lock error
// cleanup remembers a lock it was granted while giving up). So a timeout
// costs one more round trip, to ask whether the session holds the lock;
// if it does, that is a grant.
func (p *postgres) WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (SessionResult, error) {
	q, args, err := p.statement(pgWait, key, max(slice.Milliseconds(), 1))
	if err != nil {
		return SessionResult{}, err
	}
	var r SessionResult
	var void bool
	err = conn.QueryRowContext(ctx, q, args...).Scan(&void, &r.Session)
	if sqlState(err) == "55P03" {
		return p.holds(ctx, conn, key)
	}
	if err != nil {
		return SessionResult{}, err
	}
	r.OK = true
	return r, nil
}

// UnlockSession releases key. When the session did not hold it, a second
// round trip finds out why: a session that holds it now, or another
// session that holds it, means the connection's statements reach more
// than one server session (a transaction-mode pooler), reported as
// ErrTransactionPooler; nobody holding it is OK false.
func (p *postgres) UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error) {
	ok, err := p.rowStatement(ctx, conn, pgUnlock, key)
	if ok || err != nil {
		return SessionResult{OK: ok}, err
	}
	// Rare, so written with literals for every driver.
	where := advisoryWhere(key)
	var here, anywhere bool
	var r SessionResult
	err = conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT FROM pg_locks l WHERE l.pid = pg_backend_pid() AND "+where+
		"), EXISTS (SELECT FROM pg_locks l WHERE "+where+"), pg_backend_pid()").Scan(&here, &anywhere, &r.Session)
	switch {
	case err != nil:
		return r, err
	case here:
		return r, fmt.Errorf("%w: the unlock ran on a server session that did not hold the lock, and the next statement reached server session %d, which does", ErrTransactionPooler, r.Session)
	case anywhere:
		return r, fmt.Errorf("%w: the unlock ran on a server session that did not hold the lock, and another server session holds it", ErrTransactionPooler)
	}
	return r, nil
}

// advisoryWhere matches a granted advisory lock on a bigint key in pg_locks:
// classid holds the high 32 bits, objid the low 32 bits, objsubid is 1.
func advisoryWhere(key int64) string {
	return fmt.Sprintf("l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.classid = %d AND l.objid = %d AND l.objsubid = 1",
		uint32(uint64(key)>>32), uint32(uint64(key)))
}

func (p *postgres) HoldsSession(ctx context.Context, conn *sql.Conn, key int64) (bool, error) {
	r, err := p.holds(ctx, conn, key)
	return r.OK, err
}

// holds reports whether conn's session holds key, and which session it is.
func (p *postgres) holds(ctx context.Context, conn *sql.Conn, key int64) (SessionResult, error) {
	var r SessionResult
	err := conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "+advisoryWhere(key)+" AND l.pid = pg_backend_pid()), pg_backend_pid()").Scan(&r.OK, &r.Session)
	return r, err
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
	q := `SELECT l.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  CASE WHEN a.query LIKE 'SELECT pg\_%advisory\_lock(%' THEN a.query_start ELSE a.backend_start END
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE ` + advisoryWhere(key) + ` ORDER BY l.pid LIMIT 1`
	h := &Holder{Backend: p.Name(), Key: key}
	var since sql.NullTime
	found, err := p.queryRow(ctx, db, q, nil, &h.PID, &h.Application, &h.ClientAddr, &since)
	if !found || err != nil {
		return nil, err
	}
	h.Since = since.Time
	return h, nil
}

// ---------------------------------------------------------------------------
// Leases and fences: the LeaseStore half of the PostgreSQL backend.
//
// A LeaseLock is a row in advisorylock_leases and a Fence a row in
// advisorylock_fences. Every lease time comes from the database clock
// (now()), never from the application: LeaseRequest.Now is ignored here.
// Each step is one autocommit statement, sent in one round trip (see
// statement).

// postgresTables is the DDL of the lease and fence tables, one statement
// each. Operators query these tables: their names and columns are part of
// the contract.
var postgresTables = []string{
	`CREATE TABLE IF NOT EXISTS advisorylock_leases (
	name        text        PRIMARY KEY,
	owner       text,                   -- NULL when free
	generation  bigint      NOT NULL,   -- the fencing token of the latest grant
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL
)`,
	`CREATE TABLE IF NOT EXISTS advisorylock_fences (
	resource text   PRIMARY KEY,
	token    bigint NOT NULL            -- the highest token admitted
)`,
}

// schemaLock takes the transaction-scoped advisory lock that serializes
// creating the tables, so that concurrent first uses all succeed. It is a
// two-int4 lock, a key space apart from the bigint keys of Lock names, so
// no Lock can hold it.
var schemaLock = func() string {
	k := uint64(Key("advisorylock:schema"))
	return fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, %d)", int32(k>>32), int32(k))
}()

// Schema returns the DDL of advisorylock_leases and advisorylock_fences.
// PostgreSQL's Lock needs no table.
func (p *postgres) Schema() string {
	return strings.Join(postgresTables, ";\n\n") + ";\n"
}

// The lease statements; see statement for how their arguments are sent.
const (
	// The upsert bumps the generation only if the row is free or expired;
	// no row returned means held. A conflicting concurrent acquire waits
	// for the row lock and then sees the winner's row, so one name is
	// never granted twice.
	pgAcquireLease = `INSERT INTO advisorylock_leases AS l (name, owner, generation, acquired_at, expires_at)
VALUES ($1::text, $2::text, 1, now(), now() + $3::bigint * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, generation = l.generation + 1,
	acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
WHERE l.owner IS NULL OR l.expires_at <= now()
RETURNING generation`
	pgRenewLease = `UPDATE advisorylock_leases SET expires_at = now() + $1::bigint * interval '1 millisecond'
WHERE name = $2::text AND owner = $3::text AND generation = $4::bigint AND expires_at > now()
RETURNING generation`
	// The release need not be durable (a lost release only means waiting
	// for the expiry), so it commits without waiting for the WAL flush:
	// synchronous_commit is set for its own transaction, in a subquery that
	// runs before the row is written. A grant is its generation, so the
	// release names it alone; an acquire whose outcome was unknown has none
	// and frees whatever its owner label, unique per acquire, holds.
	pgReleaseLease = `UPDATE advisorylock_leases SET owner = NULL, expires_at = least(expires_at, now())
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = $1::text AND generation = $2::bigint AND owner IS NOT NULL`
	pgAbandonLease = `UPDATE advisorylock_leases SET owner = NULL, expires_at = least(expires_at, now())
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = $1::text AND owner = $2::text`
	pgLeaseHolder = `SELECT owner, generation, acquired_at, expires_at FROM advisorylock_leases
WHERE name = $1::text AND owner IS NOT NULL AND expires_at > now()`
	// The upsert stores the token only if it is not lower than the stored
	// one; no row returned means stale. It locks the row either way, so the
	// caller's write commits before any later admit of the resource.
	pgAdmitToken = `INSERT INTO advisorylock_fences AS f (resource, token) VALUES ($1::text, $2::bigint)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING token`
	pgHighestToken = `SELECT token FROM advisorylock_fences WHERE resource = $1::text`
)

// quoteLiteral returns s as a PostgreSQL string constant that reads back
// as exactly s whatever standard_conforming_strings says: an escape string
// E'…' in which every backslash and every quote is doubled, so no escape
// sequence can form. The session's client_encoding must be UTF8 (lib/pq
// and pgx insist on it). A NUL byte or invalid UTF-8 is an error: a text
// value cannot hold them.
//
// It is the only way a string reaches SQL text in this package.
func quoteLiteral(s string) (string, error) {
	if strings.IndexByte(s, 0) >= 0 {
		return "", errors.New("advisorylock: a PostgreSQL text value cannot contain a NUL byte")
	}
	if !utf8.ValidString(s) {
		return "", errors.New("advisorylock: a PostgreSQL text value must be valid UTF-8")
	}
	var b strings.Builder
	b.Grow(len(s) + 4)
	b.WriteString(" E'")
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '\'':
			b.WriteByte(c)
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String(), nil
}

// ttlMillis is a lease's TTL as whole milliseconds, at least 1.
func ttlMillis(d time.Duration) int64 { return max(d.Milliseconds(), 1) }

// errNoLockRows refuses KindLock requests: a Lock on PostgreSQL is a
// session lock and keeps no row.
var errNoLockRows = fmt.Errorf("%w: a PostgreSQL Lock is a session lock, not a lease row", ErrUnsupported)

// AcquireLease takes the lease if it is free or expired and returns the
// new generation; ErrNotAcquired if it is held. The grant commits
// durably: a lost grant could hand one token out twice after a crash.
func (p *postgres) AcquireLease(ctx context.Context, db DB, r LeaseRequest) (LeaseGrant, error) {
	if r.Kind != KindLease {
		return LeaseGrant{}, errNoLockRows
	}
	var gen int64
	found, err := p.queryRow(ctx, db, pgAcquireLease, []any{r.Name, r.Owner, ttlMillis(r.TTL)}, &gen)
	if err != nil {
		return LeaseGrant{}, err
	}
	if !found {
		return LeaseGrant{}, ErrNotAcquired
	}
	return p.granted(r, gen), nil
}

// RenewLease extends the lease by its TTL from the database's now, if
// r.Owner and r.Token still hold it unexpired; ErrLeaseLost otherwise.
func (p *postgres) RenewLease(ctx context.Context, db DB, r LeaseRequest) (LeaseGrant, error) {
	if r.Kind != KindLease {
		return LeaseGrant{}, errNoLockRows
	}
	var gen int64
	found, err := p.queryRow(ctx, db, pgRenewLease, []any{ttlMillis(r.TTL), r.Name, r.Owner, r.Token.Int64()}, &gen)
	if err != nil {
		return LeaseGrant{}, err
	}
	if !found {
		return LeaseGrant{}, fmt.Errorf("%w: it expired or was taken over", ErrLeaseLost)
	}
	return p.granted(r, gen), nil
}

// granted is the grant of generation gen. The database's clock decides
// the expiry; ExpiresAt is the local estimate.
func (p *postgres) granted(r LeaseRequest, gen int64) LeaseGrant {
	_, expires := leaseTimes(r)
	return LeaseGrant{Token: FencingToken(gen), ExpiresAt: time.UnixMilli(expires)}
}

// ReleaseLease frees the lease if grant r.Token still holds it (with
// Token 0, whatever r.Owner holds); the row stays, so the generation never
// goes down.
func (p *postgres) ReleaseLease(ctx context.Context, db DB, r LeaseRequest) error {
	if r.Kind != KindLease {
		return errNoLockRows
	}
	if r.Token == 0 {
		return p.exec(ctx, db, pgAbandonLease, r.Name, r.Owner)
	}
	return p.exec(ctx, db, pgReleaseLease, r.Name, r.Token.Int64())
}

// LeaseHolder reports the lease's holder, or nil when it is free or
// expired by the database clock.
func (p *postgres) LeaseHolder(ctx context.Context, db DB, r LeaseRequest) (*Holder, error) {
	if r.Kind != KindLease {
		return nil, errNoLockRows
	}
	h := &Holder{Name: r.Name, Backend: p.Name(), Key: r.Key}
	var gen int64
	found, err := p.queryRow(ctx, db, pgLeaseHolder, []any{r.Name}, &h.Owner, &gen, &h.Since, &h.ExpiresAt)
	if !found || err != nil {
		return nil, err
	}
	h.Token = FencingToken(gen)
	return h, nil
}

// AdmitToken stores token as resource's highest in tx if it is not lower
// than the stored one; otherwise it reads the highest and returns a
// *StaleTokenError. The table must exist: a missing table aborts tx
// (Fence creates it at its first Admit).
func (p *postgres) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token FencingToken) error {
	q, args, err := p.statement(pgAdmitToken, resource, token.Int64())
	if err != nil {
		return err
	}
	var got int64
	err = tx.QueryRowContext(ctx, q, args...).Scan(&got)
	if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	q, args, err = p.statement(pgHighestToken, resource)
	if err != nil {
		return err
	}
	var highest int64
	if err := tx.QueryRowContext(ctx, q, args...).Scan(&highest); err != nil {
		return fmt.Errorf("advisorylock: reading the highest token after a stale one: %w", err)
	}
	return &StaleTokenError{Resource: resource, Token: token, Highest: FencingToken(highest)}
}

// queryRow runs a statement that returns at most one row into dest, on a
// connection of db's (see run); found is false when it returned none.
func (p *postgres) queryRow(ctx context.Context, db DB, text string, args []any, dest ...any) (found bool, err error) {
	q, args, err := p.statement(text, args...)
	if err != nil {
		return false, err
	}
	err = p.run(ctx, db, func(on querier) error {
		return on.QueryRowContext(ctx, q, args...).Scan(dest...)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// exec runs a statement that returns no rows, as queryRow does.
func (p *postgres) exec(ctx context.Context, db DB, text string, args ...any) error {
	q, args, err := p.statement(text, args...)
	if err != nil {
		return err
	}
	return p.run(ctx, db, func(on querier) error {
		_, err := on.ExecContext(ctx, q, args...)
		return err
	})
}

// run runs stmt where statements run (see statementsOn), bounded by ctx
// also where the driver does not end a statement with ctx (see within): a
// lease step stuck on a dead network must not hold an acquire, a renewal
// or a release. If a table is missing it creates the tables and runs stmt
// again, once. A name too long for the primary key's index is reported as
// ErrUnsupported, and no rows from a statement whose context ended as an
// unknown outcome.
func (p *postgres) run(ctx context.Context, db DB, stmt func(on querier) error) error {
	return p.bound(ctx, func() error {
		on, done, err := statementsOn(ctx, db)
		if err != nil {
			return err
		}
		defer done()
		err = stmt(on)
		if sqlState(err) == "42P01" { // undefined_table
			if err := createPostgresTables(ctx, db); err != nil {
				return err
			}
			err = stmt(on)
		}
		return p.explain(ctx, unreachable(err))
	})
}

// explain turns the errors of a lease statement that mean something else
// than they say into what they mean.
func (p *postgres) explain(ctx context.Context, err error) error {
	if sqlState(err) == "54000" { // program_limit_exceeded: the index row is too big
		return fmt.Errorf("%w: the name is too long to be a PostgreSQL index key (a btree entry holds about 2.7kB after compression): %w", ErrUnsupported, err)
	}
	if errors.Is(err, sql.ErrNoRows) && ctx.Err() != nil {
		// database/sql can report a query cut short by its context as
		// no rows (lib/pq#874; seen with pgx in a network cut): that
		// answers nothing, and "no row" means "held" or "free" here.
		return fmt.Errorf("advisorylock: context ended while the statement ran, outcome unknown: %w", context.Cause(ctx))
	}
	return err
}

// bound runs f, which talks to the database, bounded by ctx: as it is
// where the driver ends a statement when its context ends (pgx), else
// through within (lib/pq).
func (p *postgres) bound(ctx context.Context, f func() error) error {
	if p.endsWithContext() {
		return f()
	}
	_, err := within(ctx, func() (struct{}, error) { return struct{}{}, f() }, nil, nil)
	return err
}

// createPostgresTables creates the tables in one transaction, serialized
// with every other creator by a transaction-scoped advisory lock, so that
// concurrent first uses all succeed.
func createPostgresTables(ctx context.Context, db DB) error {
	conn, err := takeConn(ctx, db)
	if err != nil {
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	defer tx.Rollback()
	for _, s := range append([]string{schemaLock}, postgresTables...) {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("advisorylock: creating tables: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	return nil
}

// ensureSchema creates the tables unless they exist, which costs one round
// trip. Fence calls it before its first Admit, which runs in the caller's
// transaction, where a missing table cannot be created and retried. Where
// the tables exist it writes nothing, so it works through a
// statement-mode pooler too.
func (p *postgres) ensureSchema(ctx context.Context, db DB) error {
	var exist bool
	_, err := p.queryRow(ctx, db, "SELECT to_regclass('advisorylock_leases') IS NOT NULL AND to_regclass('advisorylock_fences') IS NOT NULL", nil, &exist)
	if err != nil || exist {
		return err
	}
	return p.bound(ctx, func() error { return createPostgresTables(ctx, db) })
}
