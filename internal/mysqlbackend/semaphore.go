package mysqlbackend

import (
	"context"
	"database/sql"
	"strconv"
	"strings"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// TryLockAny tries a semaphore's slot keys in order in one statement and
// takes the first it gets: a CASE evaluates its WHEN conditions in order
// and stops at the first true one, so GET_LOCK runs for no key after the
// one granted (a GET_LOCK that fails with an error answers NULL, which is
// not 1: the next key is tried). Like a Lock's try it also reads the
// session, read_only and the session's wait_timeout (see getLock).
func (m mysqlBackend) TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, backend.SessionResult, error) {
	var b strings.Builder
	b.WriteString("SELECT CASE")
	for i, key := range keys {
		b.WriteString(" WHEN GET_LOCK(" + mysqlLockName(key) + ", 0) = 1 THEN " + strconv.Itoa(i))
	}
	b.WriteString(" ELSE -1 END, CONNECTION_ID(), @@read_only, @@session.wait_timeout")
	var got, waitTimeout int64
	var readOnly bool
	var r backend.SessionResult
	err := conn.QueryRowContext(ctx, b.String()).Scan(&got, &r.Session, &readOnly, &waitTimeout)
	switch {
	case err != nil:
		return 0, backend.SessionResult{}, err
	case readOnly:
		return 0, backend.SessionResult{}, errReadOnly
	case got < 0:
		return 0, r, nil
	}
	r.OK = true
	if m.waitTimeout > 0 && waitTimeout > m.waitTimeout {
		return int(got), r, m.setWaitTimeout(ctx, conn)
	}
	return int(got), r, nil
}

// KeyHolders reports, in one statement, the holders of a semaphore's
// slot keys: holders[i] holds keys[i], nil when free; the connection id
// from IS_USED_LOCK, the user and host from the process list where the
// user may see them, as SessionHolder does. The statement reads the slots
// one after another, microseconds apart: a snapshot but for a slot that
// changes hands within them.
func (m mysqlBackend) KeyHolders(ctx context.Context, db backend.DB, keys []int64) ([]*backend.Holder, error) {
	var used strings.Builder
	for i, key := range keys {
		if i > 0 {
			used.WriteString(" UNION ALL ")
		}
		used.WriteString("SELECT " + strconv.Itoa(i) + " AS i, IS_USED_LOCK(" + mysqlLockName(key) + ") AS id")
	}
	q := "SELECT u.i, u.id, COALESCE(p.USER, ''), COALESCE(p.HOST, '') FROM (" + used.String() +
		") AS u LEFT JOIN information_schema.PROCESSLIST p ON p.ID = u.id WHERE u.id IS NOT NULL ORDER BY u.i"
	holders := make([]*backend.Holder, len(keys))
	err := mysqlRun(ctx, db, func(on dbutil.Querier) error {
		return dbutil.EachRow(ctx, on, q, func(rows *sql.Rows) error {
			h := &backend.Holder{Backend: m.Name()}
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
