package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
)

// tryLockAny tries a semaphore's slot keys in order in one statement and
// takes the first it gets (see pgTryAny); index and OK true for a grant.
// A server in recovery is refused (errStandby) before any key is tried.
// A grant on a session without the Lock's dead-holder settings sends them
// (one more round trip, once per session, as TryLockSession does).
func (p *postgres) tryLockAny(ctx context.Context, conn *sql.Conn, keys []int64) (int, SessionResult, error) {
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = k
	}
	q, args, err := p.statement(pgTryAny(len(keys)), args...)
	if err != nil {
		return 0, SessionResult{}, err
	}
	var got int
	var mark string
	if err := conn.QueryRowContext(ctx, q, args...).Scan(&got, &mark); err != nil {
		return 0, SessionResult{}, err
	}
	switch {
	case got == -2:
		return 0, SessionResult{}, errStandby
	case got < 0:
		return 0, SessionResult{}, nil
	}
	if p.deadHolder != "" && mark != strconv.FormatInt(p.mark, 10) {
		if _, err := conn.ExecContext(ctx, p.deadHolder); err != nil {
			return 0, SessionResult{}, fmt.Errorf("advisorylock: applying the dead-holder settings: %w", err)
		}
	}
	return got, SessionResult{OK: true}, nil
}

// pgTryAny is the statement that tries n keys ($1 to $n) in order and
// takes at most one: a CASE evaluates its WHEN conditions in order and
// stops at the first true one (PostgreSQL documents it: "a CASE
// expression does not evaluate any subexpressions that are not needed to
// determine the result"), so no key after the first granted is tried. It
// returns the index of the granted key, -1 when none was, -2 on a server
// in recovery (nothing tried), and the session's dead-holder marker. The
// text depends on n alone, so pgx caches one statement per slot count.
func pgTryAny(n int) string {
	var b strings.Builder
	b.WriteString("SELECT CASE WHEN pg_is_in_recovery() THEN -2")
	for i := range n {
		b.WriteString(" WHEN pg_try_advisory_lock($")
		b.WriteString(strconv.Itoa(i + 1))
		b.WriteString("::bigint) THEN ")
		b.WriteString(strconv.Itoa(i))
	}
	b.WriteString(" ELSE -1 END, coalesce(current_setting('advisorylock.dead_holder', true), '')")
	return b.String()
}
