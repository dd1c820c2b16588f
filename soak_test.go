package advisorylock_test

// TestSoak runs every kind of lock at once under injected faults and
// prints what it did. Without ADVISORYLOCK_SOAK it runs for a few seconds,
// so that CI proves it; for a long run, give a Go duration:
//
//	ADVISORYLOCK_SOAK=10m go test -run TestSoak -v -timeout 0 .
//
// The load: Lock.Do and fenced LeaseLock.Do workers on PostgreSQL (lib/pq
// and pgx pools, through a cuttable proxy), and Lock.Do and fenced
// LeaseLock.Do workers on one SQLite file opened by two pools. The faults,
// on PostgreSQL, every few hundred milliseconds: a random holder or waiter
// terminated, the network cut for up to two seconds, or every connection
// reset. It reports operations, locks acquired, losses detected, faults
// injected, violations (two holders at once where the first did not lose
// its lock, a lease granted again before its holder knew it lost it, a
// stale write admitted, a wrong count: must be 0) and the p50/p99 latency
// from calling Do to fn running.

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// soakEnv names the soak's duration.
const soakEnv = "ADVISORYLOCK_SOAK"

// soakShort is the soak's length when soakEnv is unset.
const soakShort = 5 * time.Second

func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv(soakEnv)
	if v == "" {
		return soakShort
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive Go duration such as 10m", soakEnv, v)
	}
	return d
}

func TestSoak(t *testing.T) {
	checkGoroutines(t)
	d := soakDuration(t)
	pg := startPGLoad(t, 2, 1, func() time.Duration {
		if rand.IntN(5) == 0 {
			return 1500 * time.Millisecond // long enough for a fault to be noticed while held
		}
		return rand.N(20 * time.Millisecond)
	})
	lite := startSQLiteLoad(t, 2, 1)

	var kills, cuts, resets int
	start := time.Now()
	report := func(label string) {
		lines := []string{
			fmt.Sprintf("soak %s after %v of %v: faults injected %d (%d sessions killed, %d network cuts, %d connection resets)",
				label, time.Since(start).Round(time.Second), d, kills+cuts+resets, kills, cuts, resets),
			"  Lock on PostgreSQL:       " + pg.session.String(),
			"  LeaseLock on PostgreSQL:  " + pg.lease.String(),
			"  Lock on SQLite:           " + lite.lock.String(),
			"  LeaseLock on SQLite:      " + lite.lease.String(),
			"  total:                    " + totals(pg.session, pg.lease, lite.lock, lite.lease),
		}
		for _, line := range lines {
			t.Log(line)
			fmt.Println(line)
		}
	}

	nextReport := start.Add(30 * time.Second)
	for time.Since(start) < d {
		time.Sleep(200*time.Millisecond + rand.N(600*time.Millisecond))
		switch r := rand.IntN(10); {
		case r < 5:
			if pg.kill(t) {
				kills++
			}
		case r < 8:
			pg.cut(300*time.Millisecond + rand.N(1700*time.Millisecond))
			cuts++
		default:
			pg.proxy.Reset()
			pg.session.faults.Add(1)
			resets++
		}
		if time.Now().After(nextReport) {
			report("progress")
			nextReport = nextReport.Add(30 * time.Second)
		}
	}
	pg.progresses(t)
	pg.halt(t)
	lite.halt(t)
	report("done")
	pg.check(t)
	lite.check(t)
	for _, f := range []*figures{pg.session, pg.lease, lite.lock, lite.lease} {
		if f.acquired.Load() == 0 {
			t.Errorf("a kind of worker never acquired its lock: %v", f)
		}
	}
}

// totals sums the figures of several loads.
func totals(fs ...*figures) string {
	var all figures
	for _, f := range fs {
		for _, c := range [][2]*atomic.Int64{
			{&all.ops, &f.ops}, {&all.acquired, &f.acquired}, {&all.losses, &f.losses}, {&all.errs, &f.errs},
			{&all.faults, &f.faults}, {&all.violations, &f.violations}, {&all.writes, &f.writes},
			{&all.staleRefused, &f.staleRefused}, {&all.lateAdmitted, &f.lateAdmitted},
		} {
			c[0].Add(c[1].Load())
		}
		f.mu.Lock()
		all.latency = append(all.latency, f.latency...)
		for msg, n := range f.errLog {
			if all.errLog == nil {
				all.errLog = map[string]int{}
			}
			all.errLog[msg] += n
		}
		f.mu.Unlock()
	}
	return all.String()
}

// sqliteLoad is Lock.Do workers bumping a counter the unsafe way, and
// fenced LeaseLock.Do workers, on one SQLite file opened by two pools as
// two processes would.
type sqliteLoad struct {
	admin     *sql.DB
	pools     []*sql.DB
	name      string // the Lock's
	leaseName string // the LeaseLock's and its fence's
	counter   *testdb.Counter
	fenced    *testdb.Counter
	bumps     atomic.Int64 // counter bumps that succeeded
	lock      *figures
	lease     *figures
	secs      []*sections
	stop      context.CancelFunc
	wg        sync.WaitGroup
}

func startSQLiteLoad(t *testing.T, lockWorkers, leaseWorkers int) *sqliteLoad {
	t.Helper()
	path := testdb.SQLitePath(t)
	l := &sqliteLoad{
		admin:     testdb.OpenSQLite(t, path, sqliteLoadOptions),
		name:      testdb.UniqueName(t),
		leaseName: testdb.UniqueName(t),
		lock:      &figures{},
		lease:     &figures{},
	}
	l.counter = testdb.NewCounter(t, l.admin, true)
	l.fenced = testdb.NewCounter(t, l.admin, true)
	lockSecs := newSections(l.name, l.lock, t.Logf)
	leaseSecs := newSections(l.leaseName, l.lease, t.Logf)
	l.secs = []*sections{lockSecs, leaseSecs}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { stop(); l.wg.Wait() })
	opts := []advisorylock.Option{quiet, advisorylock.WithPollInterval(5 * time.Millisecond), advisorylock.WithLeaseTTL(3 * time.Second)}
	for range 2 {
		db := testdb.OpenSQLite(t, path, sqliteLoadOptions)
		l.pools = append(l.pools, db)
		for range lockWorkers {
			lock := newLock(t, db, l.name, opts...)
			l.wg.Go(func() { l.lockWorker(ctx, lock, db, lockSecs) })
		}
		for range leaseWorkers {
			ll, f := fencedLease(t, db, l.leaseName, opts...)
			l.wg.Go(func() { leaseWorker(ctx, ll, f, db, l.fenced, leaseSecs, l.lease) })
		}
	}
	return l
}

// lockWorker runs Lock.Do until ctx ends; each section marks its entry
// and exit in the counter row and bumps the counter in between.
func (l *sqliteLoad) lockWorker(ctx context.Context, lock *advisorylock.Lock, db *sql.DB, secs *sections) {
	for ctx.Err() == nil {
		start := time.Now()
		var sec *section
		err := lock.Do(ctx, func(fctx context.Context) error {
			l.lock.acquiredAfter(time.Since(start))
			sec = secs.enter(nil)
			defer secs.exit(sec)
			return counted(fctx, l.counter, db, func() error {
				err := l.counter.Bump(fctx, db)
				if err == nil {
					l.bumps.Add(1)
				}
				return err
			})
		})
		if sec != nil && err == nil {
			sec.clean.Store(true)
		}
		l.lock.outcome(ctx, err, false)
	}
}

// halt stops the workers (failing t if they hang) and counts the
// violations, also those only the database shows.
func (l *sqliteLoad) halt(t *testing.T) {
	t.Helper()
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, "SQLite workers")
	for _, s := range l.secs {
		s.settle()
	}
	ctx := context.Background()
	s, err := l.counter.State(ctx, l.admin)
	if err != nil {
		t.Fatal(err)
	}
	if s.N != l.bumps.Load() || s.Violations != 0 || s.Holders != 0 {
		l.lock.violations.Add(1)
		t.Logf("VIOLATION: SQLite counter %d after %d bumps; %d overlapping holders seen, %d inside at the end", s.N, l.bumps.Load(), s.Violations, s.Holders)
	}
	checkFenced(t, l.admin, true, l.fenced, l.leaseName, l.lease)
}

// check checks a halted load: no violation, nothing left held.
func (l *sqliteLoad) check(t *testing.T) {
	t.Helper()
	if v := l.lock.violations.Load() + l.lease.violations.Load(); v != 0 {
		t.Errorf("SQLite: %d violations (see the log)", v)
	}
	checkLeaks(t, leakCheck{db: l.admin, sqlite: true, locks: []string{l.name}, leases: []string{l.leaseName}, pools: l.pools})
}
