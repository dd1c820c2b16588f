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
// pooler: no statement depends on the session it lands on. A Lock's
// shared holders (RLock) are rows too: see "Shared rows" below.

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
	// pgLockHolders lists every live holder of key $1: the exclusive row
	// first (never the shared holders' summary row, owner ''), then the
	// shared holders' rows.
	pgLockHolders = `SELECT name, owner, token, acquired_at, expires_at, false FROM advisorylock_locks
WHERE key = $1::bigint AND expires_at > now() AND owner <> ''
UNION ALL SELECT name, owner, token, acquired_at, expires_at, true FROM advisorylock_shared
WHERE key = $1::bigint AND expires_at > now()`
)

// acquireLock takes a lock row and returns the grant's token;
// backend.ErrNotAcquired if a live row holds the key. A waiting writer
// (r.Wait) that finds shared holders in claims the key (see
// pgClaimWriter), in a second statement.
func (p *postgres) acquireLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	var token int64
	found, err := p.queryRow(ctx, db, pgAcquireLock, []any{r.Key, r.Name, r.Owner, dbutil.TTLMillis(max(r.TTL, r.MinHold))}, &token)
	if err != nil {
		return 0, err
	}
	if !found {
		if r.Wait {
			if err := p.exec(ctx, db, pgClaimWriter, r.Key, r.Owner, dbutil.TTLMillis(r.TTL)); err != nil {
				return 0, err
			}
		}
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
// a row held by another owner is left alone. An acquire whose outcome was
// unknown (Token 0) also withdraws its owner's claim, in a second
// statement.
func (p *postgres) releaseLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	if r.MinHold > 0 && r.Token != 0 {
		return p.exec(ctx, db, pgReleaseLockWindow, r.Key, r.Owner, r.MinHold.Milliseconds())
	}
	err := p.exec(ctx, db, pgReleaseLock, r.Key, r.Owner)
	if err == nil && r.Token == 0 {
		err = p.exec(ctx, db, pgWithdrawClaim, r.Key, r.Owner)
	}
	return err
}

// lockHolder reports a live holder of r.Key (the exclusive one if any,
// see LeaseHolders), or nil.
func (p *postgres) lockHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	hs, err := p.LeaseHolders(ctx, db, r)
	if len(hs) == 0 || err != nil {
		return nil, err
	}
	return hs[0], nil
}

// LeaseHolders lists every live holder of r.Key, exclusive and shared
// (see backend.SharedRowStore): the exclusive row first.
func (p *postgres) LeaseHolders(ctx context.Context, db backend.DB, r backend.LeaseRequest) ([]*backend.Holder, error) {
	q, args, err := p.statement(pgLockHolders, r.Key)
	if err != nil {
		return nil, err
	}
	var hs []*backend.Holder
	err = p.run(ctx, db, func(on dbutil.Querier) error {
		hs = nil // run may run it again
		rows, err := on.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			h := &backend.Holder{Backend: p.Name(), Key: r.Key}
			var token int64
			if err := rows.Scan(&h.Name, &h.Owner, &token, &h.Since, &h.ExpiresAt, &h.Shared); err != nil {
				return err
			}
			h.Token = uint64(token)
			hs = append(hs, h)
		}
		return rows.Err()
	})
	return hs, err
}

// Shared rows (RLock on a Lock kept as rows; see backend.SharedRowStore).
// A shared holder has a row of its own in advisorylock_shared, with a
// token of its own, and the key's row in advisorylock_locks is their
// summary: an empty owner (which no acquire's owner is), live until the latest
// shared holder's expiry, so that an exclusive acquire (pgAcquireLock,
// unchanged) finds it taken as it would a holder's row. Every decision
// is made on that one row, which each statement locks (the upsert, the
// updates): under READ COMMITTED a statement that waited for it sees its
// latest version, where a read of advisorylock_shared would see only its
// snapshot.
//
// The summary counts its shared holders (readers), and a shared
// holder's release that finds the count at one ends the summary's
// lease: the writer waiting behind it is not kept for a TTL. A summary
// that expired starts anew (an epoch: its token, which the shared rows
// it counts carry), so a late release of a row from an earlier epoch
// never counts down the holders of a later one; a count too high (a
// shared holder's acquire whose row never arrived) only keeps the summary
// until its expiry. A live shared row's expiry is never past its
// summary's: the grant and each renewal extend both in one statement.
//
// A waiting writer that misses because shared holders are in claims the
// key (claim_owner, claim_expires_at on the summary row), and no new
// shared holder enters while the claim is live; the claim ends with the
// row (the writer's grant, then its release deletes it) or expires.
const (
	// pgAcquireShared takes a shared hold of key $1 ($2 name, $3 owner, $4
	// TTL): the summary admits it when no exclusive row and no claim is
	// live (an expired summary or exclusive row starts a new epoch), and
	// its row goes in with a new token; no row returned means held.
	pgAcquireShared = `WITH grant_token AS (SELECT ` + pgNextToken + ` AS token),
summary AS (
	INSERT INTO advisorylock_locks AS l (key, name, owner, token, acquired_at, expires_at, readers)
	SELECT $1::bigint, $2::text, '', g.token, now(), now() + $4::bigint * interval '1 millisecond', 1 FROM grant_token AS g
	WHERE NOT EXISTS (SELECT FROM advisorylock_locks AS l WHERE l.key = $1::bigint
		AND ((l.owner <> '' AND l.expires_at > now()) OR l.claim_expires_at > now()))
	ON CONFLICT (key) DO UPDATE SET name = EXCLUDED.name, owner = '',
		token = CASE WHEN ` + pgSameEpoch + ` THEN l.token ELSE greatest(l.token + 1, EXCLUDED.token) END,
		readers = CASE WHEN ` + pgSameEpoch + ` THEN l.readers + 1 ELSE 1 END,
		acquired_at = CASE WHEN ` + pgSameEpoch + ` THEN l.acquired_at ELSE now() END,
		expires_at = greatest(l.expires_at, EXCLUDED.expires_at)
	WHERE (l.owner = '' OR l.expires_at <= now()) AND (l.claim_expires_at IS NULL OR l.claim_expires_at <= now())
	RETURNING l.key, l.token)
INSERT INTO advisorylock_shared (key, owner, name, token, epoch, acquired_at, expires_at)
SELECT s.key, $3::text, $2::text, g.token, s.token, now(), now() + $4::bigint * interval '1 millisecond' FROM summary AS s, grant_token AS g
RETURNING token`
	// pgSameEpoch: the summary row is a live summary, whose count goes on.
	pgSameEpoch = `l.owner = '' AND l.expires_at > now()`
	// pgRenewShared extends the shared row of owner $2 by the TTL $3, and
	// its summary to at least as long, if both are live; no row returned
	// means lost.
	pgRenewShared = `WITH summary AS (
	UPDATE advisorylock_locks AS l SET expires_at = greatest(l.expires_at, now() + $3::bigint * interval '1 millisecond')
	WHERE l.key = $1::bigint AND l.owner = '' AND l.expires_at > now()
		AND EXISTS (SELECT FROM advisorylock_shared AS s WHERE s.key = $1::bigint AND s.owner = $2::text AND s.expires_at > now())
	RETURNING l.key, l.token)
UPDATE advisorylock_shared AS s SET expires_at = now() + $3::bigint * interval '1 millisecond' FROM summary
WHERE s.key = summary.key AND s.epoch = summary.token AND s.owner = $2::text AND s.expires_at > now()
RETURNING s.token`
	// pgReleaseShared deletes the shared row of owner $2 and the key's
	// expired ones (dead holders'), counts those of the summary's epoch
	// out, and ends the summary's lease when none is left. It commits
	// without waiting for the WAL flush, as pgReleaseLock does.
	pgReleaseShared = `WITH gone AS (
	DELETE FROM advisorylock_shared WHERE key = $1::bigint AND (owner = $2::text OR expires_at <= now())
	RETURNING epoch),
relaxed AS (SELECT set_config('synchronous_commit', 'off', true))
UPDATE advisorylock_locks AS l SET readers = l.readers - n.gone,
	expires_at = CASE WHEN l.readers > n.gone THEN l.expires_at ELSE least(l.expires_at, now()) END
FROM (SELECT g.epoch, count(*) AS gone FROM gone AS g GROUP BY g.epoch) AS n, relaxed
WHERE l.key = $1::bigint AND l.owner = '' AND l.token = n.epoch`
	// pgClaimWriter claims key $1 for the waiting writer $2 for the TTL
	// $3 while shared holders have it.
	pgClaimWriter = `UPDATE advisorylock_locks SET claim_owner = $2::text, claim_expires_at = now() + $3::bigint * interval '1 millisecond'
WHERE key = $1::bigint AND owner = '' AND expires_at > now()`
	// pgWithdrawClaim ends the claim of writer $2 on key $1.
	pgWithdrawClaim = `UPDATE advisorylock_locks SET claim_owner = NULL, claim_expires_at = NULL
WHERE key = $1::bigint AND claim_owner = $2::text`
	// pgSharedBlocker reads what keeps a shared holder of key $1 out: the
	// exclusive row, else a waiting writer's claim.
	pgSharedBlocker = `SELECT name, owner, token, acquired_at, expires_at FROM advisorylock_locks
WHERE key = $1::bigint AND owner <> '' AND expires_at > now()
UNION ALL SELECT name, claim_owner, 0, acquired_at, claim_expires_at FROM advisorylock_locks
WHERE key = $1::bigint AND claim_expires_at > now()
LIMIT 1`
)

// postgresSharedRows is the schema step of shared rows: the summary's
// count and claim, and a row per shared holder.
var postgresSharedRows = []string{
	`ALTER TABLE advisorylock_locks
	ADD COLUMN IF NOT EXISTS readers          integer NOT NULL DEFAULT 0, -- shared holders counted in (owner '')
	ADD COLUMN IF NOT EXISTS claim_owner      text,                       -- a waiting writer's claim
	ADD COLUMN IF NOT EXISTS claim_expires_at timestamptz`,
	`CREATE TABLE IF NOT EXISTS advisorylock_shared (
	key         bigint      NOT NULL,    -- Key(name)
	owner       text        NOT NULL,    -- unique per acquire
	name        text        NOT NULL,
	token       bigint      NOT NULL,    -- the grant's fencing token
	epoch       bigint      NOT NULL,    -- the summary's token when it was counted in
	acquired_at timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL,
	PRIMARY KEY (key, owner)
)`,
}

// acquireShared takes a shared holder's row; backend.ErrNotAcquired if an
// exclusive holder or a waiting writer's claim keeps it out.
func (p *postgres) acquireShared(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	var token int64
	found, err := p.queryRow(ctx, db, pgAcquireShared, []any{r.Key, r.Name, r.Owner, dbutil.TTLMillis(r.TTL)}, &token)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, backend.ErrNotAcquired
	}
	return uint64(token), nil
}

// renewShared extends r.Owner's live shared row; backend.ErrLeaseLost
// otherwise.
func (p *postgres) renewShared(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	var token int64
	found, err := p.queryRow(ctx, db, pgRenewShared, []any{r.Key, r.Owner, dbutil.TTLMillis(r.TTL)}, &token)
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("%w: its shared row expired or was taken over", backend.ErrLeaseLost)
	}
	return uint64(token), nil
}

// sharedBlocker reports what keeps a shared holder of r.Key out, or nil.
func (p *postgres) sharedBlocker(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	h := &backend.Holder{Backend: p.Name(), Key: r.Key}
	var token int64
	found, err := p.queryRow(ctx, db, pgSharedBlocker, []any{r.Key}, &h.Name, &h.Owner, &token, &h.Since, &h.ExpiresAt)
	if !found || err != nil {
		return nil, err
	}
	h.Token = uint64(token)
	return h, nil
}
