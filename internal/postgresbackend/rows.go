package postgresbackend

import (
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"

	"context"
	"fmt"
)

// Lock rows on PostgreSQL (WithLeaseRows). A Lock, a set's names and a
// Semaphore's slots kept as rows live in advisorylock_locks, one row per
// key while held, as on SQLite; an Election on rows is a LeaseLock
// (advisorylock_leases). Every step is one autocommit statement whose
// times are the database's now(), so it works through a transaction-mode
// pooler: no statement depends on the session it lands on. There are no
// shared rows (Traits.SharedRows is false): RLock needs session locks.

// postgresLocksTable is the DDL of advisorylock_locks.
const postgresLocksTable = `CREATE TABLE IF NOT EXISTS advisorylock_locks (
	key         bigint      PRIMARY KEY, -- Key(name)
	name        text        NOT NULL,
	owner       text        NOT NULL,    -- unique per acquire
	token       bigint      NOT NULL,    -- the grant's fencing token (see pgNextToken)
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL     -- the row is free from then on
)`

// The lock-row statements. $1 is the key; times are milliseconds.
const (
	// pgAcquireLock takes the row if it is absent or expired, with a new
	// token; no row returned means held. As in pgAcquireLease, a row the
	// snapshot shows live is not tried (NOT EXISTS), so that a miss does
	// not lock the holder's row until it commits; a try let through is
	// decided by the WHERE on the row's latest version, so a key is never
	// granted twice. $2 name, $3 owner, $4 TTL (the window, if longer).
	pgAcquireLock = `INSERT INTO advisorylock_locks AS l (key, name, owner, token, acquired_at, expires_at)
SELECT $1::bigint, $2::text, $3::text, ` + pgNextToken + `, now(), now() + $4::bigint * interval '1 millisecond'
WHERE NOT EXISTS (SELECT FROM advisorylock_locks AS l WHERE l.key = $1::bigint AND l.expires_at > now())
ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, owner = EXCLUDED.owner,
	token = greatest(l.token + 1, EXCLUDED.token), acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now()
RETURNING token`
	// pgRenewLock extends the row of owner $2 if it is still live, by the
	// TTL $3 from now, and never below its window's end (acquired_at plus
	// $4, 0 without a window); no row returned means lost.
	pgRenewLock = `UPDATE advisorylock_locks
SET expires_at = greatest(now() + $3::bigint * interval '1 millisecond', acquired_at + $4::bigint * interval '1 millisecond')
WHERE key = $1::bigint AND owner = $2::text AND expires_at > now()
RETURNING token`
	// pgReleaseLock deletes the row of owner $2. It need not be durable
	// (a lost release only means waiting for the expiry), so it commits
	// without waiting for the WAL flush, as pgReleaseLease does.
	pgReleaseLock = `DELETE FROM advisorylock_locks
USING (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE key = $1::bigint AND owner = $2::text`
	// pgReleaseLockWindow frees the row of owner $2 at its window's end
	// (acquired_at plus $3), or now if that has passed: the owner stays
	// recorded until then, and the row is taken until then.
	pgReleaseLockWindow = `UPDATE advisorylock_locks
SET expires_at = least(expires_at, greatest(now(), acquired_at + $3::bigint * interval '1 millisecond'))
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE key = $1::bigint AND owner = $2::text`
	pgLockHolder = `SELECT name, owner, token, acquired_at, expires_at FROM advisorylock_locks
WHERE key = $1::bigint AND expires_at > now()`
)

// errNoSharedRows refuses "shared" requests: PostgreSQL keeps a Lock's
// shared holds as session locks only.
var errNoSharedRows = fmt.Errorf("%w: PostgreSQL keeps no shared holders as rows; RLock needs session locks", backend.ErrUnsupported)

// acquireLock takes a lock row and returns the grant's token;
// backend.ErrNotAcquired if a live row holds the key.
func (p *postgres) acquireLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	var token int64
	found, err := p.queryRow(ctx, db, pgAcquireLock, []any{r.Key, r.Name, r.Owner, dbutil.TTLMillis(max(r.TTL, r.MinHold))}, &token)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, backend.ErrNotAcquired
	}
	return uint64(token), nil
}

// renewLock extends r.Owner's live row; backend.ErrLeaseLost otherwise.
func (p *postgres) renewLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	var token int64
	found, err := p.queryRow(ctx, db, pgRenewLock, []any{r.Key, r.Owner, dbutil.TTLMillis(r.TTL), r.MinHold.Milliseconds()}, &token)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%w: its row expired or was taken over", backend.ErrLeaseLost)
	}
	return uint64(token), nil
}

// releaseLock frees r.Owner's row (with a window, at the window's end);
// a row held by another owner is left alone.
func (p *postgres) releaseLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	if r.MinHold > 0 && r.Token != 0 {
		return p.exec(ctx, db, pgReleaseLockWindow, r.Key, r.Owner, r.MinHold.Milliseconds())
	}
	return p.exec(ctx, db, pgReleaseLock, r.Key, r.Owner)
}

// lockHolder reports the live row of r.Key, or nil.
func (p *postgres) lockHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	h := &backend.Holder{Backend: p.Name(), Key: r.Key}
	var token int64
	found, err := p.queryRow(ctx, db, pgLockHolder, []any{r.Key}, &h.Name, &h.Owner, &token, &h.Since, &h.ExpiresAt)
	if !found || err != nil {
		return nil, err
	}
	h.Token = uint64(token)
	return h, nil
}
