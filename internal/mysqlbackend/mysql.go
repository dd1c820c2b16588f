// Package mysqlbackend is the MySQL and MariaDB backend of advisorylock
// (advisorylock.MySQL documents what users see). It implements package
// backend's interfaces and takes nothing else from the root.
//
// A Lock is the named lock GET_LOCK takes on its session, its server name
// derived from the key (mysqlLockName). Shared holders are rows of
// advisorylock_shared beside the GET_LOCK (shared.go); a Lock's WithMinHold
// windows are rows of advisorylock_windows written by the statement that
// calls GET_LOCK (minhold.go); a Semaphore's slots are named locks, one
// per slot (semaphore.go); an Election's terms are rows of
// advisorylock_elections trusted while their session holds the lock
// (election.go); TryDoOnce's runs are rows of advisorylock_runs (once.go);
// WithLeaseRows's Locks are rows of advisorylock_locks (rows.go).
//
// Every statement is sent as text with its values written in (strings as
// hexadecimal literals, which read back exactly whatever the connection's
// character set and sql_mode), so each step is one round trip whatever
// the DSN says: go-sql-driver sends a statement with arguments as a
// prepare, an execute and a close unless interpolateParams=true. The
// exception is the exclusive try and the unlock on go-sql-driver, which
// are prepared once per connection and run by their handle (see forDB).
// The wait_timeout a Lock's sessions get is forLock's.
package mysqlbackend

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// New returns the MySQL and MariaDB backend (advisorylock.MySQL).
func New() backend.Backend { return mysqlBackend{} }

type mysqlBackend struct {
	// waitTimeout is the wait_timeout, in seconds, a Lock's sessions get
	// at their first grant (WithDeadHolderTimeout; see forLock); 0 leaves
	// the server's.
	waitTimeout int64
	// shared takes keys shared (RLock; see shared.go).
	shared bool
	// prepared keeps the exclusive try and the unlock prepared per
	// connection (go-sql-driver/mysql; see forDB); nil: text.
	prepared *dbutil.Prepared
}

// Configure returns m with the statement forms of db's driver (see forDB)
// and the dead-holder setting for the sessions a Lock pins (see forLock);
// it has no per-session server checks to leave out.
func (m mysqlBackend) Configure(db backend.DB, deadHolder time.Duration, _ bool) backend.Backend {
	return m.forDB(db).forLock(deadHolder)
}

// forDB returns m with the statement forms of db's driver: on
// go-sql-driver/mysql the exclusive try and the unlock are server-side
// prepared statements, prepared once per connection and run by their
// handle (one round trip, and the server skips parsing them), with the
// name as an argument. Where preparing is refused (a proxy) or a session
// lost them, they go as text.
//
// What it buys: client time within SPEC 11.3's 1.25x. TryLock+Release
// against its bare statements on MariaDB (benchmarks,
// BenchmarkMySQLPaired/trylock_release_vs_raw_shared_read, median of 5
// paired runs, unpinned, 2026-12-06) is 1.12x prepared and 1.41x as text;
// the round trips are the same.
func (m mysqlBackend) forDB(db backend.DB) mysqlBackend {
	if dbutil.DriverPkg(db) == "github.com/go-sql-driver/mysql" {
		m.prepared = dbutil.PreparedOf(db)
	}
	return m
}

// forLock returns the backend for one Lock whose sessions get a
// wait_timeout of d (WithDeadHolderTimeout, in whole seconds, rounded up):
// the server then ends the session of a holder that vanished without
// closing its socket (a host powered off) after d without a statement,
// and frees its lock. A live holder is never that idle: its keep-alive
// runs more often (New checks that d exceeds it plus the release
// timeout). The session keeps the setting when it goes back to the pool,
// so only its first grant sends it: the lock statement reads
// @@session.wait_timeout, and a grant on a session whose wait_timeout is
// longer sets it, one more round trip. A session whose wait_timeout is
// already as short (the user's or the server's) is left alone. d = 0
// leaves the server's settings.
//
// A Lock without a keep-alive (WithKeepAlive(0)) gets none of this: its
// idle holder would lose the lock unnoticed.
func (m mysqlBackend) forLock(d time.Duration) mysqlBackend {
	m.waitTimeout = 0
	if d > 0 {
		m.waitTimeout = int64((d + time.Second - 1) / time.Second)
	}
	return m
}

// The capabilities the MySQL backend has, each an interface of package
// backend that a third party's backend may implement too. It has no
// transaction locks (GET_LOCK's lock belongs to the session and outlives
// the transaction, so LockTx is refused before anything is sent), no sets
// in one statement (an exclusive try is more than a GET_LOCK where the key
// may have shared holders, see shared.go, so a set takes
// and releases its keys one statement each), and no release signals or
// waiters in line (MySQL has no notifications: a semaphore's waiters wait
// server-side on a slot, in slices).
var (
	_ backend.Validator             = mysqlBackend{}
	_ backend.Recognizer            = mysqlBackend{}
	_ backend.Configurer            = mysqlBackend{}
	_ backend.SessionIdentifier     = mysqlBackend{}
	_ backend.TermKeeper            = mysqlBackend{}
	_ backend.SharedSessionLocker   = mysqlBackend{}
	_ backend.WindowedSessionLocker = mysqlBackend{}
	_ backend.SlotLocker            = mysqlBackend{}
	_ backend.MultiplexLocker       = mysqlBackend{}
	_ backend.TableChecker          = mysqlBackend{}
	_ backend.TokenAdmitter         = mysqlBackend{}
	_ backend.RunRecorder           = mysqlBackend{}
	_ backend.SharedRowStore        = mysqlBackend{}
)

func (mysqlBackend) Name() string { return "mysql" }

// Traits: go-sql-driver closes its socket when a statement's context
// ends, also on a dead network; wait_timeout ends a live session too once
// it is idle that long (see forLock); a LeaseLock's rows keep
// WithMinHold's window (see minhold.go).
func (mysqlBackend) Traits() backend.Traits {
	return backend.Traits{CancelsPromptly: true, EndsIdleSessions: true, KeepsWindows: true}
}

// Recognizes reports a MySQL or MariaDB server: one that answers
// CONNECTION_ID() and @@version.
func (mysqlBackend) Recognizes(ctx context.Context, conn *sql.Conn) bool {
	var id int64
	var v string
	return conn.QueryRowContext(ctx, "SELECT CONNECTION_ID(), @@version").Scan(&id, &v) == nil
}

// Validate refuses, with backend.ErrUnsupported, servers whose named
// locks do not exclude or behave otherwise than MySQL's (see
// mysqlServerSupported) and read-only servers (a replica's locks exclude
// nothing on its primary). It costs two round trips, once per *sql.DB
// (one where the version alone refuses the server); an error from the
// server or the pool is returned wrapped.
func (mysqlBackend) Validate(ctx context.Context, db backend.DB) error {
	var s mysqlServer
	err := mysqlRun(ctx, db, func(q dbutil.Querier) error {
		var comment sql.NullString // a proxy may answer NULL
		if err := q.QueryRowContext(ctx, "SELECT @@version, @@version_comment, @@read_only").Scan(&s.version, &comment, &s.readOnly); err != nil {
			return err
		}
		s.comment = comment.String
		if mysqlLookAlike(s.version, s.comment) != nil {
			return nil // told by its version; it may not know the next statement
		}
		// A row only for a variable the server has (Galera's and Group
		// Replication's exist only where their plugins are loaded).
		rows, err := q.QueryContext(ctx, "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('wsrep_on', 'group_replication_single_primary_mode')")
		if err != nil {
			return err
		}
		defer rows.Close()
		s.vars = map[string]string{}
		for rows.Next() {
			var name, value string
			if err := rows.Scan(&name, &value); err != nil {
				return err
			}
			s.vars[strings.ToLower(name)] = value
		}
		return rows.Err()
	})
	if err != nil {
		return fmt.Errorf("advisorylock: checking the MySQL server: %w", err)
	}
	return mysqlServerSupported(s)
}

// mysqlServer is what Validate reads of a server.
type mysqlServer struct {
	version, comment string            // @@version, @@version_comment
	readOnly         bool              // @@read_only
	vars             map[string]string // wsrep_on and group_replication_single_primary_mode, where the server has them
}

// errReadOnly refuses a read-only server.
var errReadOnly = fmt.Errorf("%w: the MySQL server is read-only (read_only=ON, as a replica is): its locks would exclude nothing on the primary", backend.ErrUnsupported)

// mysqlServerSupported refuses a MySQL look-alike (see mysqlLookAlike), a
// read-only server, a Galera/PXC node, a member of a multi-primary Group
// Replication group, and a version without several named locks per
// session.
func mysqlServerSupported(s mysqlServer) error {
	if err := mysqlLookAlike(s.version, s.comment); err != nil {
		return err
	}
	if s.readOnly {
		return errReadOnly
	}
	if strings.EqualFold(s.vars["wsrep_on"], "ON") {
		return fmt.Errorf("%w: a Galera or Percona XtraDB cluster node (wsrep_on=ON): GET_LOCK is local to one node there, so it would exclude nothing across the cluster", backend.ErrUnsupported)
	}
	if strings.EqualFold(s.vars["group_replication_single_primary_mode"], "OFF") {
		return fmt.Errorf("%w: a Group Replication member in multi-primary mode (group_replication_single_primary_mode=OFF): GET_LOCK is local to one member, so it would exclude nothing across the group; connect to a single-primary group's primary", backend.ErrUnsupported)
	}
	major, minor, patch := versionNumbers(s.version)
	old := major*100+minor < 507 // MySQL 5.7
	if strings.Contains(strings.ToLower(s.version), "mariadb") {
		old = major*10000+minor*100+patch < 100002 // MariaDB 10.0.2
	}
	if old {
		return fmt.Errorf("%w: server %s holds one named lock per session (a second GET_LOCK frees the first); MySQL 5.7+ or MariaDB 10.0.2+ is needed", backend.ErrUnsupported, s.version)
	}
	return nil
}

// mysqlLookAlike refuses the servers that speak MySQL's protocol but whose
// named locks are not MySQL's, as their version strings tell: TiDB
// ("8.0.11-TiDB-v7.5.0"), whose GET_LOCK before v6.1 is an error or, with
// tidb_enable_noop_functions, a no-op that grants every caller, and since
// then waits at least a second where a try must not wait; Vitess (vtgate
// answers "8.0.30-Vitess" by default, and PlanetScale runs it), which
// sends GET_LOCK on a reserved connection of its own to one shard and
// allows it only in a SELECT without FROM: untested with this library.
func mysqlLookAlike(version, comment string) error {
	v, c := strings.ToLower(version), strings.ToLower(comment)
	switch {
	case strings.Contains(v, "tidb"):
		return fmt.Errorf("%w: the server is TiDB (%s): its GET_LOCK is a no-op granting every caller before v6.1 (with tidb_enable_noop_functions) and waits at least one second since, so a try is not a try", backend.ErrUnsupported, version)
	case strings.Contains(v, "vitess"), strings.Contains(c, "vitess"):
		return fmt.Errorf("%w: the server is Vitess (%s): it takes GET_LOCK on a reserved connection of its own, on one shard, and only in some statements; locks there are untested", backend.ErrUnsupported, version)
	}
	return nil
}

// versionNumbers reads "major.minor.patch" from the front of a version
// string such as "10.11.6-MariaDB-1"; missing parts are 0.
func versionNumbers(v string) (major, minor, patch int) {
	var n [3]int
	for i, part := range strings.SplitN(v, ".", 3) {
		end := 0
		for end < len(part) && part[end] >= '0' && part[end] <= '9' {
			end++
		}
		n[i], _ = strconv.Atoi(part[:end])
	}
	return n[0], n[1], n[2]
}

// mysqlLockName is the server-side name of key's lock, as a quoted
// literal: the key in lowercase hex, so no two keys share a name under the
// server's case-insensitive comparison.
func mysqlLockName(key int64) string {
	return "'advisorylock:v1:" + hex.EncodeToString(binary.BigEndian.AppendUint64(nil, uint64(key))) + "'"
}

// TryLockSession makes one GET_LOCK attempt with no wait; a grant while
// shared holders are in is let go again, a miss (see
// shared.go).
func (m mysqlBackend) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	if m.shared {
		return m.tryShared(ctx, conn, key)
	}
	r, state, err := m.tryPrepared(ctx, conn, key)
	if errors.Is(err, dbutil.ErrNotPrepared) {
		r, state, err = m.grabExclusive(ctx, conn, key, "SELECT ", "GET_LOCK("+mysqlLockName(key)+", 0)")
	}
	if state == grabbedWithReaders && err == nil {
		r.OK = false
		err = m.EndWait(ctx, conn, key)
	}
	if r.OK && err == nil {
		dbutil.RememberSession(conn, m.triedSession())
	}
	return r, err
}

// WaitLockSession waits in GET_LOCK for at most slice (the server takes
// fractions of a second). A 0 is a definite miss on a healthy connection.
//
// A server statement timeout shorter than the slice would end the wait
// early with NULL, so the statement lifts it for itself: MariaDB runs the
// executable comment (SET STATEMENT max_statement_time=0 FOR, no limit),
// which MySQL ignores; MySQL takes the optimizer hint (a limit a second
// past the slice), which MariaDB ignores.
//
// A writer granted the GET_LOCK while shared holders are in keeps it, so
// that no new shared holder enters, and waits for them to leave for the
// rest of the slice (see shared.go); the next slice finds
// the GET_LOCK its own, and EndWait lets it go if the wait ends first.
func (m mysqlBackend) WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (backend.SessionResult, error) {
	end := time.Now().Add(slice)
	slice = max(slice, time.Millisecond)
	secs := strconv.FormatFloat(slice.Seconds(), 'f', 3, 64)
	limit := strconv.FormatInt((slice + time.Second).Milliseconds(), 10)
	head := "/*M! SET STATEMENT max_statement_time=0 FOR */ SELECT /*+ MAX_EXECUTION_TIME(" + limit + ") */ "
	if m.shared {
		return m.waitShared(ctx, conn, key, head, secs)
	}
	name := mysqlLockName(key)
	r, state, err := m.grabExclusive(ctx, conn, key, head, "IF(IS_USED_LOCK("+name+") = CONNECTION_ID(), 1, GET_LOCK("+name+", "+secs+"))")
	if state != grabbedWithReaders || err != nil {
		return r, err
	}
	return m.waitForReaders(ctx, conn, key, r, end)
}

// getLock runs getLock, a SELECT of GET_LOCK (1: granted, 0: missed,
// NULL: an error). It also reads the session,
// read_only and the session's wait_timeout, in the same round trip:
// behind a VIP or DNS a new connection can reach a replica, whose locks
// exclude nothing on the primary; the error makes the acquire discard the
// connection, which frees a lock granted there. A grant on a session
// whose wait_timeout is longer than the Lock's sets it (see forLock).
func (m mysqlBackend) getLock(ctx context.Context, conn *sql.Conn, getLock string) (backend.SessionResult, error) {
	r, _, err := m.lockStatement(ctx, conn, getLock)
	return r, err
}

// lockStatement is getLock returning the first column too: any value
// from 1 up is a grant, whose session gets the Lock's wait_timeout.
func (m mysqlBackend) lockStatement(ctx context.Context, conn *sql.Conn, getLock string) (backend.SessionResult, int64, error) {
	var got sql.NullInt64
	var readOnly bool
	var waitTimeout int64
	var r backend.SessionResult
	err := conn.QueryRowContext(ctx, getLock+", CONNECTION_ID(), @@read_only, @@session.wait_timeout").Scan(&got, &r.Session, &readOnly, &waitTimeout)
	return m.lockOutcome(ctx, conn, r, got, readOnly, waitTimeout, err)
}

// lockOutcome is what a lock statement's row (see lockStatement) means.
func (m mysqlBackend) lockOutcome(ctx context.Context, conn *sql.Conn, r backend.SessionResult, got sql.NullInt64, readOnly bool, waitTimeout int64, err error) (backend.SessionResult, int64, error) {
	switch {
	case err != nil:
		return backend.SessionResult{}, 0, err
	case readOnly:
		return backend.SessionResult{}, 0, errReadOnly
	case !got.Valid: // an error on the server, such as the statement being killed
		return backend.SessionResult{}, 0, errors.New("advisorylock: GET_LOCK returned NULL (the server ended the wait with an error)")
	}
	r.OK = got.Int64 == 1
	if got.Int64 >= 1 && m.waitTimeout > 0 && waitTimeout > m.waitTimeout {
		return r, got.Int64, m.setWaitTimeout(ctx, conn)
	}
	return r, got.Int64, nil
}

// setWaitTimeout gives conn's session the Lock's wait_timeout; an error
// makes the acquire discard the connection, which frees the lock.
func (m mysqlBackend) setWaitTimeout(ctx context.Context, conn *sql.Conn) error {
	if _, err := conn.ExecContext(ctx, "SET SESSION wait_timeout = "+strconv.FormatInt(m.waitTimeout, 10)); err != nil {
		return fmt.Errorf("advisorylock: setting the session's wait_timeout (WithDeadHolderTimeout): %w", err)
	}
	return nil
}

// UnlockSession releases key. RELEASE_LOCK answers 1 (released), NULL
// (nobody holds it: OK false) or 0 (another session holds it: this
// connection's statements reach another server session than the one that
// took the lock, reported as dbutil.ErrTransactionPooler).
func (m mysqlBackend) UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	if m.shared {
		return m.unlockShared(ctx, conn, key)
	}
	name := mysqlLockName(key)
	var released, holder sql.NullInt64
	var r backend.SessionResult
	err := dbutil.ErrNotPrepared
	if m.prepared != nil {
		unquoted := name[1 : len(name)-1]
		err = queryPrepared(ctx, m.prepared, conn, myUnlockPrepared, []any{unquoted, unquoted}, &released, &r.Session, &holder)
	}
	if errors.Is(err, dbutil.ErrNotPrepared) {
		err = conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK("+name+"), CONNECTION_ID(), IS_USED_LOCK("+name+")").Scan(&released, &r.Session, &holder)
	}
	switch {
	case err != nil:
		return backend.SessionResult{}, err
	case released.Valid && released.Int64 == 0:
		return r, fmt.Errorf("%w: the unlock ran on server session %d, which did not hold the lock; session %d holds it", dbutil.ErrTransactionPooler, r.Session, holder.Int64)
	case holder.Valid && holder.Int64 == r.Session:
		// A session may take a named lock more than once, and each
		// RELEASE_LOCK lets go of one: its connection must not go back
		// to the pool still holding the lock.
		return r, fmt.Errorf("advisorylock: server session %d still holds the lock after its unlock (taken on it more than once)", r.Session)
	}
	r.OK = released.Valid && released.Int64 == 1
	return r, nil
}

// HoldsSession reports whether conn's session holds key; a server that
// turned read-only (demoted in a failover) is an error, so the keep-alive
// reports the lock lost.
func (m mysqlBackend) HoldsSession(ctx context.Context, conn *sql.Conn, key int64) (bool, error) {
	var held sql.NullBool
	var readOnly bool
	holds := "IS_USED_LOCK(" + mysqlLockName(key) + ") = CONNECTION_ID()"
	if m.shared {
		holds = mysqlHoldsShared(key)
	}
	err := conn.QueryRowContext(ctx, "SELECT "+holds+", @@read_only").Scan(&held, &readOnly)
	if err == nil && readOnly {
		err = errReadOnly
	}
	return held.Valid && held.Bool, err
}

// HeldKeys asks IS_USED_LOCK of each key, a row each, in statements of up
// to mysqlKeysPerStatement keys; a read-only server (demoted in a
// failover) is an error.
func (m mysqlBackend) HeldKeys(ctx context.Context, conn *sql.Conn, keys []int64) ([]bool, error) {
	held := make([]bool, len(keys))
	for start := 0; start < len(keys); start += mysqlKeysPerStatement {
		chunk := keys[start:min(start+mysqlKeysPerStatement, len(keys))]
		var q strings.Builder
		q.WriteString("SELECT -1, @@read_only")
		for i, k := range chunk {
			fmt.Fprintf(&q, " UNION ALL SELECT %d, IFNULL(IS_USED_LOCK(%s) = CONNECTION_ID(), 0)", i, mysqlLockName(k))
		}
		if err := m.heldChunk(ctx, conn, q.String(), held[start:start+len(chunk)]); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// mysqlKeysPerStatement bounds a HeldKeys statement's keys.
const mysqlKeysPerStatement = 1000

// heldChunk runs one HeldKeys statement into held.
func (mysqlBackend) heldChunk(ctx context.Context, conn *sql.Conn, q string, held []bool) error {
	rows, err := conn.QueryContext(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var i, v int64
		if err := rows.Scan(&i, &v); err != nil {
			return err
		}
		switch {
		case i < 0 && v != 0:
			return errReadOnly
		case i >= 0 && int(i) < len(held):
			held[i] = v == 1
		}
	}
	return rows.Err()
}

// SessionIdentity is the connection id on one server (host, port, server
// id).
func (mysqlBackend) SessionIdentity(ctx context.Context, conn *sql.Conn) (string, error) {
	var id, port, server int64
	var host string
	err := conn.QueryRowContext(ctx, "SELECT CONNECTION_ID(), @@hostname, @@port, @@server_id").Scan(&id, &host, &port, &server)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d@%s:%d/%d", id, host, port, server), nil
}

// SessionHolder reports a holder of key (see SessionHolders): the
// exclusive one, else a shared one.
func (m mysqlBackend) SessionHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	hs, err := m.SessionHolders(ctx, db, key)
	if len(hs) == 0 || err != nil {
		return nil, err
	}
	return hs[0], nil
}

// ---------------------------------------------------------------------------
// Leases and fences: the backend.LeaseStore half of the MySQL backend.

// mysqlSteps are the schema's upgrade steps; advisorylock_schema records
// those applied, and the first use that finds a table missing applies the
// rest under the schema lock (see createMySQLTables). Every step is
// idempotent (MySQL's DDL is not transactional). Step 1: the lease and
// fence tables; step 2: advisorylock_windows; step 3:
// advisorylock_elections. A name of any length is
// kept byte for byte (MySQL's default collations ignore case and trailing
// spaces) in a BLOB; the key is its SHA-256, since an InnoDB key holds at
// most 3072 bytes. Times are UTC.
var mysqlSteps = [][]string{1: {
	`CREATE TABLE IF NOT EXISTS advisorylock_leases (
	name_hash   BINARY(32)  NOT NULL PRIMARY KEY, -- SHA-256 of name
	name        MEDIUMBLOB  NOT NULL,
	owner       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- NULL when free
	generation  BIGINT      NOT NULL, -- the fencing token of the latest grant
	acquired_at DATETIME(6) NOT NULL, -- UTC
	expires_at  DATETIME(6) NOT NULL  -- UTC
) ENGINE=InnoDB`,
	`CREATE TABLE IF NOT EXISTS advisorylock_fences (
	resource_hash BINARY(32) NOT NULL PRIMARY KEY, -- SHA-256 of resource
	resource      MEDIUMBLOB NOT NULL,
	token         BIGINT     NOT NULL -- the highest token admitted
) ENGINE=InnoDB`,
}, 2: {mysqlWindowsTable}, // step 2: once-per-window Locks (WithMinHold; see minhold.go)
	3: {mysqlElectionsTable}, // step 3: elections (NewElection; see election.go)
	4: {mysqlSharedTable},    // step 4: shared locks (RLock; see shared.go)
	5: {mysqlRunsTable},      // step 5: runs done (Lock.TryDoOnce; see once.go)
	6: {mysqlLocksTable},     // step 6: Locks kept as rows (WithLeaseRows; see rows.go)
	7: mysqlSharedRows,       // step 7: their shared holders (RLock; see shared_rows.go)
}

// mysqlSchemaVersions is the table of applied upgrade steps.
const mysqlSchemaVersions = `CREATE TABLE IF NOT EXISTS advisorylock_schema (
	version    INT         NOT NULL PRIMARY KEY,
	applied_at DATETIME(6) NOT NULL -- UTC
) ENGINE=InnoDB`

// Schema returns the DDL of advisorylock_leases, advisorylock_fences,
// advisorylock_windows and the schema version table, with every upgrade
// step, for an administrator or a migration tool to run (it is
// idempotent on MariaDB; on MySQL but for version 7's ALTER TABLE,
// which MySQL cannot write IF NOT EXISTS: after an upgrade, run the
// versions advisorylock_schema lacks). The application's user then needs only the grants listed at
// its end. MySQL's Lock needs no table, unless it has WithMinHold
// (advisorylock_windows) or WithLeaseRows (advisorylock_locks, and
// advisorylock_shared_rows for its shared holders).
func (mysqlBackend) Schema() string {
	return dbutil.SchemaScript(mysqlSchemaVersions, mysqlSteps, mysqlRecordVersion, `
-- The application's user needs (no CREATE; PROCESS only for Holder's user and host):
--   GRANT SELECT, INSERT, UPDATE ON db.advisorylock_leases TO app;
--   GRANT SELECT, INSERT, UPDATE ON db.advisorylock_fences TO app;
--   GRANT SELECT, INSERT, UPDATE ON db.advisorylock_windows TO app; -- Lock with WithMinHold
--   GRANT SELECT, INSERT, UPDATE ON db.advisorylock_elections TO app; -- Election
--   GRANT SELECT, INSERT, UPDATE, DELETE ON db.advisorylock_shared TO app; -- RLock
--   GRANT SELECT, INSERT, DELETE ON db.advisorylock_runs TO app; -- Lock.TryDoOnce
--   GRANT SELECT, INSERT, UPDATE, DELETE ON db.advisorylock_locks, db.advisorylock_shared_rows TO app; -- WithLeaseRows
--   GRANT SELECT ON db.advisorylock_schema TO app;
`)
}

// mysqlRecordVersion records that version v's step has run.
func mysqlRecordVersion(v int) string {
	return "INSERT IGNORE INTO advisorylock_schema (version, applied_at) VALUES (" + strconv.Itoa(v) + ", UTC_TIMESTAMP(6))"
}

// mysqlNowMicros is the database clock in microseconds since 1970 (UTC).
const mysqlNowMicros = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))"

// mysqlHex writes s as a hexadecimal string literal: it reads back as
// exactly s's bytes whatever the character set or sql_mode
// (NO_BACKSLASH_ESCAPES), so no quoting can go wrong. It is the only way a
// string reaches SQL text in this backend.
func mysqlHex(s string) string {
	if s == "" {
		return "''"
	}
	return "X'" + hex.EncodeToString([]byte(s)) + "'"
}

// mysqlHash writes the key of a name: its SHA-256, as a hex literal.
func mysqlHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return mysqlHex(string(sum[:]))
}

// mysqlExpires is now plus the lease's TTL.
func mysqlExpires(ttl time.Duration) string {
	return "UTC_TIMESTAMP(6) + INTERVAL " + strconv.FormatInt(dbutil.TTLMillis(ttl)*1000, 10) + " MICROSECOND"
}

// AcquireLease takes the lease if it is free or expired, in one upsert.
// The update's assignments run in order: the first takes the owner only
// if the row is free; the others see whether it took it by the owner
// label, which is unique per acquire. The new token is passed through
// LAST_INSERT_ID(expr), which the server reports with the statement's
// result. The VALUES row is evaluated even when the name exists, so the
// update path always sets LAST_INSERT_ID again: to the new token, or to 0
// when the row is held. The grant commits durably (InnoDB).
func (m mysqlBackend) AcquireLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	switch r.Kind {
	case backend.KindLock:
		return m.acquireLock(ctx, db, r)
	case backend.KindShared:
		return m.acquireShared(ctx, db, r)
	}
	owner, expires := mysqlHex(r.Owner), mysqlExpires(max(r.TTL, r.MinHold)) // the row stays taken for the window too
	stmt := `INSERT INTO advisorylock_leases (name_hash, name, owner, generation, acquired_at, expires_at)
VALUES (` + mysqlHash(r.Name) + `, ` + mysqlHex(r.Name) + `, ` + owner + `, LAST_INSERT_ID(` + mysqlNowMicros + `), UTC_TIMESTAMP(6), ` + expires + `)
ON DUPLICATE KEY UPDATE
	owner = IF(owner IS NULL OR expires_at <= UTC_TIMESTAMP(6), ` + owner + `, owner),
	generation = IF(owner = ` + owner + `, LAST_INSERT_ID(GREATEST(generation + 1, ` + mysqlNowMicros + `)), generation + LAST_INSERT_ID(0)),
	acquired_at = IF(owner = ` + owner + `, UTC_TIMESTAMP(6), acquired_at),
	expires_at = IF(owner = ` + owner + `, ` + expires + `, expires_at)`
	token, err := m.execToken(ctx, db, stmt)
	if err == nil && token == 0 {
		err = backend.ErrNotAcquired
	}
	return m.grant(token, err)
}

// RenewLease extends the lease by its TTL from the database's now (with
// r.MinHold, never before the window's end) if r.Owner and r.Token still
// hold it unexpired; backend.ErrLeaseLost otherwise.
func (m mysqlBackend) RenewLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	switch r.Kind {
	case backend.KindLock:
		return m.renewLock(ctx, db, r)
	case backend.KindShared:
		return m.renewShared(ctx, db, r)
	}
	expires := mysqlExpires(r.TTL)
	if r.MinHold > 0 { // never before the window's end
		expires = "GREATEST(" + expires + ", " + mysqlAfterGrant(r.MinHold) + ")"
	}
	stmt := `UPDATE advisorylock_leases SET expires_at = ` + expires + `, generation = LAST_INSERT_ID(generation)
WHERE name_hash = ` + mysqlHash(r.Name) + ` AND owner = ` + mysqlHex(r.Owner) + ` AND generation = ` + strconv.FormatInt(int64(r.Token), 10) + ` AND expires_at > UTC_TIMESTAMP(6)`
	token, err := m.execToken(ctx, db, stmt)
	if err == nil && uint64(token) != r.Token {
		err = fmt.Errorf("%w: it expired or was taken over", backend.ErrLeaseLost)
	}
	return m.grant(token, err)
}

func (mysqlBackend) grant(token int64, err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	return uint64(token), nil
}

// execToken runs stmt and returns the value it passed to LAST_INSERT_ID,
// or 0 when it passed none.
func (mysqlBackend) execToken(ctx context.Context, db backend.DB, stmt string) (int64, error) {
	var token int64
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		res, err := q.ExecContext(ctx, stmt)
		if err != nil {
			return err
		}
		token, err = res.LastInsertId()
		return err
	})
	return token, err
}

// ReleaseLease frees the lease if grant r.Token still holds it (with
// Token 0, whatever r.Owner holds); the row stays, so the token never goes
// down. With r.MinHold it stays taken by its owner until the window's end.
func (m mysqlBackend) ReleaseLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	switch r.Kind {
	case backend.KindLock:
		return m.releaseLock(ctx, db, r)
	case backend.KindShared:
		return m.releaseShared(ctx, db, r)
	}
	which := "generation = " + strconv.FormatInt(int64(r.Token), 10) + " AND owner IS NOT NULL"
	if r.Token == 0 {
		which = "owner = " + mysqlHex(r.Owner)
	}
	set := "owner = NULL, expires_at = LEAST(expires_at, UTC_TIMESTAMP(6))"
	if r.MinHold > 0 && r.Token != 0 { // taken by its owner until the window's end
		end := mysqlAfterGrant(r.MinHold)
		set = "owner = IF(" + end + " > UTC_TIMESTAMP(6), owner, NULL), expires_at = LEAST(expires_at, GREATEST(UTC_TIMESTAMP(6), " + end + "))"
	}
	stmt := "UPDATE advisorylock_leases SET " + set + " WHERE name_hash = " + mysqlHash(r.Name) + " AND " + which
	return mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		_, err := q.ExecContext(ctx, stmt)
		return err
	})
}

// LeaseHolder reports the lease's holder, or nil when it is free or
// expired by the database clock.
func (m mysqlBackend) LeaseHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	switch r.Kind {
	case backend.KindLock:
		return m.lockHolder(ctx, db, r)
	case backend.KindShared:
		return m.sharedBlocker(ctx, db, r)
	}
	stmt := `SELECT owner, generation, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at), TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at)
FROM advisorylock_leases WHERE name_hash = ` + mysqlHash(r.Name) + ` AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)`
	h := &backend.Holder{Name: r.Name, Backend: m.Name(), Key: r.Key}
	var gen, since, expires int64
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		return q.QueryRowContext(ctx, stmt).Scan(&h.Owner, &gen, &since, &expires)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	h.Token, h.Since, h.ExpiresAt = uint64(gen), time.UnixMicro(since), time.UnixMicro(expires)
	return h, nil
}

// AdmitToken stores token as resource's highest in tx if it is not lower
// than the stored one, in one upsert that locks the row either way (so
// the caller's write commits before any later admit of the resource);
// otherwise it reads the highest and returns it. As in AcquireLease,
// LAST_INSERT_ID reports the outcome: the token, or 0.
func (mysqlBackend) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token uint64) (uint64, error) {
	key, tok := mysqlHash(resource), strconv.FormatUint(token, 10)
	result, err := tx.ExecContext(ctx, "INSERT INTO advisorylock_fences (resource_hash, resource, token) VALUES ("+key+", "+mysqlHex(resource)+", LAST_INSERT_ID("+tok+"))"+
		" ON DUPLICATE KEY UPDATE token = IF(token <= "+tok+", LAST_INSERT_ID("+tok+"), token + LAST_INSERT_ID(0))")
	if err != nil {
		return 0, err
	}
	if id, err := result.LastInsertId(); err != nil {
		return 0, err
	} else if id == int64(token) {
		return token, nil
	}
	var highest int64
	if err := tx.QueryRowContext(ctx, "SELECT token FROM advisorylock_fences WHERE resource_hash = "+key).Scan(&highest); err != nil {
		return 0, fmt.Errorf("advisorylock: reading the highest token after a stale one: %w", err)
	}
	return uint64(highest), nil
}

// ensureMySQLTables creates the library's tables (see createMySQLTables)
// unless all of tables, names of the library's own, exist: one round trip
// when they do.
func ensureMySQLTables(ctx context.Context, db backend.DB, tables ...string) error {
	var n int
	err := mysqlRun(ctx, db, func(q dbutil.Querier) error {
		return q.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN ('"+
			strings.Join(tables, "', '")+"')").Scan(&n)
	})
	if err != nil || n == len(tables) {
		return err
	}
	return createMySQLTables(ctx, db)
}

// ensureMySQLTable is ensureMySQLTables for one table, once per *sql.DB.
func ensureMySQLTable(ctx context.Context, db backend.DB, table string) error {
	_, err := dbutil.CachedVerdict(ctx, db, "mysql table "+table, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, ensureMySQLTables(ctx, db, table)
	})
	return err
}

// mysqlSchemaLock is the named lock that serializes creating the tables;
// no Lock's name can be it (see mysqlLockName).
const mysqlSchemaLock = "'advisorylock:schema'"

// createMySQLTables applies the upgrade steps the database lacks, on one
// connection, while holding the schema lock, so that concurrent first
// uses all succeed. The connection is discarded if the unlock does not
// answer.
func createMySQLTables(ctx context.Context, db backend.DB) error {
	conn, err := dbutil.TakeConn(ctx, db)
	if err != nil {
		return fmt.Errorf("advisorylock: creating tables: %w", err)
	}
	err, unlockErr := createMySQLTablesOn(ctx, conn)
	dbutil.GiveBack(conn, unlockErr == nil) // ending the session frees the schema lock
	return err
}

// createMySQLTablesOn is createMySQLTables on conn; unlockErr says the
// schema lock may still be held by conn's session (discard it then).
func createMySQLTablesOn(ctx context.Context, conn *sql.Conn) (err, unlockErr error) {
	var got sql.NullInt64
	err = conn.QueryRowContext(ctx, "SELECT GET_LOCK("+mysqlSchemaLock+", 30)").Scan(&got)
	if err == nil && got.Int64 != 1 {
		err = errors.New("the schema lock was not granted within 30s")
	}
	if err == nil {
		err = applyMySQLSteps(ctx, conn)
	}
	_, unlockErr = conn.ExecContext(ctx, "DO RELEASE_LOCK("+mysqlSchemaLock+")")
	switch {
	case dbutil.MySQLErrno(err) == mysqlDenied:
		return fmt.Errorf("advisorylock: creating tables: the database user may not create them; an administrator creates them from Schema(MySQL()) and grants what its end lists: %w", err), unlockErr
	case err != nil:
		return fmt.Errorf("advisorylock: creating tables: %w", err), unlockErr
	}
	return nil, unlockErr
}

// applyMySQLSteps applies on conn the upgrade steps not recorded in
// advisorylock_schema, and records them.
func applyMySQLSteps(ctx context.Context, conn *sql.Conn) error {
	current := 0
	err := conn.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM advisorylock_schema").Scan(&current)
	if err != nil && dbutil.MySQLErrno(err) != mysqlNoSuchTable {
		return err
	}
	if current >= len(mysqlSteps)-1 {
		return nil
	}
	if _, err := conn.ExecContext(ctx, mysqlSchemaVersions); err != nil {
		return err
	}
	for v := current + 1; v < len(mysqlSteps); v++ {
		for _, ddl := range mysqlSteps[v] {
			// MySQL has no ADD COLUMN IF NOT EXISTS: a column there
			// already (a step cut short before it was recorded) is the
			// step's.
			if _, err := conn.ExecContext(ctx, ddl); err != nil && dbutil.MySQLErrno(err) != mysqlDupColumn {
				return err
			}
		}
		if _, err := conn.ExecContext(ctx, mysqlRecordVersion(v)); err != nil {
			return err
		}
	}
	return nil
}

// mysqlRun runs stmt where statements that hold no lock run (see
// dbutil.StatementsOn).
func mysqlRun(ctx context.Context, db backend.DB, stmt func(q dbutil.Querier) error) error {
	q, done, err := dbutil.StatementsOn(ctx, db)
	if err != nil {
		return err
	}
	defer done()
	err = stmt(q)
	if err != nil && ctx.Err() != nil { // say why first (a LockTimeout's budget), keep the driver's error
		err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	return dbutil.Unreachable(err)
}

// MySQL error numbers the lease statements act on.
const (
	mysqlDenied       = 1142 // ER_TABLEACCESS_DENIED_ERROR: a command the user may not run
	mysqlNoSuchTable  = 1146 // ER_NO_SUCH_TABLE
	mysqlNoSuchColumn = 1054 // ER_BAD_FIELD_ERROR: a column an upgrade step adds
	mysqlDupColumn    = 1060 // ER_DUP_FIELDNAME: a step's column is there already
	mysqlLockWaitTime = 1205 // ER_LOCK_WAIT_TIMEOUT: nothing was written
	mysqlDeadlock     = 1213 // ER_LOCK_DEADLOCK: rolled back, nothing was written
)

// mysqlLeaseRun runs a lease statement as mysqlRun does. A missing table
// is created and the statement run again, once; a deadlock or lock wait
// timeout (concurrent first inserts of one name can deadlock in InnoDB)
// wrote nothing and is retried while ctx allows, a few times. No rows from
// a statement whose context ended is an unknown outcome, not "held" or
// "free".
func mysqlLeaseRun(ctx context.Context, db backend.DB, stmt func(q dbutil.Querier) error) error {
	err := mysqlRun(ctx, db, stmt)
	for tries := 0; err != nil && tries < 5 && ctx.Err() == nil; tries++ {
		switch dbutil.MySQLErrno(err) {
		case mysqlNoSuchTable, mysqlNoSuchColumn:
			if tries > 0 {
				return err
			}
			if cerr := createMySQLTables(ctx, db); cerr != nil {
				return cerr
			}
		case mysqlDeadlock, mysqlLockWaitTime:
		default:
			return err
		}
		err = mysqlRun(ctx, db, stmt)
	}
	if errors.Is(err, sql.ErrNoRows) && ctx.Err() != nil {
		return fmt.Errorf("advisorylock: context ended while the statement ran, outcome unknown: %w", context.Cause(ctx))
	}
	return err
}

// mysqlTableColumns names, for each table a Check probes, a column every
// statement on it reads and writes.
var mysqlTableColumns = map[string]string{
	"advisorylock_leases":    "name_hash",
	"advisorylock_fences":    "resource_hash",
	"advisorylock_windows":   "lock_key",
	"advisorylock_elections": "name_hash",
	"advisorylock_locks":     "lock_key",
}

// CheckTables creates the tables if they are missing and proves, with two
// statements per table that match no row, that the user may read, insert
// and update each of tables: a missing grant comes back as the server's
// own 1142, as the first operation would get it.
func (mysqlBackend) CheckTables(ctx context.Context, db backend.DB, tables ...string) error {
	if err := ensureMySQLTables(ctx, db, tables...); err != nil {
		return err
	}
	for _, t := range tables {
		c := mysqlTableColumns[t]
		for _, probe := range []string{
			fmt.Sprintf("UPDATE %s SET %s = %[2]s WHERE FALSE", t, c),
			// Every column: in strict mode an INSERT that leaves out a
			// NOT NULL column without a default is refused (1364) even
			// when it inserts no row.
			"INSERT INTO " + t + " SELECT * FROM " + t + " WHERE FALSE",
		} {
			err := mysqlRun(ctx, db, func(q dbutil.Querier) error {
				_, err := q.ExecContext(ctx, probe)
				return err
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// The exclusive try and the unlock as prepared statements (see forDB):
// the text of grabExclusive's try and of UnlockSession, with the lock's
// name (and its shared holders' prefix) as arguments.
const (
	myTryPrepared = "SELECT CASE GET_LOCK(?, 0) WHEN 1 THEN IF(EXISTS (SELECT 1 FROM advisorylock_shared s WHERE s.lock_key = ?" +
		" AND IS_USED_LOCK(CONCAT(?, s.conn_id)) = s.conn_id), 2, 1) WHEN 0 THEN 0 END, CONNECTION_ID(), @@read_only, @@session.wait_timeout"
	myUnlockPrepared = "SELECT RELEASE_LOCK(?), CONNECTION_ID(), IS_USED_LOCK(?)"
)

// mysqlUnknownStatement is ER_UNKNOWN_STMT_HANDLER: the session lost a
// prepared statement (COM_RESET_CONNECTION, a proxy that moved it).
const mysqlUnknownStatement = 1243

// tryPrepared is grabExclusive's try as a prepared statement; it returns
// dbutil.ErrNotPrepared where nothing ran (no cache, refused, the table missing:
// the text path creates it), and the caller sends the text.
func (m mysqlBackend) tryPrepared(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, int, error) {
	if m.prepared == nil {
		return backend.SessionResult{}, grabMissed, dbutil.ErrNotPrepared
	}
	name := mysqlLockName(key)
	unquoted := name[1 : len(name)-1]
	var got sql.NullInt64
	var readOnly bool
	var waitTimeout int64
	var r backend.SessionResult
	err := queryPrepared(ctx, m.prepared, conn, myTryPrepared, []any{unquoted, key, unquoted + ":s"}, &got, &r.Session, &readOnly, &waitTimeout)
	if errors.Is(err, dbutil.ErrNotPrepared) {
		return backend.SessionResult{}, grabMissed, err
	}
	r, state, err := m.lockOutcome(ctx, conn, r, got, readOnly, waitTimeout, err)
	if err != nil {
		return backend.SessionResult{}, grabMissed, err
	}
	r.OK = state == grabbed
	return r, int(state), nil
}

// queryPrepared runs text on conn's session, prepared there first if it is
// not yet, with args, and stores its one row in dest (*int64, *bool or
// *sql.NullInt64). It returns dbutil.ErrNotPrepared where nothing ran: the
// connection is not the driver's own, the server refused to prepare (then
// the cache sends text from then on), a table is missing, or the session
// lost the statement (it is prepared again next time).
func queryPrepared(ctx context.Context, ps *dbutil.Prepared, conn *sql.Conn, text string, args []any, dest ...any) error {
	if ps.Refused.Load() {
		return dbutil.ErrNotPrepared
	}
	vals, err := ps.QueryRow(ctx, conn, text, args, func(err error) bool {
		n := dbutil.MySQLErrno(err)
		if n != 0 && n != mysqlNoSuchTable {
			ps.Refused.Store(true)
		}
		return n != 0
	}, func(err error) bool { return dbutil.MySQLErrno(err) == mysqlUnknownStatement })
	if err != nil {
		return err
	}
	if len(vals) != len(dest) {
		return fmt.Errorf("advisorylock: a prepared statement returned %d columns, want %d", len(vals), len(dest))
	}
	for i, d := range dest {
		if err := assignInt(d, vals[i]); err != nil {
			return err
		}
	}
	return nil
}

// assignInt stores an integer column's driver value v in dest.
func assignInt(dest any, v driver.Value) error {
	var n int64
	valid := true
	switch x := v.(type) {
	case nil:
		valid = false
	case int64:
		n = x
	case uint64:
		n = int64(x)
	case []byte:
		var err error
		if n, err = strconv.ParseInt(string(x), 10, 64); err != nil {
			return fmt.Errorf("advisorylock: reading an integer column: %w", err)
		}
	default:
		return fmt.Errorf("advisorylock: an integer column came as %T", v)
	}
	if d, ok := dest.(*sql.NullInt64); ok {
		*d = sql.NullInt64{Int64: n, Valid: valid}
		return nil
	}
	if !valid {
		return errors.New("advisorylock: an integer column was NULL")
	}
	switch d := dest.(type) {
	case *int64:
		*d = n
	case *bool:
		*d = n != 0
	default:
		return fmt.Errorf("advisorylock: cannot store an integer column in %T", dest)
	}
	return nil
}
