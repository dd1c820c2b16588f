package mysqlbackend

import (
	"context"
	"strconv"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Runs done on MySQL (Lock.TryDoOnce): one row per (name, run) in
// advisorylock_runs, keyed by the SHA-256 of each (a name or run key of
// any length), written after the run's fn returned and read under the
// lock by the next caller. Times are the server's, in UTC.

// mysqlRunsTable is the DDL of advisorylock_runs.
const mysqlRunsTable = `CREATE TABLE IF NOT EXISTS advisorylock_runs (
	name_hash BINARY(32)  NOT NULL, -- SHA-256 of name
	run_hash  BINARY(32)  NOT NULL, -- SHA-256 of run
	name      MEDIUMBLOB  NOT NULL,
	run       MEDIUMBLOB  NOT NULL, -- the run key given to TryDoOnce
	done_at   DATETIME(6) NOT NULL, -- UTC
	PRIMARY KEY (name_hash, run_hash)
) ENGINE=InnoDB`

// RunDone reads the record of run, one round trip.
func (m mysqlBackend) RunDone(ctx context.Context, db backend.DB, name, run string) (bool, error) {
	var n int
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		return q.QueryRowContext(ctx, "SELECT COUNT(*) FROM advisorylock_runs WHERE name_hash = "+mysqlHash(name)+" AND run_hash = "+mysqlHash(run)).Scan(&n)
	})
	return n > 0, err
}

// RecordRun writes the record of run (committed when the statement returns),
// then deletes the name's other records past the retention: two round
// trips.
func (m mysqlBackend) RecordRun(ctx context.Context, db backend.DB, name, run string, now time.Time, keep time.Duration) error {
	err := mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		_, err := q.ExecContext(ctx, "INSERT IGNORE INTO advisorylock_runs (name_hash, run_hash, name, run, done_at) VALUES ("+
			mysqlHash(name)+", "+mysqlHash(run)+", "+mysqlHex(name)+", "+mysqlHex(run)+", UTC_TIMESTAMP(6))")
		return err
	})
	if err != nil {
		return err
	}
	return mysqlLeaseRun(ctx, db, func(q dbutil.Querier) error {
		_, err := q.ExecContext(ctx, "DELETE FROM advisorylock_runs WHERE name_hash = "+mysqlHash(name)+" AND run_hash <> "+mysqlHash(run)+
			" AND done_at < UTC_TIMESTAMP(6) - INTERVAL "+strconv.FormatInt(keep.Microseconds(), 10)+" MICROSECOND")
		return err
	})
}
