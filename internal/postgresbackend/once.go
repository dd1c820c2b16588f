package postgresbackend

import (
	"context"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// Runs done on PostgreSQL (Lock.TryDoOnce): one row per (name, run) in
// advisorylock_runs, written after the run's fn returned, read under the
// lock by the next caller. Times are the database's.

// postgresRunsTable is the DDL of advisorylock_runs.
const postgresRunsTable = `CREATE TABLE IF NOT EXISTS advisorylock_runs (
	name    text        NOT NULL,
	run     text        NOT NULL,    -- the run key given to TryDoOnce
	done_at timestamptz NOT NULL,    -- when it was recorded done
	PRIMARY KEY (name, run)
)`

// The run statements. $1 is the name, $2 the run key, $3 the retention
// in milliseconds. The record deletes the name's records past the
// retention in the same statement, but never the one it writes.
const (
	pgRunDone   = `SELECT EXISTS (SELECT FROM advisorylock_runs WHERE name = $1::text AND run = $2::text)`
	pgRecordRun = `WITH pruned AS (DELETE FROM advisorylock_runs WHERE name = $1::text AND run <> $2::text AND done_at < now() - $3::bigint * interval '1 millisecond')
INSERT INTO advisorylock_runs (name, run, done_at) VALUES ($1::text, $2::text, now()) ON CONFLICT (name, run) DO NOTHING`
)

// RunDone reads the record of run, one round trip.
func (p *postgres) RunDone(ctx context.Context, db backend.DB, name, run string) (bool, error) {
	var done bool
	_, err := p.queryRow(ctx, db, pgRunDone, []any{name, run}, &done)
	return done, err
}

// RecordRun writes the record of run and prunes the name's old ones, one round
// trip, committed when it returns.
func (p *postgres) RecordRun(ctx context.Context, db backend.DB, name, run string, now time.Time, keep time.Duration) error {
	return p.exec(ctx, db, pgRecordRun, name, run, keep.Milliseconds())
}
