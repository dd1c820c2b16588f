package advisorylock_test

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// rowsLoad is the soak's rows of Locks and Elections on lease rows
// (WithLeaseRows) through PgBouncer's transaction pool, on two pools (as
// two processes), one with lib/pq and one with pgx in exec mode: Lock.Do
// workers bumping a counter the unsafe way, and Election candidates whose
// leaders make fenced writes with their term. Both record their sections
// for the history check: a leader's term is a grant whose token is the
// term, so at most one leader at a time and terms that only grow across
// leaders are the lock model's exclusion and growing tokens, and the
// leaders' writes are checked against the fence register. (The semaphore
// on rows is a row of the semaphore load: soak_semaphore_test.go.)
// MariaDB has Lock.Do workers on rows too (maria), bumping a counter of
// its own, in the same history check. Its shared rows are shared loads
// (soak_shared_test.go) on rows, through the transaction pool (pgx) and
// on MariaDB.
type rowsLoad struct {
	admin    *sql.DB // direct, for the counters' state and the leak check
	pools    []*sql.DB
	name     string
	elected  string // the Election's name and its Fence's resource
	counter  *testdb.Counter
	fenced   *testdb.Counter // the leaders' fenced writes
	bumps    atomic.Int64    // counter bumps that succeeded
	lock     *figures
	election *figures
	secs     []*sections   // the Lock's, the Election's, MariaDB's Lock's
	shared   []*sharedLoad // readers and writers of a name on rows
	maria    mariaRows
	stop     context.CancelFunc
	wg       sync.WaitGroup
}

// TestSoakLeaseRows runs the soak's lease-row rows alone for the soak's
// duration (soakShort without ADVISORYLOCK_SOAK): the Locks and the
// Election of rowsLoad and the semaphore row's lease-row backend, all
// through PgBouncer's transaction pool, checked as TestSoak checks them,
// histories included. It is TestSoak's lease-row part for a quick run.
func TestSoakLeaseRows(t *testing.T) {
	testdb.Slow(t, "soak: Locks, Semaphores and Elections on lease rows through PgBouncer")
	t.Parallel()
	testdb.PgBouncer(t) // started before the goroutine check: it runs for the whole process
	testdb.CheckGoroutines(t)
	rows := startRowsLoad(t, 2)
	sem := startSemaphoreLoad(t, semRowsBackend)
	time.Sleep(soakDuration(t)) // the load's length, not a wait for an event
	rows.halt(t)
	sem.halt(t)
	t.Logf("Lock on rows:      %v", rows.lock)
	t.Logf("Lock on MariaDB rows: %v", rows.maria.lock)
	t.Logf("Election on rows:  %v", rows.election)
	t.Logf("Semaphore on rows: %v", sem.figs)
	for _, s := range rows.shared {
		t.Logf("Shared on %s: %v", s.backend, s)
	}
	rows.check(t)
	sem.check(t)
	checkHistory(t, rows.secs...) // history hook
	if rows.lock.acquired.Load() == 0 {
		t.Errorf("vacuous: no Lock on rows was acquired: %v", rows.lock)
	}
}

func startRowsLoad(t *testing.T, workers int) *rowsLoad {
	t.Helper()
	txDSN, _ := testdb.PgBouncer(t)
	l := &rowsLoad{admin: testdb.OpenPostgres(t, "postgres"), name: testdb.UniqueName(t), elected: testdb.UniqueName(t), lock: &figures{}, election: &figures{}}
	l.counter = testdb.NewCounter(t, l.admin, false)
	l.fenced = testdb.NewCounter(t, l.admin, false)
	secs := newSections(l.name, l.lock, t.Logf)
	terms := newSections(l.elected, l.election, t.Logf)
	l.secs = []*sections{secs, terms}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { stop(); l.wg.Wait() })
	opts := []advisorylock.Option{quiet, advisorylock.WithLeaseRows(), advisorylock.WithPollInterval(5 * time.Millisecond), advisorylock.WithLeaseTTL(3 * time.Second)}
	for _, c := range []struct{ driver, params string }{{"postgres", ""}, {"pgx", "&default_query_exec_mode=exec"}} {
		db := testdb.OpenPostgresDSN(t, c.driver, txDSN+c.params)
		l.pools = append(l.pools, db)
		for range workers {
			lock := newLock(t, db, l.name, opts...)
			l.wg.Go(func() { lockDoWorker(ctx, lock, db, secs, l.counter, &l.bumps, l.lock) })
		}
		fence, err := advisorylock.NewFence(db, l.elected)
		if err != nil {
			t.Fatal(err)
		}
		for range workers {
			e := newElection(t, db, l.elected, opts...)
			l.wg.Go(func() { l.candidate(ctx, e, fence, db, terms) })
		}
	}
	l.startMaria(ctx, t, workers, opts)
	rowsOpts := []advisorylock.Option{advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(3 * time.Second)}
	l.shared = []*sharedLoad{
		startSharedLoad(t, "rows-pgbouncer-pgx", func() *sql.DB {
			return testdb.OpenPostgresDSN(t, "pgx", txDSN+"&default_query_exec_mode=exec")
		}, rowsOpts...),
		startSharedLoad(t, "rows-mariadb", func() *sql.DB { return testdb.OpenMySQL(t) }, rowsOpts...),
	}
	return l
}

// mariaRows is the MariaDB Lock workers' row of a rowsLoad.
type mariaRows struct {
	admin   *sql.DB
	name    string
	counter *testdb.Counter
	bumps   atomic.Int64
	lock    *figures
	secs    *sections
}

// startMaria starts workers Lock.Do workers on rows on MariaDB, each on a
// pool of its own, recording their sections in the history check.
func (l *rowsLoad) startMaria(ctx context.Context, t *testing.T, workers int, opts []advisorylock.Option) {
	m := &l.maria
	m.admin, m.name, m.lock = testdb.OpenMySQL(t), testdb.UniqueName(t), &figures{}
	m.counter = testdb.NewMySQLCounter(t, m.admin)
	secs := newSections(m.name, m.lock, t.Logf)
	m.secs = secs
	l.secs = append(l.secs, secs)
	for range workers {
		db := testdb.OpenMySQL(t)
		l.pools = append(l.pools, db)
		lock := newLock(t, db, m.name, opts...)
		l.wg.Go(func() { lockDoWorker(ctx, lock, db, secs, m.counter, &m.bumps, m.lock) })
	}
}

// candidate runs Election.Run on e until ctx ends. Each lead makes a few
// fenced writes with its term, holds the leadership briefly (or until
// lost) and returns nil, which resigns. Run campaigns between two leads
// and resigns after each before it campaigns again, so a term's grant
// lies between the previous lead's return and its own lead's start, and
// its release between its lead's return and the next lead's start (or
// Run's return), where it is recorded.
func (l *rowsLoad) candidate(ctx context.Context, e *advisorylock.Election, f *advisorylock.Fence, db *sql.DB, terms *sections) {
	called := time.Now() // the next term's campaign began
	var sec *section     // the last term
	var secCalled time.Time
	ended := func() {
		terms.record(secCalled, sec) // history hook
		l.election.outcome(ctx, nil, false)
		if sec.told.Load() != 0 {
			l.election.losses.Add(1)
		}
	}
	err := e.Run(ctx, func(lctx context.Context, term advisorylock.FencingToken) error {
		l.election.acquiredAfter(time.Since(called))
		if sec != nil {
			ended() // the previous term, released before this one began
		}
		sec, secCalled = terms.enterTerm(lctx, term), called
		defer func() {
			terms.exit(sec)
			called = time.Now()
		}()
		for range 1 + rand.IntN(3) {
			began := time.Now()
			err := l.election.fenced(lctx, db, f, l.fenced, term)
			terms.wrote(term, began, err) // history hook
			if err != nil {
				return nil // lost (lctx ended) or refused: the term ends either way
			}
		}
		t := time.NewTimer(holdBriefly())
		defer t.Stop()
		select {
		case <-t.C:
		case <-lctx.Done():
		}
		return nil
	})
	if sec != nil {
		ended()
	}
	if ctx.Err() == nil {
		l.election.outcome(ctx, err, false) // Run gave up: an error that trying again does not heal
	}
}

// halt stops the workers (failing t if they hang) and counts the
// violations, also those only the database shows.
func (l *rowsLoad) halt(t *testing.T) {
	t.Helper()
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, "lease-row workers")
	for _, s := range l.shared {
		s.halt(t)
	}
	for _, s := range l.secs {
		s.settle()
	}
	l.secs[0].checkCounter(t, "lease-row", l.counter, l.admin, l.bumps.Load())
	checkFenced(t, l.admin, false, l.fenced, l.elected, l.election)
	m := &l.maria
	m.secs.checkCounter(t, "MariaDB lease-row", m.counter, m.admin, m.bumps.Load())
}

// check checks a halted load: no violation, no live row left, every
// connection back.
func (l *rowsLoad) check(t *testing.T) {
	t.Helper()
	if v := l.lock.violations.Load() + l.election.violations.Load() + l.maria.lock.violations.Load(); v != 0 {
		t.Errorf("lease rows through PgBouncer: %d violations (see the log)", v)
	}
	for _, s := range l.shared {
		s.check(t)
	}
	if n := l.election.acquired.Load(); n < 2 {
		t.Errorf("vacuous: %d terms led on rows, want a handover at least: %v", n, l.election)
	}
	testdb.WaitFor(t, wait, func() bool {
		return countRows(t, l.admin, "SELECT count(*) FROM advisorylock_locks WHERE key = $1 AND expires_at > now()", advisorylock.Key(l.name)) == 0
	}, "lock row %q left held", l.name)
	if l.maria.lock.acquired.Load() == 0 {
		t.Errorf("vacuous: no Lock on rows on MariaDB was acquired: %v", l.maria.lock)
	}
	testdb.WaitFor(t, wait, func() bool {
		return countRows(t, l.maria.admin, "SELECT COUNT(*) FROM advisorylock_locks WHERE lock_key = ? AND expires_at > UTC_TIMESTAMP(6)", advisorylock.Key(l.maria.name)) == 0
	}, "MariaDB lock row %q left held", l.maria.name)
	checkLeaks(t, leakCheck{db: l.admin, leases: []string{l.elected}, pools: l.pools})
}
