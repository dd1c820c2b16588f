package advisorylock_test

// TestSoak runs every kind of lock at once under injected faults and
// prints what it did. Without ADVISORYLOCK_SOAK it runs one round of its
// fault schedule (a few seconds at least), so that CI proves it; for a
// long run, give a Go duration:
//
//	ADVISORYLOCK_SOAK=10m go test -run TestSoak -v -timeout 0 .
//
// The load: Lock.Do and fenced LeaseLock.Do workers on PostgreSQL (lib/pq
// and pgx, each worker with a pool and a cuttable proxy of its own), and
// Lock.Do and fenced LeaseLock.Do workers on one SQLite file opened by two
// pools, and the MySQL row (mysqlLoad: Lock.Do and fenced LeaseLock.Do
// workers on MariaDB through a cuttable proxy, which every round gets a
// KILL of a holder or waiter, a cut and a reset of every connection). The
// faults, on PostgreSQL, in a fixed round so that every class
// is reached in every run: a Lock holder's session terminated, a Lock
// holder's connections reset, a Lock holder cut off, a lease holder cut
// off for longer than its lease, and a lease granted over a slow network
// (answers held back 1.2s) then cut off. Each is aimed at one worker
// holding its lock (or, for the slow network, waiting for it); the rest of
// the load still reaches the server. The soak fails as vacuous unless
// every one of these made its holder report a loss, and the fence refused
// a stale write. Three more classes follow, each with its own effect to
// reach: a Lock holder blackholed (iptables drops its server connection;
// the workers run with WithDeadHolderTimeout(3s)) must report the loss
// before the server ends its session and a successor is granted; a Lock
// whose sessions have statement_timeout=300ms must be granted after a
// wait longer than that, with no error; and, once per run, a Lock and a
// LeaseLock on a hot standby must be refused with ErrUnsupported (a grant
// there is a violation).
//
// It reports per class the faults injected and what they reached,
// and per kind of lock the operations, locks acquired, losses detected,
// violations (two holders at once where the older was not told of its
// loss before the newer grant, a stale write admitted, a wrong count:
// must be 0) and the p50/p99 latency from calling Do to fn running. The
// semaphore row (soak_semaphore_test.go) counts as a violation more
// holders than slots that no fault explains. The Lock and LeaseLock rows
// also record their history (every acquire, release, loss and fenced
// write), which must be linearizable against a lock-plus-register model
// (history_test.go); a line reports the operations checked. The
// multiplexed and set rows (soak_mux_test.go: Locks sharing sessions with
// WithMultiplexing, sets over overlapping names in opposite orders, on
// PostgreSQL and MariaDB) get faults of their own in every round, beside
// the others: sessions killed, connections reset, cuts, slow answers; a
// set's grant is recorded as a grant of each of its names, and their
// histories are checked with the rest. The TryDoOnce row
// (soak_once_test.go: replicas running a sequence of run keys once each,
// on PostgreSQL, MariaDB and SQLite) gets its own faults while fn runs:
// callers interrupted, sessions killed, cuts, resets; no key may complete
// twice or be recorded without a fn that succeeded, and every key must be
// done by the end. The lease-row rows (soak_rows_test.go), on
// WithLeaseRows through PgBouncer's transaction pool with lib/pq and pgx:
// Lock.Do workers bumping a counter, and Election candidates whose
// leaders make fenced writes with their term, recorded as grants whose
// token is the term (one leader at a time, terms growing across leaders:
// the lock model's own rules), their histories checked with the rest;
// the semaphore row has a backend on lease rows too.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// soakEnv names the soak's duration.
const soakEnv = "ADVISORYLOCK_SOAK"

// soakShort is the soak's least length when soakEnv is unset; it always
// runs at least one round of the fault schedule.
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

// faultClass is one kind of fault the soak injects, and what it reached.
type faultClass struct {
	name     string
	inject   func(pg *pgLoad, c *faultClass) bool // reports whether it found its target
	effect   string                               // what reached counts; "losses reported" if empty
	injected atomic.Int64
	reached  atomic.Int64 // faults that had their effect (most: losses their targets reported)
	spent    atomic.Int64 // nanoseconds spent injecting it, recovery included
}

func (c *faultClass) String() string {
	effect := c.effect
	if effect == "" {
		effect = "losses reported"
	}
	return fmt.Sprintf("%-44s injected %d, %s %d (%v)", c.name+":", c.injected.Load(), effect, c.reached.Load(),
		time.Duration(c.spent.Load()).Round(100*time.Millisecond))
}

// soakFaults returns the soak's fault classes, in the order it runs them.
func soakFaults(t *testing.T) []*faultClass {
	x := &soakExtras{t: t}
	return []*faultClass{
		{name: "Lock holder's session terminated", inject: (*pgLoad).killHolder},
		{name: "Lock holder's connections reset", inject: (*pgLoad).resetHolder},
		{name: "Lock holder cut off", inject: (*pgLoad).cutLockHolder},
		{name: "lease holder cut off past its TTL", inject: (*pgLoad).cutLeaseHolder},
		{name: "lease granted over a slow network, cut off", inject: (*pgLoad).slowThenCut},
		{name: "Lock holder blackholed", inject: x.blackholeHolder, effect: "lost, then a successor granted"},
		{name: "Lock waiter with statement_timeout=300ms", inject: x.shortStatementTimeout, effect: "waits >300ms acquired"},
		{name: "Lock and LeaseLock pointed at a standby", inject: x.pointAtStandby, effect: "refused"},
	}
}

func TestSoak(t *testing.T) {
	testdb.Slow(t, "soak: a minute of load with every fault")
	testdb.PgBouncer(t) // started before the goroutine check: it runs for the whole process
	testdb.CheckGoroutines(t)
	d := soakDuration(t)
	pg := startPGLoad(t, 2, 2, func() time.Duration {
		if rand.IntN(5) == 0 {
			return 1500 * time.Millisecond // long enough for a fault to be noticed while held
		}
		return rand.N(20 * time.Millisecond)
	})
	lite := startSQLiteLoad(t, 2, 1)
	rows := startRowsLoad(t, 2)
	my := startMySQLLoad(t, 2, 1, holdBriefly)
	sem := startSemaphoreLoad(t)
	shared := startSharedLoads(t)
	mux := startMuxLoads(t)
	once := startOnceLoads(t)
	var myFaults mysqlFaults
	classes := soakFaults(t)

	start := time.Now()
	report := func(label string) {
		lines := []string{fmt.Sprintf("soak %s after %v of %v:", label, time.Since(start).Round(time.Second), d)}
		for _, c := range classes {
			lines = append(lines, "  fault "+c.String())
		}
		lines = append(lines,
			"  Lock on PostgreSQL:       "+pg.session.String(),
			"  LeaseLock on PostgreSQL:  "+pg.lease.String(),
			"  Lock on SQLite:           "+lite.lock.String(),
			"  LeaseLock on SQLite:      "+lite.lease.String(),
			"  Lock on rows, PgBouncer:  "+rows.lock.String(),
			"  Election on rows, PgBouncer: "+rows.election.String(),
			"  Lock on MySQL:            "+my.session.String(),
			"  LeaseLock on MySQL:       "+my.lease.String(),
			"  MySQL faults:             "+myFaults.String(),
			"  Semaphores (PG, MySQL, SQLite, rows via PgBouncer; sessions killed): "+sem.figs.String(),
		)
		for _, s := range shared {
			lines = append(lines, fmt.Sprintf("  shared Lock on %-9s %v", s.backend+":", s))
		}
		for _, m := range mux {
			lines = append(lines,
				fmt.Sprintf("  multiplexed Lock on %-11s %v", m.backend+":", m.mux),
				fmt.Sprintf("  set on %-11s %v", m.backend+":", m.set),
				fmt.Sprintf("  %s multiplexed and set faults: %v", m.backend, m))
		}
		for _, o := range once {
			lines = append(lines, fmt.Sprintf("  TryDoOnce on %-9s %v", o.backend+":", o))
		}
		lines = append(lines,
			"  total:                    "+totals(pg.session, pg.lease, lite.lock, lite.lease, my.session, my.lease),
		)
		for _, line := range lines {
			t.Log(line)
			fmt.Println(line)
		}
	}

	nextReport := start.Add(30 * time.Second)
	for round := 0; round == 0 || time.Since(start) < d; round++ {
		muxRound := injectMuxRounds(t, mux) // on their own pools and proxies, beside the rest
		for _, c := range classes {
			pg.injectAndRecover(c)
		}
		muxRound()
		myFaults.injectRound(t, my)
		sem.injectRound(t)
		if time.Now().After(nextReport) {
			report("progress")
			nextReport = nextReport.Add(30 * time.Second)
		}
	}
	// A class whose target was busy elsewhere gets a few more tries, so a
	// short run is never vacuous by bad luck.
	for _, c := range classes {
		for try := 0; try < 5 && c.reached.Load() == 0; try++ {
			pg.injectAndRecover(c)
		}
	}
	for try := 0; try < 5 && myFaults.kills == 0; try++ {
		myFaults.injectRound(t, my)
	}
	// A semaphore holder killed just as it released tells no loss: more
	// kills, each given time for the keep-alive to see it.
	for try := 0; try < 5 && sem.figs.losses.Load() == 0; try++ {
		sem.injectRound(t)
		eventually(func() bool { return sem.figs.losses.Load() > 0 })
	}
	for try := 0; try < 5 && slices.ContainsFunc(mux, func(m *muxLoad) bool { return !m.reached() }); try++ {
		injectMuxRounds(t, mux)()
	}
	pg.progresses(t)
	my.progresses(t)
	for _, m := range mux {
		m.progresses(t)
	}
	pg.halt(t)
	lite.halt(t)
	rows.halt(t)
	my.halt(t)
	sem.halt(t)
	for _, s := range shared {
		s.halt(t)
	}
	for _, o := range once {
		o.halt(t)
	}
	muxSecs := []*sections{}
	for _, m := range mux {
		m.halt(t)
		muxSecs = append(muxSecs, m.sections()...)
	}
	report("done")
	pg.check(t)
	lite.check(t)
	rows.check(t)
	my.check(t)
	sem.check(t)
	for _, s := range shared {
		s.check(t)
	}
	for _, m := range mux {
		m.check(t)
	}
	for _, o := range once {
		o.check(t) // its history too
	}
	checkHistory(t, slices.Concat(pg.secs, lite.secs, rows.secs, my.secs, muxSecs)...) // history hook
	if myFaults.kills == 0 || myFaults.cuts == 0 || myFaults.resets == 0 {
		t.Errorf("vacuous: MySQL faults %v", &myFaults)
	}
	if sem.figs.faults.Load() == 0 || sem.figs.losses.Load() == 0 {
		t.Errorf("vacuous: no semaphore holder was killed and told: %v", sem.figs)
	}
	for _, f := range []*figures{pg.session, pg.lease, lite.lock, lite.lease, rows.lock, rows.election, my.session, my.lease, sem.figs} {
		if f.acquired.Load() == 0 {
			t.Errorf("a kind of worker never acquired its lock: %v", f)
		}
	}
	for _, c := range classes {
		if c.injected.Load() == 0 || c.reached.Load() == 0 {
			t.Errorf("vacuous: fault %v", c)
		}
	}
	if pg.lease.staleRefused.Load() == 0 {
		t.Errorf("vacuous: the fence never refused a cut-off lease holder's write: %v", pg.lease)
	}
}

// mysqlFaults counts the faults the soak's MySQL row got: each round kills
// a holder's or waiter's connection (KILL), cuts the network for a while,
// and resets every connection.
type mysqlFaults struct{ kills, cuts, resets int }

func (f *mysqlFaults) String() string {
	return fmt.Sprintf("killed %d, cut %d, reset %d", f.kills, f.cuts, f.resets)
}

// injectRound injects one fault of each kind into my, a moment apart.
func (f *mysqlFaults) injectRound(t *testing.T, my *mysqlLoad) {
	// Right after a reset every session of the load may still be
	// reconnecting, with none holding or waiting: poll for one.
	if eventually(func() bool { return my.kill(t) }) {
		f.kills++
	}
	time.Sleep(200*time.Millisecond + rand.N(300*time.Millisecond)) // spacing faults, not synchronizing
	my.cut(300*time.Millisecond + rand.N(1200*time.Millisecond))
	f.cuts++
	time.Sleep(200*time.Millisecond + rand.N(300*time.Millisecond))
	my.secs[0].fault()
	my.proxy.Reset()
	my.session.faults.Add(1)
	f.resets++
}

// injectAndRecover injects one fault of class c and gives the load a
// moment to recover before the next.
func (l *pgLoad) injectAndRecover(c *faultClass) {
	defer func(start time.Time) { c.spent.Add(int64(time.Since(start))) }(time.Now())
	if c.inject(l, c) {
		c.injected.Add(1)
		l.session.faults.Add(1)
	}
	time.Sleep(200*time.Millisecond + rand.N(300*time.Millisecond))
}

// aim marks w as the target of c, so that the loss it reports is c's.
func aim(w *pgWorker, c *faultClass) { w.aimed.Store(c) }

// killHolder terminates the server sessions of a worker that holds the
// Lock.
func (l *pgLoad) killHolder(c *faultClass) bool {
	w := l.holder(false, 3*time.Second)
	if w == nil {
		return false
	}
	aim(w, c)
	l.secs[0].fault()
	var n int
	err := l.admin.QueryRow("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", w.app).Scan(&n)
	return err == nil && n > 0
}

// resetHolder resets the connections of a worker that holds the Lock.
func (l *pgLoad) resetHolder(c *faultClass) bool {
	w := l.holder(false, 3*time.Second)
	if w == nil {
		return false
	}
	aim(w, c)
	l.secs[0].fault()
	w.proxy.Reset()
	return true
}

// cutLockHolder cuts off a worker that holds the Lock until it reports
// the loss (its server session, and so the lock, lives on meanwhile).
func (l *pgLoad) cutLockHolder(c *faultClass) bool {
	w := l.holder(false, 3*time.Second)
	if w == nil {
		return false
	}
	aim(w, c)
	w.proxy.Cut()
	testdb.Poll(5*time.Second, func() bool { return w.aimed.Load() == nil })
	w.proxy.Heal()
	return true
}

// cutLeaseHolder cuts off a worker that holds the lease for longer than
// the lease, so that another worker is granted it meanwhile and the cut
// one's late write meets the fence.
func (l *pgLoad) cutLeaseHolder(c *faultClass) bool {
	w := l.holder(true, 3*time.Second)
	if w == nil {
		return false
	}
	aim(w, c)
	w.proxy.Cut()
	time.Sleep(leaseTTL + time.Second)
	w.proxy.Heal()
	return true
}

// slowThenCut holds back the answers to a lease worker by 1.2s and
// pauses its rivals until it reports a loss, then cuts it off past the
// lease. Its next grant (or a renewal of the one it holds) arrives after
// most of the lease is gone: only a holder that counts its local deadline
// from when it sent the statement knows it lost the lease before the
// database lets a rival in; a grant that arrives lost runs no section (Do
// returns the loss), which the worker reports as its loss. The target is
// a worker that waits with Do, so that its next grant follows at once.
func (l *pgLoad) slowThenCut(c *faultClass) bool {
	var w *pgWorker
	for _, i := range rand.Perm(len(l.workers)) {
		if cand := l.workers[i]; cand.lease && !cand.try {
			w = cand
		}
	}
	var resume []func()
	for _, o := range l.workers {
		if o.lease && o != w {
			resume = append(resume, o.pause())
		}
	}
	rivalsGoOn := func() {
		for _, r := range resume {
			r()
		}
	}
	defer rivalsGoOn()
	aim(w, c)
	w.proxy.SetDelay(1200 * time.Millisecond)
	defer w.proxy.SetDelay(0)
	// The loss comes within a few TTLs; under -race and a loaded CI
	// machine one took 15.3s, so the deadline is generous.
	if !testdb.Poll(45*time.Second, func() bool { return w.aimed.Load() == nil }) { // the loss was reported
		return false
	}
	rivalsGoOn()
	w.proxy.Cut()
	time.Sleep(leaseTTL + time.Second)
	w.proxy.Heal()
	return true
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

// noHold holds a lock no longer than its section's work.
func noHold() time.Duration { return 0 }

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
	secs      []*sections // the Lock's, the LeaseLock's
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
			l.wg.Go(func() { lockDoWorker(ctx, lock, db, lockSecs, l.counter, &l.bumps, l.lock) })
		}
		for range leaseWorkers {
			ll, f := fencedLease(t, db, l.leaseName, opts...)
			l.wg.Go(func() { leaseWorker(ctx, ll, f, db, l.fenced, leaseSecs, l.lease, noHold, nil) })
		}
	}
	return l
}

// lockDoWorker runs Lock.Do until ctx ends; each section marks its entry
// and exit in the counter row and bumps the counter in between, counting
// the bumps that succeeded; fig gets each acquire's time and outcome.
func lockDoWorker(ctx context.Context, lock *advisorylock.Lock, db *sql.DB, secs *sections, counter *testdb.Counter, bumps *atomic.Int64, fig *figures) {
	for ctx.Err() == nil {
		start := time.Now()
		var sec *section
		err := lock.Do(ctx, func(fctx context.Context) error {
			fig.acquiredAfter(time.Since(start))
			sec = secs.enter(fctx, nil)
			defer secs.exit(sec)
			return counted(fctx, counter, db, func() error {
				// Whole, as counted's marks: a bump cancelled as the
				// load stops may commit all the same, uncounted.
				err := counter.Bump(context.WithoutCancel(fctx), db)
				if err == nil {
					bumps.Add(1)
				}
				return err
			})
		})
		secs.record(start, sec) // history hook
		fig.outcome(ctx, err, false)
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
	l.secs[0].checkCounter(t, "SQLite", l.counter, l.admin, l.bumps.Load())
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

// soakExtras is what the soak's later fault classes need beyond a
// pgLoad: the test (for the harness's iptables rules and clusters), a pool
// with a short statement_timeout, and a hot standby, both made on first
// use.
type soakExtras struct {
	t       *testing.T
	short   []*advisorylock.Lock // per driver, on a pool whose sessions have statement_timeout=300ms
	blocker *advisorylock.Lock   // on a pool of its own with the server's defaults
	standby bool                 // the standby class ran
}

// blackholeHolder makes the server connection of a worker that holds the
// Lock vanish (iptables drops its packets both ways, no reset, no close):
// the worker must report the loss (its keep-alive fails), and then the
// server, through the dead-holder settings on the session, must end the
// session so that a successor is granted the lock. The rule goes once the
// session is gone. Workers reach the server through a proxy each: the
// connection blackholed is the proxy's upstream one, the one the server
// sees.
func (x *soakExtras) blackholeHolder(l *pgLoad, c *faultClass) bool {
	w := l.holder(false, 3*time.Second)
	if w == nil {
		return false
	}
	pid, ok := l.sessionOf(w)
	if !ok {
		return false
	}
	lost := &faultClass{}
	aim(w, lost)
	heal := testdb.Blackhole(x.t, testdb.Port(x.t, testdb.PostgresDSN(x.t)), testdb.ClientPort(x.t, l.admin, pid))
	defer heal()
	told := testdb.Poll(wait, func() bool { return lost.reached.Load() > 0 })
	var ended bool
	var granted int64
	testdb.Poll(4*deadHolder+wait, func() bool {
		granted = l.session.acquired.Load()
		ended = !l.sessionAlive(pid)
		return ended
	})
	heal()
	successor := ended && testdb.Poll(2*wait, func() bool { return l.session.acquired.Load() > granted })
	if told && successor {
		c.reached.Add(1)
	} else {
		w.aimed.CompareAndSwap(lost, nil)
		x.t.Logf("blackholed Lock holder %s: loss reported %v, session ended %v, successor granted %v", w.app, told, ended, successor)
	}
	return true
}

// sessionOf returns the server session (pid) of worker w that holds an
// advisory lock, if any.
func (l *pgLoad) sessionOf(w *pgWorker) (int, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var pid int
	err := l.admin.QueryRowContext(ctx, `SELECT a.pid FROM pg_stat_activity a JOIN pg_locks k ON k.pid = a.pid
		WHERE a.application_name = $1 AND k.locktype = 'advisory' AND k.granted LIMIT 1`, w.app).Scan(&pid)
	return pid, err == nil
}

// sessionAlive reports whether server session pid still exists (true
// when it cannot tell).
func (l *pgLoad) sessionAlive(pid int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var n int
	if err := l.admin.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&n); err != nil {
		return true
	}
	return n > 0
}

// shortStatementTimeout has a Lock per driver whose sessions run with
// statement_timeout=300ms wait for the Lock behind a holder that keeps it
// for a second, with the load's Lock workers paused: Lock waits in slices
// that bound their own statements, so each wait, longer than the server's
// statement_timeout, must end in a grant and no error. Both sections are
// checked for exclusion with the load's.
func (x *soakExtras) shortStatementTimeout(l *pgLoad, c *faultClass) bool {
	if x.short == nil {
		dsn := testdb.PostgresDSN(x.t)
		for _, drv := range testdb.Drivers {
			db := testdb.OpenPostgresDSN(x.t, drv, testdb.WithParam(dsn, "options", "-c statement_timeout=300"))
			x.short = append(x.short, newPGLoadLock(x.t, db, l.lockName))
		}
		x.blocker = newPGLoadLock(x.t, testdb.OpenPostgresDSN(x.t, "postgres", dsn), l.lockName)
	}
	var resume []func()
	for _, o := range l.workers {
		if !o.lease {
			resume = append(resume, o.pause())
		}
	}
	defer func() {
		for _, r := range resume {
			r()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*wait)
	defer cancel()
	secs := l.secs[0]
	inside := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		start := time.Now()
		var sec *section
		err := x.blocker.Do(ctx, func(fctx context.Context) error {
			l.session.acquiredAfter(0)
			sec = secs.enter(fctx, nil)
			defer secs.exit(sec)
			close(inside)
			select {
			case <-time.After(time.Second):
				return nil
			case <-fctx.Done():
				return context.Cause(fctx)
			}
		})
		secs.record(start, sec) // history hook
		l.session.outcome(ctx, err, false)
	})
	select {
	case <-inside:
	case <-ctx.Done():
		return false
	}
	var granted atomic.Int64
	for _, short := range x.short {
		wg.Go(func() {
			start := time.Now()
			var waited time.Duration
			var sec *section
			err := short.Do(ctx, func(fctx context.Context) error {
				waited = time.Since(start)
				l.session.acquiredAfter(waited)
				sec = secs.enter(fctx, nil)
				defer secs.exit(sec)
				return nil
			})
			secs.record(start, sec) // history hook
			l.session.outcome(ctx, err, false)
			if err == nil && waited > 300*time.Millisecond {
				granted.Add(1)
			} else {
				x.t.Logf("Lock with statement_timeout=300ms: waited %v, error %v", waited, err)
			}
		})
	}
	wg.Wait()
	if granted.Load() == int64(len(x.short)) {
		c.reached.Add(1)
	}
	return true
}

// pointAtStandby, once per run, points a Lock and a LeaseLock at a hot
// standby (started on first use from a throwaway cluster of the test's
// own), on both drivers: each must be refused with ErrUnsupported; a
// grant there, which would exclude nothing, is a violation.
func (x *soakExtras) pointAtStandby(l *pgLoad, c *faultClass) bool {
	if x.standby {
		return false
	}
	x.standby = true
	standby := testdb.StandbyOf(x.t, testdb.OwnCluster(x.t))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	refused := 0
	for _, drv := range testdb.Drivers {
		db := testdb.OpenPostgresDSN(x.t, drv, standby.DSN)
		name := testdb.UniqueName(x.t)
		for _, try := range []func() (release func(context.Context) error, err error){
			func() (func(context.Context) error, error) {
				g, err := newLock(x.t, db, name, quiet).TryLock(ctx)
				if err != nil || g == nil {
					return nil, err
				}
				return g.Release, nil
			},
			func() (func(context.Context) error, error) {
				g, err := newLeaseLock(x.t, db, name, quiet).TryLock(ctx)
				if err != nil || g == nil {
					return nil, err
				}
				return g.Release, nil
			},
		} {
			release, err := try()
			switch {
			case err == nil:
				l.session.violations.Add(1)
				x.t.Logf("VIOLATION: %s: a lock granted on a hot standby (or TryLock found it held there)", drv)
				if release != nil {
					_ = release(ctx)
				}
			case errors.Is(err, advisorylock.ErrUnsupported):
				refused++
			default:
				x.t.Logf("%s on a hot standby: %v, want ErrUnsupported", drv, err)
			}
		}
	}
	if refused == 2*len(testdb.Drivers) {
		c.reached.Add(1)
	}
	return true
}
