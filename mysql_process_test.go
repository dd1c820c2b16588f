package advisorylock_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os/exec"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestMySQLMutualExclusionAcrossProcesses is TestMutualExclusionUnderLoad
// on MariaDB: processes with several goroutines each run a non-atomic
// read-modify-write of one counter row under Lock.Do, and under
// LeaseLock.Do with fenced writes. The count must be exact, no two
// holders inside at once, every lease grant its own token, and the fence
// log never back in token order; nothing may be left held.
func TestMySQLMutualExclusionAcrossProcesses(t *testing.T) {
	testdb.Slow(t, "several processes under load")
	t.Parallel()
	const procs, goroutines = 3, 4
	for _, tc := range []struct {
		kind  string
		iters int
	}{{"lock", 15}, {"lease", 6}} {
		t.Run(tc.kind, func(t *testing.T) {
			testdb.CheckGoroutines(t)
			ctx := context.Background()
			admin := testdb.OpenMySQL(t)
			job := faultJob{Kind: tc.kind, Driver: "mysql", MySQL: testdb.MySQLDSN(t), Name: testdb.UniqueName(t), Goroutines: goroutines, Iters: tc.iters}
			job.Counter = *testdb.NewMySQLCounter(t, admin)
			env, err := json.Marshal(job)
			if err != nil {
				t.Fatal(err)
			}
			cmds := make([]*exec.Cmd, procs)
			for i := range cmds {
				cmds[i] = testdb.HelperCommand(t, "TestFaultHelperProcess", fmt.Sprintf("mysql-%d", i), faultJobEnv+"="+string(env))
				if err := cmds[i].Start(); err != nil {
					t.Fatalf("start helper: %v", err)
				}
			}
			for i, c := range cmds {
				if err := c.Wait(); err != nil {
					t.Errorf("helper %d: %v (its output is above)", i, err)
				}
			}
			s, err := job.Counter.State(ctx, admin)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(procs * goroutines * tc.iters)
			if s.N != want || s.Violations != 0 || s.Holders != 0 {
				t.Fatalf("counter %d (want %d), %d overlapping holders seen, %d inside at the end", s.N, want, s.Violations, s.Holders)
			}
			if tc.kind == "lease" {
				distinct := countRows(t, admin, "SELECT COUNT(DISTINCT token) FROM "+job.Counter.Table+"_writes")
				if s.Writes != want || int64(distinct) != want || s.Regressions != 0 {
					t.Fatalf("fence log: %d writes, %d distinct tokens (want %d each), %d stale writes admitted", s.Writes, distinct, want, s.Regressions)
				}
				var top int64
				if err := admin.QueryRow("SELECT token FROM advisorylock_fences WHERE resource = ?", job.Name).Scan(&top); err != nil || top != s.MaxToken {
					t.Fatalf("fence keeps token %d (%v), the highest write was %d", top, err, s.MaxToken)
				}
			}
			checkMySQLLeaks(t, admin, job.Name, tc.kind == "lease")
		})
	}
}

// checkMySQLLeaks waits until name is held neither as a Lock nor (with
// lease) as an unexpired lease, and no connection of db is checked out.
func checkMySQLLeaks(t *testing.T, db *sql.DB, name string, lease bool) {
	t.Helper()
	testdb.WaitFor(t, wait, func() bool { return mysqlHolder(t, db, name) == 0 }, "lock %q left held", name)
	testdb.WaitFor(t, wait, func() bool {
		if !lease {
			return true
		}
		return countRows(t, db, "SELECT COUNT(*) FROM advisorylock_leases WHERE name = ? AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)", name) == 0
	}, "lease %q left held", name)
	testdb.WaitFor(t, wait, func() bool { return db.Stats().InUse == 0 }, "%d connections left checked out", db.Stats().InUse)
}
