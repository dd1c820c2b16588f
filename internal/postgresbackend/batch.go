package postgresbackend

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

var _ backend.BatchLocker = (*postgres)(nil)

// pgTryUnlock is a shared session's batch (see TryUnlock): $1 the keys to
// try, $2 those to unlock, each a bigint[] written as text; it answers
// each with '1' (granted, freed) or '0', in order. %[1]s and %[2]s are
// the lock and unlock functions (exclusive or shared).
const pgTryUnlock = `SELECT
 (SELECT coalesce(string_agg(CASE WHEN %[1]s(k) THEN '1' ELSE '0' END, '' ORDER BY i), '') FROM unnest($1::text::bigint[]) WITH ORDINALITY AS t(k, i)),
 (SELECT coalesce(string_agg(CASE WHEN %[2]s(k) THEN '1' ELSE '0' END, '' ORDER BY i), '') FROM unnest($2::text::bigint[]) WITH ORDINALITY AS t(k, i))`

var (
	pgTryUnlockExclusive = fmt.Sprintf(pgTryUnlock, "pg_try_advisory_lock", "pg_advisory_unlock")
	pgTryUnlockShared    = fmt.Sprintf(pgTryUnlock, "pg_try_advisory_lock_shared", "pg_advisory_unlock_shared")
)

// TryUnlock runs the tries and unlocks that queued on a shared session in
// one statement (see backend.BatchLocker). It runs only on a session that
// passed a try's checks (a primary's, with p's dead-holder settings):
// the statement is the bare lock functions, as a checked session's try is.
func (p *postgres) TryUnlock(ctx context.Context, conn *sql.Conn, try, unlock []int64) (granted, freed []bool, err error) {
	if !dbutil.SessionKnows(conn, p.checkedSession()) {
		return nil, nil, fmt.Errorf("%w: the session has not passed a try's checks", backend.ErrUnsupported)
	}
	text := pgTryUnlockExclusive
	if p.shared {
		text = pgTryUnlockShared
	}
	tries, unlocks := bigintArray(try), bigintArray(unlock)
	var g, f string
	if p.prepared != nil {
		g, f, err = queryPairPrepared(ctx, p.prepared, conn, text, tries, unlocks)
	}
	if p.prepared == nil || errors.Is(err, dbutil.ErrNotPrepared) {
		var q string
		var args []any
		if q, args, err = p.statement(text, tries, unlocks); err != nil {
			return nil, nil, err
		}
		err = conn.QueryRowContext(ctx, q, args...).Scan(&g, &f)
	}
	if err != nil {
		return nil, nil, err
	}
	if len(g) != len(try) || len(f) != len(unlock) {
		return nil, nil, fmt.Errorf("advisorylock: a batch of %d tries and %d unlocks answered %q and %q", len(try), len(unlock), g, f)
	}
	return ones(g), ones(f), nil
}

// bigintArray writes keys as a PostgreSQL array literal: {1,-2,3}.
func bigintArray(keys []int64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(k, 10))
	}
	b.WriteByte('}')
	return b.String()
}

// ones reads a batch's answer: true for each '1'.
func ones(s string) []bool {
	out := make([]bool, len(s))
	for i := range s {
		out[i] = s[i] == '1'
	}
	return out
}

// queryPairPrepared runs text, whose one row is two text columns, with
// args, prepared on conn's session (lib/pq): the batch's text is the
// same whatever its keys, so the server parses and plans it once per
// session. It returns dbutil.ErrNotPrepared where nothing was sent.
func queryPairPrepared(ctx context.Context, ps *dbutil.Prepared, conn *sql.Conn, text string, a, b string) (string, string, error) {
	vals, err := ps.QueryRow(ctx, conn, text, []any{a, b}, nil, func(err error) bool { return dbutil.SQLState(err) == "26000" })
	if err != nil {
		return "", "", err
	}
	if len(vals) != 2 {
		return "", "", fmt.Errorf("advisorylock: a batch returned %d columns, want 2", len(vals))
	}
	return textOf(vals[0]), textOf(vals[1]), nil
}

// textOf is a driver's text value as a string.
func textOf(v driver.Value) string {
	switch v := v.(type) {
	case []byte:
		return string(v)
	case string:
		return v
	}
	return ""
}
