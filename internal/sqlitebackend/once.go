package sqlitebackend

import (
	"context"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Runs done on SQLite (Lock.TryDoOnce): one row per (name, run) in
// advisorylock_runs, written after the run's fn returned and read under
// the lock by the next caller. Times are the lock's clock's, in Unix
// milliseconds, as the other tables'.

// sqliteRunsTable is the DDL of advisorylock_runs.
const sqliteRunsTable = `CREATE TABLE IF NOT EXISTS advisorylock_runs (
	name    TEXT    NOT NULL,
	run     TEXT    NOT NULL, -- the run key given to TryDoOnce
	done_at INTEGER NOT NULL, -- when it was recorded done
	PRIMARY KEY (name, run)
)`

// RunDone reads the record of run, one statement.
func (s sqliteBackend) RunDone(ctx context.Context, db backend.DB, name, run string) (bool, error) {
	var n int
	err := s.run(ctx, db, busyNewcomer, func(q dbutil.Querier) error {
		return q.QueryRowContext(ctx, "SELECT count(*) FROM advisorylock_runs WHERE name = ? AND run = ?", name, run).Scan(&n)
	})
	return n > 0, err
}

// RecordRun writes the record of run, then deletes the name's other records past
// the retention: two statements, each committed on its own (the record
// first, so that a prune that fails loses nothing).
func (s sqliteBackend) RecordRun(ctx context.Context, db backend.DB, name, run string, now time.Time, keep time.Duration) error {
	if now.IsZero() {
		now = time.Now()
	}
	err := s.run(ctx, db, busyHolder, func(q dbutil.Querier) error {
		_, err := q.ExecContext(ctx, "INSERT INTO advisorylock_runs (name, run, done_at) VALUES (?, ?, ?) ON CONFLICT (name, run) DO NOTHING",
			name, run, now.UnixMilli())
		return err
	})
	if err != nil {
		return err
	}
	return s.run(ctx, db, busyHolder, func(q dbutil.Querier) error {
		_, err := q.ExecContext(ctx, "DELETE FROM advisorylock_runs WHERE name = ? AND run <> ? AND done_at < ?", name, run, now.Add(-keep).UnixMilli())
		return err
	})
}
