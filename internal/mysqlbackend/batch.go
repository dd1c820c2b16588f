package mysqlbackend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

var _ backend.BatchLocker = mysqlBackend{}

// TryUnlock runs the tries and unlocks that queued on a shared session in
// one statement (see backend.BatchLocker): one GET_LOCK(name, 0) per try,
// with the shared holders' check of a single try, and one RELEASE_LOCK
// per unlock, each answered by a character. MySQL has no arrays to bind,
// so the text carries the keys (names the library writes, never a
// user's string) and is not prepared. It runs only on a session whose try
// was granted (see triedSession): that try created the shared holders'
// table and gave the session its wait_timeout. A try granted while shared
// holders are in is let go again, a miss, as TryLockSession does: one more
// statement, only then.
func (m mysqlBackend) TryUnlock(ctx context.Context, conn *sql.Conn, try, unlock []int64) (granted, freed []bool, err error) {
	if m.shared || !dbutil.SessionKnows(conn, m.triedSession()) || dbutil.SessionKnows(conn, mysqlMayNotCreate) {
		return nil, nil, fmt.Errorf("%w: the session has not had a try granted", backend.ErrUnsupported)
	}
	var g, f string
	var readOnly bool
	err = conn.QueryRowContext(ctx, batchStatement(try, unlock)).Scan(&g, &f, &readOnly)
	switch {
	case dbutil.MySQLErrno(err) == mysqlNoSuchTable: // dropped since: nothing ran
		return nil, nil, fmt.Errorf("%w: %w", backend.ErrUnsupported, err)
	case err != nil:
		return nil, nil, err
	case readOnly:
		// Not errReadOnly, which matches ErrUnsupported: this statement
		// ran, and its session's state is unknown.
		return nil, nil, errors.New("advisorylock: the MySQL server turned read-only (read_only=ON, as a replica is) under a shared session")
	case len(g) != len(try) || len(f) != len(unlock):
		return nil, nil, fmt.Errorf("advisorylock: a batch of %d tries and %d unlocks answered %q and %q", len(try), len(unlock), g, f)
	case strings.Contains(g, "n"):
		return nil, nil, errors.New("advisorylock: GET_LOCK returned NULL in a batch (the server ended it with an error)")
	case strings.Contains(f, "x"):
		return nil, nil, fmt.Errorf("%w: a batch's unlock ran on a server session that did not hold the lock", dbutil.ErrTransactionPooler)
	case strings.Contains(f, "m"):
		return nil, nil, errors.New("advisorylock: a server session still holds a lock after a batch's unlock (taken on it more than once)")
	}
	granted, freed = make([]bool, len(try)), make([]bool, len(unlock))
	for i, c := range []byte(g) {
		granted[i] = c == '1'
		if c == '2' {
			if err := m.EndWait(ctx, conn, try[i]); err != nil {
				return nil, nil, err
			}
		}
	}
	for i, c := range []byte(f) {
		freed[i] = c == '1'
	}
	return granted, freed, nil
}

// batchStatement is the text of a batch: a try answers 1 (granted), 0
// (held elsewhere), 2 (granted, but shared holders are in) or n (NULL:
// an error on the server); an unlock answers 1 (freed), 0 (not held), x
// (held by another session) or m (still held by this one).
func batchStatement(try, unlock []int64) string {
	var b strings.Builder
	b.WriteString("SELECT CONCAT(''")
	for _, k := range try {
		name := mysqlLockName(k)
		b.WriteString(", CASE GET_LOCK(" + name + ", 0) WHEN 1 THEN IF(" + mysqlReadersIn(k) + ", '2', '1') WHEN 0 THEN '0' ELSE 'n' END")
	}
	b.WriteString("), CONCAT(''")
	for _, k := range unlock {
		name := mysqlLockName(k)
		b.WriteString(", CASE RELEASE_LOCK(" + name + ") WHEN 1 THEN IF(IS_USED_LOCK(" + name + ") <=> CONNECTION_ID(), 'm', '1') WHEN 0 THEN 'x' ELSE '0' END")
	}
	b.WriteString("), @@read_only")
	return b.String()
}

// triedSession is the fact (see dbutil.RememberSession) that a try of m
// was granted on a session: it has m's wait_timeout (see lockOutcome),
// and the shared holders' table exists.
func (m mysqlBackend) triedSession() string {
	return "mysql: a try granted, wait_timeout " + strconv.FormatInt(m.waitTimeout, 10)
}
