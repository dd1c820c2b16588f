package advisorylock_test

// The soak's TryDoOnce row: replicas run a sequence of run keys once
// each, under faults.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// onceKeys is how many run keys each backend's replicas go through.
const onceKeys = 30

// errOnPurpose is what fn returns when it fails on purpose.
var errOnPurpose = errors.New("the job failed on purpose")

// onceReplica is one replica: a Lock on a pool of its own (through a
// cuttable proxy of its own on a server backend).
type onceReplica struct {
	lock      *advisorylock.Lock
	proxy     *testdb.Proxy // nil on SQLite
	inside    atomic.Bool   // fn is running
	interrupt atomic.Pointer[context.CancelFunc]
}

// onceLoad is the TryDoOnce row on one backend: replicas calling
// TryDoOnce over the run keys, each key until the test saw it done; a fn
// that sometimes fails on purpose and records its section (the lock's
// history); a fault goroutine that, while fn runs, interrupts its caller
// (a replica that dies), and on a server backend kills the holder's
// session, cuts its network for a while, or resets its connections.
type onceLoad struct {
	backend  string
	name     string
	admin    *sql.DB
	replicas []*onceReplica
	secs     *sections
	figs     *figures

	stop, stopFaults context.CancelFunc
	wg, fwg          sync.WaitGroup // the replicas; the faults

	mu        sync.Mutex
	clean     map[string]int       // calls that returned (true, nil)
	succeeded map[string]int       // fn invocations that returned nil
	failed    map[string]int       // fn invocations that returned an error
	active    map[string]time.Time // the key's first call, or its last fn's return
	settled   map[string]bool      // no more calls (the test's view, not the record's)
	late      atomic.Int64         // calls on a key already done that ran nothing
	lateRan   atomic.Int64         // ... that ran fn: a violation
	onPurpose atomic.Int64
	cut       [4]atomic.Int64 // faults: interrupts, kills, cuts, resets
}

// TestSoakTryDoOnce: three replicas run 30 run keys with TryDoOnce on
// PostgreSQL (lib/pq and pgx replicas), MariaDB and a SQLite file, while
// fn fails on purpose one time in four and faults land while fn runs:
// its caller interrupted (everywhere), its session killed, its network
// cut, its connections reset (PostgreSQL and MariaDB). Then, read from
// advisorylock_runs: no run key completed twice (TryDoOnce returned
// (true, nil) at most once per key), a key is recorded only if some fn
// of it returned nil (a failed or interrupted run is never recorded), a
// key completed is recorded, and every key was recorded by the end (the
// replicas live on). A late call on a key already done runs nothing. The
// fn invocations form a history checked against the lock model (no two
// holders at once, save a killed holder not yet told).
func TestSoakTryDoOnce(t *testing.T) {
	testdb.Slow(t, "soak: TryDoOnce replicas under faults, per backend")
	t.Parallel()
	// The backends' rows run side by side, as in TestSoak: each has its
	// own name, pools and proxies, and its faults hit only those. The
	// goroutine check covers them together, on the whole test.
	testdb.CheckGoroutines(t)
	for _, backend := range onceBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			l := startOnceLoad(t, backend)
			l.halt(t)
			l.check(t)
		})
	}
}

// onceBackends are the backends of the TryDoOnce row.
var onceBackends = []string{"postgres", "mysql", "sqlite"}

// onceIdle is how long the replicas go on calling a run key whose fn no
// call has run meanwhile: past the longest a fault keeps the lock held.
const onceIdle = 5 * time.Second

// onceBudget bounds a TryDoOnce row: every run key must be done within
// it. It only keeps a hung row from running forever: a row ends once its
// keys are done, which beside the whole soak under the race detector on
// a loaded CI machine took more than 90s (MariaDB's row, a fault every
// few hundred milliseconds, some holding a key's lock for seconds).
const onceBudget = 4 * time.Minute

// startOnceLoads starts the TryDoOnce row on every backend at once, for
// the soak.
func startOnceLoads(t *testing.T) []*onceLoad {
	var loads []*onceLoad
	for _, b := range onceBackends {
		loads = append(loads, startOnceLoad(t, b))
	}
	return loads
}

// startOnceLoad starts the TryDoOnce row on backend: three replicas, the
// tables made first, and the faults.
func startOnceLoad(t *testing.T, backend string) *onceLoad {
	l := &onceLoad{
		backend: backend, name: testdb.UniqueName(t), figs: &figures{},
		clean: map[string]int{}, succeeded: map[string]int{}, failed: map[string]int{},
		active: map[string]time.Time{}, settled: map[string]bool{},
	}
	l.secs = newSections(l.name, l.figs, t.Logf).sessionFaults(3 * time.Second)
	opts := []advisorylock.Option{quiet, advisorylock.WithKeepAlive(200 * time.Millisecond), advisorylock.WithReleaseTimeout(2 * time.Second)}
	path := ""
	switch backend {
	case "postgres":
		l.admin = testdb.OpenPostgres(t, "pgx")
	case "mysql":
		l.admin = testdb.OpenMySQL(t)
	case "sqlite":
		path = testdb.SQLitePath(t)
		l.admin = testdb.OpenSQLite(t, path, sqliteLoadOptions)
		opts = append(opts, advisorylock.WithPollInterval(5*time.Millisecond), advisorylock.WithLeaseTTL(electionSQLTTL))
	}
	for i := range 3 {
		r := &onceReplica{}
		var db *sql.DB
		switch backend {
		case "postgres":
			db, r.proxy = testdb.OpenPostgresProxied(t, testdb.Drivers[i%len(testdb.Drivers)])
		case "mysql":
			db, r.proxy = testdb.OpenMySQLProxied(t)
		case "sqlite":
			db = testdb.OpenSQLite(t, path, sqliteLoadOptions)
		}
		r.lock = newLock(t, db, l.name, opts...)
		l.replicas = append(l.replicas, r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := l.replicas[0].lock.Check(ctx); err != nil { // the tables, made once
		t.Fatal(err)
	}
	l.start(t)
	return l
}

func onceKey(k int) string { return fmt.Sprintf("tick-%02d", k) }

// start starts the replicas and the faults; the replicas stop once every
// key is settled, or after onceBudget.
func (l *onceLoad) start(t *testing.T) {
	ctx, stop := context.WithTimeout(context.Background(), onceBudget)
	faults, stopFaults := context.WithCancel(ctx)
	l.stop, l.stopFaults = stop, stopFaults
	t.Cleanup(func() { stop(); l.wg.Wait(); l.fwg.Wait() })
	for _, r := range l.replicas {
		l.wg.Go(func() { l.replica(ctx, r) })
	}
	l.fwg.Go(func() { l.inject(t, faults) })
}

// halt waits for the replicas to finish (failing t if they hang), then
// stops the faults.
func (l *onceLoad) halt(t *testing.T) {
	t.Helper()
	waitGroupWithin(t, &l.wg, onceBudget+2*wait, "TryDoOnce replicas on "+l.backend)
	l.stopFaults()
	waitGroupWithin(t, &l.fwg, 2*wait, "TryDoOnce faults on "+l.backend)
	l.stop()
	l.secs.settle()
}

// replica calls TryDoOnce on each key in turn until the key is settled,
// and now and then on an earlier key, as a late replica would.
func (l *onceLoad) replica(ctx context.Context, r *onceReplica) {
	for k := 0; k < onceKeys && ctx.Err() == nil; {
		if l.isSettled(onceKey(k)) {
			k++
			continue
		}
		if k > 0 && rand.IntN(3) == 0 {
			l.call(ctx, r, onceKey(rand.IntN(k)))
		}
		if !l.call(ctx, r, onceKey(k)) {
			time.Sleep(2 * time.Millisecond) // a miss does not spin on a shared server
		}
	}
}

// isSettled reports whether the replicas are done with run: a call
// completed it, or none has run its fn for onceIdle (a call that ran fn
// but returned an error may have recorded it; check decides from the
// record).
func (l *onceLoad) isSettled(run string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.active[run]
	switch {
	case !ok:
		l.active[run] = time.Now()
	case time.Since(at) > onceIdle:
		l.settled[run] = true
	}
	return l.settled[run]
}

// call makes one TryDoOnce call of r on run and reports whether fn ran.
func (l *onceLoad) call(ctx context.Context, r *onceReplica, run string) bool {
	l.mu.Lock()
	doneBefore := l.clean[run] > 0
	l.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.interrupt.Store(&cancel)
	start := time.Now()
	var sec *section
	fnRan, fnErr := false, error(nil)
	ran, err := r.lock.TryDoOnce(cctx, run, func(fctx context.Context) error {
		l.figs.acquiredAfter(time.Since(start))
		sec = l.secs.enter(fctx, nil)
		defer l.secs.exit(sec)
		r.inside.Store(true)
		defer r.inside.Store(false)
		fnRan = true
		hold := rand.N(5 * time.Millisecond)
		if rand.IntN(3) == 0 {
			hold = 300 * time.Millisecond // long enough for a fault to land inside
		}
		select {
		case <-time.After(hold):
		case <-fctx.Done():
			fnErr = context.Cause(fctx)
			return fnErr
		}
		if rand.IntN(4) == 0 {
			l.onPurpose.Add(1)
			fnErr = errOnPurpose
		}
		return fnErr
	})
	r.interrupt.Store(nil)
	if sec != nil && err != nil {
		sec.tell() // Do's error is the first word a short section gets of a loss
	}
	l.secs.record(start, sec) // history hook
	l.figs.outcome(ctx, err, false)
	l.mu.Lock()
	defer l.mu.Unlock()
	if doneBefore {
		l.late.Add(1)
		if fnRan {
			l.lateRan.Add(1)
		}
	}
	switch {
	case !fnRan:
	case fnErr != nil:
		l.failed[run]++
	default:
		l.succeeded[run]++
	}
	switch {
	case ran && err == nil:
		l.clean[run]++
		l.settled[run] = true
	case fnRan:
		l.active[run] = time.Now()
	}
	return fnRan
}

// inject lands a fault on a replica inside fn, in turn: its caller
// interrupted, then (server backends) its session killed, its network cut
// for a while, its connections reset; until ctx ends.
func (l *onceLoad) inject(t *testing.T, ctx context.Context) {
	kinds := 1
	if l.backend != "sqlite" {
		kinds = len(l.cut)
	}
	for i := 0; ctx.Err() == nil; {
		var r *onceReplica
		testdb.Poll(time.Second, func() bool {
			for _, c := range rand.Perm(len(l.replicas)) {
				if l.replicas[c].inside.Load() {
					r = l.replicas[c]
					return true
				}
			}
			return ctx.Err() != nil
		})
		if r == nil || ctx.Err() != nil {
			continue
		}
		kind := i % kinds
		i++
		switch kind {
		case 0:
			if cancel := r.interrupt.Load(); cancel != nil {
				(*cancel)()
			}
		case 1:
			if !l.killHolder(t, ctx) {
				continue
			}
		case 2:
			r.proxy.Cut()
			select {
			case <-time.After(300*time.Millisecond + rand.N(900*time.Millisecond)):
			case <-ctx.Done():
			}
			r.proxy.Heal()
		case 3:
			l.secs.fault()
			r.proxy.Reset()
		}
		l.cut[kind].Add(1)
		l.figs.faults.Add(1)
		select {
		case <-time.After(100*time.Millisecond + rand.N(200*time.Millisecond)): // spacing faults, not synchronizing
		case <-ctx.Done():
		}
	}
}

// killHolder ends the server session that holds the lock, if any.
func (l *onceLoad) killHolder(t *testing.T, ctx context.Context) bool {
	qctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if l.backend == "mysql" {
		var id sql.NullInt64
		if err := l.admin.QueryRowContext(qctx, "SELECT IS_USED_LOCK(?)", mysqlLockName(l.name)).Scan(&id); err != nil || !id.Valid {
			return false
		}
		l.secs.fault()
		_, err := l.admin.ExecContext(qctx, fmt.Sprintf("KILL %d", id.Int64))
		if err != nil && !isUnknownThread(err) && ctx.Err() == nil {
			t.Errorf("kill: %v", err)
		}
		return err == nil
	}
	k := uint64(advisorylock.Key(l.name))
	l.secs.fault()
	var n int
	err := l.admin.QueryRowContext(qctx, fmt.Sprintf(`SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = %d AND objid = %d AND objsubid = 1`, k>>32, k&0xFFFFFFFF)).Scan(&n)
	return err == nil && n > 0
}

// check fails t on a run completed twice, a record without a successful
// fn, a completed run unrecorded, a run never done, a late call that ran
// fn, a history not linearizable, or a row that proved nothing.
func (l *onceLoad) check(t *testing.T) {
	t.Helper()
	recorded := runsRecorded(t, l.admin, l.backend, l.name)
	l.mu.Lock()
	defer l.mu.Unlock()
	var keys []string
	for k := range onceKeys {
		keys = append(keys, onceKey(k))
	}
	for _, run := range recorded {
		if !slices.Contains(keys, run) {
			t.Errorf("%s: run %q recorded, which no replica was given", l.backend, run)
		}
	}
	for _, run := range keys {
		rec := slices.Contains(recorded, run)
		switch {
		case l.clean[run] > 1:
			t.Errorf("%s: run %q completed %d times (TryDoOnce returned (true, nil) each time)", l.backend, run, l.clean[run])
		case rec && l.succeeded[run] == 0:
			t.Errorf("%s: run %q recorded done, but every fn of it failed or was interrupted (%d)", l.backend, run, l.failed[run])
		case !rec && l.clean[run] > 0:
			t.Errorf("%s: run %q completed but not recorded", l.backend, run)
		case !rec:
			t.Errorf("%s: run %q never done (fn succeeded %d times, failed %d; unrecorded)", l.backend, run, l.succeeded[run], l.failed[run])
		}
	}
	if n := l.lateRan.Load(); n != 0 {
		t.Errorf("%s: %d calls on a run already completed ran fn again", l.backend, n)
	}
	if v := l.figs.violations.Load(); v != 0 {
		t.Errorf("%s: %d times two fn invocations overlapped (see the log)", l.backend, v)
	}
	checkHistory(t, l.secs)
	failedRuns := l.failedRuns()
	t.Logf("TryDoOnce on %s: %d runs recorded; %v", l.backend, len(recorded), l.describe(failedRuns))
	if l.onPurpose.Load() == 0 || l.late.Load() == 0 || l.cut[0].Load() == 0 || failedRuns <= int(l.onPurpose.Load()) {
		t.Errorf("vacuous: %s: no failure on purpose, no late call, no interrupt, or none that failed a run", l.backend)
	}
	if l.backend != "sqlite" && (l.cut[1].Load() == 0 || l.cut[2].Load() == 0 || l.cut[3].Load() == 0) {
		t.Errorf("vacuous: %s: a kind of fault never landed", l.backend)
	}
}

// failedRuns counts the fn invocations that returned an error; call it
// with l.mu held.
func (l *onceLoad) failedRuns() int {
	n := 0
	for _, f := range l.failed {
		n += f
	}
	return n
}

func (l *onceLoad) describe(failedRuns int) string {
	return fmt.Sprintf("fn failed %d times (%d on purpose); %d late calls; faults: interrupted %d, killed %d, cut %d, reset %d; %v",
		failedRuns, l.onPurpose.Load(), l.late.Load(), l.cut[0].Load(), l.cut[1].Load(), l.cut[2].Load(), l.cut[3].Load(), l.figs)
}

func (l *onceLoad) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.describe(l.failedRuns())
}
