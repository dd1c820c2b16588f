package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
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

// keyedSQL is a session statement with integer values: the text around
// them, and the same text with $1, $2, … in their places.
type keyedSQL struct {
	parts  []string
	params string
}

func keyed(parts ...string) keyedSQL {
	var b strings.Builder
	for i, part := range parts {
		if i > 0 {
			b.WriteString("$" + strconv.Itoa(i))
		}
		b.WriteString(part)
	}
	return keyedSQL{parts: parts, params: b.String()}
}

var (
	// The try and the unlock are sent with Exec: the row count is the
	// answer (1: granted, or released), which spares database/sql and the
	// driver a result set (about ten allocations a statement) and, when
	// the context can end, database/sql a goroutine that watches it.
	sqlTryLock = keyed("SELECT WHERE pg_try_advisory_lock(", ")")
	sqlUnlock  = keyed("SELECT WHERE pg_advisory_unlock(", ")")
	sqlWait    = keyed("SELECT pg_advisory_lock(", ") IS NULL, pg_backend_pid() FROM (SELECT set_config('lock_timeout', (", ")::int::text, true)) AS bounded")
)

// text returns s with vals: as literals in the text (lib/pq sends a
// statement with arguments as two round trips), or as arguments to the
// constant text (pgx sends them in one, and caches the statement).
func (p *postgres) text(s keyedSQL, vals ...int64) (string, []any) {
	if p.params {
		args := make([]any, len(vals))
		for i, v := range vals {
			args[i] = v
		}
		return s.params, args
	}
	var b strings.Builder
	b.Grow(len(s.params) + 20*len(vals))
	for i, part := range s.parts {
		if i > 0 {
			b.WriteString(strconv.FormatInt(vals[i-1], 10))
		}
		b.WriteString(part)
	}
	return b.String(), nil
}

// rowStatement runs s, one row or none, and reports whether it returned a
// row.
func (p *postgres) rowStatement(ctx context.Context, conn *sql.Conn, s keyedSQL, key int64) (bool, error) {
	q, args := p.text(s, key)
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
	ok, err := p.rowStatement(ctx, conn, sqlTryLock, key)
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
	q, args := p.text(sqlWait, key, max(slice.Milliseconds(), 1))
	var r SessionResult
	var void bool
	err := conn.QueryRowContext(ctx, q, args...).Scan(&void, &r.Session)
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
	ok, err := p.rowStatement(ctx, conn, sqlUnlock, key)
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
	stmt := `SELECT l.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  CASE WHEN a.query LIKE 'SELECT pg\_%advisory\_lock(%' THEN a.query_start ELSE a.backend_start END
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE ` + advisoryWhere(key) + ` ORDER BY l.pid LIMIT 1`
	read := func() (*Holder, error) {
		h := &Holder{Backend: p.Name(), Key: key}
		var since sql.NullTime
		err := p.run(ctx, db, func(on handle) error {
			return on.QueryRowContext(ctx, stmt).Scan(&h.PID, &h.Application, &h.ClientAddr, &since)
		})
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		h.Since = since.Time
		return h, nil
	}
	return bounded(ctx, p, read)
}

// bounded runs f, bounded by ctx even where the driver does not end a
// statement with ctx (see grant). The hot lease steps branch by themselves
// instead, so that pgx pays for no closure.
func bounded[T any](ctx context.Context, p *postgres, f func() (T, error)) (T, error) {
	if p.endsWithContext() {
		return f()
	}
	return within(ctx, f, nil, nil)
}

// ---------------------------------------------------------------------------
// Leases and fences: the LeaseStore half of the PostgreSQL backend.
//
// A LeaseLock is a row in advisorylock_leases and a Fence a row in
// advisorylock_fences. Every lease time comes from the database clock
// (now()), never from the application: LeaseRequest.Now is ignored here.
// Each step is one autocommit statement, sent in one round trip: with
// lib/pq (and unknown drivers) the values are written into the SQL text,
// strings through quoteLiteral, because lib/pq sends a query with
// arguments as two round trips; with pgx the text is constant and the
// values go as $n arguments, because pgx caches one prepared statement per
// SQL text and distinct texts would churn its cache.

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

// The lease statements. Each %s is a value written by pgSQL: a literal or
// a $n argument.
const (
	// The upsert bumps the generation only if the row is free or expired;
	// no row returned means held. A conflicting concurrent acquire waits
	// for the row lock and then sees the winner's row, so one name is
	// never granted twice.
	pgAcquireLease = `INSERT INTO advisorylock_leases AS l (name, owner, generation, acquired_at, expires_at)
VALUES (%s, %s, 1, now(), now() + %s * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, generation = l.generation + 1,
	acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
WHERE l.owner IS NULL OR l.expires_at <= now()
RETURNING generation`
	pgRenewLease = `UPDATE advisorylock_leases SET expires_at = now() + %s * interval '1 millisecond'
WHERE name = %s AND owner = %s AND generation = %s AND expires_at > now()
RETURNING generation`
	// The release need not be durable (a lost release only means waiting
	// for the expiry), so it commits without waiting for the WAL flush:
	// synchronous_commit is set for its own transaction, in a subquery that
	// runs before the row is written. A grant is its generation, so the
	// release names it alone; an acquire whose outcome was unknown has none
	// and frees whatever its owner label, unique per acquire, holds.
	pgReleaseLease = `UPDATE advisorylock_leases SET owner = NULL, expires_at = least(expires_at, now())
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = %s AND generation = %s AND owner IS NOT NULL`
	pgAbandonLease = `UPDATE advisorylock_leases SET owner = NULL, expires_at = least(expires_at, now())
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = %s AND owner = %s`
	pgLeaseHolder = `SELECT owner, generation, acquired_at, expires_at FROM advisorylock_leases
WHERE name = %s AND owner IS NOT NULL AND expires_at > now()`
	// The upsert stores the token only if it is not lower than the stored
	// one; no row returned means stale. It locks the row either way, so the
	// caller's write commits before any later admit of the resource.
	pgAdmitToken = `INSERT INTO advisorylock_fences AS f (resource, token) VALUES (%s, %s)
ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING token`
	pgHighestToken = `SELECT token FROM advisorylock_fences WHERE resource = %s`
)

// pgSQL writes the values of one statement: as literals, or (params) as
// $n arguments collected in args. It lives on its caller's stack, and so
// do its arguments: a slice it appended to would be on the heap.
type pgSQL struct {
	params bool
	n      int
	vals   [4]any // as many as a statement has
	err    error
}

func (p *postgres) sql() pgSQL { return pgSQL{params: p.params} }

// args returns the $n arguments written so far.
func (q *pgSQL) args() []any { return q.vals[:q.n] }

// text writes a string value.
func (q *pgSQL) text(s string) string {
	if q.params {
		q.vals[q.n] = s
		q.n++
		return placeholder(q.n, "::text")
	}
	lit, err := quoteLiteral(s)
	if err != nil && q.err == nil {
		q.err = err
	}
	return lit
}

// int writes an integer value.
func (q *pgSQL) int(v int64) string {
	if q.params {
		q.vals[q.n] = v
		q.n++
		return placeholder(q.n, "::bigint")
	}
	return strconv.FormatInt(v, 10)
}

// placeholder is $n with a cast; the first few are made once.
func placeholder(n int, cast string) string {
	if n < len(placeholders) {
		switch cast {
		case "::text":
			return placeholders[n][0]
		case "::bigint":
			return placeholders[n][1]
		}
	}
	return "$" + strconv.Itoa(n) + cast
}

var placeholders = func() (p [8][2]string) {
	for n := range p {
		p[n] = [2]string{"$" + strconv.Itoa(n) + "::text", "$" + strconv.Itoa(n) + "::bigint"}
	}
	return p
}()

// stmt fills format with the values written so far. With arguments the
// text depends on format alone, so it is made once per format.
func (q *pgSQL) stmt(format string, vals ...string) string {
	if !q.params {
		return fill(format, vals)
	}
	if t, ok := paramTexts.Load(format); ok {
		return t.(string)
	}
	t := fill(format, vals)
	paramTexts.Store(format, t)
	return t
}

// paramTexts caches the $n text of each statement format.
var paramTexts sync.Map

// fill writes vals into format's %s verbs, in order, in one allocation;
// the statement formats use no other verb.
func fill(format string, vals []string) string {
	size := len(format)
	for _, v := range vals {
		size += len(v)
	}
	var b strings.Builder
	b.Grow(size)
	for _, v := range vals {
		before, after, _ := strings.Cut(format, "%s")
		b.WriteString(before)
		b.WriteString(v)
		format = after
	}
	b.WriteString(format)
	return b.String()
}

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
	q := p.sql()
	stmt := q.stmt(pgAcquireLease, q.text(r.Name), q.text(r.Owner), q.int(ttlMillis(r.TTL)))
	g, found, err := p.grant(ctx, db, q, stmt, r)
	if err == nil && !found {
		err = ErrNotAcquired
	}
	return g, err
}

// RenewLease extends the lease by its TTL from the database's now, if
// r.Owner and r.Token still hold it unexpired; ErrLeaseLost otherwise.
func (p *postgres) RenewLease(ctx context.Context, db DB, r LeaseRequest) (LeaseGrant, error) {
	if r.Kind != KindLease {
		return LeaseGrant{}, errNoLockRows
	}
	q := p.sql()
	stmt := q.stmt(pgRenewLease, q.int(ttlMillis(r.TTL)), q.text(r.Name), q.text(r.Owner), q.int(r.Token.Int64()))
	g, found, err := p.grant(ctx, db, q, stmt, r)
	if err == nil && !found {
		err = fmt.Errorf("%w: it expired or was taken over", ErrLeaseLost)
	}
	return g, err
}

// ReleaseLease frees the lease if grant r.Token still holds it (with
// Token 0, whatever r.Owner holds); the row stays, so the generation never
// goes down.
func (p *postgres) ReleaseLease(ctx context.Context, db DB, r LeaseRequest) error {
	if r.Kind != KindLease {
		return errNoLockRows
	}
	q := p.sql()
	var stmt string
	if r.Token == 0 {
		stmt = q.stmt(pgAbandonLease, q.text(r.Name), q.text(r.Owner))
	} else {
		stmt = q.stmt(pgReleaseLease, q.text(r.Name), q.int(r.Token.Int64()))
	}
	if q.err != nil {
		return q.err
	}
	if !p.endsWithContext() { // see grant
		_, err := within(ctx, func() (struct{}, error) { return struct{}{}, p.release(ctx, db, nil, stmt) }, nil, nil)
		return err
	}
	return p.release(ctx, db, q.args(), stmt)
}

func (p *postgres) release(ctx context.Context, db DB, args []any, stmt string) error {
	return p.run(ctx, db, func(h handle) error {
		_, err := h.ExecContext(ctx, stmt, args...)
		return err
	})
}

// LeaseHolder reports the lease's holder, or nil when it is free or
// expired by the database clock.
func (p *postgres) LeaseHolder(ctx context.Context, db DB, r LeaseRequest) (*Holder, error) {
	if r.Kind != KindLease {
		return nil, errNoLockRows
	}
	q := p.sql()
	stmt := q.stmt(pgLeaseHolder, q.text(r.Name))
	if q.err != nil {
		return nil, q.err
	}
	return bounded(ctx, p, func() (*Holder, error) {
		h := &Holder{Name: r.Name, Backend: p.Name(), Key: r.Key}
		var gen int64
		err := p.run(ctx, db, func(on handle) error {
			return on.QueryRowContext(ctx, stmt, q.args()...).Scan(&h.Owner, &gen, &h.Since, &h.ExpiresAt)
		})
		if errors.Is(err, sql.ErrNoRows) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		h.Token = FencingToken(gen)
		return h, nil
	})
}

// AdmitToken stores token as resource's highest in tx if it is not lower
// than the stored one; otherwise it reads the highest and returns a
// *StaleTokenError. The table must exist: a missing table aborts tx
// (NewFence creates it).
func (p *postgres) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token FencingToken) error {
	q := p.sql()
	stmt := q.stmt(pgAdmitToken, q.text(resource), q.int(token.Int64()))
	if q.err != nil {
		return q.err
	}
	var got int64
	err := tx.QueryRowContext(ctx, stmt, q.args()...).Scan(&got)
	if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	q = p.sql()
	stmt = q.stmt(pgHighestToken, q.text(resource))
	var highest int64
	if err := tx.QueryRowContext(ctx, stmt, q.args()...).Scan(&highest); err != nil {
		return fmt.Errorf("advisorylock: reading the highest token after a stale one: %w", err)
	}
	return &StaleTokenError{Resource: resource, Token: token, Highest: FencingToken(highest)}
}

// grant runs an acquire or renew statement and reads the grant it
// returns; found is false when it returned no row. Where the driver does
// not end a statement with ctx (lib/pq), the step is bounded by ctx all
// the same (see within): a lease step stuck on a dead network must not
// hold an acquire, a renewal or a release. The branch is here, not in a
// helper, so that the drivers that need no bound pay for no closure; the
// bounded drivers get literals, so the closure passes no arguments (which
// would move every statement's arguments to the heap).
func (p *postgres) grant(ctx context.Context, db DB, q pgSQL, stmt string, r LeaseRequest) (LeaseGrant, bool, error) {
	if q.err != nil {
		return LeaseGrant{}, false, q.err
	}
	if !p.endsWithContext() {
		type granted struct {
			g     LeaseGrant
			found bool
		}
		a, err := within(ctx, func() (granted, error) {
			g, found, err := p.grantNow(ctx, db, nil, stmt, r)
			return granted{g, found}, err
		}, nil, nil)
		return a.g, a.found, err
	}
	return p.grantNow(ctx, db, q.args(), stmt, r)
}

func (p *postgres) grantNow(ctx context.Context, db DB, args []any, stmt string, r LeaseRequest) (LeaseGrant, bool, error) {
	var gen int64
	err := p.run(ctx, db, func(h handle) error {
		return h.QueryRowContext(ctx, stmt, args...).Scan(&gen)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return LeaseGrant{}, false, nil
	}
	if err != nil {
		return LeaseGrant{}, false, err
	}
	_, expires := leaseTimes(r) // the database's clock decides; this is the local estimate
	return LeaseGrant{Token: FencingToken(gen), ExpiresAt: time.UnixMilli(expires)}, true, nil
}

// run runs stmt where lease statements run (see onHandle). If a table is
// missing it creates the tables and runs stmt again, once. A name too long
// for the primary key's index is reported as ErrUnsupported, and no rows
// from a statement whose context ended as an unknown outcome.
func (p *postgres) run(ctx context.Context, db DB, stmt func(h handle) error) error {
	h, done, err := onHandle(ctx, db)
	if err != nil {
		return err
	}
	defer done()
	err = stmt(h)
	if sqlState(err) == "42P01" { // undefined_table
		if err := createPostgresTables(ctx, db); err != nil {
			return err
		}
		err = stmt(h)
	}
	if sqlState(err) == "54000" { // program_limit_exceeded: the index row is too big
		return fmt.Errorf("%w: the name is too long to be a PostgreSQL index key (a btree entry holds about 2.7kB after compression): %w", ErrUnsupported, err)
	}
	if errors.Is(err, sql.ErrNoRows) && ctx.Err() != nil {
		// database/sql can report a query cut short by its context as
		// no rows (lib/pq#874; seen with pgx in a network cut): that
		// answers nothing, and "no row" means "held" or "free" here.
		return fmt.Errorf("advisorylock: context ended while the statement ran, outcome unknown: %w", context.Cause(ctx))
	}
	return unreachable(err)
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
	stmts := append([]string{schemaLock}, postgresTables...)
	for _, s := range stmts {
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
// trip. Fence calls it: Admit runs in the caller's transaction, where a
// missing table cannot be created and retried. Where the tables exist it
// writes nothing, so it works through a statement-mode pooler too.
func (p *postgres) ensureSchema(ctx context.Context, db DB) error {
	var exist bool
	err := p.run(ctx, db, func(h handle) error {
		return h.QueryRowContext(ctx, "SELECT to_regclass('advisorylock_leases') IS NOT NULL AND to_regclass('advisorylock_fences') IS NOT NULL").Scan(&exist)
	})
	if err != nil || exist {
		return err
	}
	return createPostgresTables(ctx, db)
}
