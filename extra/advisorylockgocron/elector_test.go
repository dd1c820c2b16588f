package advisorylockgocron_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockgocron"
	"github.com/advisorylock/advisorylock/internal/schedtest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/go-co-op/gocron/v2"
)

// startElectors starts one Elector per db on the election name, closed at
// t.Cleanup.
func startElectors(t *testing.T, dbs []*sql.DB, name string) []*advisorylockgocron.Elector {
	t.Helper()
	electors := make([]*advisorylockgocron.Elector, len(dbs))
	for i, db := range dbs {
		e, err := advisorylock.NewElection(db, name)
		if err != nil {
			t.Fatal(err)
		}
		el, err := advisorylockgocron.NewElector(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := el.Close(); err != nil {
				t.Errorf("Close of replica %d's Elector: %v", i, err)
			}
		})
		electors[i] = el
	}
	return electors
}

// waitLeader polls until exactly one Elector other than skip leads and
// returns it, failing if two ever say they lead at once.
func waitLeader(t *testing.T, electors []*advisorylockgocron.Elector, skip int) int {
	t.Helper()
	leader := -1
	testdb.WaitFor(t, 0, func() bool {
		leader = -1
		for i, el := range electors {
			if i == skip || el.IsLeader(context.Background()) != nil {
				continue
			}
			if leader >= 0 {
				t.Fatalf("replicas %d and %d both lead", leader, i)
			}
			leader = i
		}
		return leader >= 0
	}, "no replica leads")
	return leader
}

func TestElectorRunsEachTickOnTheLeaderAlone(t *testing.T) {
	for _, backend := range schedtest.Backends {
		t.Run(backend, func(t *testing.T) {
			dbs := schedtest.OpenReplicas(t, backend, schedtest.Replicas)
			electors := startElectors(t, dbs, testdb.UniqueName(t))
			leader := waitLeader(t, electors, -1)
			c := schedtest.NewCounter(nextOrigin())
			startSkewed(t, c, testdb.UniqueName(t), func(i int) []gocron.SchedulerOption {
				return []gocron.SchedulerOption{gocron.WithDistributedElector(electors[i])}
			})
			c.Check(t, 0)

			// The leader resigns: another replica leads, in a later term,
			// and runs every tick from then on.
			old, _ := electors[leader].Term()
			resigned := time.Now()
			if err := electors[leader].Close(); err != nil {
				t.Fatal(err)
			}
			if err := electors[leader].IsLeader(context.Background()); !errors.Is(err, advisorylockgocron.ErrNotLeader) {
				t.Fatalf("IsLeader after Close: %v, want ErrNotLeader", err)
			}
			next := waitLeader(t, electors, leader)
			took := time.Since(resigned)
			term, _ := electors[next].Term()
			if term <= old {
				t.Errorf("term after the takeover %d, want more than %d", term, old)
			}
			t.Logf("replica %d (term %d) resigned, replica %d leads (term %d) %v later (Close and a poll of IsLeader included)", leader, old, next, term, took)
			c.Check(t, c.NextTick())
		})
	}
}

func TestElectorReportsWhyTheCampaignEnded(t *testing.T) {
	// An in-memory SQLite database cannot be locked: the election refuses
	// it at its first operation, and the Elector says so.
	db := testdb.OpenSQLite(t, ":memory:", "")
	e, err := advisorylock.NewElection(db, testdb.UniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	el, err := advisorylockgocron.NewElector(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	if !testdb.Poll(testdb.DefaultWait, func() bool {
		err = el.IsLeader(context.Background())
		return errors.Is(err, advisorylock.ErrUnsupported)
	}) {
		t.Fatalf("IsLeader: %v, want the campaign's ErrUnsupported", err)
	}
	if !errors.Is(err, advisorylockgocron.ErrNotLeader) {
		t.Errorf("IsLeader: %v, want ErrNotLeader too", err)
	}
	if err := el.Close(); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("Close: %v, want ErrUnsupported", err)
	}
	if _, err := advisorylockgocron.NewElector(context.Background(), nil); err == nil {
		t.Error("NewElector(nil) returned no error")
	}
}
