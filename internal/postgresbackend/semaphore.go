package postgresbackend

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// TryLockAny tries a semaphore's slot keys in order in one statement and
// takes the first it gets (see pgTryAny); index and OK true for a grant.
// A server in recovery is refused (errStandby) before any key is tried.
// A grant on a session without the Lock's dead-holder settings sends them
// (one more round trip, once per session, as TryLockSession does).
//
// A session that has passed both checks is remembered as a Lock's try
// remembers it, under the same fact (see checkedSession): later tries on
// it, a semaphore's or a Lock's, send the lock functions alone.
func (p *postgres) TryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, backend.SessionResult, error) {
	fact := p.checkedSession()
	checks := !dbutil.SessionKnows(conn, fact)
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	q, args, err := p.statement(pgTryAny(len(keys), checks), args...)
	if err != nil {
		return 0, backend.SessionResult{}, err
	}
	var got int
	var mark string
	row := conn.QueryRowContext(ctx, q, args...)
	if checks {
		err = row.Scan(&got, &mark)
	} else {
		err = row.Scan(&got)
	}
	switch {
	case err != nil:
		return 0, backend.SessionResult{}, err
	case got == -2:
		return 0, backend.SessionResult{}, errStandby
	case got < 0:
		return 0, backend.SessionResult{}, nil
	}
	if checks {
		if p.deadHolder != "" && mark != strconv.FormatInt(p.mark, 10) {
			if _, err := conn.ExecContext(ctx, p.deadHolder); err != nil {
				return 0, backend.SessionResult{}, fmt.Errorf("advisorylock: applying the dead-holder settings: %w", err)
			}
		}
		dbutil.RememberSession(conn, fact)
	}
	return got, backend.SessionResult{OK: true}, nil
}

// pgTryAny is the statement that tries n keys ($1 to $n) in order and
// takes at most one: a CASE evaluates its WHEN conditions in order and
// stops at the first true one (PostgreSQL documents it: "a CASE
// expression does not evaluate any subexpressions that are not needed to
// determine the result"), so no key after the first granted is tried. It
// returns the index of the granted key, or -1 when none was. With checks
// it also returns -2 on a server in recovery (nothing tried), and a second
// column, the session's dead-holder marker. The text depends on n and
// checks alone, so pgx caches one statement per slot count.
func pgTryAny(n int, checks bool) string {
	var b strings.Builder
	b.WriteString("SELECT CASE")
	if checks {
		b.WriteString(" WHEN pg_is_in_recovery() THEN -2")
	}
	for i := range n {
		b.WriteString(" WHEN pg_try_advisory_lock($")
		b.WriteString(strconv.Itoa(i + 1))
		b.WriteString("::bigint) THEN ")
		b.WriteString(strconv.Itoa(i))
	}
	b.WriteString(" ELSE -1 END")
	if checks {
		b.WriteString(", coalesce(current_setting('advisorylock.dead_holder', true), '')")
	}
	return b.String()
}

// KeyHolders reports, in one statement (one snapshot), the holders of a
// semaphore's slot keys: holders[i] holds keys[i], nil when free. It reads
// pg_locks joined with pg_stat_activity, as SessionHolder does; Since is
// the start of the holder's try while that is still its latest
// statement, else its session's start (an earlier bound).
func (p *postgres) KeyHolders(ctx context.Context, db backend.DB, keys []int64) ([]*backend.Holder, error) {
	var values strings.Builder
	for i, key := range keys {
		if i > 0 {
			values.WriteString(", ")
		}
		fmt.Fprintf(&values, "(%d, %d, %d)", i, uint32(uint64(key)>>32), uint32(uint64(key)))
	}
	q := `SELECT s.i, l.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  CASE WHEN a.query LIKE 'SELECT CASE WHEN pg\_%try\_advisory\_lock(%' THEN a.query_start ELSE a.backend_start END
FROM (VALUES ` + values.String() + `) AS s(i, classid, objid)
JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = s.classid::bigint::oid AND l.objid = s.objid::bigint::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
ORDER BY s.i`
	holders := make([]*backend.Holder, len(keys))
	err := p.run(ctx, db, func(on dbutil.Querier) error {
		return dbutil.EachRow(ctx, on, q, func(rows *sql.Rows) error {
			h := &backend.Holder{Backend: p.Name()}
			var i int
			var since sql.NullTime
			if err := rows.Scan(&i, &h.PID, &h.Application, &h.ClientAddr, &since); err != nil {
				return err
			}
			h.Since = since.Time
			holders[i] = h
			return nil
		})
	})
	return holders, err
}

// pgUnlockAndSignal releases $1 and, only if that freed it, notifies
// pgReleaseChannel with $2 (a CASE evaluates no branch it does not
// need); delivered to listeners when it commits, right after the unlock.
// It returns a row when it freed the key, as pgUnlock does.
const pgUnlockAndSignal = `SELECT WHERE CASE WHEN pg_advisory_unlock($1::bigint)
	THEN (SELECT true FROM pg_notify('` + pgReleaseChannel + `', $2::text)) ELSE false END`

// UnlockAndSignal releases a semaphore's slot key and notifies
// pgReleaseChannel with signal, the semaphore's wake key, which its
// waiters' listener hears as it hears a lease's release (see
// ListenReleases). A key found not held is looked into as UnlockSession
// does, and notifies nothing.
func (p *postgres) UnlockAndSignal(ctx context.Context, conn *sql.Conn, key, signal int64) (backend.SessionResult, error) {
	if p.shared {
		return backend.SessionResult{}, fmt.Errorf("%w: a shared hold is no semaphore slot", backend.ErrUnsupported)
	}
	q, args, err := p.statement(pgUnlockAndSignal, key, strconv.FormatInt(signal, 10))
	if err != nil {
		return backend.SessionResult{}, err
	}
	res, err := conn.ExecContext(ctx, q, args...)
	if err != nil {
		return backend.SessionResult{}, err
	}
	if n, err := res.RowsAffected(); n == 1 || err != nil {
		return backend.SessionResult{OK: n == 1}, err
	}
	return p.unlockMissed(ctx, conn, key)
}
