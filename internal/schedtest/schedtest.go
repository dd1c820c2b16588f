// Package schedtest is the shared harness of the scheduler adapters' tests
// (extra/advisorylockgocron, extra/advisorylockcron): it opens one
// *sql.DB per simulated replica on a real database and counts, per tick,
// how many replicas' schedulers fired a job and how many ran it.
//
// Replicas are skewed on purpose: replica i fires each tick i*Skew after
// replica 0 (its clock is that much behind), as schedulers on hosts a
// little apart do.
package schedtest

import (
	"database/sql"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/internal/testdb"
	_ "github.com/jackc/pgx/v5/stdlib" // registers driver "pgx"
)

// The figures the adapters' tests share: three schedulers 120 ms
// apart, a 50 ms job, and a one-second tick, with a min-hold of half the
// tick (longer than the 240 ms between the first and last replica,
// shorter than the tick minus it).
const (
	Replicas = 3
	Skew     = 120 * time.Millisecond
	Job      = 50 * time.Millisecond
	Period   = time.Second
	MinHold  = Period / 2
	// Ticks is how many consecutive ticks a test checks.
	Ticks = 4
)

// Backends are the databases the adapters are tested on.
var Backends = []string{"postgres", "mysql", "sqlite"}

// OpenReplicas opens n handles on one database of backend ("postgres":
// the test server with pgx; "mysql": the test run's MariaDB database;
// "sqlite": one file in t.TempDir()), each its own pool as separate
// replicas would have. They close at t.Cleanup.
func OpenReplicas(t testing.TB, backend string, n int) []*sql.DB {
	t.Helper()
	var open func() *sql.DB
	switch backend {
	case "postgres":
		open = func() *sql.DB { return testdb.OpenPostgres(t, "pgx") }
	case "mysql":
		open = func() *sql.DB { return testdb.OpenMySQL(t) }
	case "sqlite":
		path := testdb.SQLitePath(t)
		open = func() *sql.DB {
			return testdb.OpenSQLite(t, path, "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		}
	default:
		t.Fatalf("schedtest: unknown backend %q", backend)
	}
	dbs := make([]*sql.DB, n)
	for i := range dbs {
		dbs[i] = open()
	}
	return dbs
}

// Counter counts, per tick, the replicas that fired a job (ran it or
// skipped it) and the runs. Tick k of replica i is the one due at
// Origin + k*Period + i*Skew; an event is counted in the tick nearest to
// it, so events must come less than Period/2 after their tick (a 50 ms
// job does). It is safe for concurrent use.
type Counter struct {
	Origin time.Time // replica 0's tick 0

	mu    sync.Mutex
	fired map[int]int
	ran   map[int]int
	odd   []string // events outside any tick, reported by Check
}

// NewCounter returns a Counter whose tick 0 is at origin.
func NewCounter(origin time.Time) *Counter {
	return &Counter{Origin: origin, fired: map[int]int{}, ran: map[int]int{}}
}

// Fired records that replica's scheduler fired the job now, and whether
// it ran it.
func (c *Counter) Fired(replica int, ran bool) {
	at := time.Since(c.Origin) - time.Duration(replica)*Skew
	k := int(math.Round(float64(at) / float64(Period)))
	c.mu.Lock()
	defer c.mu.Unlock()
	if off := at - time.Duration(k)*Period; off < -Period/4 {
		c.odd = append(c.odd, fmt.Sprintf("replica %d fired %v before its tick %d", replica, -off, k))
	}
	c.fired[k]++
	if ran {
		c.ran[k]++
	}
}

// Check waits until every replica has fired ticks first to
// first+Ticks-1 (see WaitTick), then fails t unless each of those ticks ran
// the job exactly once. It logs the runs per tick.
func (c *Counter) Check(t testing.TB, first int) {
	t.Helper()
	runs := make([]int, Ticks)
	for i := range runs {
		runs[i] = c.WaitTick(t, first+i)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, n := range runs {
		if k := first + i; c.fired[k] != Replicas || n != 1 {
			t.Errorf("tick %d: fired on %d replicas, ran %d times; want %d and 1", k, c.fired[k], n, Replicas)
		}
	}
	for _, s := range c.odd {
		t.Error(s)
	}
	t.Logf("ticks %d to %d: runs per tick %v", first, first+Ticks-1, runs)
}

// WaitTick waits (polling, until testdb.DefaultWait after the tick is due)
// until every replica has fired tick k, and returns how many ran it.
func (c *Counter) WaitTick(t testing.TB, k int) int {
	t.Helper()
	wait := time.Until(c.Origin.Add(time.Duration(k+1)*Period)) + testdb.DefaultWait
	if !testdb.Poll(wait, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.fired[k] >= Replicas
	}) {
		t.Fatalf("after %v, not every replica fired tick %d: %s", wait, k, c.snapshot())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ran[k]
}

func (c *Counter) snapshot() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("fired %v, ran %v", c.fired, c.ran)
}

// NextTick returns the first tick that replica 0 fires after now.
func (c *Counter) NextTick() int {
	return int(math.Floor(float64(time.Since(c.Origin))/float64(Period))) + 1
}

// CheckRunsTwice waits for ticks from first on, one at a time, until one
// of them ran the job more than once, and fails t if none of Ticks ticks
// did: what schedulers without a min-hold do. Looking at several ticks
// keeps a slow machine (a run that outlasts the skew) from failing it.
func (c *Counter) CheckRunsTwice(t testing.TB, first int) {
	t.Helper()
	var runs []int
	for k := first; k < first+Ticks; k++ {
		runs = append(runs, c.WaitTick(t, k))
		if runs[len(runs)-1] >= 2 {
			t.Logf("without a min-hold, ticks %d to %d: runs per tick %v", first, k, runs)
			return
		}
	}
	t.Errorf("without a min-hold, ticks %d to %d ran %v times; want a tick run on more than one replica", first, first+Ticks-1, runs)
}
