package mysqlbackend

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Windows (WithMinHold) on MySQL. A named lock ends with its session, so
// the window of a Lock lives in a row of advisorylock_windows, keyed by
// the lock's key and written by the statement that takes the lock: an
// upsert whose update clause calls GET_LOCK only once the stored window
// has ended, under the row's lock, so two sessions never both see it
// ended. The release stays a plain RELEASE_LOCK, and a holder that dies
// leaves its window behind. A lease keeps its window in its own row's
// expires_at. Every time is the database's UTC_TIMESTAMP(6). Locks
// without the option never read or write the table.

// mysqlWindowsTable is the DDL of advisorylock_windows (schema step 2).
const mysqlWindowsTable = `CREATE TABLE IF NOT EXISTS advisorylock_windows (
	lock_key      BIGINT      NOT NULL PRIMARY KEY, -- Key(name)
	name          MEDIUMBLOB  NOT NULL,
	connection_id BIGINT      NOT NULL, -- the granting session's CONNECTION_ID()
	user          VARCHAR(255) NOT NULL, -- its USER(), before the @
	host          VARCHAR(255) NOT NULL, -- and after it
	grants        BIGINT      NOT NULL, -- grants recorded so far
	acquired_at   DATETIME(6) NOT NULL, -- UTC; the grant
	taken_until   DATETIME(6) NOT NULL  -- UTC; the name stays taken until then
) ENGINE=InnoDB`

// mysqlWindowGranted is true, in the update clause of mysqlWindowUpsert
// after its first assignment, when this statement made the grant: only
// the grant sets acquired_at to the statement's now (UTC_TIMESTAMP is
// fixed for a statement), and a window that had not ended keeps
// taken_until after now, while an ended one started at least a
// millisecond before it.
const mysqlWindowGranted = "(taken_until <= UTC_TIMESTAMP(6) AND acquired_at = UTC_TIMESTAMP(6))"

// The session's user and client host, as USER() has them.
const (
	mysqlUser = "SUBSTRING_INDEX(USER(), '@', 1)"
	mysqlHost = "SUBSTRING_INDEX(USER(), '@', -1)"
)

// mysqlWindowUpsert records the window of a grant made now unless an
// earlier grant's window is still open. With try, the grant is a GET_LOCK
// with no wait made in the update clause once the stored window has
// ended (never in the VALUES row, which the server evaluates even when
// the key exists): so a key's first try only inserts an ended window, and
// the caller runs the statement again. Without try the session already
// holds the lock (a wait was granted) and the VALUES row is its window.
// The statement reports through LAST_INSERT_ID: 0 when it recorded no
// window, 1 when it inserted the key's first (ended) window, else the
// session's connection id (at least 1) times two, plus one when the
// session's wait_timeout is longer than the Lock's (see forLock; read by
// windowGrant).
func (m mysqlBackend) mysqlWindowUpsert(key int64, name string, window time.Duration, try bool) string {
	k := strconv.FormatInt(key, 10)
	until := "UTC_TIMESTAMP(6) + INTERVAL " + strconv.FormatInt(dbutil.TTLMillis(window)*1000, 10) + " MICROSECOND"
	granted := "CONNECTION_ID() * 2"
	if m.waitTimeout > 0 {
		granted += " + (@@session.wait_timeout > " + strconv.FormatInt(m.waitTimeout, 10) + ")"
	}
	values := "LAST_INSERT_ID(" + granted + "), UTC_TIMESTAMP(6), " + until
	grab := "TRUE"
	if try {
		values = "LAST_INSERT_ID(1), '1970-01-01', '1970-01-01'" // an ended window
		grab = "GET_LOCK(" + mysqlLockName(key) + ", 0) = 1"
	}
	set := func(col, v string) string {
		return col + " = IF(" + mysqlWindowGranted + ", " + v + ", " + col + ")"
	}
	return `INSERT INTO advisorylock_windows (lock_key, name, connection_id, user, host, grants, acquired_at, taken_until)
VALUES (` + k + `, ` + mysqlHex(name) + `, CONNECTION_ID(), ` + mysqlUser + `, ` + mysqlHost + `, ` + values + `)
ON DUPLICATE KEY UPDATE
	acquired_at = IF(taken_until <= UTC_TIMESTAMP(6) AND ` + grab + `, UTC_TIMESTAMP(6), acquired_at),
	grants = IF(` + mysqlWindowGranted + `, grants + 1 + 0 * LAST_INSERT_ID(` + granted + `), grants + LAST_INSERT_ID(0)),
	` + set("name", mysqlHex(name)) + `,
	` + set("connection_id", "CONNECTION_ID()") + `,
	` + set("user", mysqlUser) + `,
	` + set("host", mysqlHost) + `,
	` + set("taken_until", until)
}

// PrepareWindows creates the tables (advisorylock_windows among them)
// unless advisorylock_windows exists, once per *sql.DB. Where it exists
// (say, created by an administrator from Schema) it writes nothing.
func (mysqlBackend) PrepareWindows(ctx context.Context, db backend.DB) error {
	return ensureMySQLTable(ctx, db, "advisorylock_windows")
}

// TryLockSessionFor takes key unless a window is open, and records the
// grant's window, in one statement (see mysqlWindowUpsert); a key's first
// try ever takes a second one. A deadlock or lock wait timeout (InnoDB,
// while the statement waits for the row) is retried a few times, after
// letting go of whatever the rolled-back statement's GET_LOCK took.
func (m mysqlBackend) TryLockSessionFor(ctx context.Context, conn *sql.Conn, key int64, name string, window time.Duration) (backend.SessionResult, error) {
	stmt := m.mysqlWindowUpsert(key, name, window, true)
	for range 5 {
		id, err := execWindow(ctx, conn, stmt)
		if n := dbutil.MySQLErrno(err); (n == mysqlDeadlock || n == mysqlLockWaitTime) && ctx.Err() == nil {
			// Concurrent first inserts of a key, rolled back; a GET_LOCK
			// it made is not, so let it go (the session held no lock on
			// key before the try) before trying again.
			if _, err := conn.ExecContext(ctx, "DO RELEASE_LOCK("+mysqlLockName(key)+")"); err != nil {
				return backend.SessionResult{}, err
			}
			continue
		}
		if id == 1 {
			continue // the key's first, ended window was inserted: no lock was tried
		}
		if err != nil || id != 0 {
			return m.windowGrant(ctx, conn, id, err)
		}
		return backend.SessionResult{}, nil // refused: a window is open, or the lock is held
	}
	return backend.SessionResult{}, nil
}

// execWindow runs a window upsert and returns what it reported (see
// mysqlWindowUpsert).
func execWindow(ctx context.Context, conn *sql.Conn, stmt string) (int64, error) {
	res, err := conn.ExecContext(ctx, stmt)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// ClaimWindow records the window of a lock the session was just granted,
// or releases the lock when an earlier window is open.
func (m mysqlBackend) ClaimWindow(ctx context.Context, conn *sql.Conn, key int64, name string, window time.Duration) (backend.SessionResult, error) {
	id, err := execWindow(ctx, conn, m.mysqlWindowUpsert(key, name, window, false))
	if err != nil || id != 0 {
		return m.windowGrant(ctx, conn, id, err)
	}
	r, err := m.UnlockSession(ctx, conn, key)
	if err == nil && !r.OK {
		err = errors.New("advisorylock: releasing a lock granted in another grant's window: the session did not hold it")
	}
	return backend.SessionResult{Session: r.Session}, err
}

// windowGrant is the grant a window upsert reported as id (see
// mysqlWindowUpsert), or its error; it sets the session's wait_timeout
// where the upsert found it longer than the Lock's.
func (m mysqlBackend) windowGrant(ctx context.Context, conn *sql.Conn, id int64, err error) (backend.SessionResult, error) {
	if err != nil {
		return backend.SessionResult{}, err
	}
	if id%2 == 1 {
		if err := m.setWaitTimeout(ctx, conn); err != nil {
			return backend.SessionResult{}, err
		}
	}
	return backend.SessionResult{OK: true, Session: id / 2}, nil
}

// WindowLeft asks the database how long key's window stays open.
func (mysqlBackend) WindowLeft(ctx context.Context, conn *sql.Conn, key int64) (time.Duration, error) {
	var micros int64
	err := conn.QueryRowContext(ctx, "SELECT COALESCE((SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), taken_until) FROM advisorylock_windows WHERE lock_key = "+
		strconv.FormatInt(key, 10)+" AND taken_until > UTC_TIMESTAMP(6)), 0)").Scan(&micros)
	return time.Duration(micros) * time.Microsecond, err
}

// WindowHolder reports the grant whose window on key is open (ExpiresAt
// the window's end), or nil.
func (m mysqlBackend) WindowHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	stmt := `SELECT name, connection_id, user, host, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at), TIMESTAMPDIFF(MICROSECOND, '1970-01-01', taken_until)
FROM advisorylock_windows WHERE lock_key = ` + strconv.FormatInt(key, 10) + ` AND taken_until > UTC_TIMESTAMP(6)`
	h := &backend.Holder{Backend: m.Name(), Key: key}
	var name []byte
	var since, until int64
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		return q.QueryRowContext(ctx, stmt).Scan(&name, &h.PID, &h.User, &h.ClientAddr, &since, &until)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	h.Name, h.Since, h.ExpiresAt = string(name), time.UnixMicro(since), time.UnixMicro(until)
	return h, nil
}

// mysqlAfterGrant is the end of a lease's window: its grant plus minHold.
func mysqlAfterGrant(minHold time.Duration) string {
	return "acquired_at + INTERVAL " + strconv.FormatInt(dbutil.TTLMillis(minHold)*1000, 10) + " MICROSECOND"
}
