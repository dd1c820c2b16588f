package mysqlbackend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Shared locks on MySQL and MariaDB (RLock). GET_LOCK has no shared mode,
// so shared holders are rows, and the exclusive GET_LOCK and the rows
// exclude each other by the order of their steps:
//
//   - A shared holder inserts its row (lock_key, its CONNECTION_ID()),
//     taking in the same statement a named lock of its own,
//     "advisorylock:v1:<key>:s<connection id>", which says the row is
//     live: a holder whose session ends loses it, and its row is then
//     stale and ignored. Once the row is committed it checks, in a fresh
//     statement, that no session holds the key's GET_LOCK; if one does it
//     deletes its row and lets its own lock go: a miss.
//   - An exclusive holder takes the key's GET_LOCK and, in the same
//     statement once it is granted, looks for live shared rows (a CASE
//     orders the two: InnoDB opens the read's snapshot at its first row,
//     after the grant; checked on MariaDB 10.11).
//
// Whichever of the two checks comes second sees the other's step, so they
// never both hold. A writer that finds shared holders in lets its
// GET_LOCK go at once (TryLock), or keeps it while it waits for them to
// leave (Lock), so that no new shared holder enters meanwhile: waiting
// writers are not starved. A waiting shared holder waits server-side in
// GET_LOCK for the writer to go (and lets the GET_LOCK go at once).
//
// Rows of holders whose session ended are ignored, and deleted by the
// key's next shared release.
//
// Costs: a shared try is two round trips (four on a miss), its release
// two; an exclusive try stays one: where advisorylock_shared does not
// exist yet, the first grab creates the library's tables (a role that may
// not create them checks in a second round trip after each grant; see
// grabExclusive). The exclusive try's read of
// advisorylock_shared is most of what it costs over a bare GET_LOCK, and
// the table stays InnoDB, which Group Replication requires.
// A Lock with WithMinHold cannot be taken shared; its windowed exclusive
// try does not look for shared holders of another Lock on the same name.

// mysqlSharedTable is schema step 4: one row per shared holder.
const mysqlSharedTable = `CREATE TABLE IF NOT EXISTS advisorylock_shared (
	lock_key    BIGINT          NOT NULL, -- Key(name)
	conn_id     BIGINT UNSIGNED NOT NULL, -- the holder's CONNECTION_ID()
	acquired_at DATETIME(6)     NOT NULL, -- UTC
	PRIMARY KEY (lock_key, conn_id)
) ENGINE=InnoDB`

// mysqlHolderLock is the SQL expression naming the holder lock of the
// shared row of key whose connection id is connID (an SQL expression).
func mysqlHolderLock(key int64, connID string) string {
	name := mysqlLockName(key)
	return "CONCAT(" + name[:len(name)-1] + ":s', " + connID + ")"
}

// mysqlReadersIn is the SQL condition that a live shared holder of key is
// in.
func mysqlReadersIn(key int64) string {
	return "EXISTS (SELECT 1 FROM advisorylock_shared s WHERE s.lock_key = " + strconv.FormatInt(key, 10) +
		" AND IS_USED_LOCK(" + mysqlHolderLock(key, "s.conn_id") + ") = s.conn_id)"
}

// mysqlHoldsShared is the SQL condition that this session holds key
// shared: its holder lock and its row.
func mysqlHoldsShared(key int64) string {
	return "IS_USED_LOCK(" + mysqlHolderLock(key, "CONNECTION_ID()") + ") = CONNECTION_ID() AND EXISTS (SELECT 1 FROM advisorylock_shared WHERE lock_key = " +
		strconv.FormatInt(key, 10) + " AND conn_id = CONNECTION_ID())"
}

// Shared returns the backend in shared mode.
func (m mysqlBackend) Shared() backend.SessionLocker {
	m.shared = true
	return m
}

// The outcomes of grabExclusive.
const (
	grabMissed         = 0
	grabbed            = 1
	grabbedWithReaders = 2 // the GET_LOCK is held, but shared holders are in
)

// grabExclusive runs head+grab, grab being GET_LOCK's call, and in the
// same statement, once it is granted, looks for live shared holders.
// Where advisorylock_shared does not exist (no RLock ran on the database
// yet) it creates the library's tables, once, and runs the statement
// again. A role that may not create them (see Schema) runs grab alone and
// looks in a second statement, which finds the table missing unless a
// shared holder's administrator created it meanwhile; its session is
// remembered so that it does not ask again.
func (m mysqlBackend) grabExclusive(ctx context.Context, conn *sql.Conn, key int64, head, grab string) (backend.SessionResult, int, error) {
	stmt := head + "CASE " + grab + " WHEN 1 THEN IF(" + mysqlReadersIn(key) + ", 2, 1) WHEN 0 THEN 0 END"
	r, got, err := m.lockStatement(ctx, conn, stmt)
	if dbutil.MySQLErrno(err) == mysqlNoSuchTable && !dbutil.SessionKnows(conn, mysqlMayNotCreate) {
		created, unlockErr := createMySQLTablesOn(ctx, conn)
		switch {
		case unlockErr != nil: // the session may still hold the schema lock
			// created says first why (a statement that broke the
			// connection makes the release's error a bare "bad connection").
			return backend.SessionResult{}, grabMissed, errors.Join(created, fmt.Errorf("advisorylock: releasing the schema lock: %w", unlockErr))
		case created == nil:
			r, got, err = m.lockStatement(ctx, conn, stmt)
		case dbutil.MySQLErrno(created) == mysqlDenied:
			dbutil.RememberSession(conn, mysqlMayNotCreate)
		}
	}
	if dbutil.MySQLErrno(err) == mysqlNoSuchTable {
		if r, got, err = m.lockStatement(ctx, conn, head+grab); err == nil && got == grabbed {
			got, err = readersIn(ctx, conn, key)
		}
	}
	if err != nil {
		return backend.SessionResult{}, grabMissed, err
	}
	r.OK = got == grabbed
	return r, int(got), nil
}

// mysqlMayNotCreate is the fact of a session whose role may not create
// the library's tables (see dbutil.RememberSession).
const mysqlMayNotCreate = "mysql: may not create tables"

// readersIn asks whether a live shared holder of key is in: grabbed when
// none is (or the table does not exist), grabbedWithReaders otherwise.
func readersIn(ctx context.Context, conn *sql.Conn, key int64) (int64, error) {
	var in bool
	err := conn.QueryRowContext(ctx, "SELECT "+mysqlReadersIn(key)).Scan(&in)
	switch {
	case dbutil.MySQLErrno(err) == mysqlNoSuchTable:
		return grabbed, nil
	case err != nil:
		return grabMissed, err
	case in:
		return grabbedWithReaders, nil
	}
	return grabbed, nil
}

// mysqlReaderPoll is how often a writer holding the GET_LOCK looks again
// for shared holders to have left (server-side, in SLEEP).
const mysqlReaderPoll = 20 * time.Millisecond

// waitForReaders waits, holding the GET_LOCK, until no shared holder of
// key is in (a grant) or end passes (a miss that keeps the GET_LOCK: see
// EndWait). Each look is one round trip that sleeps on the server first.
func (m mysqlBackend) waitForReaders(ctx context.Context, conn *sql.Conn, key int64, r backend.SessionResult, end time.Time) (backend.SessionResult, error) {
	// SLEEP answers 0, or 1 when interrupted: either way the look follows.
	stmt := "SELECT SLEEP(" + strconv.FormatFloat(mysqlReaderPoll.Seconds(), 'f', 3, 64) + ") >= 0 AND " + mysqlReadersIn(key)
	for time.Now().Before(end) {
		var in sql.NullBool
		if err := conn.QueryRowContext(ctx, stmt).Scan(&in); err != nil {
			return backend.SessionResult{}, err
		}
		if !in.Valid {
			return backend.SessionResult{}, errors.New("advisorylock: looking for shared holders returned NULL")
		}
		if !in.Bool {
			r.OK = true
			return r, nil
		}
	}
	r.OK = false
	return r, nil
}

// EndWait lets go of the key's GET_LOCK if this session holds it: what a
// writer's wait that ended while shared holders were in leaves.
func (mysqlBackend) EndWait(ctx context.Context, conn *sql.Conn, key int64) error {
	name := mysqlLockName(key)
	_, err := conn.ExecContext(ctx, "DO IF(IS_USED_LOCK("+name+") = CONNECTION_ID(), RELEASE_LOCK("+name+"), 0)")
	return err
}

// tryShared inserts the shared holder's row, with its holder lock, then
// checks that no session holds the key's GET_LOCK; on a miss it takes
// both back.
func (m mysqlBackend) tryShared(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	k := strconv.FormatInt(key, 10)
	insert := "INSERT INTO advisorylock_shared (lock_key, conn_id, acquired_at) VALUES (" + k + ", CONNECTION_ID(), IF(GET_LOCK(" +
		mysqlHolderLock(key, "CONNECTION_ID()") + ", 0) = 1, UTC_TIMESTAMP(6), NULL)) ON DUPLICATE KEY UPDATE acquired_at = VALUES(acquired_at)"
	_, err := conn.ExecContext(ctx, insert)
	if dbutil.MySQLErrno(err) == mysqlNoSuchTable {
		var unlockErr error
		if err, unlockErr = createMySQLTablesOn(ctx, conn); err == nil && unlockErr == nil {
			_, err = conn.ExecContext(ctx, insert)
		}
		err = errors.Join(err, unlockErr) // an error discards the connection, schema lock and all
	}
	if err != nil {
		return backend.SessionResult{}, err
	}
	r, err := m.getLock(ctx, conn, "SELECT IS_FREE_LOCK("+mysqlLockName(key)+")")
	if err != nil || r.OK {
		return r, err
	}
	_, err = m.unlockShared(ctx, conn, key)
	return backend.SessionResult{Session: r.Session}, err
}

// waitShared waits server-side, for at most the slice, for the key's
// GET_LOCK to be free (taking it for an instant when a writer held it),
// then tries.
func (m mysqlBackend) waitShared(ctx context.Context, conn *sql.Conn, key int64, head, secs string) (backend.SessionResult, error) {
	name := mysqlLockName(key)
	var free sql.NullBool
	err := conn.QueryRowContext(ctx, head+"IF(IS_FREE_LOCK("+name+"), 1, GET_LOCK("+name+", "+secs+") AND RELEASE_LOCK("+name+"))").Scan(&free)
	switch {
	case err != nil:
		return backend.SessionResult{}, err
	case !free.Valid:
		return backend.SessionResult{}, errors.New("advisorylock: GET_LOCK returned NULL (the server ended the wait with an error)")
	case !free.Bool:
		return backend.SessionResult{}, nil
	}
	return m.tryShared(ctx, conn, key)
}

// unlockShared deletes the session's shared row (and the key's rows
// whose holder lock is free: holders whose session ended; a live row's
// holder lock is taken before the row exists), then lets its holder lock
// go: OK false if it held none, dbutil.ErrTransactionPooler if another
// session holds it. A deadlock or lock wait timeout (InnoDB, against
// concurrent shared holders of the key) deleted nothing and is retried.
func (mysqlBackend) unlockShared(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	del := "DELETE FROM advisorylock_shared WHERE lock_key = " + strconv.FormatInt(key, 10) +
		" AND (conn_id = CONNECTION_ID() OR IS_USED_LOCK(" + mysqlHolderLock(key, "conn_id") + ") IS NULL)"
	_, err := conn.ExecContext(ctx, del)
	for tries := 0; tries < 3 && (dbutil.MySQLErrno(err) == mysqlDeadlock || dbutil.MySQLErrno(err) == mysqlLockWaitTime) && ctx.Err() == nil; tries++ {
		_, err = conn.ExecContext(ctx, del)
	}
	if err != nil {
		return backend.SessionResult{}, err
	}
	var released sql.NullInt64
	var r backend.SessionResult
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK("+mysqlHolderLock(key, "CONNECTION_ID()")+"), CONNECTION_ID()").Scan(&released, &r.Session); err != nil {
		return backend.SessionResult{}, err
	}
	if released.Valid && released.Int64 == 0 {
		return r, fmt.Errorf("%w: the unlock ran on server session %d, whose shared hold another session has", dbutil.ErrTransactionPooler, r.Session)
	}
	r.OK = released.Valid && released.Int64 == 1
	return r, nil
}

// SessionHolders lists key's holders: its live shared holders (from their
// rows) or, when none is in, the session holding its GET_LOCK (a writer
// holding it while shared holders are in is still waiting). User and host
// come from the process list where the user may see them (PROCESS).
func (m mysqlBackend) SessionHolders(ctx context.Context, db backend.DB, key int64) ([]*backend.Holder, error) {
	k := strconv.FormatInt(key, 10)
	stmt := "SELECT s.conn_id, COALESCE(p.USER, ''), COALESCE(p.HOST, ''), TIMESTAMPDIFF(MICROSECOND, '1970-01-01', s.acquired_at) FROM advisorylock_shared s " +
		"LEFT JOIN information_schema.PROCESSLIST p ON p.ID = s.conn_id WHERE s.lock_key = " + k + " AND IS_USED_LOCK(" + mysqlHolderLock(key, "s.conn_id") + ") = s.conn_id ORDER BY s.conn_id"
	var hs []*backend.Holder
	err := mysqlRun(ctx, db, func(q dbutil.Querier) error {
		hs = nil
		rows, err := q.QueryContext(ctx, stmt)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			h := &backend.Holder{Backend: m.Name(), Key: key, Shared: true}
			var since int64
			if err := rows.Scan(&h.PID, &h.User, &h.ClientAddr, &since); err != nil {
				return err
			}
			h.Since = time.UnixMicro(since)
			hs = append(hs, h)
		}
		return rows.Err()
	})
	if err != nil && dbutil.MySQLErrno(err) != mysqlNoSuchTable || len(hs) > 0 {
		return hs, err
	}
	h, err := m.exclusiveHolder(ctx, db, key)
	if h == nil || err != nil {
		return nil, err
	}
	return []*backend.Holder{h}, nil
}

// exclusiveHolder reads the holder's connection id from IS_USED_LOCK, and
// its user and host from the process list where the user may see them
// (PROCESS privilege). Since stays zero: the server does not say when a
// named lock was taken.
func (m mysqlBackend) exclusiveHolder(ctx context.Context, db backend.DB, key int64) (*backend.Holder, error) {
	stmt := "SELECT u.id, COALESCE(p.USER, ''), COALESCE(p.HOST, '') FROM (SELECT IS_USED_LOCK(" + mysqlLockName(key) +
		") AS id) AS u LEFT JOIN information_schema.PROCESSLIST p ON p.ID = u.id"
	h := &backend.Holder{Backend: m.Name(), Key: key}
	var id sql.NullInt64
	err := mysqlRun(ctx, db, func(q dbutil.Querier) error {
		return q.QueryRowContext(ctx, stmt).Scan(&id, &h.User, &h.ClientAddr)
	})
	if err != nil || !id.Valid {
		return nil, err
	}
	h.PID = int(id.Int64)
	return h, nil
}
