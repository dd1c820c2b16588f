package advisorylock_test

// The database server itself fails under load: PostgreSQL killed
// (an immediate shutdown, as pg_ctl stop -m immediate) and restarted,
// MariaDB SIGKILLed and restarted, and a failover to a hot standby
// (the primary killed, the standby promoted, the clients repointed).
// Each runs on servers of its own, started by the harness on free ports,
// under the soak's contended load (pgLoad, mysqlLoad) and with locks of
// every kind held across the fault (heldLocks). What each test asserts:
// every lock held across the fault reports its loss (Guard.Lost closes,
// Do's context ends with ErrLockLost, a lease's Lost closes) within
// lostWithin; a Lock section of the load still inside once the server is
// gone is told too; no two holders overlap unless the older was told (the
// sections' count and the history's check); fencing tokens never repeat
// or go back at the fence (the fence log, ErrStaleToken for the old
// holders' writes, the history); after the restart every pool takes new
// locks and leases; every goroutine returns (goleak); nothing is left
// held.

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// lostWithin bounds how long after a server fault a holder may go on not
// knowing: a session guard checks every 200ms and a check gives up
// within a second; a lease is lost at its local deadline, a second
// after its last renew was sent. The bound is ten times that, for a
// loaded machine.
const lostWithin = 10 * time.Second

// serverFaultHold holds one section in four for 1.5s (or until lost),
// long enough for a keep-alive to find the fault, so that the fault finds
// holders inside, and the rest briefly, so that the workers contend.
func serverFaultHold() time.Duration {
	if rand.IntN(4) == 0 {
		return 1500 * time.Millisecond
	}
	return rand.N(20 * time.Millisecond)
}

// TestPostgresServerKilledUnderLoad kills a private PostgreSQL
// (SIGQUIT to the postmaster: an immediate shutdown, no checkpoint,
// every session dropped, as pg_ctl stop -m immediate) under Lock and
// fenced LeaseLock workers on lib/pq and pgx, keeps it down until every
// held lock knows it lost, and restarts it (crash recovery). The cluster
// commits synchronously, as a production one does: a kill must not take
// back an acknowledged grant or fenced write.
func TestPostgresServerKilledUnderLoad(t *testing.T) {
	testdb.Slow(t, "server kill: kills a private PostgreSQL under load")
	t.Parallel()
	testdb.CheckGoroutines(t)
	c := testdb.OwnCluster(t, "synchronous_commit=on")
	l := startPGLoadOn(t, c.DSN, 2, 2, serverFaultHold)
	l.admin.SetMaxIdleConns(-1) // a fresh session per query: none is left dead by the kill
	held := holdLocks(t, pgHeldPools(t, c.DSN), pgLoadOptions)
	waitHeld(t, l.session, l.lease, l.secs)

	faultNow(l.secs)
	c.Crash(t)
	inside := insideNow(l.secs[0])
	held.lost(t)
	told(t, inside)
	c.Restart(t)

	held.recovered(t)
	l.progresses(t)
	l.halt(t)
	l.check(t)
	held.check(t, l.admin)
	checkHistory(t, l.secs...) // history hook
	t.Logf("Lock workers: %v", l.session)
	t.Logf("lease workers: %v", l.lease)
}

// TestMariaDBKilledUnderLoad SIGKILLs a private MariaDB under Lock and
// fenced LeaseLock workers (the MySQL backend), keeps it down until every
// held lock knows it lost, and starts it again (InnoDB crash recovery).
func TestMariaDBKilledUnderLoad(t *testing.T) {
	testdb.Slow(t, "server kill: kills a private MariaDB under load")
	t.Parallel()
	testdb.CheckGoroutines(t)
	m := testdb.OwnMariaDB(t)
	l := startMySQLLoadOn(t, m.DSN, 2, 1, serverFaultHold)
	pool := testdb.OpenMySQLDSN(t, m.DSN)
	held := holdLocks(t, []*sql.DB{pool}, pgLoadOptions)
	waitHeld(t, l.session, l.lease, l.secs)

	faultNow(l.secs)
	m.Kill(t)
	inside := insideNow(l.secs[0])
	held.lost(t)
	told(t, inside)
	m.Start(t)

	held.recovered(t)
	l.progresses(t)
	l.halt(t)
	checkHistory(t, l.secs...) // history hook
	t.Logf("Lock on MariaDB: %v", l.session)
	t.Logf("LeaseLock on MariaDB: %v", l.lease)
	l.check(t)
	held.check(t, l.admin)
}

// TestFailoverToStandbyUnderLoad fails over mid-load: the primary of a
// private pair is killed (an immediate shutdown), its hot standby
// promoted, and the address every client dials (a proxy standing for a
// virtual IP or a DNS name) moved to it. Replication is synchronous, so
// the promoted standby has every grant and fenced write the primary
// acknowledged; its grants carry the new timeline in their tokens, above
// every token the old primary issued.
func TestFailoverToStandbyUnderLoad(t *testing.T) {
	testdb.Slow(t, "failover: promotes a streaming standby under load")
	t.Parallel()
	testdb.CheckGoroutines(t)
	primary := testdb.OwnCluster(t, "synchronous_commit=on", "synchronous_standby_names=*")
	standby := testdb.StandbyOf(t, primary)
	direct := testdb.OpenPostgresDSN(t, "pgx", primary.DSN)
	testdb.WaitFor(t, wait, func() bool {
		return countRows(t, direct, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") == 1
	}, "the standby never became synchronous")
	front := testdb.NewProxy(t, testdb.HostPort(t, primary.DSN))
	dsn := front.DSN(primary.DSN)
	l := startPGLoadOn(t, dsn, 2, 1, serverFaultHold)
	l.admin.SetMaxIdleConns(-1)
	held := holdLocks(t, pgHeldPools(t, dsn), pgLoadOptions)
	waitHeld(t, l.session, l.lease, l.secs)

	faultNow(l.secs)
	primary.Crash(t)
	inside := insideNow(l.secs[0])
	held.lost(t)
	told(t, inside)
	standby.Promote(t)
	front.Retarget(testdb.HostPort(t, standby.DSN))
	front.Reset()

	held.recovered(t)
	if tl := standby.Timeline(t); tl < 2 {
		t.Fatalf("the promoted standby is on timeline %d, want a new one", tl)
	}
	l.progresses(t)
	l.halt(t)
	l.check(t)
	held.check(t, l.admin)
	checkHistory(t, l.secs...) // history hook
	t.Logf("Lock workers: %v", l.session)
	t.Logf("lease workers: %v", l.lease)
}

// pgHeldPools opens a pool on dsn per driver, for heldLocks.
func pgHeldPools(t *testing.T, dsn string) []*sql.DB {
	var pools []*sql.DB
	for _, drv := range testdb.Drivers {
		pools = append(pools, testdb.OpenPostgresDSN(t, drv, dsn))
	}
	return pools
}

// waitHeld waits until the load has acquired both kinds of lock a few
// times and then, for a while, until both kinds are held at once (see
// told), each name of secs by a section of its own.
func waitHeld(t *testing.T, session, lease *figures, secs []*sections) {
	t.Helper()
	testdb.WaitFor(t, wait, func() bool { return session.acquired.Load() > 2 && lease.acquired.Load() > 2 },
		"the load never got going: %v; %v", session, lease)
	testdb.Poll(5*time.Second, func() bool {
		return !slices.ContainsFunc(secs, func(s *sections) bool { return len(insideNow(s)) == 0 })
	})
}

// faultNow notes, on every one of secs, a session-ending fault injected
// now (see sections): call it just before the server fails.
func faultNow(secs []*sections) {
	for _, s := range secs {
		s.fault()
	}
	secs[0].figs.faults.Add(1)
}

// insideNow returns the sections inside s now. Called once the server is
// gone, each has lost its lock and has yet to release it.
func insideNow(s *sections) []*section {
	s.mu.Lock()
	defer s.mu.Unlock()
	var inside []*section
	for sec := range s.inside {
		inside = append(inside, sec)
	}
	return inside
}

// told fails t unless every one of secs, Lock sections inside once the
// server was gone, is told of its loss within lostWithin: their lock is
// gone with the server's sessions, and a holder finds out at its next
// keep-alive check, or at the release when its section ends first.
func told(t *testing.T, secs []*section) {
	t.Helper()
	testdb.WaitFor(t, lostWithin, func() bool {
		return !slices.ContainsFunc(secs, func(s *section) bool { return s.told.Load() == 0 })
	}, "of the %d Lock sections of the load inside once the server was gone, some were never told of the loss", len(secs))
	t.Logf("%d Lock sections of the load were inside once the server was gone; all were told", len(secs))
}

// heldLocks are locks taken before a server fault and held across it, a
// set on each pool, each on a name of its own: a Guard, a Lock.Do and a
// LeaseLock.Do whose fn runs until its context ends, and a lease that
// made a fenced write. A
// name is contended: a waiter on another pool of the set waits for each
// Guard.
type heldLocks struct {
	opts    []advisorylock.Option // the leases'; the Locks' add a keep-alive
	lockOpt []advisorylock.Option
	pools   []*sql.DB
	guards  []*advisorylock.Guard
	gnames  []string // guards[i]'s name
	dos     []*heldDo
	leases  []*advisorylock.LeaseGuard
	lnames  []string // leases[i]'s name
	fences  []*advisorylock.Fence
	waiters []chan error // each waiter's Lock or Release error
	taken   []heldName   // the names of the Guards and the Dos
	wg      sync.WaitGroup
}

// heldName is a name heldLocks took, the pool it took it on, and whether
// it is a lease's.
type heldName struct {
	name  string
	db    *sql.DB
	lease bool
}

// heldDo is a Do whose fn waits for its context.
type heldDo struct {
	name    string
	lease   bool // a LeaseLock.Do, else a Lock.Do
	entered chan struct{}
	cause   chan error // fn's context's cause, when it ended
	done    chan error // Do's result
}

// holdLocks takes the locks on each pool, with opts and a keep-alive of
// 200ms for the session locks, and stops whatever still runs at
// t.Cleanup.
func holdLocks(t *testing.T, pools []*sql.DB, opts []advisorylock.Option) *heldLocks {
	t.Helper()
	h := &heldLocks{opts: opts, lockOpt: append(slices.Clip(opts), advisorylock.WithKeepAlive(200*time.Millisecond)), pools: pools}
	ctx, stop := context.WithCancel(context.Background())
	t.Cleanup(func() { stop(); h.wg.Wait() })
	for i, db := range pools {
		name := testdb.UniqueName(t)
		h.taken = append(h.taken, heldName{name, db, false})
		g, err := newLock(t, db, name, h.lockOpt...).TryLock(ctx)
		if err != nil {
			t.Fatalf("pool %d: TryLock %q: %v", i, name, err)
		}
		h.guards, h.gnames = append(h.guards, g), append(h.gnames, name)
		t.Cleanup(func() { _ = g.Release(context.Background()) })
		waiter := newLock(t, pools[(i+1)%len(pools)], name, h.lockOpt...)
		res := make(chan error, 1)
		h.waiters = append(h.waiters, res)
		h.wg.Go(func() {
			g, err := waiter.Lock(ctx)
			if err == nil {
				err = g.Release(context.Background())
			}
			res <- err
		})

		for _, lease := range []bool{false, true} {
			d := h.do(t, ctx, db, lease)
			select {
			case <-d.entered:
			case err := <-d.done:
				t.Fatalf("pool %d: Do %q: %v", i, d.name, err)
			case <-time.After(wait):
				t.Fatalf("pool %d: Do %q never ran fn", i, d.name)
			}
		}

		ll, f := fencedLease(t, db, testdb.UniqueName(t), opts...)
		lg, err := ll.TryLock(ctx)
		if err != nil {
			t.Fatalf("pool %d: lease TryLock %q: %v", i, ll.Name(), err)
		}
		t.Cleanup(func() { _ = lg.Release(context.Background()) })
		if err := fencedWrite(ctx, db, f, nil, lg.Lease().Token()); err != nil {
			t.Fatalf("pool %d: fenced write of lease %q: %v", i, ll.Name(), err)
		}
		h.leases, h.lnames = append(h.leases, lg), append(h.lnames, ll.Name())
		h.fences = append(h.fences, f)
	}
	return h
}

// do starts a Lock.Do (or a LeaseLock.Do) on a new name on db whose fn
// waits for its context and reports the cause.
func (h *heldLocks) do(t *testing.T, ctx context.Context, db *sql.DB, lease bool) *heldDo {
	t.Helper()
	d := &heldDo{name: testdb.UniqueName(t), lease: lease, entered: make(chan struct{}), cause: make(chan error, 1), done: make(chan error, 1)}
	h.dos = append(h.dos, d)
	h.taken = append(h.taken, heldName{d.name, db, lease})
	fn := func(fctx context.Context) error {
		close(d.entered)
		<-fctx.Done()
		d.cause <- context.Cause(fctx)
		return context.Cause(fctx)
	}
	if lease {
		ll := newLeaseLock(t, db, d.name, h.opts...)
		h.wg.Go(func() {
			d.done <- ll.Do(ctx, func(fctx context.Context, _ advisorylock.Lease) error { return fn(fctx) })
		})
	} else {
		l := newLock(t, db, d.name, h.lockOpt...)
		h.wg.Go(func() { d.done <- l.Do(ctx, fn) })
	}
	return d
}

// lost fails t unless every held lock reports its loss within lostWithin
// of the call, made just after the server failed: each Guard's Lost
// closes, each Do's fn sees its context end with ErrLockLost (a
// LeaseLock.Do's naming the lease) and Do returns an error matching it,
// and each lease's Lost closes.
func (h *heldLocks) lost(t *testing.T) {
	t.Helper()
	deadline := time.After(lostWithin)
	for i, g := range h.guards {
		select {
		case <-g.Lost():
		case <-deadline:
			t.Fatalf("the Guard of %q did not report the loss within %v", h.gnames[i], lostWithin)
		}
	}
	for _, d := range h.dos {
		select {
		case cause := <-d.cause:
			if !errors.Is(cause, advisorylock.ErrLockLost) {
				t.Errorf("Do %q: fn's context ended with %v, want ErrLockLost", d.name, cause)
			}
		case <-deadline:
			t.Fatalf("Do %q: fn's context was not cancelled within %v", d.name, lostWithin)
		}
		select {
		case err := <-d.done:
			if !errors.Is(err, advisorylock.ErrLockLost) {
				t.Errorf("Do %q returned %v, want ErrLockLost", d.name, err)
			}
		case <-deadline:
			t.Fatalf("Do %q did not return within %v of the fault", d.name, lostWithin)
		}
	}
	for i, lg := range h.leases {
		select {
		case <-lg.Lease().Lost():
		case <-deadline:
			t.Fatalf("lease %q (token %d) did not report the loss within %v", h.lnames[i], lg.Lease().Token(), lostWithin)
		}
	}
}

// recovered fails t unless, once the server is back, every waiter
// returns (holding the lock after the restart, or with an error) and
// every pool takes each held name again: a Lock on the Guard's and the
// Do's names, and a lease whose token is above the lost one's; the fence
// then admits the successor's write and refuses the lost holder's with a
// refusal (ErrStaleToken) naming the successor's token. A pool may first hand
// out connections that died with the server: each acquire is retried
// until it works.
func (h *heldLocks) recovered(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	for i, res := range h.waiters {
		select {
		case err := <-res:
			t.Logf("the waiter on %q returned: %v", h.gnames[i], err)
		case <-time.After(2 * wait):
			t.Fatalf("the waiter on %q still waits long after the server came back", h.gnames[i])
		}
	}
	for i, g := range h.guards {
		if err := g.Release(ctx); err != nil {
			t.Errorf("Release of the lost Guard of %q: %v", h.gnames[i], err)
		}
	}
	for _, n := range h.taken {
		var lastErr error
		testdb.WaitFor(t, wait, func() bool {
			var g interface{ Release(context.Context) error }
			if n.lease {
				g, lastErr = newLeaseLock(t, n.db, n.name, h.opts...).TryLock(ctx)
			} else {
				g, lastErr = newLock(t, n.db, n.name, h.lockOpt...).TryLock(ctx)
			}
			if lastErr == nil {
				lastErr = g.Release(ctx)
			}
			return lastErr == nil
		}, "%q never taken again after the fault: %v", n.name, lastErr)
	}
	for i, db := range h.pools {
		old := h.leases[i]
		ll, _ := fencedLease(t, db, h.lnames[i], h.opts...)
		var next *advisorylock.LeaseGuard
		var lastErr error
		testdb.WaitFor(t, wait, func() bool {
			next, lastErr = ll.TryLock(ctx)
			return lastErr == nil
		}, "pool %d never took lease %q again after the fault: %v", i, ll.Name(), lastErr)
		if next.Lease().Token() <= old.Lease().Token() {
			t.Errorf("lease %q: the successor's token %d is not above the lost holder's %d", ll.Name(), next.Lease().Token(), old.Lease().Token())
		}
		testdb.WaitFor(t, wait, func() bool {
			lastErr = fencedWrite(ctx, db, h.fences[i], nil, next.Lease().Token())
			return lastErr == nil
		}, "lease %q: the successor's fenced write: %v", ll.Name(), lastErr)
		if err := fencedWrite(ctx, db, h.fences[i], nil, old.Lease().Token()); !isStale(err, ll.Name(), old.Lease().Token(), next.Lease().Token()) {
			t.Errorf("lease %q: the lost holder's write (token %d) = %v, want ErrStaleToken with highest %d", ll.Name(), old.Lease().Token(), err, next.Lease().Token())
		}
		if err := old.Release(ctx); err != nil {
			t.Logf("release of the lost lease %q: %v", ll.Name(), err)
		}
		mustRelease(t, next)
	}
}

// check fails t if a held name is left held, or a pool left a connection
// checked out. admin saw the fault too: it must have recovered.
func (h *heldLocks) check(t *testing.T, admin *sql.DB) {
	t.Helper()
	ctx := context.Background()
	var locks []interface {
		Name() string
		Holder(context.Context) (*advisorylock.Holder, error)
	}
	for _, n := range h.taken {
		if n.lease {
			locks = append(locks, newLeaseLock(t, admin, n.name, h.opts...))
		} else {
			locks = append(locks, newLock(t, admin, n.name, h.lockOpt...))
		}
	}
	for _, name := range h.lnames {
		locks = append(locks, newLeaseLock(t, admin, name, h.opts...))
	}
	for _, l := range locks {
		var h *advisorylock.Holder
		var err error
		testdb.WaitFor(t, wait, func() bool {
			h, err = l.Holder(ctx)
			return err == nil && h == nil
		}, "%q left held (%+v, %v)", l.Name(), h, err)
	}
	for i, p := range h.pools {
		testdb.WaitFor(t, wait, func() bool { return p.Stats().InUse == 0 }, "pool %d: %d connections left checked out", i, p.Stats().InUse)
	}
}
