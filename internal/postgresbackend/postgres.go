// Package postgresbackend is advisorylock's PostgreSQL backend
// (advisorylock.Postgres): a Lock is a session advisory lock on a pinned
// connection (with WithMinHold, its windows are rows of
// advisorylock_windows), a LeaseLock a row in advisorylock_leases. It
// implements the contract of package backend and imports nothing of the
// advisorylock package.
//
// Every lock step is one round trip. pgx sends arguments in one round
// trip and caches statements, so there the SQL text stays constant and
// keys go as arguments (with none, pgx would send the text over the
// simple protocol, parsed and planned anew each time). lib/pq sends a
// query with arguments as two round trips, so keys go into the SQL text
// as integer literals there (and for unknown drivers), except in lib/pq's
// try and unlock, which are prepared once per connection (see
// dbutil.Prepared), and in a lease's steps, prepared once per session by
// name (see pgSteps).
package postgresbackend

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// New returns the PostgreSQL backend (advisorylock.Postgres): a
// SessionLocker of advisory locks and a LeaseStore of rows, with the
// optional capabilities asserted below.
func New() backend.Backend { return &postgres{} }

type postgres struct {
	// params sends keys as arguments (pgx) instead of literals (lib/pq and
	// unknown drivers).
	params bool
	// prepared keeps lib/pq's try and unlock prepared per connection, and
	// knows where its lease steps are (see pgSteps); nil for other drivers.
	prepared *dbutil.Prepared
	// tryLock is the try statement: pgTryLock, or pgTryLockMarked with
	// the marker of a Lock's dead-holder settings (see forLock); whyMissed
	// is the question a try that returned no row asks.
	tryLock, whyMissed string
	// deadHolder is the statement that applies those settings to a
	// session, "" for none; mark is the marker it sets (0 for none).
	deadHolder string
	mark       int64
	// shared takes, waits for, checks and releases keys in shared mode
	// (see Shared).
	shared bool
}

// The capabilities the PostgreSQL backend has, each an interface of
// package backend that a third party's backend may implement too.
var (
	_ backend.Validator             = (*postgres)(nil)
	_ backend.Recognizer            = (*postgres)(nil)
	_ backend.Configurer            = (*postgres)(nil)
	_ backend.SessionIdentifier     = (*postgres)(nil)
	_ backend.TermKeeper            = (*postgres)(nil)
	_ backend.TxLocker              = (*postgres)(nil)
	_ backend.SharedSessionLocker   = (*postgres)(nil)
	_ backend.WindowedSessionLocker = (*postgres)(nil)
	_ backend.SlotLocker            = (*postgres)(nil)
	_ backend.SetLocker             = (*postgres)(nil)
	_ backend.MultiplexLocker       = (*postgres)(nil)
	_ backend.ReleaseSignaler       = (*postgres)(nil)
	_ backend.TableChecker          = (*postgres)(nil)
	_ backend.TokenAdmitter         = (*postgres)(nil)
	_ backend.RunRecorder           = (*postgres)(nil)
	_ backend.ReleaseListener       = (*postgres)(nil)
	_ backend.LeaseSleeper          = (*postgres)(nil)
	_ backend.SharedRowStore        = (*postgres)(nil)
)

func (p *postgres) Name() string { return "postgres" }

// Configure returns a copy of p with the statement forms of db's driver
// (see forDB) and the settings for the sessions a Lock pins (see
// forLock).
func (p *postgres) Configure(db backend.DB, deadHolder time.Duration, serverChecks bool) backend.Backend {
	return p.forDB(db).forLock(deadHolder, serverChecks)
}

// forDB returns a copy of p with the statement forms of db's driver:
// bound parameters on pgx, statements prepared once per session on
// lib/pq.
func (p *postgres) forDB(db backend.DB) *postgres {
	c := *p
	pkg := dbutil.DriverPkg(db)
	c.params = strings.HasPrefix(pkg, "github.com/jackc/pgx/")
	if pkg == "github.com/lib/pq" {
		c.prepared = dbutil.PreparedOf(db)
	}
	return &c
}

// Shared returns p in shared mode, for RLock: the same statements
// (and the same one round trip per step) with pg_try_advisory_lock_shared,
// pg_advisory_lock_shared and pg_advisory_unlock_shared, and a keep-alive
// that looks for the session's ShareLock in pg_locks.
func (p *postgres) Shared() backend.SessionLocker {
	c := *p
	c.shared = true
	if c.tryLock == "" { // not configured: a backend used outside a Lock
		c.tryLock, c.whyMissed = pgTryLock, pgWhyMissed
	}
	c.tryLock = strings.Replace(c.tryLock, "pg_try_advisory_lock(", "pg_try_advisory_lock_shared(", 1)
	return &c
}

// EndWait has nothing to let go of: an advisory lock wait that ends
// without the lock leaves nothing on the session.
func (p *postgres) EndWait(context.Context, *sql.Conn, int64) error { return nil }

// lockMode is the pg_locks mode of p's locks.
func (p *postgres) lockMode() string {
	if p.shared {
		return "ShareLock"
	}
	return "ExclusiveLock"
}

// forLock returns a copy of p for one Lock whose sessions get the
// dead-holder settings of d (WithDeadHolderTimeout): TCP keepalives and a
// TCP user timeout that make the server end a session within about d once
// its client has vanished without closing the socket (a host powered off,
// a blackhole), and idle_session_timeout = 0 (an idle lock holder is not
// idle). d = 0 leaves the server's settings.
//
// The kernel gives up on an idle connection after the keepalive idle time
// plus the probes, or, with a user timeout, at the first probe after that
// timeout: with idle d/4, interval d/8, 4 probes and a user timeout of
// 3d/4, that is between 3d/4 and d (seconds are whole, at least 1).
//
// A session keeps the settings (and the marker advisorylock.dead_holder,
// a custom setting any role may set) when it goes back to the pool, where
// shorter keepalives are harmless, so only a session's first grant sends
// them: the try reads the marker, and a grant on a session without it
// costs two more round trips (see TryLockSession). Sending the settings
// with every try would cost lib/pq, which sends the statement's text each
// time, their parsing at every try; reading the marker costs less.
//
// With the server checks off (WithServerChecks(false): go-sqlmock, or an
// operator who knows the topology) a missed try asks nothing, so the
// settings go with every try instead (pgTryLockInline), and a standby is
// not refused.
func (p *postgres) forLock(d time.Duration, serverChecks bool) *postgres {
	c := *p
	c.tryLock, c.whyMissed, c.deadHolder = pgTryLock, pgWhyMissed, ""
	secs := func(f time.Duration) int64 { return max(int64(f/time.Second), 1) }
	marker := max((3 * d / 4).Milliseconds(), 1)
	if d > 0 {
		c.mark = marker
	}
	switch {
	case d > 0 && serverChecks:
		c.tryLock = fmt.Sprintf(pgTryLockMarked, secs(d/4), secs(d/8), 4, marker)
		c.whyMissed = fmt.Sprintf(pgWhyMissedMarked, secs(d/4), secs(d/8), 4, marker)
		c.deadHolder = fmt.Sprintf(pgDeadHolder, secs(d/4), secs(d/8), 4, marker)
	case d > 0:
		c.tryLock = fmt.Sprintf(pgTryLockInline, secs(d/4), secs(d/8), 4, marker)
		c.whyMissed = ""
		c.deadHolder = fmt.Sprintf(pgDeadHolder, secs(d/4), secs(d/8), 4, marker)
	case !serverChecks:
		c.whyMissed = ""
	}
	return &c
}

// Validate refuses a PostgreSQL look-alike whose advisory locks exclude
// nothing (CockroachDB accepts pg_try_advisory_lock and grants it to every
// caller at once) and a hot standby, where a lock excludes nothing on the
// primary. It runs once per *sql.DB until it passes (one round trip), so
// Check finds a replica's DSN at start-up. Since a new connection can
// reach another server (DNS moved by a failover), the statements check
// for a standby on every connection too (see TryLockSession).
func (p *postgres) Validate(ctx context.Context, db backend.DB) error {
	var version string
	var standby bool
	if _, err := p.queryRow(ctx, db, "SELECT version(), pg_is_in_recovery()", nil, &version, &standby); err != nil {
		if ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)) {
			err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
		}
		return fmt.Errorf("advisorylock: asking the server's version: %w", err)
	}
	if err := postgresLookAlike(version); err != nil {
		return err
	}
	if standby {
		return errStandby
	}
	return nil
}

// postgresLookAlike refuses the servers that speak PostgreSQL's protocol
// but whose advisory locks are not PostgreSQL's, as version() tells:
// CockroachDB grants them to every caller at once; YugabyteDB
// ("PostgreSQL 11.2-YB-2.20.1.0-b0 …") fails them with "advisory locks
// are not yet implemented" (0A000) before they arrived in 2025, or grants
// them to every caller where yb_silence_advisory_locks_not_supported_error
// is set, and the versions that have them are untested here.
func postgresLookAlike(version string) error {
	switch {
	case strings.Contains(version, "CockroachDB"):
		return fmt.Errorf("%w: the server is CockroachDB (%s), whose advisory locks exclude nothing (every caller is granted them at once); its PostgreSQL compatibility does not extend to locks", backend.ErrUnsupported, version)
	case strings.Contains(version, "-YB-"):
		return fmt.Errorf("%w: the server is YugabyteDB (%s): its advisory locks fail (\"not yet implemented\") or, with yb_silence_advisory_locks_not_supported_error, exclude nothing before 2025 versions, and are untested in those", backend.ErrUnsupported, version)
	}
	return nil
}

// errStandby is the refusal of a server in recovery.
var errStandby = fmt.Errorf("%w: the server is a hot standby (read-only, in recovery): a lock taken there excludes nothing on the primary; point the connection at the primary", backend.ErrUnsupported)

// Traits: pgx closes its socket when a statement's context ends, so its
// statements need no bounding (see dbutil.Within); lib/pq's
// need it. A LeaseLock's rows keep WithMinHold's window in expires_at
// (see minhold.go). A lease's release notifies its
// listeners (see ListenReleases).
func (p *postgres) Traits() backend.Traits {
	return backend.Traits{CancelsPromptly: p.cancelsPromptly(), KeepsWindows: true}
}

// cancelsPromptly reports whether p's driver ends a statement when its
// context ends: pgx.
func (p *postgres) cancelsPromptly() bool { return p.params }

// Recognizes reports a server whose version() names PostgreSQL.
func (p *postgres) Recognizes(ctx context.Context, conn *sql.Conn) bool {
	var v string
	return conn.QueryRowContext(ctx, "SELECT version()").Scan(&v) == nil && strings.Contains(v, "PostgreSQL")
}

// The session statements. Texts are constant: with pgx the key goes as an
// argument (pgx caches one prepared statement per text), with lib/pq
// statement writes it into the text as a literal (see statement).
//
// The try and the unlock are sent with Exec: the row count is the answer
// (1: granted, or released), which spares database/sql and the driver a
// result set. The try is not even attempted on a server in recovery (a
// hot standby, where a lock excludes nothing): CASE evaluates in order.
// pgTryLockMarked also returns no row for a grant on a session that lacks
// the dead-holder settings (its marker is not set), and notes which of
// the two it was in the session setting advisorylock.granted (a miss
// clears it): a try that returns no row asks why (pgWhyMissed), which
// tells a miss from a standby and from such a grant by reading that
// setting, and applies the settings in the same statement, so that the
// session's later tries, misses included, are the bare statement. The
// question costs the same whatever the server holds: it reads no lock
// table (pg_locks is built from every lock on the server, and a replica
// whose tries all miss would read it at every try).
const (
	pgTryLock = `SELECT WHERE CASE WHEN pg_is_in_recovery() THEN false ELSE pg_try_advisory_lock($1::bigint) END`
	// pgTryLockBare is the try on a session that has passed the checks of
	// the Lock's try statement before (see TryLockSession).
	pgTryLockBare       = `SELECT WHERE pg_try_advisory_lock($1::bigint)`
	pgTryLockSharedBare = `SELECT WHERE pg_try_advisory_lock_shared($1::bigint)`
	pgTryLockMarked     = `SELECT WHERE CASE WHEN pg_is_in_recovery() THEN false
	WHEN NOT pg_try_advisory_lock($1::bigint) THEN set_config('advisorylock.granted', '', false) IS NULL
	WHEN current_setting('advisorylock.dead_holder', true) = '%[4]d' THEN true
	ELSE set_config('advisorylock.granted', 'yes', false) IS NULL END`
	// pgTryLockInline sends the dead-holder settings with the try (values
	// as in pgDeadHolderSettings); the second condition is never false, so
	// the lock is tried whichever the planner evaluates first.
	pgTryLockInline = pgTryLock + `
	AND (current_setting('advisorylock.dead_holder', true) = '%[4]d' OR ROW(` + pgDeadHolderSettings + `) IS NOT NULL)`
	// pgWhyMissed and pgWhyMissedMarked answer: in recovery, granted,
	// and (a constant true, or the applied settings) nothing to read.
	pgWhyMissed       = `SELECT pg_is_in_recovery(), false, true`
	pgWhyMissedMarked = `SELECT pg_is_in_recovery(), coalesce(current_setting('advisorylock.granted', true) = 'yes', false),
	ROW(` + pgDeadHolderSettings + `) IS NOT NULL`
	// The dead-holder settings (see forLock), values in order: keepalive
	// idle, interval and count, and the user timeout in milliseconds, which
	// is also the marker. idle_session_timeout exists from PostgreSQL 14.
	pgDeadHolderSettings = `set_config('tcp_keepalives_idle', '%[1]d', false), set_config('tcp_keepalives_interval', '%[2]d', false),
	set_config('tcp_keepalives_count', '%[3]d', false), set_config('tcp_user_timeout', '%[4]d', false),
	CASE WHEN current_setting('idle_session_timeout', true) IS NOT NULL THEN set_config('idle_session_timeout', '0', false) ELSE '' END,
	set_config('advisorylock.dead_holder', '%[4]d', false)`
	pgDeadHolder   = `SELECT ` + pgDeadHolderSettings
	pgUnlock       = `SELECT WHERE pg_advisory_unlock($1::bigint)`
	pgUnlockShared = `SELECT WHERE pg_advisory_unlock_shared($1::bigint)`
	// The wait is three statements in one simple-protocol message (no
	// arguments: pgx sends it as a simple query too), which PostgreSQL runs
	// as one implicit transaction: SET LOCAL bounds the wait by lock_timeout
	// and this statement by statement_timeout, both gone when it ends (the
	// session-level lock, once granted, stays). statement_timeout must be
	// set by a statement of its own: its timer starts with each statement,
	// so a set_config in the locking statement would come too late for a
	// role's or DSN's shorter statement_timeout.
	pgWait       = `SET LOCAL statement_timeout = %d; SET LOCAL lock_timeout = %d; SELECT pg_advisory_lock(%d)`
	pgWaitShared = `SET LOCAL statement_timeout = %d; SET LOCAL lock_timeout = %d; SELECT pg_advisory_lock_shared(%d)`
)

// statement returns text and its arguments in the form the driver sends
// in one round trip: pgx sends arguments with the statement and caches it
// by its text, so they stay arguments; lib/pq (and unknown drivers) send a
// statement with arguments as two round trips (Parse and Describe, then
// Bind and Execute), so they are written into the text as literals.
//
// What the literals buy: a round trip per statement on lib/pq. Sent as
// arguments there, a TryDo with WithMinHold takes 3 round trips instead of
// 2, as does a LeaseLock's TryLock+Release with WithMinHold
// (benchmarks, BenchmarkRoundTrips/trydo_minhold/pq, 2026-12-06).
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
// hold no other '$'. It and quoteLiteral are the only writers of values
// into PostgreSQL text in this package.
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
		b.WriteString(text[:i])
		switch v := args[n-1].(type) {
		case int64:
			if v < 0 {
				b.WriteString("(" + strconv.FormatInt(v, 10) + ")")
			} else {
				b.WriteString(strconv.FormatInt(v, 10))
			}
		case string:
			lit, err := quoteLiteral(v)
			if err != nil {
				return "", err
			}
			b.WriteString(lit)
		default:
			return "", fmt.Errorf("advisorylock: cannot write a %T into SQL text", v)
		}
		text = text[j:]
	}
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

// rowStatement runs text, a statement whose one argument is key, on conn
// and reports whether it returned a row. A hot statement (a lock step's,
// sent on every try or unlock) runs prepared on the connection's session
// where p keeps statements prepared (lib/pq: one parse and plan per
// session instead of one per statement); any other, or where preparing
// sends nothing (see execPrepared), runs as text.
func (p *postgres) rowStatement(ctx context.Context, conn *sql.Conn, text string, key int64, hot bool) (bool, error) {
	if hot && p.prepared != nil {
		n, err := execPrepared(ctx, p.prepared, conn, text, key)
		if !errors.Is(err, dbutil.ErrNotPrepared) {
			return n == 1, err
		}
	}
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

// execPrepared runs text on conn's session, prepared there first if it is not yet,
// with key as its one argument, and returns the row count. It returns
// dbutil.ErrNotPrepared where nothing was sent: the connection is not lib/pq's
// own (a wrapper around it, which would not see prepared statements run),
// or the session lost the statement (SQLSTATE 26000: the Bind failed, so
// the statement did not run).
func execPrepared(ctx context.Context, ps *dbutil.Prepared, conn *sql.Conn, text string, key int64) (int64, error) {
	var n int64
	var added bool
	err := conn.Raw(func(dc any) error {
		var st driver.Stmt
		var err error
		if st, added, err = ps.Stmt(ctx, dc, text); err != nil {
			return err
		}
		se, ok := st.(driver.StmtExecContext)
		if !ok {
			return dbutil.ErrNotPrepared
		}
		res, err := se.ExecContext(ctx, []driver.NamedValue{{Ordinal: 1, Value: key}})
		if dbutil.SQLState(err) == "26000" {
			ps.Forget(dc)
			return dbutil.ErrNotPrepared
		}
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if added {
		ps.Trim()
	}
	return n, err
}

// Lease steps, prepared by name. lib/pq sends a statement's text every
// time, which the server parses and plans anew: for a lease's release, a
// long UPDATE, that was about 40% of the statement's time here. On lib/pq
// the statements a lease runs at each step (pgSteps) are prepared once per
// session, by PREPARE under a name that carries a hash of the text, and run
// as EXECUTE with the arguments written as literals: still one round trip.
//
// They are prepared by SQL, not as the driver's statements, for the name:
// lib/pq numbers its statements per connection ("1", "2", ...), so behind a
// transaction-mode pooler that the probe did not catch, a statement could
// run on a server session where another client's statement has its name.
// An EXECUTE of a step that reaches another session runs the same text (the
// name is its hash) or fails with 26000 before anything ran. A step whose
// statement a session lost (a pooler moved the connection, the application
// ran DISCARD ALL or DEALLOCATE) runs as text, and every step on that
// *sql.DB from then on.
//
// What it buys: the LeaseLock handoff gate on lib/pq (SPEC 11.3: p50 ≤ 3x
// the session Lock's). Benchmarks, BenchmarkLeaseHandoffPaired/
// leaselock_vs_advisorylock/pq, 6 paired runs each, unpinned, 2026-12-06:
// median 2.93x (2.31–3.12x) with the steps prepared, 3.70x (3.20–4.32x)
// with them as text; the round trips are the same.
var pgSteps = stepNames(map[string]string{
	pgAcquireLease: "acquire", pgRenewLease: "renew", pgReleaseLease: "release", pgAbandonLease: "abandon",
	pgQueueLease: "queue", pgWokenInLine: "woken",
})

// stepNames maps each statement text to its name: the step, and a hash of
// the text.
func stepNames(steps map[string]string) map[string]string {
	names := make(map[string]string, len(steps))
	for text, step := range steps {
		h := fnv.New64a()
		h.Write([]byte(text))
		names[text] = fmt.Sprintf("advisorylock_%s_%016x", step, h.Sum64())
	}
	return names
}

// sendStep runs text, the statement of the step name, by send on a
// connection of db's: on (taken from db when it is not a connection),
// prepared there by name first if the session lacks it (see pgSteps).
func (p *postgres) sendStep(ctx context.Context, db backend.DB, on dbutil.Querier, name, text string, args []any, send func(on dbutil.Querier, q string, args []any) error) error {
	conn, ok := on.(*sql.Conn)
	if !ok {
		var err error
		if conn, err = dbutil.TakeConn(ctx, db); err != nil {
			return err
		}
		defer conn.Close()
	}
	q, err := p.execute(ctx, conn, name, text, args)
	if err == nil {
		err = send(conn, q, nil)
		if dbutil.SQLState(err) != "26000" {
			return err
		}
		p.prepared.StepsAsText.Store(true) // the session lost it: nothing ran
	} else if !errors.Is(err, dbutil.ErrNotPrepared) {
		return err
	}
	q, args, err = p.statement(text, args...)
	if err != nil {
		return err
	}
	return send(conn, q, args)
}

// execute returns the EXECUTE of name with args as literals, having
// prepared text as name on conn's session unless the cache knows it is
// there; dbutil.ErrNotPrepared for a connection the cache does not keep (a
// wrapper's).
func (p *postgres) execute(ctx context.Context, conn *sql.Conn, name, text string, args []any) (string, error) {
	var dc any
	_ = conn.Raw(func(c any) error { dc = c; return nil })
	if !dbutil.PreparesOn(dc) {
		return "", dbutil.ErrNotPrepared
	}
	if !p.prepared.HasNamed(dc, name) {
		// Already there (42P05): prepared by this connection before the
		// cache dropped it, or, behind a pooler, by another: the same text.
		if _, err := conn.ExecContext(ctx, "PREPARE "+name+" AS "+text); err != nil && dbutil.SQLState(err) != "42P05" {
			return "", err
		}
		p.prepared.AddNamed(dc, name)
	}
	marks := make([]string, len(args))
	for i := range args {
		marks[i] = "$" + strconv.Itoa(i+1)
	}
	return inline("EXECUTE "+name+"("+strings.Join(marks, ", ")+")", args)
}

// TryLockSession reports no session: the statement asks only for the
// lock, and UnlockSession finds out by itself when a pooler moved the
// connection to another server session.
//
// The same statement refuses a hot standby, per connection: behind DNS, a
// virtual IP or a multi-host DSN a new connection can reach a demoted
// server. A try that returns no row asks why, one more round trip, once
// per session: a standby is an error matching backend.ErrUnsupported (should the
// session hold the lock after all, the guard discards the connection,
// which frees it); otherwise the question applies the dead-holder
// settings and says whether the try was a grant on a session that lacked
// them.
//
// Both checks hold for the rest of a session once it has passed them (a
// primary's session never enters recovery; the settings stay unless
// someone resets them on that connection), so a session that has, by a
// grant or by a miss, is remembered (see checkedSession) and later tries
// send only the lock function: the bare statement a user would write.
func (p *postgres) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	text, why := p.tryLock, p.whyMissed
	if text == "" { // not configured: a backend used outside a Lock
		text, why = pgTryLock, pgWhyMissed
	}
	fact := p.checkedSession()
	if dbutil.SessionKnows(conn, fact) {
		bare := pgTryLockBare
		if p.shared {
			bare = pgTryLockSharedBare
		}
		ok, err := p.rowStatement(ctx, conn, bare, key, true)
		return backend.SessionResult{OK: ok}, err
	}
	ok, err := p.rowStatement(ctx, conn, text, key, false)
	if ok {
		dbutil.RememberSession(conn, fact)
	}
	if ok || err != nil || why == "" {
		return backend.SessionResult{OK: ok}, err
	}
	var standby, granted, applied bool
	if err := conn.QueryRowContext(ctx, why).Scan(&standby, &granted, &applied); err != nil {
		return backend.SessionResult{}, err
	}
	if standby {
		return backend.SessionResult{}, errStandby
	}
	dbutil.RememberSession(conn, fact)
	return backend.SessionResult{OK: granted}, nil
}

// checkedSession is the fact (see dbutil.RememberSession) that a session has
// passed the checks of p's try: it is a primary's, and it has p's
// dead-holder settings, if p has any. It is named by the try statement,
// whose text holds the settings' marker.
func (p *postgres) checkedSession() string {
	if p.tryLock == "" { // not configured: a backend used outside a Lock
		return pgTryLock
	}
	return p.tryLock
}

// WaitLockSession waits in pg_advisory_lock bounded by a transaction-local
// lock_timeout of slice, and the statement by a statement_timeout a little
// longer (see pgWait): one round trip, whatever statement_timeout the
// role, the database or the DSN sets.
//
// A lock_timeout (55P03) or statement_timeout (57014, while ctx is live)
// leaves the connection healthy, but it is not by itself a miss: when the
// lock is granted at the moment the timeout fires, PostgreSQL keeps the
// grant and still fails the statement (its lock error cleanup remembers a
// lock it was granted while giving up). So a timeout costs one more round
// trip, to ask whether the session holds the lock; if it does, that is a
// grant.
func (p *postgres) WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (backend.SessionResult, error) {
	ms := max(slice.Milliseconds(), 1)
	wait := pgWait
	if p.shared {
		wait = pgWaitShared
	}
	q := fmt.Sprintf(wait, ms+waitStatementSlack.Milliseconds(), ms, key)
	if p.deadHolder != "" {
		// A slice is long next to a statement: it sends the settings each
		// time (they are rolled back with a slice that times out).
		q = strings.Replace(q, "SELECT pg_advisory_lock", p.deadHolder+"; SELECT pg_advisory_lock", 1)
	}
	res, err := conn.ExecContext(ctx, q)
	if code := dbutil.SQLState(err); code == "55P03" || code == "57014" && ctx.Err() == nil {
		return p.holds(ctx, conn, key)
	}
	if err != nil {
		return backend.SessionResult{}, err
	}
	n, err := res.RowsAffected()
	return backend.SessionResult{OK: n == 1}, err
}

// waitStatementSlack is how much longer than its lock_timeout a waiting
// statement's statement_timeout is, so that the lock_timeout ends it.
const waitStatementSlack = 500 * time.Millisecond

// UnlockSession releases key. When the session did not hold it, a second
// round trip finds out why: a session that holds it now, or another
// session that holds it, means the connection's statements reach more
// than one server session (a transaction-mode pooler), reported as
// dbutil.ErrTransactionPooler; nobody holding it is OK false. (In shared mode
// other sessions hold it too, so only the first says anything.)
func (p *postgres) UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	unlock := pgUnlock
	if p.shared {
		unlock = pgUnlockShared
	}
	ok, err := p.rowStatement(ctx, conn, unlock, key, true)
	if ok || err != nil {
		return backend.SessionResult{OK: ok}, err
	}
	return p.unlockMissed(ctx, conn, key)
}

// unlockMissed finds out why an unlock of key found it not held (see
// UnlockSession).
func (p *postgres) unlockMissed(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	// Rare, so written with literals for every driver.
	where := advisoryWhere(key) + " AND l.mode = '" + p.lockMode() + "'"
	var here, anywhere bool
	var r backend.SessionResult
	err := conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT FROM pg_locks l WHERE l.pid = pg_backend_pid() AND "+where+
		"), EXISTS (SELECT FROM pg_locks l WHERE "+where+"), pg_backend_pid()").Scan(&here, &anywhere, &r.Session)
	switch {
	case err != nil:
		return r, err
	case here:
		return r, fmt.Errorf("%w: the unlock ran on a server session that did not hold the lock, and the next statement reached server session %d, which does", dbutil.ErrTransactionPooler, r.Session)
	case anywhere && !p.shared:
		return r, fmt.Errorf("%w: the unlock ran on a server session that did not hold the lock, and another server session holds it", dbutil.ErrTransactionPooler)
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

// holds reports whether conn's session holds key on a primary, and which
// session it is. A lock held on a server that is now in recovery (a
// primary demoted by a failover) is not held: it excludes nothing.
func (p *postgres) holds(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	var r backend.SessionResult
	err := conn.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "+advisoryWhere(key)+" AND l.mode = '"+p.lockMode()+"' AND l.pid = pg_backend_pid()) AND NOT pg_is_in_recovery(), pg_backend_pid()").Scan(&r.OK, &r.Session)
	return r, err
}

// TryLockAll takes every one of keys or none, in one statement: it tries
// each, and if any misses it lets go of those it took, in the same
// statement. A session that has not passed TryLockSession's checks (a
// standby, the dead-holder settings) takes the first key with
// TryLockSession, which makes them, and the rest after.
func (p *postgres) TryLockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	if !dbutil.SessionKnows(conn, p.checkedSession()) {
		res, err := p.TryLockSession(ctx, conn, keys[0])
		if err != nil || !res.OK || len(keys) == 1 {
			return res, err
		}
		if res, err = p.TryLockAll(ctx, conn, keys[1:]); err != nil || res.OK {
			return res, err
		}
		_, err = p.UnlockSession(ctx, conn, keys[0])
		return backend.SessionResult{}, err
	}
	var all bool
	var undone int64
	err := conn.QueryRowContext(ctx, "WITH t AS MATERIALIZED (SELECT k, pg_try_advisory_lock(k) AS ok FROM unnest("+pgKeyArray(keys)+
		") AS k), a AS MATERIALIZED (SELECT coalesce(bool_and(ok), false) AS ok FROM t) "+
		"SELECT a.ok, (SELECT count(pg_advisory_unlock(t.k)) FROM t WHERE t.ok AND NOT a.ok) FROM a").Scan(&all, &undone)
	return backend.SessionResult{OK: all}, err
}

// UnlockAll releases keys in one statement; OK false when the session did
// not hold one of them.
func (p *postgres) UnlockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	var all bool
	err := conn.QueryRowContext(ctx, "SELECT coalesce(bool_and(pg_advisory_unlock(k)), true) FROM unnest("+pgKeyArray(keys)+") AS k").Scan(&all)
	return backend.SessionResult{OK: all}, err
}

// pgKeyArray is keys as an int8[] literal.
func pgKeyArray(keys []int64) string {
	list := make([]string, len(keys))
	for i, k := range keys {
		list[i] = strconv.FormatInt(k, 10)
	}
	return "ARRAY[" + strings.Join(list, ",") + "]::int8[]"
}

// HeldKeys reads which of keys conn's session holds, exclusively, on a
// primary, in one statement over pg_locks; on a server in recovery it
// holds none. It reads no table (a session's locks are all in its own
// database), so it needs no lock of its own and still answers when the
// server's lock table is full.
func (p *postgres) HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error) {
	rows, err := conn.QueryContext(ctx, "SELECT (l.classid::int8 << 32) | l.objid::int8 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = pg_backend_pid() AND l.mode = 'ExclusiveLock' AND NOT pg_is_in_recovery()")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	have := make(map[int64]bool, len(keys))
	for rows.Next() {
		var k int64
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		have[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	held := make([]bool, len(keys))
	for i, k := range keys {
		held[i] = have[k]
	}
	return held, nil
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

// SessionHolder reads pg_locks joined with pg_stat_activity: a holder of
// key, shared or exclusive (see SessionHolders).
func (p *postgres) SessionHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	hs, err := p.sessionHolders(ctx, db, key, " LIMIT 1")
	if len(hs) == 0 || err != nil {
		return nil, err
	}
	return hs[0], nil
}

// SessionHolders lists every session that holds key, shared or exclusive,
// from pg_locks joined with pg_stat_activity. Since is when the holder's
// acquire statement started while that is still its latest statement, and
// otherwise its session's start (an earlier bound). Without
// pg_read_all_stats, other roles' sessions show their pid alone.
func (p *postgres) SessionHolders(ctx context.Context, db backend.DB, key int64) ([]*backend.Holder, error) {
	return p.sessionHolders(ctx, db, key, "")
}

// pgHolders reads the holders of a key (the WHERE clause is appended).
const pgHolders = `SELECT l.pid, l.mode = 'ShareLock', coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  CASE WHEN a.query LIKE 'SELECT pg\_%advisory\_lock%(%' THEN a.query_start ELSE a.backend_start END
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE `

func (p *postgres) sessionHolders(ctx context.Context, db backend.DB, key int64, limit string) ([]*backend.Holder, error) {
	q := pgHolders + advisoryWhere(key) + ` ORDER BY l.pid` + limit
	var hs []*backend.Holder
	err := p.run(ctx, db, func(on dbutil.Querier) error {
		hs = nil // run may run it twice
		rows, err := on.QueryContext(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			h := &backend.Holder{Backend: p.Name(), Key: key}
			var since sql.NullTime
			if err := rows.Scan(&h.PID, &h.Shared, &h.Application, &h.ClientAddr, &since); err != nil {
				return err
			}
			h.Since = since.Time
			hs = append(hs, h)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err // and hs unread: an abandoned statement (see dbutil.Within) may still write it
	}
	return hs, nil
}

// ---------------------------------------------------------------------------
// Leases and fences: the backend.LeaseStore half of the PostgreSQL backend.
//
// A LeaseLock is a row in advisorylock_leases and a Fence a row in
// advisorylock_fences. Every lease time comes from the database clock
// (now()), never from the application: backend.LeaseRequest.Now is ignored here.
// Each step is one autocommit statement, sent in one round trip (see
// statement).

// The schema is versioned: advisorylock_schema records the upgrade steps
// applied, and the first use that finds a table or the sequence missing
// applies the rest, in one transaction, under the schema lock (see
// upgradePostgresSchema). Every step is idempotent. Operators query these
// tables: their names and columns are part of the contract.
var postgresSteps = [][]string{
	1: { // leases and fences
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
	},
	2: { // tokens that survive deleted rows and failovers (see pgNextToken)
		`CREATE SEQUENCE IF NOT EXISTS advisorylock_token_seq AS bigint MINVALUE 1 MAXVALUE 1099511627775 NO CYCLE`,
	},
	3: { // once-per-window Locks (WithMinHold; see minhold.go)
		postgresWindowsTable,
	},
	4: { // elections (NewElection; see election.go)
		postgresElectionsTable,
	},
	5: { // runs done (Lock.TryDoOnce; see once.go)
		postgresRunsTable,
	},
	6: { // a LeaseLock waiter's place in line (see QueueLease)
		// next_owner: the queued waiter, NULL when none; next_generation:
		// the token its grant will carry; next_expires_at: when its
		// place, and a grant handed over to it, ends.
		`ALTER TABLE advisorylock_leases
	ADD COLUMN IF NOT EXISTS next_owner      text,
	ADD COLUMN IF NOT EXISTS next_generation bigint,
	ADD COLUMN IF NOT EXISTS next_expires_at timestamptz`,
	},
	7: { // a waiter in line that sleeps on the server (see SleepInLine)
		// next_pid: the backend of the session that took the place, which
		// the handover wakes if it sleeps in line there.
		`ALTER TABLE advisorylock_leases ADD COLUMN IF NOT EXISTS next_pid integer`,
	},
	8: { // Locks kept as rows (WithLeaseRows; see rows.go)
		postgresLocksTable,
	},
	9: postgresSharedRows, // their shared holders (RLock; see rows.go)
}

// pgSchemaVersions is the table of applied upgrade steps.
const pgSchemaVersions = `CREATE TABLE IF NOT EXISTS advisorylock_schema (
	version    int         PRIMARY KEY,
	applied_at timestamptz NOT NULL DEFAULT now()
)`

// pgSchemaVersion is the version this code needs.
var pgSchemaVersion = len(postgresSteps) - 1

// schemaLock takes the transaction-scoped advisory lock that serializes
// creating and upgrading the tables, so that concurrent first uses all
// succeed. It is a two-int4 lock, a key space apart from the bigint keys
// of Lock names, so no Lock can hold it. Its two halves are the high and
// low 32 bits of advisorylock.Key("advisorylock:schema"), and never
// change: every release that upgrades the schema takes the same lock (a
// test checks them).
const schemaLock = "SELECT pg_advisory_xact_lock(1924073131, 2075971670)"

// Schema returns the DDL of advisorylock_leases, advisorylock_fences,
// the token sequence and the schema version table, with every upgrade
// step, for an administrator or a migration tool to run (it is
// idempotent: run it again after an upgrade of this package). The role
// the application connects as then needs only the grants listed at its
// end. PostgreSQL's Lock needs no table, unless it has WithMinHold
// (advisorylock_windows) or WithLeaseRows (advisorylock_locks); an
// Election records its terms in advisorylock_elections.
func (p *postgres) Schema() string {
	return dbutil.SchemaScript(pgSchemaVersions, postgresSteps, pgRecordVersion, `
-- The application's role needs (no CREATE, no superuser):
--   GRANT SELECT, INSERT, UPDATE ON advisorylock_leases, advisorylock_fences, advisorylock_windows, advisorylock_elections TO app;
--   GRANT SELECT, INSERT, DELETE ON advisorylock_runs TO app; -- Lock.TryDoOnce
--   GRANT SELECT, INSERT, UPDATE, DELETE ON advisorylock_locks, advisorylock_shared TO app; -- WithLeaseRows
--   GRANT USAGE ON SEQUENCE advisorylock_token_seq TO app;
--   GRANT SELECT ON advisorylock_schema TO app;
`)
}

// pgRecordVersion records that version v's step has run.
func pgRecordVersion(v int) string {
	return "INSERT INTO advisorylock_schema (version) VALUES (" + strconv.Itoa(v) + ") ON CONFLICT DO NOTHING"
}

// pgNextToken makes a grant's fencing token: the server's WAL timeline in
// the high bits (bits 40 to 62) and a number from advisorylock_token_seq
// in the low 40. A sequence survives deleting lease rows, and a promoted
// standby always starts a higher timeline, so its grants exceed every
// token of the old primary, including those whose rows (and sequence
// values) never reached the standby. The timeline is the first 8 hex
// digits of the current WAL file's name, which an ordinary role may read.
// A row written by an older release holds a generation counted from 1,
// far below 2^40: new tokens exceed them all. docs/fencing.md gives the bounds.
const pgNextToken = `(('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint << 40) + nextval('advisorylock_token_seq')`

// The lease statements; see statement for how their arguments are sent.
const (
	// The upsert takes a new token (see pgNextToken) only if the row is
	// free or expired; no row returned means held. The token never goes
	// below the row's own generation plus one, should the timeline ever
	// restart (pg_upgrade). A conflicting concurrent acquire waits for the
	// row lock and then sees the winner's row, so one name is never granted
	// twice.
	//
	// A queued waiter's live place (see pgQueueLease) keeps everyone else
	// out, also once the lease has expired: only that waiter may take it.
	//
	// A row that the statement's snapshot already shows taken is not
	// tried (NOT EXISTS): ON CONFLICT DO UPDATE locks the row before it
	// tests its WHERE, so a try that misses would hold the row against
	// the holder's release or renewal until it commits, and would commit
	// durably, waiting for the WAL flush, having written nothing but the
	// lock. A try that the snapshot lets through is decided, as before,
	// by the WHERE on the row's latest version.
	pgAcquireLease = `INSERT INTO advisorylock_leases AS l (name, owner, generation, acquired_at, expires_at)
SELECT $1::text, $2::text, ` + pgNextToken + `, now(), now() + $3::bigint * interval '1 millisecond'
WHERE NOT EXISTS (SELECT FROM advisorylock_leases AS l WHERE l.name = $1::text AND NOT (` + pgLeaseTakable + `))
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, generation = greatest(l.generation + 1, EXCLUDED.generation),
	acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
	next_owner = NULL, next_generation = NULL, next_expires_at = NULL, next_pid = NULL
WHERE ` + pgLeaseTakable + `
RETURNING generation`
	// pgQueueLease gives a waiter the place next in line for a held
	// lease, or renews its place: the release hands the lease to it (see
	// pgReleaseLease). The place takes its token now and commits durably,
	// so that a handover needs no durable commit of its own: should the
	// server crash and lose the handover, the place, live until
	// next_expires_at, still keeps everyone but its waiter out until the
	// waiter's local deadline has passed. No row: the lease is free,
	// expired, the waiter's own, or another waiter has the place. The
	// place records the backend it was taken on, which the handover wakes
	// should the waiter sleep in line there (see pgWakeSleeper).
	pgQueueLease = `UPDATE advisorylock_leases
SET next_generation = CASE WHEN next_owner = $2::text THEN next_generation ELSE ` + pgNextToken + ` END,
	next_owner = $2::text, next_expires_at = now() + $3::bigint * interval '1 millisecond', next_pid = pg_backend_pid()
WHERE name = $1::text AND owner IS NOT NULL AND owner <> $2::text AND expires_at > now()
	AND (next_owner IS NULL OR next_owner = $2::text OR next_expires_at <= now())
RETURNING next_generation`
	pgRenewLease = `UPDATE advisorylock_leases SET expires_at = now() + $1::bigint * interval '1 millisecond'
WHERE name = $2::text AND owner = $3::text AND generation = $4::bigint AND expires_at > now()
RETURNING generation`
	// The release need not be durable (a lost release only means waiting
	// for the expiry), so it commits without waiting for the WAL flush:
	// synchronous_commit is set for its own transaction, in a subquery that
	// runs before the row is written. A grant is its generation, so the
	// release names it alone; an acquire whose outcome was unknown has none
	// and frees whatever its owner label, unique per acquire, holds.
	//
	//
	// A release hands the lease over to the queued waiter whose place is
	// live (pgHandOver): the place's owner, token and end become the
	// grant's. The handover, too, commits without waiting for the flush:
	// the place it consumed was durable (see pgQueueLease).
	//
	// A release notifies pgReleaseChannel when it commits (see
	// ListenReleases), with the lease's key and, after a handover, a
	// space and the new owner; and a handover wakes the new owner should
	// it sleep in line (pgWakeSleeper).
	pgReleaseLease = `UPDATE advisorylock_leases SET ` + pgReleaseSet + `
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = $1::text AND generation = $2::bigint AND owner IS NOT NULL
RETURNING pg_notify('` + pgReleaseChannel + `', ` + pgReleasePayload + `), ` + pgWakeSleeper
	// pgAbandonLease frees whatever an owner label ($2) has: the lease,
	// handed over as a release hands it, or its place in line. A place
	// withdrawn notifies too, so that other waiters may queue.
	pgAbandonLease = `UPDATE advisorylock_leases SET
	owner = CASE WHEN owner IS DISTINCT FROM $2::text THEN owner WHEN ` + pgHandOver + ` THEN next_owner END,
	generation = CASE WHEN owner = $2::text AND ` + pgHandOver + ` THEN next_generation ELSE generation END,
	acquired_at = CASE WHEN owner = $2::text AND ` + pgHandOver + ` THEN now() ELSE acquired_at END,
	expires_at = CASE WHEN owner IS DISTINCT FROM $2::text THEN expires_at WHEN ` + pgHandOver + ` THEN next_expires_at ELSE least(expires_at, now()) END,
	next_owner = CASE WHEN owner = $2::text OR next_owner = $2::text THEN NULL ELSE next_owner END,
	next_generation = CASE WHEN owner = $2::text OR next_owner = $2::text THEN NULL ELSE next_generation END,
	next_expires_at = CASE WHEN owner = $2::text OR next_owner = $2::text THEN NULL ELSE next_expires_at END,
	next_pid = CASE WHEN owner = $2::text AND ` + pgHandOver + ` THEN next_pid END
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = $1::text AND (owner = $2::text OR next_owner = $2::text)
RETURNING pg_notify('` + pgReleaseChannel + `', ` + pgReleasePayload + `), ` + pgWakeSleeper
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

// pgLeaseTakable is true of a lease row l that the owner $2 may take:
// the lease is free or expired, and no other waiter's place is live.
const pgLeaseTakable = `(l.owner IS NULL OR l.expires_at <= now())
	AND (l.next_owner IS NULL OR l.next_expires_at <= now() OR l.next_owner = $2::text)`

// pgHandOver is true, in a release of a lease row, when the row's
// queued waiter gets the lease: its place is live and its token above the
// grant's (it is, unless the timeline restarted; see pgNextToken).
const pgHandOver = `(next_owner IS NOT NULL AND next_expires_at > now() AND next_generation > generation)`

// pgReleasePayload is a lease release's notification: its key ($3) and,
// after a handover, a space and the new owner, unless the label is too
// long to send (its waiter then reads the row to learn it was granted).
const pgReleasePayload = `$3::text || coalesce(' ' || CASE WHEN octet_length(owner) <= 1000 THEN owner END, '')`

// pgReleaseSet is the SET list of pgReleaseLease: the lease handed over
// (pgHandOver) or freed, and the place emptied either way; next_pid stays
// through a handover only, for pgWakeSleeper.
const pgReleaseSet = `owner = CASE WHEN ` + pgHandOver + ` THEN next_owner END,
	generation = CASE WHEN ` + pgHandOver + ` THEN next_generation ELSE generation END,
	acquired_at = CASE WHEN ` + pgHandOver + ` THEN now() ELSE acquired_at END,
	expires_at = CASE WHEN ` + pgHandOver + ` THEN next_expires_at ELSE least(expires_at, now()) END,
	next_owner = NULL, next_generation = NULL, next_expires_at = NULL,
	next_pid = CASE WHEN ` + pgHandOver + ` THEN next_pid END`

// Sleeping in line. A waiter in line that cannot hear releases (plain
// lib/pq, whose notifications reach only a pq.Listener) sleeps on the
// server instead, on a connection it keeps for its whole wait and took
// its place on, and the release that hands it the lease cuts the sleep
// short by cancelling it (pg_cancel_backend): the waiter's handoff is
// then about the release's round trip, not a poll. The cancel is sent
// only to a session that holds, at that moment, the transaction-scoped advisory
// lock of that place, that backend and that role (the three hashed into
// a key by hashtextextended), which only the sleep statement takes (and
// its end frees): a pid whose session has gone, or whose
// sleep has ended and which may serve anyone now, is not signalled, nor
// one of another role (whose key differs, and which pg_cancel_backend
// would refuse with an error that failed the release).
//
// A cancel can still reach the session in the moment between the
// release's test of the lock and its signal, should the sleep end just
// then: the waiter's next statement there is its own (it keeps the
// connection until it has read the outcome), and it takes the cancel
// as a wake.

// pgWakeSleeper, in the RETURNING list of a release, cancels the sleep of
// the waiter the release handed the lease to, if it sleeps in line: after
// a handover the row's generation is the place's token and next_pid the
// backend it was taken on (next_pid is NULL after any other release).
const pgWakeSleeper = `CASE WHEN next_pid IS NULL THEN NULL
	WHEN pg_try_advisory_xact_lock(hashtextextended('advisorylock in line ' || generation || ' ' || next_pid || ' ' || current_user, 0)) THEN NULL
	ELSE pg_cancel_backend(next_pid) END`

// pgSleepInLine sleeps up to $2 milliseconds holding the key of the place
// ($1: its token) that pgWakeSleeper tests, unless the lease ($3) is
// already the waiter's ($4), and then reads whether it is: the command tag
// of its last statement counts one row if so. It is four statements in
// one simple-protocol message, one implicit transaction (the key,
// transaction-scoped, is held until the message ends):
//   - the key;
//   - whether to sleep, read with a snapshot taken once the key is held,
//     and kept in a setting for the third; and a commit that does not
//     wait for the WAL flush, as the release's (the fourth's row lock
//     writes). A handover whose test of the key came first holds the key
//     until it commits, so the read sees it; one whose test comes later
//     finds the key held and cancels the sleep. Without it, a handover
//     between the waiter's place and its sleep would not wake it, and it
//     would sleep its whole slice holding the lease;
//   - the sleep, in a DO block that catches the handover's cancel
//     (57014), so that the message goes on (its body is a constant: no
//     name reaches it);
//   - the read, FOR SHARE, which waits for the handover to commit (the
//     cancel comes from inside its statement) and reads what it wrote
//     (its now() is when the message began: an expiry during the sleep
//     is the waiter's local deadline's to catch, see keepLease). OFFSET 0
//     keeps the test of the owner above the row lock: the planner pushes
//     an outer qual down into the scan, below the lock, where it would
//     test the version the handover is replacing, and, as the holder's,
//     skip the row without waiting for the commit.
//
// So a woken waiter learns of its grant with no round trip after the
// release's: the sleep's message answers it. A cancel landing outside the
// DO block (see "Sleeping in line") fails the message with 57014 instead.
const pgSleepInLine = `SELECT pg_advisory_xact_lock(hashtextextended('advisorylock in line ' || $1::bigint || ' ' || pg_backend_pid() || ' ' || session_user, 0));
SELECT set_config('advisorylock.sleep_seconds', CASE WHEN EXISTS (SELECT FROM advisorylock_leases WHERE name = $3::text AND owner = $4::text) THEN '0' ELSE ($2::bigint / 1000.0)::text END, true),
	set_config('synchronous_commit', 'off', true);
DO 'BEGIN PERFORM pg_sleep(current_setting(''advisorylock.sleep_seconds'')::float8); EXCEPTION WHEN query_canceled THEN NULL; END';
SELECT FROM (SELECT l.owner FROM advisorylock_leases AS l WHERE l.name = $3::text AND l.owner IS NOT NULL AND l.expires_at > now() OFFSET 0 FOR SHARE OF l) AS l
WHERE l.owner = $4::text`

// pgWokenInLine reads the lease's owner after a cancel that ended a
// sleeper's message outside its DO block (see pgSleepInLine): the cancel
// comes from inside the release's statement, before it commits, and FOR
// SHARE waits for the row's writer to commit and reads what it wrote. It
// commits without waiting for the WAL flush, as the release does.
const pgWokenInLine = `SELECT l.owner FROM advisorylock_leases AS l, (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE l.name = $1::text AND l.owner IS NOT NULL AND l.expires_at > now()
FOR SHARE OF l`

// AcquireLease takes the lease if it is free or expired and returns the
// new generation; backend.ErrNotAcquired if it is held. The grant commits
// durably: a lost grant could hand one token out twice after a crash.
func (p *postgres) AcquireLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	switch r.Kind {
	case backend.KindLock:
		return p.acquireLock(ctx, db, r)
	case backend.KindShared:
		return p.acquireShared(ctx, db, r)
	}
	var gen int64
	found, err := p.queryRow(ctx, db, pgAcquireLease, []any{r.Name, r.Owner, dbutil.TTLMillis(max(r.TTL, r.MinHold))}, &gen)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, backend.ErrNotAcquired
	}
	return uint64(gen), nil
}

// RenewLease extends the lease by its TTL from the database's now, if
// r.Owner and r.Token still hold it unexpired; backend.ErrLeaseLost otherwise.
func (p *postgres) RenewLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	switch r.Kind {
	case backend.KindLock:
		return p.renewLock(ctx, db, r)
	case backend.KindShared:
		return p.renewShared(ctx, db, r)
	}
	var gen int64
	var found bool
	var err error
	if r.MinHold > 0 {
		found, err = p.renewLeaseWindow(ctx, db, r, &gen)
	} else {
		found, err = p.queryRow(ctx, db, pgRenewLease, []any{dbutil.TTLMillis(r.TTL), r.Name, r.Owner, int64(r.Token)}, &gen)
	}
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%w: it expired or was taken over", backend.ErrLeaseLost)
	}
	return uint64(gen), nil
}

// ReleaseLease frees the lease if grant r.Token still holds it (with
// Token 0, whatever r.Owner holds); the row stays, so the generation never
// goes down. With r.MinHold it stays taken by its owner until the window's
// end.
func (p *postgres) ReleaseLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	switch r.Kind {
	case backend.KindLock:
		return p.releaseLock(ctx, db, r)
	case backend.KindShared:
		return p.exec(ctx, db, pgReleaseShared, r.Key, r.Owner)
	}
	key := strconv.FormatInt(r.Key, 10)
	if r.Token == 0 {
		return p.exec(ctx, db, pgAbandonLease, r.Name, r.Owner, key)
	}
	if r.MinHold > 0 {
		return p.releaseLeaseWindow(ctx, db, r)
	}
	return p.exec(ctx, db, pgReleaseLease, r.Name, int64(r.Token), key)
}

// QueueLease gives r.Owner the place next in line for the held lease, or
// renews its place, and returns the token of the grant the holder's
// release will hand it; backend.ErrNotAcquired when the lease is free, expired or
// r.Owner's, or another waiter's place is live. The place lasts r.TTL and
// commits durably (see pgQueueLease). It runs on conn, where the waiter
// sleeps in line (see SleepInLine), else on a connection of db's.
func (p *postgres) QueueLease(ctx context.Context, db backend.DB, conn *sql.Conn, r backend.LeaseRequest) (uint64, error) {
	if r.Kind != backend.KindLease {
		return 0, fmt.Errorf("%w: only a LeaseLock's waiters queue", backend.ErrUnsupported)
	}
	if conn != nil {
		db = dbutil.OnConn{Kept: conn, DB: db}
	}
	var gen int64
	found, err := p.queryRow(ctx, db, pgQueueLease, []any{r.Name, r.Owner, dbutil.TTLMillis(r.TTL)}, &gen)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, backend.ErrNotAcquired
	}
	return uint64(gen), nil
}

// SleepInLine sleeps up to d on conn, where r.Owner took the place of
// token r.Token, unless the release that hands it the lease wakes it
// first (see pgWakeSleeper), or has already; either way it then reads,
// in the same message, whether the lease is r.Owner's (see
// pgSleepInLine). Through a transaction-mode pooler it sleeps nowhere
// (backend.ErrUnsupported): the sleep would keep a server connection, and the
// place's backend is not the sleeper's.
func (p *postgres) SleepInLine(ctx context.Context, db backend.DB, conn *sql.Conn, r backend.LeaseRequest, d time.Duration) (granted bool, err error) {
	if err := dbutil.CheckPooler(ctx, db, p); err != nil {
		if errors.Is(err, dbutil.ErrTransactionPooler) {
			return false, fmt.Errorf("%w: %w", backend.ErrUnsupported, err)
		}
		return false, err
	}
	on := dbutil.OnConn{Kept: conn, DB: db}
	// Four statements, so literals on every driver: without arguments lib/pq
	// and pgx send them as one simple-protocol message, and report the
	// command tag of the last.
	sleep, err := inline(pgSleepInLine, []any{int64(r.Token), max(d.Milliseconds(), 1), r.Name, r.Owner})
	if err != nil {
		return false, err
	}
	var mine int64
	err = p.run(ctx, on, func(on dbutil.Querier) error {
		res, err := on.ExecContext(ctx, sleep)
		if err == nil {
			mine, err = res.RowsAffected()
		}
		return err
	})
	switch {
	case ctx.Err() != nil:
		// Cut short by ctx, whose cancel the DO block may have caught: the
		// sleep overran, or the wait ended (a grant meanwhile is withdrawn).
		return false, cmp.Or(err, context.Cause(ctx))
	case dbutil.SQLState(err) != "57014":
		return err == nil && mine == 1, err
	}
	// The cancel landed outside the DO block (or a statement_timeout cut
	// it: the read then finds the lease as it was). A cancel sent late
	// (see "Sleeping in line") may end the read: it is read again.
	for range 3 {
		var owner string
		var found bool
		found, err = p.queryRow(ctx, on, pgWokenInLine, []any{r.Name}, &owner)
		if dbutil.SQLState(err) != "57014" || ctx.Err() != nil {
			return found && owner == r.Owner, err
		}
	}
	return false, err
}

// LeaseHolder reports the lease's holder, or nil when it is free or
// expired by the database clock.
func (p *postgres) LeaseHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	switch r.Kind {
	case backend.KindLock:
		return p.lockHolder(ctx, db, r)
	case backend.KindShared:
		return p.sharedBlocker(ctx, db, r)
	}
	h := &backend.Holder{Name: r.Name, Backend: p.Name(), Key: r.Key}
	var gen int64
	found, err := p.queryRow(ctx, db, pgLeaseHolder, []any{r.Name}, &h.Owner, &gen, &h.Since, &h.ExpiresAt)
	if !found || err != nil {
		return nil, err
	}
	h.Token = uint64(gen)
	return h, nil
}

// AdmitToken stores token as resource's highest in tx if it is not lower
// than the stored one; otherwise it reads the highest and returns it. The
// table must exist: a missing table aborts tx (Fence creates it at its
// first Admit). A read-only transaction (a hot
// standby's, or one begun READ ONLY) is an error matching backend.ErrUnsupported.
func (p *postgres) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token uint64) (uint64, error) {
	q, args, err := p.statement(pgAdmitToken, resource, int64(token))
	if err != nil {
		return 0, err
	}
	var got int64
	err = tx.QueryRowContext(ctx, q, args...).Scan(&got)
	if dbutil.SQLState(err) == "25006" {
		// The transaction is read-only, which aborts it: it cannot ask
		// the server whether it is a standby.
		return 0, fmt.Errorf("%w: the transaction is read-only (on a hot standby, or begun READ ONLY), and admitting a token writes; run the fenced transaction on the primary: %w", backend.ErrUnsupported, err)
	}
	switch {
	case err == nil:
		return token, nil
	case !errors.Is(err, sql.ErrNoRows):
		return 0, err
	}
	q, args, err = p.statement(pgHighestToken, resource)
	if err != nil {
		return 0, err
	}
	var highest int64
	if err := tx.QueryRowContext(ctx, q, args...).Scan(&highest); err != nil {
		return 0, fmt.Errorf("advisorylock: reading the highest token after a stale one: %w", err)
	}
	return uint64(highest), nil
}

// queryRow runs a statement that returns at most one row into dest, on a
// connection of db's (see run); found is false when it returned none.
func (p *postgres) queryRow(ctx context.Context, db backend.DB, text string, args []any, dest ...any) (found bool, err error) {
	err = p.runStatement(ctx, db, text, args, func(on dbutil.Querier, q string, args []any) error {
		return on.QueryRowContext(ctx, q, args...).Scan(dest...)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// exec runs a statement that returns no rows, as queryRow does.
func (p *postgres) exec(ctx context.Context, db backend.DB, text string, args ...any) error {
	return p.runStatement(ctx, db, text, args, func(on dbutil.Querier, q string, args []any) error {
		_, err := on.ExecContext(ctx, q, args...)
		return err
	})
}

// runStatement runs text with args by send, in the form statement writes
// (see run), except a lease's step on lib/pq (see pgSteps), which runs
// prepared on the connection's session.
func (p *postgres) runStatement(ctx context.Context, db backend.DB, text string, args []any, send func(on dbutil.Querier, q string, args []any) error) error {
	if name := pgSteps[text]; name != "" && p.prepared != nil && !p.prepared.StepsAsText.Load() {
		return p.run(ctx, db, func(on dbutil.Querier) error {
			return p.sendStep(ctx, db, on, name, text, args, send)
		})
	}
	q, args, err := p.statement(text, args...)
	if err != nil {
		return err
	}
	return p.run(ctx, db, func(on dbutil.Querier) error { return send(on, q, args) })
}

// run runs stmt where statements run (see dbutil.StatementsOn), bounded by ctx
// also where the driver does not end a statement with ctx (see dbutil.Within): a
// lease step stuck on a dead network must not hold an acquire, a renewal
// or a release. If a table is missing it creates the tables and runs stmt
// again, once. A name too long for the primary key's index is reported as
// backend.ErrUnsupported, and no rows from a statement whose context ended as an
// unknown outcome.
func (p *postgres) run(ctx context.Context, db backend.DB, stmt func(on dbutil.Querier) error) error {
	return p.bound(ctx, func() error {
		err := p.runOn(ctx, db, stmt)
		// A relation (a table, the sequence) or a column that an upgrade
		// step adds is missing: apply the steps the database lacks. The
		// upgrade takes a connection of its own only once stmt's is back:
		// on a small pool, a burst of first uses that each held one while
		// asking for another would leave none for any of them.
		if code := dbutil.SQLState(err); code == "42P01" || code == "42703" {
			if err := upgradePostgresSchema(ctx, db); err != nil {
				return p.runOn(ctx, db, func(dbutil.Querier) error { return err }) // a standby says so
			}
			err = p.runOn(ctx, db, stmt)
		}
		return p.explain(ctx, err)
	})
}

// runOn runs stmt on a dbutil.Querier of dbutil.StatementsOn, and says if its error is
// a hot standby's refusal (see onStandby).
func (p *postgres) runOn(ctx context.Context, db backend.DB, stmt func(on dbutil.Querier) error) error {
	on, done, err := dbutil.StatementsOn(ctx, db)
	if err != nil {
		return err
	}
	defer done()
	return p.onStandby(ctx, on, dbutil.Unreachable(stmt(on)))
}

// explain turns the errors of a lease statement that mean something else
// than they say into what they mean.
func (p *postgres) explain(ctx context.Context, err error) error {
	if dbutil.SQLState(err) == "54000" { // program_limit_exceeded: the index row is too big
		return fmt.Errorf("%w: the name is too long to be a PostgreSQL index key (a btree entry holds about 2.7kB after compression): %w", backend.ErrUnsupported, err)
	}
	if dbutil.SQLState(err) == "42501" { // insufficient_privilege
		return fmt.Errorf("advisorylock: the database role lacks a privilege on the library's tables; an administrator grants it (see Schema for the grants): %w", err)
	}
	if errors.Is(err, sql.ErrNoRows) && ctx.Err() != nil {
		// database/sql can report a query cut short by its context as
		// no rows (lib/pq#874; seen with pgx in a network cut): that
		// answers nothing, and "no row" means "held" or "free" here.
		return fmt.Errorf("advisorylock: context ended while the statement ran, outcome unknown: %w", context.Cause(ctx))
	}
	return err
}

// onStandby reports err as the refusal of a hot standby when it is a
// read-only error and the server says it is in recovery (one more round
// trip, on such errors only). Lease statements need no check of their
// own: on a standby they fail (25006, or 55000 from pg_current_wal_lsn,
// or 0A000 from a read-write BEGIN).
func (p *postgres) onStandby(ctx context.Context, on dbutil.Querier, err error) error {
	switch dbutil.SQLState(err) {
	case "25006", "55000", "0A000":
	default:
		return err
	}
	var standby bool
	if on.QueryRowContext(ctx, "SELECT pg_is_in_recovery()").Scan(&standby) != nil || !standby {
		return err
	}
	return fmt.Errorf("%w (%w)", errStandby, err)
}

// bound runs f, which talks to the database, bounded by ctx: as it is
// where the driver ends a statement when its context ends (pgx), else
// through dbutil.Within (lib/pq).
func (p *postgres) bound(ctx context.Context, f func() error) error {
	if p.cancelsPromptly() {
		return f()
	}
	_, err := dbutil.Within(ctx, func() (struct{}, error) { return struct{}{}, f() }, nil, nil)
	return err
}

// upgradePostgresSchema creates the tables, or upgrades them to this
// code's version, in one transaction, serialized with every other
// upgrader by a transaction-scoped advisory lock, so that concurrent first
// uses all succeed and each step runs once. A database with the first
// step's tables and no version table is version 0: every step is
// idempotent.
func upgradePostgresSchema(ctx context.Context, db backend.DB) error {
	conn, err := dbutil.TakeConn(ctx, db)
	if err != nil {
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	defer tx.Rollback()
	if err := applySteps(ctx, tx); err != nil {
		if dbutil.SQLState(err) == "42501" {
			return fmt.Errorf("advisorylock: creating tables: the database role may not create them; an administrator creates them from Schema(Postgres()) and grants what its end lists: %w", err)
		}
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	return nil
}

// applySteps applies, in tx, the upgrade steps the database lacks.
func applySteps(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, schemaLock); err != nil {
		return err
	}
	var versioned bool
	if err := tx.QueryRowContext(ctx, "SELECT to_regclass('advisorylock_schema') IS NOT NULL").Scan(&versioned); err != nil {
		return err
	}
	current := 0
	if versioned {
		if err := tx.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM advisorylock_schema").Scan(&current); err != nil {
			return err
		}
	}
	if current >= pgSchemaVersion {
		return nil
	}
	if _, err := tx.ExecContext(ctx, pgSchemaVersions); err != nil {
		return err
	}
	for v := current + 1; v <= pgSchemaVersion; v++ {
		for _, ddl := range postgresSteps[v] {
			if _, err := tx.ExecContext(ctx, ddl); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, pgRecordVersion(v)); err != nil {
			return err
		}
	}
	return nil
}

// pgTableColumns names, for each table a Check probes, a column every
// statement on it reads and writes.
var pgTableColumns = map[string]string{
	"advisorylock_leases":    "name",
	"advisorylock_fences":    "resource",
	"advisorylock_windows":   "key",
	"advisorylock_elections": "name",
	"advisorylock_locks":     "key",
}

// CheckTables creates the tables if they are missing and proves, in one
// statement that writes nothing, that the role may read, insert and
// update each of tables and draw from the token sequence: a missing grant
// comes back as the server's own 42501, as the first operation would get
// it. The data-modifying WITH clauses run on no rows; the CASE calls
// nextval only when the privilege is missing, to raise its error. Only
// leases and elections draw tokens from the sequence.
func (p *postgres) CheckTables(ctx context.Context, db backend.DB, tables ...string) error {
	var with []string
	probe := "SELECT 0"
	for i, t := range tables {
		if t == "advisorylock_leases" || t == "advisorylock_elections" || t == "advisorylock_locks" {
			probe = "SELECT CASE WHEN has_sequence_privilege('advisorylock_token_seq', 'USAGE') THEN 0 ELSE nextval('advisorylock_token_seq') END"
		}
		c := pgTableColumns[t]
		with = append(with,
			fmt.Sprintf("u%d AS (UPDATE %s SET %s = %[3]s WHERE false RETURNING 1)", i, t, c),
			fmt.Sprintf("i%d AS (INSERT INTO %s (%s) SELECT %[3]s FROM %[2]s WHERE false RETURNING 1)", i, t, c))
	}
	if len(with) > 0 {
		probe = "WITH " + strings.Join(with, ", ") + " " + probe
	}
	var n int64
	_, err := p.queryRow(ctx, db, probe, nil, &n)
	return err
}

// pgReleaseChannel is the channel lease releases notify, one for the
// table, with the lease's key as the payload (and, after a handover, its
// new owner; see pgReleasePayload): a listener per *sql.DB hears every
// name with one LISTEN, and a payload never reaches the server's limit,
// whatever the name's length. Two names of one key
// share wakes, which only makes a waiter look early.
const pgReleaseChannel = "advisorylock_leases"

// ListenReleases listens for lease releases (see backend.ReleaseListener):
// through db's Listen where db is a backend.Notifier, else on conn, which needs a
// driver that delivers notifications to a connection of database/sql's
// pool, as pgx's stdlib does (its Conn().WaitForNotification). lib/pq
// hands them only to a pq.Listener, so on a plain lib/pq handle, and
// behind a transaction-mode pooler (where a LISTEN stays on whichever
// server session ran it), it returns backend.ErrUnsupported and waiters poll.
// The pooler is told by the probe New uses, once per *sql.DB.
func (p *postgres) ListenReleases(ctx context.Context, db backend.DB, conn *sql.Conn, ready func(), released func(key int64)) error {
	return p.ListenGrants(ctx, db, conn, ready, func(key int64, _ string) { released(key) })
}

// ListenGrants is ListenReleases that also names the owner a release
// handed the lease to (see backend.LeaseQueuer).
func (p *postgres) ListenGrants(ctx context.Context, db backend.DB, conn *sql.Conn, ready func(), released func(key int64, grantee string)) error {
	n, own := db.(backend.Notifier)
	if !p.params && !own {
		return fmt.Errorf("%w: the driver delivers no notifications to a pooled connection", backend.ErrUnsupported)
	}
	if err := dbutil.CheckPooler(ctx, db, p); err != nil {
		if errors.Is(err, dbutil.ErrTransactionPooler) {
			return fmt.Errorf("%w: %w", backend.ErrUnsupported, err)
		}
		return err
	}
	heard := func(payload string) {
		k, grantee, _ := strings.Cut(payload, " ")
		if key, err := strconv.ParseInt(k, 10, 64); err == nil {
			released(key, grantee)
		}
	}
	if own {
		return n.Listen(ctx, pgReleaseChannel, ready, heard)
	}
	if _, err := conn.ExecContext(ctx, "LISTEN "+pgReleaseChannel); err != nil {
		return err
	}
	return conn.Raw(func(dc any) error {
		next, ok := pgxNotifications(dc)
		if !ok {
			return fmt.Errorf("%w: the driver connection %T has no WaitForNotification", backend.ErrUnsupported, dc)
		}
		ready()
		for {
			payload, err := next(ctx)
			if err != nil {
				return err
			}
			heard(payload)
		}
	})
}

// pgxNotifications returns a function that waits for the next
// notification on dc, a driver connection of pgx's stdlib, and returns
// its payload: dc.Conn().WaitForNotification(ctx), called by method name
// so that the package imports no driver. ok is false when dc has no such
// methods.
func pgxNotifications(dc any) (next func(ctx context.Context) (string, error), ok bool) {
	connOf := reflect.ValueOf(dc).MethodByName("Conn")
	if !connOf.IsValid() || connOf.Type().NumIn() != 0 || connOf.Type().NumOut() != 1 {
		return nil, false
	}
	wait := connOf.Call(nil)[0].MethodByName("WaitForNotification")
	ctxType, errType := reflect.TypeFor[context.Context](), reflect.TypeFor[error]()
	if !wait.IsValid() || wait.Type().NumIn() != 1 || wait.Type().In(0) != ctxType ||
		wait.Type().NumOut() != 2 || wait.Type().Out(1) != errType {
		return nil, false
	}
	return func(ctx context.Context) (string, error) {
		out := wait.Call([]reflect.Value{reflect.ValueOf(&ctx).Elem()})
		if err, _ := out[1].Interface().(error); err != nil {
			return "", err
		}
		n := reflect.Indirect(out[0])
		if n.Kind() != reflect.Struct {
			return "", nil
		}
		if f := n.FieldByName("Payload"); f.Kind() == reflect.String {
			return f.String(), nil
		}
		return "", nil
	}, true
}
