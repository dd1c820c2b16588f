package sqlitebackend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// New returns the SQLite backend (advisorylock.SQLite): a LeaseStore of
// rows in the application's database file, with shared rows, runs and
// fences, and a Recognizer and Validator.
func New() backend.Backend { return sqliteBackend{} }

type sqliteBackend struct{}

// The SQLite backend is a LeaseStore with shared rows, runs and fences,
// and no more (beside the first-use Recognizer and Validator).
var (
	_ backend.Validator      = sqliteBackend{}
	_ backend.Recognizer     = sqliteBackend{}
	_ backend.SharedRowStore = sqliteBackend{}
	_ backend.RunRecorder    = sqliteBackend{}
	_ backend.TokenAdmitter  = sqliteBackend{}
)

// sqliteSteps are the schema's upgrade steps, one statement each, every
// one idempotent (processes sharing the file may run them at once).
// advisorylock_schema records the versions applied. Times are Unix
// milliseconds.
var sqliteSteps = [][]string{
	1: { // locks and leases as rows
		`CREATE TABLE IF NOT EXISTS advisorylock_locks (
	key         INTEGER PRIMARY KEY, -- Key(name)
	name        TEXT    NOT NULL,
	owner       TEXT    NOT NULL,    -- unique per acquire
	acquired_at INTEGER NOT NULL,    -- Unix milliseconds
	expires_at  INTEGER NOT NULL     -- Unix milliseconds
)`,
		`CREATE TABLE IF NOT EXISTS advisorylock_leases (
	name        TEXT    PRIMARY KEY,
	owner       TEXT,                -- NULL when free
	generation  INTEGER NOT NULL,    -- the fencing token of the last grant
	acquired_at INTEGER NOT NULL,    -- Unix milliseconds
	expires_at  INTEGER NOT NULL     -- Unix milliseconds
)`,
		`CREATE TABLE IF NOT EXISTS advisorylock_fences (
	resource TEXT    PRIMARY KEY,
	token    INTEGER NOT NULL        -- the highest token admitted
)`,
	},
	2: { // tokens that survive deleted rows: the highest ever granted, kept
		// by triggers (so that grants by an older release, which knows only
		// the first schema, count too)
		`CREATE TABLE IF NOT EXISTS advisorylock_tokens (
	id   INTEGER PRIMARY KEY CHECK (id = 1),
	last INTEGER NOT NULL            -- the highest token granted so far
)`,
		`INSERT OR IGNORE INTO advisorylock_tokens (id, last) SELECT 1, coalesce(max(generation), 0) FROM advisorylock_leases`,
		`CREATE TRIGGER IF NOT EXISTS advisorylock_tokens_insert AFTER INSERT ON advisorylock_leases
BEGIN UPDATE advisorylock_tokens SET last = max(last, NEW.generation) WHERE id = 1; END`,
		`CREATE TRIGGER IF NOT EXISTS advisorylock_tokens_update AFTER UPDATE OF generation ON advisorylock_leases
BEGIN UPDATE advisorylock_tokens SET last = max(last, NEW.generation) WHERE id = 1; END`,
	},
	3: { // shared locks (RLock): a row per shared holder, and waiting writers' claims
		`CREATE TABLE IF NOT EXISTS advisorylock_shared (
	key         INTEGER NOT NULL,    -- Key(name)
	owner       TEXT    NOT NULL,    -- unique per acquire
	name        TEXT    NOT NULL,
	acquired_at INTEGER NOT NULL,    -- Unix milliseconds
	expires_at  INTEGER NOT NULL,    -- Unix milliseconds
	PRIMARY KEY (key, owner)
)`,
		`CREATE TABLE IF NOT EXISTS advisorylock_writers (
	key        INTEGER PRIMARY KEY,  -- Key(name)
	owner      TEXT    NOT NULL,     -- the waiting writer's acquire
	expires_at INTEGER NOT NULL      -- Unix milliseconds
)`,
		// A writer's grant ends its own claim, in the grant's statement.
		`CREATE TRIGGER IF NOT EXISTS advisorylock_writers_insert AFTER INSERT ON advisorylock_locks
BEGIN DELETE FROM advisorylock_writers WHERE key = NEW.key AND owner = NEW.owner; END`,
		`CREATE TRIGGER IF NOT EXISTS advisorylock_writers_update AFTER UPDATE OF owner ON advisorylock_locks
BEGIN DELETE FROM advisorylock_writers WHERE key = NEW.key AND owner = NEW.owner; END`,
	},
	4: { // exclusive grants as cheap as without shared holders: they keep a
		// summary row (owner '', which no acquire's owner can be) in
		// advisorylock_locks, live until the latest shared holder's
		// expiry, which refuses the exclusive upsert as a live holder's
		// row would; kept by triggers on advisorylock_shared, so that
		// shared holders of step 3's code keep it too. A waiting writer
		// withdraws its claim after its grant (the triggers that did it
		// made every grant pay).
		`CREATE TRIGGER IF NOT EXISTS advisorylock_shared_insert AFTER INSERT ON advisorylock_shared
BEGIN ` + sqliteKeepSummary + ` VALUES (NEW.key, NEW.name, '', NEW.acquired_at, NEW.expires_at)` + sqliteSummaryConflict + `; END`,
		`CREATE TRIGGER IF NOT EXISTS advisorylock_shared_renew AFTER UPDATE OF expires_at ON advisorylock_shared
BEGIN UPDATE advisorylock_locks SET expires_at = max(expires_at, NEW.expires_at) WHERE key = NEW.key AND owner = ''; END`,
		`CREATE TRIGGER IF NOT EXISTS advisorylock_shared_delete AFTER DELETE ON advisorylock_shared
BEGIN
	DELETE FROM advisorylock_locks WHERE key = OLD.key AND owner = '' AND NOT EXISTS (SELECT 1 FROM advisorylock_shared WHERE key = OLD.key);
	UPDATE advisorylock_locks SET expires_at = (SELECT max(expires_at) FROM advisorylock_shared WHERE key = OLD.key) WHERE key = OLD.key AND owner = '';
END`,
		// The shared holders already there (WHERE true: an upsert's
		// SELECT needs one).
		sqliteKeepSummary + ` SELECT key, max(name), '', min(acquired_at), max(expires_at) FROM advisorylock_shared WHERE true GROUP BY key` + sqliteSummaryConflict,
		`DROP TRIGGER IF EXISTS advisorylock_writers_insert`,
		`DROP TRIGGER IF EXISTS advisorylock_writers_update`,
	},
	5: { // a lease grant writes its row alone: the counter needs to cover
		// deleted rows only (a row keeps its generation while it exists),
		// so it is kept when a row is deleted, not at every grant (which
		// wrote the counter's page in every grant's commit)
		`CREATE TRIGGER IF NOT EXISTS advisorylock_tokens_delete AFTER DELETE ON advisorylock_leases
BEGIN UPDATE advisorylock_tokens SET last = max(last, OLD.generation) WHERE id = 1; END`,
		`DROP TRIGGER IF EXISTS advisorylock_tokens_insert`,
		`DROP TRIGGER IF EXISTS advisorylock_tokens_update`,
	},
	6: { // runs done (Lock.TryDoOnce; see once.go)
		sqliteRunsTable,
	},
}

// sqliteKeepSummary and sqliteSummaryConflict write the shared holders'
// summary row of a key: a summary row takes the later expiry, an expired
// exclusive row gives way, a live one stays (a shared holder's statement
// makes sure there is none).
const (
	sqliteKeepSummary     = `INSERT INTO advisorylock_locks (key, name, owner, acquired_at, expires_at)`
	sqliteSummaryConflict = `
	ON CONFLICT (key) DO UPDATE SET name = excluded.name, owner = '',
		acquired_at = CASE WHEN advisorylock_locks.owner = '' THEN advisorylock_locks.acquired_at ELSE excluded.acquired_at END,
		expires_at = CASE WHEN advisorylock_locks.owner = '' THEN max(advisorylock_locks.expires_at, excluded.expires_at) ELSE excluded.expires_at END
	WHERE advisorylock_locks.owner = '' OR advisorylock_locks.expires_at <= excluded.acquired_at`
)

// sqliteSchemaVersions is the table of applied upgrade steps.
const sqliteSchemaVersions = `CREATE TABLE IF NOT EXISTS advisorylock_schema (
	version    INTEGER PRIMARY KEY,
	applied_at INTEGER NOT NULL      -- Unix milliseconds
)`

// The statements. Each is one autocommit statement with bound parameters;
// ?1 is the key or name, and times are Unix milliseconds from the lock's
// clock (WithClock).
const (
	// The upsert takes the row only if it is absent or expired (live
	// shared holders keep their summary row live): one row changed means
	// acquired.
	sqliteAcquireLock = `INSERT INTO advisorylock_locks (key, name, owner, acquired_at, expires_at) VALUES (?1, ?2, ?3, ?4, ?5)
ON CONFLICT (key) DO UPDATE SET name = excluded.name, owner = excluded.owner,
	acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE advisorylock_locks.expires_at <= excluded.acquired_at`
	sqliteRenewLock   = `UPDATE advisorylock_locks SET expires_at = ?3 WHERE key = ?1 AND owner = ?2 AND expires_at > ?4`
	sqliteReleaseLock = `DELETE FROM advisorylock_locks WHERE key = ?1 AND owner = ?2`

	// Shared holds (see backend.SharedRowStore). A shared holder's row goes in
	// only while no exclusive row (owner not '', the summary's) and no
	// waiting writer's claim is live; a waiting writer claims the key
	// (any writer may take a claim over) while shared holders keep it
	// from the lock row. A release also clears the key's expired rows
	// (dead holders'). The triggers of schema step 4 keep the summary row.
	sqliteAcquireShared = `INSERT INTO advisorylock_shared (key, owner, name, acquired_at, expires_at)
SELECT ?1, ?3, ?2, ?4, ?5 WHERE NOT EXISTS (SELECT 1 FROM advisorylock_locks WHERE key = ?1 AND expires_at > ?4 AND owner <> '')
	AND NOT EXISTS (SELECT 1 FROM advisorylock_writers WHERE key = ?1 AND expires_at > ?4)`
	sqliteRenewShared   = `UPDATE advisorylock_shared SET expires_at = ?3 WHERE key = ?1 AND owner = ?2 AND expires_at > ?4`
	sqliteReleaseShared = `DELETE FROM advisorylock_shared WHERE key = ?1 AND (owner = ?2 OR expires_at <= ?3)`
	sqliteClaimWriter   = `INSERT INTO advisorylock_writers (key, owner, expires_at) VALUES (?1, ?2, ?3)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at`
	sqliteWithdrawClaim = `DELETE FROM advisorylock_writers WHERE key = ?1 AND owner = ?2`
	// What keeps a shared holder out: the exclusive row, else a claim.
	sqliteSharedBlocker = `SELECT name, owner, acquired_at, expires_at FROM advisorylock_locks WHERE key = ?1 AND expires_at > ?2 AND owner <> ''
UNION ALL SELECT '', owner, 0, expires_at FROM advisorylock_writers WHERE key = ?1 AND expires_at > ?2 LIMIT 1`
	// Every live holder, the exclusive one first (never the summary row).
	sqliteHolders = `SELECT name, owner, acquired_at, expires_at, 0 FROM advisorylock_locks WHERE key = ?1 AND expires_at > ?2 AND owner <> ''
UNION ALL SELECT name, owner, acquired_at, expires_at, 1 FROM advisorylock_shared WHERE key = ?1 AND expires_at > ?2`

	// The upsert bumps the generation only if the row is free or expired,
	// and returns it; no row returned means held.
	// A new row's token is one more than the highest of the file's
	// deleted rows (advisorylock_tokens), so deleting a row never brings a
	// token back; a row's next grant takes one more than its own.
	sqliteAcquireLease = `INSERT INTO advisorylock_leases (name, owner, generation, acquired_at, expires_at)
VALUES (?1, ?2, (SELECT last + 1 FROM advisorylock_tokens WHERE id = 1), ?3, ?4)
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner,
	generation = max(advisorylock_leases.generation + 1, excluded.generation),
	acquired_at = excluded.acquired_at, expires_at = excluded.expires_at
WHERE advisorylock_leases.owner IS NULL OR advisorylock_leases.expires_at <= excluded.acquired_at
RETURNING generation`
	sqliteRenewLease = `UPDATE advisorylock_leases SET expires_at = ?4
WHERE name = ?1 AND owner = ?2 AND generation = ?3 AND expires_at > ?5`
	// A grant is its generation: a release names it alone. An acquire
	// whose outcome was unknown has none, and frees whatever its owner
	// label, unique per acquire, holds.
	sqliteReleaseLease = `UPDATE advisorylock_leases SET owner = NULL, expires_at = min(expires_at, ?3)
WHERE name = ?1 AND generation = ?2 AND owner IS NOT NULL`
	sqliteAbandonLease = `UPDATE advisorylock_leases SET owner = NULL, expires_at = min(expires_at, ?3)
WHERE name = ?1 AND owner = ?2`
	sqliteLeaseHolder = `SELECT owner, generation, acquired_at, expires_at FROM advisorylock_leases
WHERE name = ?1 AND owner IS NOT NULL AND expires_at > ?2`

	// With a window (backend.LeaseRequest.MinHold, ?5 or ?4 in milliseconds), a
	// renewal or release never moves expires_at before the window's end:
	// a lock row is kept instead of deleted, a lease row keeps its owner
	// for Holder to show, until then.
	sqliteRenewLockWindow   = `UPDATE advisorylock_locks SET expires_at = max(?3, acquired_at + ?5) WHERE key = ?1 AND owner = ?2 AND expires_at > ?4`
	sqliteReleaseLockWindow = `UPDATE advisorylock_locks SET expires_at = min(expires_at, max(?3, acquired_at + ?4)) WHERE key = ?1 AND owner = ?2`
	sqliteRenewLeaseWindow  = `UPDATE advisorylock_leases SET expires_at = max(?4, acquired_at + ?6)
WHERE name = ?1 AND owner = ?2 AND generation = ?3 AND expires_at > ?5`
	sqliteReleaseLeaseWindow = `UPDATE advisorylock_leases SET owner = CASE WHEN acquired_at + ?4 > ?3 THEN owner END,
	expires_at = min(expires_at, max(?3, acquired_at + ?4))
WHERE name = ?1 AND generation = ?2 AND owner IS NOT NULL`

	// The upsert keeps the higher token and returns it: a returned token
	// above ours means ours is stale.
	sqliteAdmitToken = `INSERT INTO advisorylock_fences (resource, token) VALUES (?1, ?2)
ON CONFLICT (resource) DO UPDATE SET token = max(advisorylock_fences.token, excluded.token)
RETURNING token`
)

// busyPolicy says how a statement retries SQLITE_BUSY: the pause doubles
// from a millisecond up to maxPause, with jitter so that processes that
// collided do not collide again, until the context ends or, if patience
// is set, patience has passed.
//
// SQLite serves no queue: whoever tries when the writer lock is free gets
// it, and a long pause loses to everyone who keeps trying. So pauses stay
// short, and a holder's statements (renew, release) pause less than a
// newcomer's, so that under contention renewals win over acquires.
type busyPolicy int

const (
	busyNewcomer busyPolicy = iota // acquires, reads, DDL
	busyHolder                     // renewals and releases
	// busyInTx bounds Fence.Admit's retries in the caller's transaction:
	// a transaction that already read holds a shared lock, and a writer
	// waiting for it to go cannot commit until the caller rolls back, so
	// waiting longer helps no one. Its patience is shorter than the
	// drivers' usual 5s busy_timeout, so that the other writer is still
	// waiting when the caller rolls back.
	busyInTx
)

func (p busyPolicy) maxPause() time.Duration {
	if p == busyHolder {
		return 2 * time.Millisecond
	}
	return 8 * time.Millisecond
}

func (p busyPolicy) patience() time.Duration {
	if p == busyInTx {
		return 2 * time.Second
	}
	return 0 // as long as the context allows
}

// sqliteBusySnapshot is SQLITE_BUSY_SNAPSHOT: a WAL transaction's snapshot
// is older than the latest commit, so it cannot write; only a new
// transaction can, and retrying is useless.
const sqliteBusySnapshot = 5 | 2<<8

func (sqliteBackend) Name() string { return "sqlite" }

// Traits: a lease row keeps WithMinHold's window in its expiry; a Lock's
// shared holds are rows of advisorylock_shared (see LeaseHolders); a
// release is heard by no one (waiters poll).
func (sqliteBackend) Traits() backend.Traits {
	return backend.Traits{KeepsWindows: true}
}

// Schema returns the DDL of advisorylock_locks, advisorylock_leases,
// advisorylock_fences, the token counter and the schema version table,
// with every upgrade step (idempotent: run it again after an upgrade).
func (sqliteBackend) Schema() string {
	return dbutil.SchemaScript(sqliteSchemaVersions, sqliteSteps, func(v int) string { return sqliteRecordVersion(v, 0) }, "")
}

// sqliteRecordVersion records that version v's step has run, at
// (milliseconds since 1970; 0 in Schema's script).
func sqliteRecordVersion(v int, at int64) string {
	return fmt.Sprintf("INSERT OR IGNORE INTO advisorylock_schema (version, applied_at) VALUES (%d, %d)", v, at)
}

// Validate refuses an in-memory database and creates the tables.
func (s sqliteBackend) Validate(ctx context.Context, db backend.DB) error {
	return retryBusy(ctx, busyNewcomer, func() error {
		conn, err := dbutil.TakeConn(ctx, db)
		if err != nil {
			return err
		}
		defer conn.Close()
		file, err := mainFile(ctx, conn)
		if err != nil {
			return err
		}
		if file == "" {
			return fmt.Errorf("%w: the SQLite database is in memory (\":memory:\", mode=memory or no file name); "+
				"database/sql gives every connection its own in-memory database, so a lock there would exclude nothing: "+
				"open a database file (such as \"app.db\") that every process taking the lock opens too", backend.ErrUnsupported)
		}
		if upToDate(ctx, conn) {
			return nil
		}
		return createTables(ctx, conn)
	})
}

// mainFile returns the file name of the connection's main database, "" if
// it is in memory or temporary.
func mainFile(ctx context.Context, conn *sql.Conn) (string, error) {
	rows, err := conn.QueryContext(ctx, "PRAGMA database_list")
	if err != nil {
		return "", err
	}
	defer rows.Close()
	for rows.Next() {
		var seq int
		var name string
		var file sql.NullString
		if err := rows.Scan(&seq, &name, &file); err != nil {
			return "", err
		}
		if name == "main" {
			return file.String, rows.Close()
		}
	}
	return "", rows.Err()
}

// createTables creates the tables or upgrades them to this code's
// version. Each statement is idempotent, so processes upgrading at once
// all succeed (busy ones retry), and a file whose tables were dropped
// behind the version table's back gets them again.
func createTables(ctx context.Context, q dbutil.Querier) error {
	stmts := []string{sqliteSchemaVersions}
	for v := 1; v < len(sqliteSteps); v++ {
		stmts = append(stmts, sqliteSteps[v]...)
		stmts = append(stmts, sqliteRecordVersion(v, time.Now().UnixMilli()))
	}
	for _, ddl := range stmts {
		if err := retryBusy(ctx, busyNewcomer, func() error {
			_, err := q.ExecContext(ctx, ddl)
			return err
		}); err != nil {
			return fmt.Errorf("advisorylock: sqlite: create tables: %w", err)
		}
	}
	return nil
}

// upToDate reports whether advisorylock_schema says the file has this
// code's version (one read; a file made before versions has no version
// table).
func upToDate(ctx context.Context, q dbutil.Querier) bool {
	var current int
	err := q.QueryRowContext(ctx, "SELECT coalesce(max(version), 0) FROM advisorylock_schema").Scan(&current)
	return err == nil && current >= len(sqliteSteps)-1
}

// Recognizes reports a database that answers sqlite_version().
func (sqliteBackend) Recognizes(ctx context.Context, conn *sql.Conn) bool {
	var v string
	return conn.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v) == nil && v != ""
}

// AcquireLease takes the row if it is absent, free or expired, in one
// upsert.
func (s sqliteBackend) AcquireLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	r.TTL = max(r.TTL, r.MinHold) // the row stays taken for the window too
	now, exp := leaseTimes(r)
	token := int64(1) // a lock row's grant; a lease row returns its generation
	acquired := false
	err := s.acquireInTurn(ctx, db, busyNewcomer, func(q dbutil.Querier) error {
		if r.Kind != backend.KindLease {
			var err error
			acquired, err = s.acquireRow(ctx, q, r, now, exp)
			return err
		}
		var gen int64 // its own variable: only a lease pays for the Scan's pointer
		err := q.QueryRowContext(ctx, sqliteAcquireLease, r.Name, r.Owner, now, exp).Scan(&gen)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		acquired, token = err == nil, gen
		return err
	})
	if err != nil {
		return 0, err
	}
	if !acquired {
		return 0, backend.ErrNotAcquired
	}
	if r.Wait && r.Retry && r.Kind == backend.KindLock {
		s.withdrawClaim(ctx, db, r)
	}
	return uint64(token), nil
}

// withdrawClaim ends the claim a waiting writer may have left while it
// waited (see acquireRow), once it holds the row after a miss (a first
// attempt has made no claim): from now on its row keeps shared holders
// out, and after its release nothing should. It runs in a statement of
// its own, after the grant's: run retries a busy statement from the
// start, and a grant must not be tried twice. If it fails, the claim
// expires by itself with the writer's TTL.
func (s sqliteBackend) withdrawClaim(ctx context.Context, db backend.DB, r backend.LeaseRequest) {
	_ = s.run(ctx, db, busyHolder, func(q dbutil.Querier) error {
		_, err := q.ExecContext(ctx, sqliteWithdrawClaim, r.Key, r.Owner)
		return err
	})
}

// acquireRow takes a lock row (backend.KindLock) or a shared holder's
// row (backend.KindShared) in one statement; a waiting writer that missed
// claims the key in a second (see backend.SharedRowStore).
func (sqliteBackend) acquireRow(ctx context.Context, q dbutil.Querier, r backend.LeaseRequest, now, exp int64) (bool, error) {
	stmt := sqliteAcquireLock
	if r.Kind == backend.KindShared {
		stmt = sqliteAcquireShared
	}
	res, err := q.ExecContext(ctx, stmt, r.Key, r.Name, r.Owner, now, exp)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if n == 1 || err != nil || !r.Wait || r.Kind != backend.KindLock {
		return n == 1, err
	}
	_, err = q.ExecContext(ctx, sqliteClaimWriter, r.Key, r.Owner, exp)
	return false, err
}

// RenewLease extends the row if r.Owner (and, for a lease, r.Token) still
// holds it unexpired; backend.ErrLeaseLost otherwise.
func (s sqliteBackend) RenewLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	now, exp := leaseTimes(r)
	var n int64
	err := s.run(ctx, db, busyHolder, func(q dbutil.Querier) error {
		var res sql.Result
		var err error
		win := r.MinHold.Milliseconds()
		switch {
		case r.Kind == backend.KindShared:
			res, err = q.ExecContext(ctx, sqliteRenewShared, r.Key, r.Owner, exp, now)
		case r.Kind == backend.KindLock && win > 0:
			res, err = q.ExecContext(ctx, sqliteRenewLockWindow, r.Key, r.Owner, exp, now, win)
		case r.Kind == backend.KindLock:
			res, err = q.ExecContext(ctx, sqliteRenewLock, r.Key, r.Owner, exp, now)
		case win > 0:
			res, err = q.ExecContext(ctx, sqliteRenewLeaseWindow, r.Name, r.Owner, int64(r.Token), exp, now, win)
		default:
			res, err = q.ExecContext(ctx, sqliteRenewLease, r.Name, r.Owner, int64(r.Token), exp, now)
		}
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, fmt.Errorf("%w: its row expired or was taken over", backend.ErrLeaseLost)
	}
	return max(r.Token, 1), nil
}

// ReleaseLease deletes a lock row if r.Owner holds it, or frees a lease
// row (which stays, so generations never go down) if grant r.Token holds
// it; a release with Token 0 frees what the owner label holds. With
// r.MinHold, a grant's row stays taken (a lease row by its owner) until
// the window's end instead. A release
// waits for a busy database as long as ctx allows, plus one statement's
// busy_timeout (an interrupt does not end the driver's busy wait): keep
// busy_timeout below the release timeout.
func (s sqliteBackend) ReleaseLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	now, _ := leaseTimes(r)
	return s.run(ctx, db, busyHolder, func(q dbutil.Querier) error {
		var err error
		win := r.MinHold.Milliseconds()
		switch {
		case r.Kind == backend.KindShared:
			_, err = q.ExecContext(ctx, sqliteReleaseShared, r.Key, r.Owner, now)
		case r.Kind == backend.KindLock && win > 0 && r.Token != 0:
			_, err = q.ExecContext(ctx, sqliteReleaseLockWindow, r.Key, r.Owner, now, win)
		case r.Kind == backend.KindLock && r.Token == 0: // an abandoned acquire: its claim too
			if _, err = q.ExecContext(ctx, sqliteReleaseLock, r.Key, r.Owner); err == nil {
				_, err = q.ExecContext(ctx, sqliteWithdrawClaim, r.Key, r.Owner)
			}
		case r.Kind == backend.KindLock:
			_, err = q.ExecContext(ctx, sqliteReleaseLock, r.Key, r.Owner)
		case r.Token == 0:
			_, err = q.ExecContext(ctx, sqliteAbandonLease, r.Name, r.Owner, now)
		case win > 0:
			_, err = q.ExecContext(ctx, sqliteReleaseLeaseWindow, r.Name, int64(r.Token), now, win)
		default:
			_, err = q.ExecContext(ctx, sqliteReleaseLease, r.Name, int64(r.Token), now)
		}
		return err
	})
}

// LeaseHolder reads the row; nil when it is absent, free or expired as of
// r.Now. For a Lock (backend.KindLock) that is its exclusive row, else one
// of its shared holders; for a shared holder (backend.KindShared), what
// keeps it out: the exclusive row, else a waiting writer's claim (Owner the writer's).
func (s sqliteBackend) LeaseHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	switch r.Kind {
	case backend.KindShared:
		return s.sharedBlocker(ctx, db, r)
	case backend.KindLock:
		hs, err := s.LeaseHolders(ctx, db, r)
		if len(hs) == 0 || err != nil {
			return nil, err
		}
		return hs[0], nil
	}
	return s.oneHolder(ctx, db, r, sqliteLeaseHolder, r.Name, func(h *backend.Holder) []any { return []any{&h.Owner, &h.Token} })
}

// sharedBlocker reports what keeps a shared holder of r.Key out.
func (s sqliteBackend) sharedBlocker(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	return s.oneHolder(ctx, db, r, sqliteSharedBlocker, r.Key, func(h *backend.Holder) []any { return []any{&h.Name, &h.Owner} })
}

// oneHolder reads the one row of query (its arguments: arg, then r.Now)
// into a Holder of r: the columns fields names, then the row's acquired
// and expiry times; nil when the query finds no row.
func (s sqliteBackend) oneHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest, query string, arg any, fields func(h *backend.Holder) []any) (*backend.Holder, error) {
	now, _ := leaseTimes(r)
	var h *backend.Holder
	err := s.run(ctx, db, busyNewcomer, func(q dbutil.Querier) error {
		h = &backend.Holder{Name: r.Name, Backend: "sqlite", Key: r.Key}
		var since, until int64
		err := q.QueryRowContext(ctx, query, arg, now).Scan(append(fields(h), &since, &until)...)
		if errors.Is(err, sql.ErrNoRows) {
			h = nil
			return nil
		}
		h.Since, h.ExpiresAt = time.UnixMilli(since), time.UnixMilli(until)
		return err
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// LeaseHolders lists every live holder of r.Key as of r.Now: the
// exclusive row first, then the shared holders' rows.
func (s sqliteBackend) LeaseHolders(ctx context.Context, db backend.DB, r backend.LeaseRequest) ([]*backend.Holder, error) {
	now, _ := leaseTimes(r)
	var hs []*backend.Holder
	err := s.run(ctx, db, busyNewcomer, func(q dbutil.Querier) error {
		hs = nil // run may run it again
		rows, err := q.QueryContext(ctx, sqliteHolders, r.Key, now)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			h := &backend.Holder{Backend: "sqlite", Key: r.Key}
			var since, until int64
			if err := rows.Scan(&h.Name, &h.Owner, &since, &until, &h.Shared); err != nil {
				return err
			}
			h.Since, h.ExpiresAt = time.UnixMilli(since), time.UnixMilli(until)
			hs = append(hs, h)
		}
		return rows.Err()
	})
	return hs, err
}

// AdmitToken keeps the higher of token and the stored one, in tx, and
// returns it. A busy database
// is retried for a short while only (busyInTx): if it stays busy,
// or the transaction's WAL snapshot is stale, the error says to roll back
// and retry the transaction, which BEGIN IMMEDIATE avoids.
func (sqliteBackend) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token uint64) (uint64, error) {
	var highest uint64
	err := withTables(ctx, tx, busyInTx, func() error {
		return tx.QueryRowContext(ctx, sqliteAdmitToken, resource, int64(token)).Scan(&highest)
	})
	if err != nil {
		if isBusy(err) {
			return 0, fmt.Errorf("advisorylock: sqlite: database busy inside the transaction; roll back and retry it (begin it IMMEDIATE to avoid this): %w", err)
		}
		return 0, err
	}
	return max(highest, token), nil
}

// leaseTimes returns r.Now and r.Now+r.TTL in Unix milliseconds. A zero
// Now means the system clock.
func leaseTimes(r backend.LeaseRequest) (now, expires int64) {
	t := r.Now
	if t.IsZero() {
		t = time.Now()
	}
	return t.UnixMilli(), t.Add(r.TTL).UnixMilli()
}

// run runs stmt where statements run (see dbutil.StatementsOn); it retries while
// the database is busy (opening a connection runs the driver's pragmas, so
// that can be busy too) and creates the tables if they are missing.
func (sqliteBackend) run(ctx context.Context, db backend.DB, p busyPolicy, stmt func(q dbutil.Querier) error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	created := false
	return retryBusy(ctx, p, func() error {
		on, done, err := dbutil.StatementsOn(ctx, db)
		if err != nil {
			return err
		}
		defer done()
		q := endless{on}
		err = stmt(q)
		if err != nil && !created && isMissingTable(err) {
			created = true
			if err := createTables(ctx, q); err != nil {
				return err
			}
			err = stmt(q)
		}
		return settled(ctx, err)
	})
}

// endless runs its statements with their context's values but without
// its end. A statement of this backend reads or writes a row or two of a
// local file; the one wait it can make is in the driver's busy handler,
// which the driver's interrupt does not end (busy_timeout does). So a
// context that can end buys nothing there, and costs a goroutine per
// statement that the drivers (glebarez/go-sqlite, modernc.org/sqlite,
// mattn/go-sqlite3) start to watch it: 12% of an uncontended release,
// measured (benchmarks/README.md). run still gives up retrying once ctx
// ends, and settled still says that a statement ran as ctx ended.
type endless struct{ q dbutil.Querier }

func (e endless) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return e.q.ExecContext(context.WithoutCancel(ctx), query, args...)
}

func (e endless) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return e.q.QueryContext(context.WithoutCancel(ctx), query, args...)
}

func (e endless) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return e.q.QueryRowContext(context.WithoutCancel(ctx), query, args...)
}

// acquireInTurn is run for an acquire, taken in turn with the other
// acquires of db's handle: SQLite has one writer at a time and serves no
// queue, so acquires of one pool that tried at once would sleep in the
// driver's busy handler (for up to 100ms between its tries, each time)
// while newcomers barge in, and one could wait for seconds. In turn
// (first come, first served), an acquire waits for the acquires ahead of
// it and no longer. A holder's statements (renew, release) do not wait
// for their turn, so that under contention they still win over acquires
// (see busyPolicy); they, the writes of other processes and the caller's
// own statements still meet SQLITE_BUSY, which run retries.
func (s sqliteBackend) acquireInTurn(ctx context.Context, db backend.DB, p busyPolicy, stmt func(q dbutil.Querier) error) error {
	turn, _ := dbutil.CachedVerdict(ctx, db, "sqlite acquires", func(context.Context) (chan struct{}, error) {
		return make(chan struct{}, 1), nil
	})
	if turn == nil { // ctx ended while another caller made it
		return s.run(ctx, db, p, stmt)
	}
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("advisorylock: sqlite: waiting for this pool's acquires ahead: %w", context.Cause(ctx))
	}
	defer func() { <-turn }()
	return s.run(ctx, db, p, stmt)
}

// settled returns err, or also ctx's error if ctx ended while the
// statement ran: then an error is likely the interruption, and success
// is unknown. (glebarez/go-sqlite's Exec, when the context ends just as it
// starts, returns no error without running the statement, and
// RowsAffected then reports the connection's previous statement, which
// could read as a grant or a renewal that never happened.)
func settled(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	switch {
	case cause == nil || err != nil && (errors.Is(err, cause) || isBusy(err)):
		return err
	case err == nil:
		return fmt.Errorf("advisorylock: sqlite: context ended while the statement ran, outcome unknown: %w", cause)
	default:
		return fmt.Errorf("advisorylock: sqlite: context ended while the statement ran: %w (%w)", cause, err)
	}
}

// withTables runs stmt in a transaction, retrying while busy as p says,
// and creating the tables (in the transaction) if missing.
func withTables(ctx context.Context, tx *sql.Tx, p busyPolicy, stmt func() error) error {
	created := false
	return retryBusy(ctx, p, func() error {
		err := stmt()
		if err != nil && !created && isMissingTable(err) {
			created = true
			if err := createTables(ctx, tx); err != nil {
				return err
			}
			err = stmt()
		}
		return settled(ctx, err)
	})
}

// retryBusy runs stmt until it returns anything but a retryable busy
// error, ctx ends, or p's patience (if any) has passed; then
// it returns the last busy error, wrapped with ctx's error if ctx ended.
func retryBusy(ctx context.Context, p busyPolicy, stmt func() error) error {
	var until time.Time
	if p.patience() > 0 {
		until = time.Now().Add(p.patience())
	}
	pause := time.Millisecond
	var timer *time.Timer
	for {
		err := stmt()
		if err == nil || !isBusy(err) || busyCode(err) == sqliteBusySnapshot {
			return err
		}
		if !until.IsZero() && !time.Now().Before(until) {
			return err
		}
		wait := pause/2 + rand.N(pause)
		pause = min(2*pause, p.maxPause())
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("advisorylock: sqlite: database still busy when the context ended: %w (last: %w)", context.Cause(ctx), err)
		case <-timer.C:
		}
	}
}

// isBusy reports SQLITE_BUSY or SQLITE_LOCKED (any extended code), from
// the driver's Code() where it has one, else from the message.
func isBusy(err error) bool {
	if code := busyCode(err); code >= 0 {
		return code&0xff == 5 || code&0xff == 6
	}
	msg := err.Error()
	for _, s := range []string{"database is locked", "database table is locked", "SQLITE_BUSY", "SQLITE_LOCKED"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// busyCode returns the SQLite result code of a driver error with a Code()
// method (glebarez/go-sqlite, modernc.org/sqlite), or -1.
func busyCode(err error) int {
	var c interface{ Code() int }
	if errors.As(err, &c) {
		return c.Code()
	}
	return -1
}

// isMissingTable reports an error about one of our tables not existing.
func isMissingTable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "no such table") && strings.Contains(msg, "advisorylock_")
}
