package advisorylock_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// electionHelperEnv carries a helper process's electionJob, as JSON.
const electionHelperEnv = "ADVISORYLOCK_ELECTION_JOB"

// electionJob tells an election helper process where to campaign.
type electionJob struct {
	Backend, DSN, Name string
	TTL                time.Duration // WithLeaseTTL (SQLite, and rows)
	Rows               bool          // WithLeaseRows
	Owner              string        // WithOwner; "helper" when empty

	// With Record, each lead is marked in it and writes through a Fence
	// into Counter's log (see recordedLead).
	Record  *holdRecord
	Counter *testdb.Counter

	// Slots > 0: instead of campaigning, hold a slot of a Semaphore of
	// Slots on Name Turns times, each hold marked in Record (see holdSlots).
	Slots, Turns int
}

// TestElectionHelperProcess is the body of the helper processes: a
// candidate labelled "helper" (or job.Owner) that leads until it is
// killed, or a semaphore holder (job.Slots). It skips in a normal run.
func TestElectionHelperProcess(t *testing.T) {
	if testdb.HelperRole() == "" {
		t.Skip("helper process only")
	}
	var job electionJob
	if err := json.Unmarshal([]byte(os.Getenv(electionHelperEnv)), &job); err != nil {
		t.Fatalf("helper process: bad %s: %v", electionHelperEnv, err)
	}
	db := openElectionDB(t, job.Backend, job.DSN)
	owner := cmp.Or(job.Owner, "helper")
	opts := []advisorylock.Option{advisorylock.WithOwner(owner), advisorylock.WithLeaseTTL(job.TTL)}
	if job.Rows {
		opts = append(opts, advisorylock.WithLeaseRows())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if job.Slots > 0 {
		holdSlots(ctx, t, db, job, owner, opts)
		return
	}
	e := newElection(t, db, job.Name, opts...)
	lead := func(ctx context.Context, term advisorylock.FencingToken) error {
		<-ctx.Done() // lead until killed
		return ctx.Err()
	}
	if job.Record != nil {
		lead = recordedLead(t, db, job, owner)
	}
	err := e.Run(ctx, lead)
	t.Fatalf("helper's Run returned: %v", err)
}

// TestElectionKilledLeaderProcessIsTakenOver kills (SIGKILL) a helper
// process that leads: on PostgreSQL and MySQL its socket closes and the
// server frees the lock at once, so a waiting candidate leads within a
// few round trips; on SQLite its lease runs out, so within the TTL (and
// the poll cap). Each takeover's term exceeds the dead leader's. The
// takeover times are logged (see docs/election.md).
func TestElectionKilledLeaderProcessIsTakenOver(t *testing.T) {
	testdb.Slow(t, "server kill: kills leader processes, waits out a TTL on SQLite")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		within := takeoverWithin
		if !edb.session {
			within = sqliteTakeoverIn
		}
		job, err := json.Marshal(electionJob{Backend: edb.name, DSN: edb.dsn, Name: name, TTL: electionSQLTTL})
		if err != nil {
			t.Fatal(err)
		}
		watcher := newElection(t, edb.open(t), name, edb.opts...)
		var took []time.Duration
		for round := range 2 {
			cmd := testdb.HelperCommand(t, "TestElectionHelperProcess", fmt.Sprintf("leader-%d", round), electionHelperEnv+"="+string(job))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var dead *advisorylock.Holder
			testdb.WaitFor(t, wait, func() bool {
				h, err := watcher.Leader(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				dead = h
				return h != nil && h.Owner == "helper"
			}, "the helper never led")
			c := startCandidates(t, edb, name, 1)
			// Once its first-use work is done the candidate is campaigning.
			if err := c.elections[0].Check(context.Background()); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			tm := c.next(t, wait)
			took = append(took, tm.at.Sub(killed))
			if tm.token <= dead.Token {
				t.Fatalf("term %v after the dead leader's %v", tm.token, dead.Token)
			}
			checkLeader(t, watcher, name, tm)
			c.stop(t)
		}
		t.Logf("killed-process takeover on %s: %v", edb.name, took)
		if m := slices.Max(took); m > within {
			t.Fatalf("killed-process takeover took %v, want within %v", m, within)
		}
		if !edb.session && slices.Min(took) < electionSQLTTL/3 {
			t.Fatalf("SQLite takeover after %v: before the dead leader's lease could expire", slices.Min(took))
		}
	})
}
