package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/go-sql-driver/mysql"
)

// mysqlLoad is the MySQL row of the soak: Lock.Do workers on one name and
// fenced LeaseLock.Do workers on another, on one go-sql-driver pool
// through a cuttable proxy; faults: a holder or waiter killed (KILL), the
// network cut, every connection reset. It has the methods of pgLoad, so
// the soak drives it the same way:
//
//	my := startMySQLLoad(t, 2, 1, hold)
//	... my.kill(t), my.cut(d), my.proxy.Reset() ...
//	my.progresses(t); my.halt(t); my.check(t)
//	report line: "  Lock on MySQL: " + my.session.String(), and my.lease.
type mysqlLoad struct {
	proxy     *testdb.Proxy
	admin     *sql.DB // direct to the server: sees no fault
	pool      *sql.DB
	lockName  string
	leaseName string
	counter   *testdb.Counter
	session   *figures
	lease     *figures
	secs      []*sections
	stop      context.CancelFunc
	wg        sync.WaitGroup
}

// startMySQLLoad starts the workers (see startPGLoad: the same options,
// so cuts of more than a second lose leases and keep-alives see a cut
// within about 1.2s).
func startMySQLLoad(t *testing.T, sessionWorkers, leaseWorkers int, hold func() time.Duration) *mysqlLoad {
	t.Helper()
	return startMySQLLoadOn(t, testdb.MySQLDSN(t), sessionWorkers, leaseWorkers, hold)
}

// startMySQLLoadOn is startMySQLLoad on the database of dsn.
func startMySQLLoadOn(t *testing.T, dsn string, sessionWorkers, leaseWorkers int, hold func() time.Duration) *mysqlLoad {
	t.Helper()
	proxy := testdb.NewMySQLProxy(t, testdb.MySQLAddr(t, dsn))
	db := testdb.OpenMySQLDSN(t, testdb.WithMySQLAddr(t, dsn, proxy.Addr()))
	l := &mysqlLoad{proxy: proxy, admin: testdb.OpenMySQLDSN(t, dsn), pool: db, lockName: testdb.UniqueName(t), leaseName: testdb.UniqueName(t),
		session: &figures{}, lease: &figures{}}
	l.counter = testdb.NewMySQLCounter(t, l.admin)
	sessionSecs := newSections(l.lockName, l.session, t.Logf).sessionFaults(3 * time.Second)
	leaseSecs := newSections(l.leaseName, l.lease, t.Logf)
	l.secs = []*sections{sessionSecs, leaseSecs}
	opts := []advisorylock.Option{quiet, advisorylock.WithReleaseTimeout(time.Second), advisorylock.WithLeaseTTL(1500 * time.Millisecond)}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { l.proxy.Heal(); stop(); l.wg.Wait() })
	for range sessionWorkers {
		lock := newLock(t, db, l.lockName, append(slices.Clip(opts), advisorylock.WithKeepAlive(200*time.Millisecond))...)
		l.wg.Go(func() { sessionWorker(ctx, lock, sessionSecs, l.session, hold, nil) })
	}
	for range leaseWorkers {
		ll, f := fencedLease(t, db, l.leaseName, opts...)
		l.wg.Go(func() { leaseWorker(ctx, ll, f, db, l.counter, leaseSecs, l.lease, noHold, nil) })
	}
	return l
}

// cut partitions the load from the server for d, then heals.
func (l *mysqlLoad) cut(d time.Duration) {
	l.proxy.Cut()
	time.Sleep(d)
	l.proxy.Heal()
	l.session.faults.Add(1)
}

// kill ends, with KILL, the session that holds the load's Lock or one
// that waits for it, and reports whether there was one.
func (l *mysqlLoad) kill(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var id sql.NullInt64
	q := "SELECT IS_USED_LOCK(?)"
	if rand.IntN(2) == 0 {
		q = "SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND INFO LIKE CONCAT('%GET_LOCK(''', ?, '''%') ORDER BY RAND() LIMIT 1"
	}
	err := l.admin.QueryRowContext(ctx, q, mysqlLockName(l.lockName)).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !id.Valid {
		return false
	}
	if err == nil {
		l.secs[0].fault() // a session-ending fault: see sections
		_, err = l.admin.ExecContext(ctx, fmt.Sprintf("KILL %d", id.Int64))
	}
	if err != nil && !isUnknownThread(err) {
		t.Errorf("kill: %v", err)
		return false
	}
	l.session.faults.Add(1)
	return err == nil
}

// isUnknownThread is MySQL's answer to a KILL of a session that ended
// meanwhile (error 1094).
func isUnknownThread(err error) bool {
	var e *mysql.MySQLError
	return errors.As(err, &e) && e.Number == 1094
}

// progresses fails t unless both kinds of workers acquire again after
// the faults ended.
func (l *mysqlLoad) progresses(t *testing.T) {
	t.Helper()
	s, ls := l.session.acquired.Load(), l.lease.acquired.Load()
	testdb.WaitFor(t, 2*wait, func() bool { return l.session.acquired.Load() > s+1 && l.lease.acquired.Load() > ls+1 },
		"no progress after the faults: %d Lock and %d lease acquisitions since", l.session.acquired.Load()-s, l.lease.acquired.Load()-ls)
}

// halt heals the network, stops the workers and counts the violations
// the database shows (stale writes admitted, an inexact fenced count).
func (l *mysqlLoad) halt(t *testing.T) {
	t.Helper()
	l.proxy.Heal()
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, "workers")
	for _, s := range l.secs {
		s.settle()
	}
	st, err := l.counter.State(context.Background(), l.admin)
	if err != nil {
		t.Fatal(err)
	}
	var top int64
	if st.Writes > 0 {
		if err := l.admin.QueryRow("SELECT token FROM advisorylock_fences WHERE resource = ?", l.leaseName).Scan(&top); err != nil {
			t.Fatal(err)
		}
	}
	fenceViolations(t, l.lease, st, top)
}

// check checks a halted load: no violation, nothing held or checked out.
func (l *mysqlLoad) check(t *testing.T) {
	t.Helper()
	if v := l.session.violations.Load() + l.lease.violations.Load(); v != 0 {
		t.Errorf("%d violations (see the log)", v)
	}
	checkMySQLLeaks(t, l.admin, l.lockName, false)
	checkMySQLLeaks(t, l.admin, l.leaseName, true)
	testdb.WaitFor(t, wait, func() bool { return l.pool.Stats().InUse == 0 }, "%d connections left checked out", l.pool.Stats().InUse)
}

// TestMySQLFaultsUnderLoad runs the MySQL soak row for a few seconds with
// every fault: no violation, progress after the faults, nothing left.
func TestMySQLFaultsUnderLoad(t *testing.T) {
	testdb.Slow(t, "fault: soak of MySQL with injected faults")
	t.Parallel()
	testdb.CheckGoroutines(t)
	l := startMySQLLoad(t, 2, 1, holdBriefly)
	var kills, cuts, resets int
	for start := time.Now(); time.Since(start) < 5*time.Second || kills == 0 || cuts == 0 || resets == 0; {
		time.Sleep(200*time.Millisecond + rand.N(400*time.Millisecond)) // spacing faults, not synchronizing
		switch {
		case kills <= cuts && kills <= resets:
			if l.kill(t) {
				kills++
			}
		case cuts <= resets:
			l.cut(300*time.Millisecond + rand.N(1200*time.Millisecond))
			cuts++
		default:
			l.secs[0].fault()
			l.proxy.Reset()
			l.session.faults.Add(1)
			resets++
		}
		if time.Since(start) > 2*wait {
			t.Fatalf("faults not all injected in %v: %d kills, %d cuts, %d resets", 2*wait, kills, cuts, resets)
		}
	}
	l.progresses(t)
	l.halt(t)
	checkHistory(t, l.secs...) // history hook
	t.Logf("Lock on MySQL: %v", l.session)
	t.Logf("LeaseLock on MySQL: %v", l.lease)
	l.check(t)
	for _, f := range []*figures{l.session, l.lease} {
		if f.acquired.Load() == 0 {
			t.Errorf("a kind of worker never acquired its lock: %v", f)
		}
	}
}
