package mysqlbackend

import (
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"

	"cmp"
	"context"
	"fmt"
	"strconv"
)

// Lock rows on MySQL and MariaDB (WithLeaseRows): as on PostgreSQL, a
// Lock, a set's names and a Semaphore's slots kept as rows live in
// advisorylock_locks, one row per key while held, each step one
// autocommit statement on the database's clock (UTC), so it works
// through a proxy that moves statements between server connections
// (ProxySQL, RDS Proxy). Shared holders (RLock) are rows too: see
// shared_rows.go.

// mysqlLocksTable is the DDL of advisorylock_locks.
const mysqlLocksTable = `CREATE TABLE IF NOT EXISTS advisorylock_locks (
	lock_key    BIGINT      NOT NULL PRIMARY KEY, -- Key(name)
	name        MEDIUMBLOB  NOT NULL,
	owner       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- unique per acquire
	token       BIGINT      NOT NULL, -- the grant's fencing token
	acquired_at DATETIME(6) NOT NULL, -- UTC
	expires_at  DATETIME(6) NOT NULL  -- UTC; the row is free from then on
) ENGINE=InnoDB`

// acquireLock takes the lock row if it is absent or expired, in one
// upsert, as AcquireLease takes a lease (a waiting writer that misses
// claims the key in a second statement: see claimWriter): the first assignment takes the
// owner only if the row has expired, the others see by the owner label
// (unique per acquire) whether it did, and the new token, from the
// database clock's microseconds and never below the row's own plus one,
// comes back through LAST_INSERT_ID (0 when the row is held).
func (m mysqlBackend) acquireLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	owner, expires, took := mysqlHex(r.Owner), mysqlExpires(max(r.TTL, r.MinHold)), "owner = "+mysqlHex(r.Owner)
	stmt := `INSERT INTO advisorylock_locks (lock_key, name, owner, token, acquired_at, expires_at)
VALUES (` + strconv.FormatInt(r.Key, 10) + `, ` + mysqlHex(r.Name) + `, ` + owner + `, LAST_INSERT_ID(` + mysqlNowMicros + `), UTC_TIMESTAMP(6), ` + expires + `)
ON DUPLICATE KEY UPDATE
	owner = IF(expires_at <= UTC_TIMESTAMP(6), ` + owner + `, owner),
	token = IF(` + took + `, LAST_INSERT_ID(GREATEST(token + 1, ` + mysqlNowMicros + `)), token + LAST_INSERT_ID(0)),
	name = IF(` + took + `, ` + mysqlHex(r.Name) + `, name),
	acquired_at = IF(` + took + `, UTC_TIMESTAMP(6), acquired_at),
	expires_at = IF(` + took + `, ` + expires + `, expires_at)`
	token, err := m.execToken(ctx, db, stmt)
	if err == nil && token == 0 {
		err = backend.ErrNotAcquired
		if r.Wait {
			err = cmp.Or(m.claimWriter(ctx, db, r), err)
		}
	}
	return m.grant(token, err)
}

// renewLock extends r.Owner's live row by its TTL from now (with
// r.MinHold, never before the window's end); backend.ErrLeaseLost
// otherwise. The row's token comes back through LAST_INSERT_ID and must
// be the grant's.
func (m mysqlBackend) renewLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	expires := mysqlExpires(r.TTL)
	if r.MinHold > 0 {
		expires = "GREATEST(" + expires + ", " + mysqlAfterGrant(r.MinHold) + ")"
	}
	stmt := `UPDATE advisorylock_locks SET expires_at = ` + expires + `, token = LAST_INSERT_ID(token)
WHERE lock_key = ` + strconv.FormatInt(r.Key, 10) + ` AND owner = ` + mysqlHex(r.Owner) + ` AND expires_at > UTC_TIMESTAMP(6)`
	token, err := m.execToken(ctx, db, stmt)
	if err == nil && uint64(token) != r.Token { // 0: no row matched
		err = fmt.Errorf("%w: its row expired or was taken over", backend.ErrLeaseLost)
	}
	return m.grant(token, err)
}

// releaseLock deletes r.Owner's row, or with a window lets it expire at
// the window's end (or now, if that has passed); a row held by another
// owner is left alone. An acquire whose outcome was unknown (Token 0)
// also withdraws its owner's claim, in a second statement.
func (mysqlBackend) releaseLock(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	which := " WHERE lock_key = " + strconv.FormatInt(r.Key, 10) + " AND owner = " + mysqlHex(r.Owner)
	stmt := "DELETE FROM advisorylock_locks" + which
	if r.MinHold > 0 && r.Token != 0 {
		stmt = "UPDATE advisorylock_locks SET expires_at = LEAST(expires_at, GREATEST(UTC_TIMESTAMP(6), " + mysqlAfterGrant(r.MinHold) + "))" + which
	}
	err := mysqlExec(ctx, db, stmt)
	if err == nil && r.Token == 0 {
		err = mysqlExec(ctx, db, "UPDATE advisorylock_locks SET claim_owner = NULL, claim_expires_at = NULL"+
			" WHERE lock_key = "+strconv.FormatInt(r.Key, 10)+" AND claim_owner = "+mysqlHex(r.Owner))
	}
	return err
}

// mysqlExec runs stmt, a statement that returns no rows, as a lease
// statement (see mysqlLeaseRun).
func mysqlExec(ctx context.Context, db backend.DB, stmt string) error {
	return mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		_, err := q.ExecContext(ctx, stmt)
		return err
	})
}

// lockHolder reports a live holder of r.Key (the exclusive one if any,
// see LeaseHolders), or nil.
func (m mysqlBackend) lockHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	hs, err := m.LeaseHolders(ctx, db, r)
	if len(hs) == 0 || err != nil {
		return nil, err
	}
	return hs[0], nil
}
