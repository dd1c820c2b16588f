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

// Shared rows on MySQL and MariaDB (RLock on a Lock kept as rows; see
// backend.SharedRowStore), as on PostgreSQL (internal/postgresbackend's
// rows.go): a shared holder has a row of its own in
// advisorylock_shared_rows (advisorylock_shared is the session RLock's),
// with a token of its own, and the key's row in advisorylock_locks is
// their summary: an empty owner, which no acquire's owner is, live until
// the latest shared holder's expiry, so that the exclusive acquire
// (acquireLock, unchanged) finds it taken as it would a holder's row.
// Every decision is made on that one row, which each deciding statement
// locks: InnoDB's writes read its latest version, where a plain read of
// advisorylock_shared_rows would read a snapshot.
//
// The summary counts its shared holders (readers); the release that
// counts the last out ends the summary's lease, so the writer waiting
// behind it is not kept for a TTL. A summary that expired starts anew:
// an epoch, the token of its first shared grant, which the shared rows it
// counted carry, so that a late release from an earlier epoch never
// counts down a later one's holders. A count too high (a shared grant
// whose row never arrived, a dead holder's row) only keeps the summary
// until its expiry; a live shared row's expiry is never past its
// summary's.
//
// MySQL writes one table per statement (but for a multi-table UPDATE),
// so a shared grant is two statements (the summary's count, then the
// holder's row) and a release three (count out, end the summary's lease
// if none is left, delete the row); each is safe on its own, should the
// next never run. A renewal is one.
//
// A waiting writer that misses because shared holders are in claims the
// key (claim_owner, claim_expires_at on the summary row); no new shared
// holder enters while the claim is live, which ends with the row (the
// writer's grant, then its release deletes it) or expires.

// mysqlSharedRows is schema step 7: the summary's count, epoch and
// claim, and a row per shared holder. MariaDB runs the IF NOT EXISTS of
// the ALTER (a comment MySQL skips); MySQL has none, and
// applyMySQLSteps takes its duplicate-column error as the step done.
var mysqlSharedRows = []string{
	`ALTER TABLE advisorylock_locks
	ADD COLUMN /*M! IF NOT EXISTS */ readers          INT         NOT NULL DEFAULT 0, -- shared holders counted in (empty owner)
	ADD COLUMN /*M! IF NOT EXISTS */ epoch            BIGINT      NOT NULL DEFAULT 0, -- the token that began the count
	ADD COLUMN /*M! IF NOT EXISTS */ claim_owner      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, -- a waiting writer's claim
	ADD COLUMN /*M! IF NOT EXISTS */ claim_expires_at DATETIME(6) NULL`,
	`CREATE TABLE IF NOT EXISTS advisorylock_shared_rows (
	lock_key    BIGINT      NOT NULL, -- Key(name)
	token       BIGINT      NOT NULL, -- the grant's fencing token
	owner       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- unique per acquire
	name        MEDIUMBLOB  NOT NULL,
	epoch       BIGINT      NOT NULL, -- the summary's epoch it was counted in; 0 once counted out
	acquired_at DATETIME(6) NOT NULL, -- UTC
	expires_at  DATETIME(6) NOT NULL, -- UTC
	PRIMARY KEY (lock_key, token)
) ENGINE=InnoDB`,
}

// mysqlNow is the database clock, constant within a statement.
const mysqlNow = "UTC_TIMESTAMP(6)"

// acquireShared takes a shared holder's row; backend.ErrNotAcquired if an
// exclusive holder or a waiting writer's claim keeps it out. The upsert
// counts the holder in, and passes its token through LAST_INSERT_ID as
// acquireLock does (0 when kept out); its assignments run in order, each
// seeing the ones before, so the decisions read the columns that the
// assignments before them have not changed. The holder's row then goes in
// if the summary is still of the grant's epoch (no later epoch begins at
// or below the grant's token).
func (m mysqlBackend) acquireShared(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	key, name, expires := strconv.FormatInt(r.Key, 10), mysqlHex(r.Name), mysqlExpires(r.TTL)
	admitted := "((owner = '' OR expires_at <= " + mysqlNow + ") AND (claim_expires_at IS NULL OR claim_expires_at <= " + mysqlNow + "))"
	fresh := "(owner <> '' OR expires_at <= " + mysqlNow + ")" // a new epoch
	stmt := `INSERT INTO advisorylock_locks (lock_key, name, owner, token, acquired_at, expires_at, readers, epoch)
VALUES (` + key + `, ` + name + `, '', LAST_INSERT_ID(` + mysqlNowMicros + `), ` + mysqlNow + `, ` + expires + `, 1, ` + mysqlNowMicros + `)
ON DUPLICATE KEY UPDATE
	token = IF(` + admitted + `, LAST_INSERT_ID(GREATEST(token + 1, ` + mysqlNowMicros + `)), token + LAST_INSERT_ID(0)),
	epoch = IF(` + admitted + ` AND ` + fresh + `, token, epoch),
	readers = IF(` + admitted + `, IF(` + fresh + `, 1, readers + 1), readers),
	acquired_at = IF(` + admitted + ` AND ` + fresh + `, ` + mysqlNow + `, acquired_at),
	name = IF(` + admitted + `, ` + name + `, name),
	owner = IF(` + admitted + `, '', owner),
	expires_at = IF(` + admitted + `, GREATEST(expires_at, ` + expires + `), expires_at)`
	token, err := m.execToken(ctx, db, stmt)
	if err == nil && token == 0 {
		err = backend.ErrNotAcquired
	}
	if err != nil {
		return 0, err
	}
	tok := strconv.FormatInt(token, 10)
	row := `INSERT INTO advisorylock_shared_rows (lock_key, token, owner, name, epoch, acquired_at, expires_at)
SELECT lock_key, ` + tok + `, ` + mysqlHex(r.Owner) + `, ` + name + `, epoch, ` + mysqlNow + `, LEAST(expires_at, ` + expires + `)
FROM advisorylock_locks WHERE lock_key = ` + key + ` AND owner = '' AND expires_at > ` + mysqlNow + ` AND epoch <= ` + tok
	var n int64
	err = mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		res, err := q.ExecContext(ctx, row)
		if err == nil {
			n, err = res.RowsAffected()
		}
		return err
	})
	if err == nil && n != 1 {
		err = errors.New("advisorylock: mysql: the shared grant's summary ended before its row went in")
	}
	return m.grant(token, err)
}

// renewShared extends r.Owner's live shared row by its TTL, and its
// summary to at least as long, in one multi-table UPDATE that locks both;
// backend.ErrLeaseLost when either has ended.
func (m mysqlBackend) renewShared(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	expires := mysqlExpires(r.TTL)
	stmt := `UPDATE advisorylock_locks AS l JOIN advisorylock_shared_rows AS s ON s.lock_key = l.lock_key AND s.epoch = l.epoch
SET l.expires_at = GREATEST(l.expires_at, ` + expires + `), s.expires_at = ` + expires + `, s.token = LAST_INSERT_ID(s.token)
WHERE l.lock_key = ` + strconv.FormatInt(r.Key, 10) + ` AND l.owner = '' AND l.expires_at > ` + mysqlNow + `
	AND s.owner = ` + mysqlHex(r.Owner) + ` AND s.expires_at > ` + mysqlNow
	token, err := m.execToken(ctx, db, stmt)
	if err == nil && uint64(token) != r.Token { // 0: no row matched
		err = fmt.Errorf("%w: its shared row expired or was taken over", backend.ErrLeaseLost)
	}
	return m.grant(token, err)
}

// releaseShared counts r.Owner's row out of its summary's epoch, if it
// is the summary's (one multi-table UPDATE, which also marks the row
// counted out), ends the summary's lease if no holder is left counted
// in, and deletes the row with the key's expired ones (dead holders').
func (m mysqlBackend) releaseShared(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	key, owner := strconv.FormatInt(r.Key, 10), mysqlHex(r.Owner)
	return mysqlExecAll(ctx, db,
		`UPDATE advisorylock_locks AS l JOIN advisorylock_shared_rows AS s ON s.lock_key = l.lock_key AND s.epoch = l.epoch
SET l.readers = l.readers - 1, s.epoch = 0
WHERE l.lock_key = `+key+` AND l.owner = '' AND s.owner = `+owner,
		`UPDATE advisorylock_locks SET expires_at = LEAST(expires_at, `+mysqlNow+`) WHERE lock_key = `+key+` AND owner = '' AND readers <= 0`,
		`DELETE FROM advisorylock_shared_rows WHERE lock_key = `+key+` AND (owner = `+owner+` OR expires_at <= `+mysqlNow+`)`)
}

// mysqlExecAll runs stmts in order (see mysqlExec), until one fails.
func mysqlExecAll(ctx context.Context, db backend.DB, stmts ...string) error {
	for _, stmt := range stmts {
		if err := mysqlExec(ctx, db, stmt); err != nil {
			return err
		}
	}
	return nil
}

// claimWriter claims r.Key for the waiting writer r.Owner for its TTL,
// while shared holders have it.
func (mysqlBackend) claimWriter(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	return mysqlExec(ctx, db, `UPDATE advisorylock_locks SET claim_owner = `+mysqlHex(r.Owner)+`, claim_expires_at = `+mysqlExpires(r.TTL)+`
WHERE lock_key = `+strconv.FormatInt(r.Key, 10)+` AND owner = '' AND expires_at > `+mysqlNow)
}

// mysqlMicros reads a DATETIME(6) column as microseconds since 1970.
func mysqlMicros(column string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', " + column + ")"
}

// LeaseHolders lists every live holder of r.Key, exclusive and shared
// (see backend.SharedRowStore): the exclusive row first.
func (m mysqlBackend) LeaseHolders(ctx context.Context, db backend.DB, r backend.LeaseRequest) ([]*backend.Holder, error) {
	key := strconv.FormatInt(r.Key, 10)
	stmt := `SELECT name, owner, token, ` + mysqlMicros("acquired_at") + `, ` + mysqlMicros("expires_at") + `, 0 FROM advisorylock_locks
WHERE lock_key = ` + key + ` AND owner <> '' AND expires_at > ` + mysqlNow + `
UNION ALL SELECT name, owner, token, ` + mysqlMicros("acquired_at") + `, ` + mysqlMicros("expires_at") + `, 1 FROM advisorylock_shared_rows
WHERE lock_key = ` + key + ` AND epoch <> 0 AND expires_at > ` + mysqlNow
	var hs []*backend.Holder
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		hs = nil // run again after creating the tables
		rows, err := q.QueryContext(ctx, stmt)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			h, err := m.scanHolder(rows.Scan, r.Key)
			if err != nil {
				return err
			}
			hs = append(hs, h)
		}
		return rows.Err()
	})
	return hs, err
}

// scanHolder scans a holder's name, owner, token, times and shared flag.
func (m mysqlBackend) scanHolder(scan func(dest ...any) error, key int64) (*backend.Holder, error) {
	h := &backend.Holder{Backend: m.Name(), Key: key}
	var token, since, expires int64
	if err := scan(&h.Name, &h.Owner, &token, &since, &expires, &h.Shared); err != nil {
		return nil, err
	}
	h.Token, h.Since, h.ExpiresAt = uint64(token), time.UnixMicro(since), time.UnixMicro(expires)
	return h, nil
}

// sharedBlocker reports what keeps a shared holder of r.Key out: the
// exclusive row, else a waiting writer's claim; nil when nothing does.
func (m mysqlBackend) sharedBlocker(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	key := strconv.FormatInt(r.Key, 10)
	stmt := `SELECT name, owner, token, ` + mysqlMicros("acquired_at") + `, ` + mysqlMicros("expires_at") + `, 0 FROM advisorylock_locks
WHERE lock_key = ` + key + ` AND owner <> '' AND expires_at > ` + mysqlNow + `
UNION ALL SELECT name, claim_owner, 0, ` + mysqlMicros("acquired_at") + `, ` + mysqlMicros("claim_expires_at") + `, 0 FROM advisorylock_locks
WHERE lock_key = ` + key + ` AND claim_expires_at > ` + mysqlNow + ` LIMIT 1`
	var h *backend.Holder
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		var err error
		h, err = m.scanHolder(q.QueryRowContext(ctx, stmt).Scan, r.Key)
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return h, err
}
