package dbutil_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
	"github.com/advisorylock/advisorylock/internal/postgresbackend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestProbeRoundRate measures how often ONE round of the pooler probe sees
// multiplexing, with two connections (the normal probe) and with one (the
// SetMaxOpenConns(1) fallback), on an idle PgBouncer transaction pool and
// on one kept busy by other clients; directly and through the session pool
// it must never see any. The figures are logged (docs/production.md quotes
// them); only the absence of false positives and a non-zero rate where a
// pooler multiplexes are asserted.
func TestProbeRoundRate(t *testing.T) {
	testdb.Slow(t, "measures 200 probe rounds per pool and driver")
	txDSN, sessionDSN := testdb.PgBouncer(t)
	const rounds = 200
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			direct := testdb.OpenPostgres(t, drv)
			session := testdb.OpenPostgresDSN(t, drv, bouncerDSN(drv, sessionDSN))
			tx := testdb.OpenPostgresDSN(t, drv, bouncerDSN(drv, txDSN))
			for _, c := range []struct {
				name string
				db   *sql.DB
			}{{"direct", direct}, {"session pool", session}} {
				for _, paired := range []bool{true, false} {
					if n := roundsSeeing(t, c.db, drv, paired, rounds); n != 0 {
						t.Errorf("%s, paired=%v: %d/%d rounds saw multiplexing, want 0", c.name, paired, n, rounds)
					}
				}
			}
			for _, busy := range []int{0, 2, 4} {
				stop := testdb.KeepBusy(t, drv, bouncerDSN(drv, txDSN), busy)
				paired := roundsSeeing(t, tx, drv, true, rounds)
				single := roundsSeeing(t, tx, drv, false, rounds)
				stop()
				t.Logf("%s, transaction pool (pool size %d), %d other clients busy: one round saw multiplexing %d/%d times with two connections, %d/%d with one",
					drv, testdb.PgBouncerPoolSize, busy, paired, rounds, single, rounds)
				if paired == 0 {
					t.Errorf("%d other clients busy: the two-connection round never saw the transaction pool multiplex", busy)
				}
			}
		})
	}
}

// bouncerDSN configures a PgBouncer DSN for drv as its documentation asks
// for a transaction pool without prepared statements: pgx in exec mode;
// lib/pq needs nothing.
func bouncerDSN(drv, dsn string) string {
	if drv == "pgx" {
		return dsn + "&default_query_exec_mode=exec"
	}
	return dsn
}

// roundsSeeing runs n probe rounds on db and counts those that saw
// multiplexing.
func roundsSeeing(t *testing.T, db *sql.DB, drv string, paired bool, n int) int {
	t.Helper()
	s := postgresbackend.New().(backend.Configurer).Configure(db, 0, true).(backend.SessionIdentifier)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seen := 0
	for range n {
		why, _, err := dbutil.ProbeRound(ctx, db, s, paired)
		if err != nil {
			t.Fatalf("%s probe round: %v", drv, err)
		}
		if why != "" {
			seen++
		}
	}
	return seen
}
