package schedtest

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// What CheckProcesses runs: for each of ProcessSkews, Replicas processes
// on an every-second schedule, their firings of one tick spread over that
// skew, for ProcessTicks ticks (at least ten seconds), on each of
// ProcessBackends.
var (
	ProcessSkews    = []time.Duration{0, 200 * time.Millisecond, 450 * time.Millisecond}
	ProcessBackends = []string{"postgres", "sqlite"}
)

// ProcessTicks is how many consecutive ticks CheckProcesses counts.
const ProcessTicks = 11

// envReplica carries a Replica's settings, as JSON, to its process.
const envReplica = "ADVISORYLOCK_SCHEDTEST_REPLICA"

// Replica is what a helper process started by CheckProcesses runs: one
// replica's scheduler, firing every tick of an every-second schedule
// Offset after it (early when negative), whose job runs through the
// adapter under test and calls Ran.
type Replica struct {
	Index   int
	Offset  time.Duration
	Backend string // "postgres" or "sqlite"
	SQLite  string // the SQLite file, shared by the replicas
	Name    string // the lock's name, shared by the replicas
	Runs    string // the file Ran appends to
	Ready   string // the file Serve creates
}

// HelperReplica returns the Replica this helper process runs and its own
// pool on the database (closed at t.Cleanup), or false when this process
// is not a CheckProcesses helper.
func HelperReplica(t testing.TB) (Replica, *sql.DB, bool) {
	t.Helper()
	var r Replica
	s := os.Getenv(envReplica)
	if s == "" || testdb.HelperRole() == "" {
		return r, nil, false
	}
	if err := json.Unmarshal([]byte(s), &r); err != nil {
		t.Fatalf("schedtest: %s: %v", envReplica, err)
	}
	return r, r.open(t), true
}

// open opens the replica's pool, small because many helpers share the
// server.
func (r Replica) open(t testing.TB) *sql.DB {
	var db *sql.DB
	switch r.Backend {
	case "postgres":
		db = testdb.OpenPostgres(t, "pgx")
	case "sqlite":
		db = testdb.OpenSQLite(t, r.SQLite, "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	default:
		t.Fatalf("schedtest: unknown backend %q", r.Backend)
	}
	db.SetMaxOpenConns(3)
	return db
}

// Start returns a time at least a second from now, Offset after a whole
// second: where a scheduler of this replica starts its every-second job.
func (r Replica) Start() time.Time {
	return time.Now().Truncate(time.Second).Add(2*time.Second + r.Offset)
}

// Ran records that this replica ran the job for tick. Each run is one
// line appended to the runs file, in one write.
func (r Replica) Ran(t testing.TB, tick time.Time) {
	f, err := os.OpenFile(r.Runs, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Errorf("schedtest: replica %d: %v", r.Index, err)
		return
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%d %d %d\n", tick.UnixNano(), time.Now().UnixNano(), r.Index); err != nil {
		t.Errorf("schedtest: replica %d: %v", r.Index, err)
	}
}

// Serve tells the parent that this replica's scheduler runs, and returns
// when the parent stops it (closes the helper's standard input). The
// caller then stops its scheduler, waiting for a running job.
func (r Replica) Serve(t testing.TB) {
	if err := os.WriteFile(r.Ready, nil, 0o644); err != nil {
		t.Fatalf("schedtest: replica %d: %v", r.Index, err)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// Offset returns replica i's offset from each tick for a spread of skew:
// the replicas are centred on the tick, the first skew/2 early and the
// last skew/2 late, as hosts whose clocks are apart.
func Offset(i int, skew time.Duration) time.Duration {
	return time.Duration(2*i-(Replicas-1)) * skew / time.Duration(2*(Replicas-1))
}

// CheckProcesses runs, for each of ProcessSkews at once, Replicas helper
// processes (the test named helper, which runs its Replica, see
// HelperReplica) on backend, firing each tick spread over that skew, each
// skew's replicas on a lock of their own. Once every replica's scheduler
// runs, it counts ProcessTicks consecutive ticks from the first whole
// second a second later (the ticks before it, which some replicas may not
// have fired, are not counted), then stops the replicas and fails t unless
// each of those ticks ran exactly once for each skew.
func CheckProcesses(t *testing.T, helper, backend string) {
	t.Helper()
	dir := t.TempDir()
	sqlite := filepath.Join(dir, "test.db")
	exited := make(chan error, Replicas*len(ProcessSkews))
	var stops []io.Closer
	stopped := 0
	stop := func() {
		for _, s := range stops {
			_ = s.Close()
		}
		for ; stopped < len(stops); stopped++ {
			if err := <-exited; err != nil {
				t.Errorf("a replica failed: %v", err)
			}
		}
	}
	defer stop()

	groups := make([]Replica, len(ProcessSkews))
	for g, skew := range ProcessSkews {
		base := Replica{Backend: backend, SQLite: sqlite, Name: fmt.Sprintf("%s-%v", testdb.UniqueName(t), skew), Runs: filepath.Join(dir, fmt.Sprintf("runs-%d", g))}
		warmUp(t, base)
		groups[g] = base
		for i := range Replicas {
			r := base
			r.Index, r.Offset, r.Ready = i, Offset(i, skew), filepath.Join(dir, fmt.Sprintf("ready-%d-%d", g, i))
			env, err := json.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			cmd := testdb.HelperCommand(t, helper, fmt.Sprintf("%s-%v-replica-%d", backend, skew, i), envReplica+"="+string(env))
			in, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stops = append(stops, in)
			go func() { exited <- cmd.Wait() }()
		}
	}

	ready := func() bool {
		m, _ := filepath.Glob(filepath.Join(dir, "ready-*"))
		return len(m) == len(stops)
	}
	if !testdb.Poll(testdb.DefaultWait, func() bool { return ready() || len(exited) > 0 }) || len(exited) > 0 {
		t.Fatalf("not every replica's scheduler started within %v", testdb.DefaultWait)
	}
	first := time.Now().Truncate(time.Second).Add(2 * time.Second)
	last := first.Add((ProcessTicks - 1) * time.Second)
	// Once a tick after last has run for a skew, each of its replicas has
	// fired last (each fires it less than a second before the next); stop
	// then waits for a job still running.
	wait := time.Until(last) + testdb.DefaultWait
	if !testdb.Poll(wait, func() bool {
		for _, g := range groups {
			if !latestTick(g.Runs).After(last) {
				return len(exited) > 0
			}
		}
		return true
	}) {
		t.Errorf("not every skew ran a tick after %v within %v", last, wait)
	}
	stop()

	for g, skew := range ProcessSkews {
		runs := readRuns(t, groups[g].Runs)
		var counts, by []string
		var late time.Duration // the largest distance from a run to its tick
		for k := first; !k.After(last); k = k.Add(time.Second) {
			rs := runs[k.UnixNano()]
			delete(runs, k.UnixNano())
			counts = append(counts, strconv.Itoa(len(rs)))
			var replicas []int
			for _, r := range rs {
				replicas = append(replicas, r.replica)
				off := r.at.Sub(r.tick).Abs()
				late = max(late, off)
				// A replica fires at most skew/2 from the tick, and runs
				// the job a few round trips later: a run further than half
				// the period from its tick ran for the wrong one.
				if off >= Period/2 {
					t.Errorf("%v apart: replica %d ran tick %s at %s, %v from it", skew, r.replica, k.Format("15:04:05"), r.at.Format("15:04:05.000"), off)
				}
			}
			by = append(by, fmt.Sprint(replicas))
			if len(rs) != 1 {
				t.Errorf("%v apart: tick %s ran %d times (by replicas %v), want once", skew, k.Format("15:04:05"), len(rs), replicas)
			}
		}
		for _, rs := range runs {
			if at := rs[0].tick; !at.Before(first) && !at.After(last) {
				t.Errorf("%v apart: %d runs for %v, not a whole second", skew, len(rs), at)
			}
		}
		t.Logf("%s, %v apart: runs per tick from %s: %s (by replicas %s; a run at most %v from its tick)",
			backend, skew, first.Format("15:04:05"), strings.Join(counts, " "), strings.Join(by, " "), late.Round(time.Millisecond))
	}
}

// warmUp makes the lock's tables before the replicas start, so that the
// replicas' first runs do not all create them at once.
func warmUp(t *testing.T, r Replica) {
	t.Helper()
	lock, err := advisorylock.New(r.open(t), r.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.TryDoOnce(context.Background(), "warm-up", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// run is one line of a runs file: a replica ran the job for tick at at.
type run struct {
	tick, at time.Time
	replica  int
}

// readRuns returns the runs in the file, by tick (its UnixNano).
func readRuns(t testing.TB, path string) map[int64][]run {
	t.Helper()
	runs := map[int64][]run{}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return runs
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var tick, at int64
		var replica int
		if _, err := fmt.Sscan(sc.Text(), &tick, &at, &replica); err != nil {
			t.Fatalf("runs file: line %q: %v", sc.Text(), err)
		}
		runs[tick] = append(runs[tick], run{time.Unix(0, tick), time.Unix(0, at), replica})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}

// latestTick returns the latest tick in the runs file, skipping a line
// still being written.
func latestTick(path string) time.Time {
	b, _ := os.ReadFile(path)
	var latest int64
	for _, line := range strings.Split(string(b), "\n") {
		if tick, _, ok := strings.Cut(line, " "); ok {
			if n, err := strconv.ParseInt(tick, 10, 64); err == nil && n > latest {
				latest = n
			}
		}
	}
	return time.Unix(0, latest)
}
