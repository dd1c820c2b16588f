package mysqlbackend

import (
	"context"
	"database/sql"
	"errors"
	"strconv"

	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Elections on MySQL and MariaDB. The leader holds the election's named
// lock (GET_LOCK); right after the grant its session records the term in
// a row of advisorylock_elections, in one statement: the larger of the
// name's previous term plus one and the database clock in microseconds,
// as a lease's token (see AcquireLease). Leader reads the row, and trusts
// it only while the connection that wrote it still holds the lock
// (IS_USED_LOCK).

// mysqlElectionsTable is the DDL of advisorylock_elections (schema step 3).
const mysqlElectionsTable = `CREATE TABLE IF NOT EXISTS advisorylock_elections (
	name_hash     BINARY(32)  NOT NULL PRIMARY KEY, -- SHA-256 of name
	name          MEDIUMBLOB  NOT NULL,
	owner         VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, -- the leader's label (WithOwner)
	term          BIGINT      NOT NULL, -- the fencing token of the latest term
	connection_id BIGINT      NOT NULL, -- the leader's CONNECTION_ID()
	user          VARCHAR(255) NOT NULL, -- its USER(), before the @
	host          VARCHAR(255) NOT NULL, -- and after it
	since         DATETIME(6) NOT NULL  -- UTC; the term's start
) ENGINE=InnoDB`

// PrepareElections creates the tables unless advisorylock_elections
// exists (one round trip when it does), once per *sql.DB.
func (mysqlBackend) PrepareElections(ctx context.Context, db backend.DB) error {
	return ensureMySQLTable(ctx, db, "advisorylock_elections")
}

// BeginTerm records a new term of name, led by owner, on conn, whose
// session holds the election's lock. The new term goes through
// LAST_INSERT_ID(expr), which the server reports with the result.
func (m mysqlBackend) BeginTerm(ctx context.Context, conn *sql.Conn, key int64, name, owner string) (uint64, error) {
	o := mysqlHex(owner)
	stmt := `INSERT INTO advisorylock_elections (name_hash, name, owner, term, connection_id, user, host, since)
VALUES (` + mysqlHash(name) + `, ` + mysqlHex(name) + `, ` + o + `, LAST_INSERT_ID(` + mysqlNowMicros + `), CONNECTION_ID(), ` + mysqlUser + `, ` + mysqlHost + `, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE term = LAST_INSERT_ID(GREATEST(term + 1, ` + mysqlNowMicros + `)), owner = ` + o + `,
	connection_id = CONNECTION_ID(), user = ` + mysqlUser + `, host = ` + mysqlHost + `, since = UTC_TIMESTAMP(6)`
	res, err := conn.ExecContext(ctx, stmt)
	if err != nil {
		return 0, err
	}
	term, err := res.LastInsertId()
	if err != nil {
		return 0, err
	}
	return dbutil.TermToken(term)
}

// TermHolder reports name's latest term while the connection that began
// it still holds key's lock, or nil. User and ClientAddr are the leader's
// USER() at its term's start.
func (m mysqlBackend) TermHolder(ctx context.Context, db backend.DB, key int64, name string) (*backend.Holder, error) {
	stmt := `SELECT owner, term, connection_id, user, host, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', since)
FROM advisorylock_elections WHERE name_hash = ` + mysqlHash(name) + ` AND connection_id = IS_USED_LOCK(` + mysqlLockName(key) + `)`
	h := &backend.Holder{Backend: m.Name()}
	var term, since int64
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		return q.QueryRowContext(ctx, stmt).Scan(&h.Owner, &term, &h.PID, &h.User, &h.ClientAddr, &since)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	h.Token, h.Since = uint64(term), time.UnixMicro(since)
	return h, nil
}

// EndTerm marks term of name ended in its row, on conn, the resigning
// leader's (see termEnder).
func (m mysqlBackend) EndTerm(ctx context.Context, conn *sql.Conn, name string, term uint64) error {
	_, err := conn.ExecContext(ctx, `UPDATE advisorylock_elections SET connection_id = 0 WHERE name_hash = `+mysqlHash(name)+
		` AND term = `+strconv.FormatUint(term, 10)+` AND connection_id = CONNECTION_ID()`)
	return err
}
