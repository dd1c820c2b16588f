package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
)

// TryLockAny tries a semaphore's slot keys in order in one statement and
// takes the first it gets: a CASE evaluates its WHEN conditions in order
// and stops at the first true one, so GET_LOCK runs for no key after the
// one granted (a GET_LOCK that fails with an error answers NULL, which is
// not 1: the next key is tried). Like a Lock's try it also reads the
// session, read_only and the session's wait_timeout (see getLock).
func (m mysqlBackend) TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, SessionResult, error) {
	var b strings.Builder
	b.WriteString("SELECT CASE")
	for i, key := range keys {
		b.WriteString(" WHEN GET_LOCK(" + mysqlLockName(key) + ", 0) = 1 THEN " + strconv.Itoa(i))
	}
	b.WriteString(" ELSE -1 END, CONNECTION_ID(), @@read_only, @@session.wait_timeout")
	var got, waitTimeout int64
	var readOnly bool
	var r SessionResult
	err := conn.QueryRowContext(ctx, b.String()).Scan(&got, &r.Session, &readOnly, &waitTimeout)
	switch {
	case err != nil:
		return 0, SessionResult{}, err
	case readOnly:
		return 0, SessionResult{}, errReadOnly
	case got < 0:
		return 0, r, nil
	}
	r.OK = true
	if m.waitTimeout > 0 && waitTimeout > m.waitTimeout {
		return int(got), r, m.setWaitTimeout(ctx, conn)
	}
	return int(got), r, nil
}

// TryLockAll is unsupported: an exclusive try is more than a GET_LOCK
// where the key may have shared holders (see backend_mysql_shared.go), so
// a set's try takes its keys one TryLockSession each.
func (mysqlBackend) TryLockAll(context.Context, *sql.Conn, []int64) (SessionResult, error) {
	return SessionResult{}, errOneKeyAtATime
}

// UnlockAll is unsupported, as TryLockAll: a set's release lets go of its
// keys one UnlockSession each.
func (mysqlBackend) UnlockAll(context.Context, *sql.Conn, []int64) (SessionResult, error) {
	return SessionResult{}, errOneKeyAtATime
}

// UnlockAndSignal is unsupported: MySQL has no notifications, so a
// semaphore's waiters wait server-side on a slot, in slices, and a slot's
// release is an UnlockSession.
func (mysqlBackend) UnlockAndSignal(context.Context, *sql.Conn, int64, int64) (SessionResult, error) {
	return SessionResult{}, errNoReleaseSignals
}

// errOneKeyAtATime makes a set's try and release fall back to one
// statement per key (see MultiKeyLocker).
var errOneKeyAtATime = fmt.Errorf("%w: one key at a time", ErrUnsupported)

// KeyHolders reports, in one statement, the holders of a semaphore's
// slot keys: holders[i] holds keys[i], nil when free; the connection id
// from IS_USED_LOCK, the user and host from the process list where the
// user may see them, as SessionHolder does. The statement reads the slots
// one after another, microseconds apart: a snapshot but for a slot that
// changes hands within them.
func (m mysqlBackend) KeyHolders(ctx context.Context, db DB, keys []int64) ([]*Holder, error) {
	var used strings.Builder
	for i, key := range keys {
		if i > 0 {
			used.WriteString(" UNION ALL ")
		}
		used.WriteString("SELECT " + strconv.Itoa(i) + " AS i, IS_USED_LOCK(" + mysqlLockName(key) + ") AS id")
	}
	q := "SELECT u.i, u.id, COALESCE(p.USER, ''), COALESCE(p.HOST, '') FROM (" + used.String() +
		") AS u LEFT JOIN information_schema.PROCESSLIST p ON p.ID = u.id WHERE u.id IS NOT NULL ORDER BY u.i"
	holders := make([]*Holder, len(keys))
	err := mysqlRun(ctx, db, func(on querier) error {
		return eachRow(ctx, on, q, func(rows *sql.Rows) error {
			h := &Holder{Backend: m.Name()}
			var i int
			var id int64
			if err := rows.Scan(&i, &id, &h.User, &h.ClientAddr); err != nil {
				return err
			}
			h.PID = int(id)
			holders[i] = h
			return nil
		})
	})
	return holders, err
}
