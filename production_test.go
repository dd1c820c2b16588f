package advisorylock_test

// Tests for PostgreSQL in production and fencing tokens across a
// failover, against the real thing:
// a streaming hot standby, an iptables blackhole, a short
// statement_timeout, an exhausted pool.

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// firstUse runs op on a lock made by mk, and returns the error of
// whichever refused: the constructor or the first operation (checks that
// need the server run at the first operation).
func firstUse[L any](mk func() (L, error), op func(L) error) error {
	l, err := mk()
	if err != nil {
		return err
	}
	return op(l)
}

func TestHotStandbyRefusesLocksAndLeases(t *testing.T) {
	testdb.Slow(t, "standby: a private cluster and its standby")
	t.Parallel()
	primary := testdb.OwnCluster(t)
	standby := testdb.StandbyOf(t, primary)
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgresDSN(t, drv, standby.DSN)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			name := testdb.UniqueName(t)
			wantStandby := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "standby") {
					t.Fatalf("%s on a hot standby = %v, want ErrUnsupported saying hot standby", what, err)
				}
				if !strings.Contains(err.Error(), name) {
					t.Fatalf("%s: error %q does not name the lock", what, err)
				}
			}
			// Check at start-up finds a replica's DSN for every kind, and
			// Run does not campaign on it forever.
			checks := map[string]func() error{
				"Lock.Check":      func() error { return newLock(t, db, name).Check(ctx) },
				"LeaseLock.Check": func() error { return newLeaseLock(t, db, name).Check(ctx) },
				"Semaphore.Check": func() error { return newSemaphore(t, db, name, 2).Check(ctx) },
				"Election.Check":  func() error { return newElection(t, db, name).Check(ctx) },
				"Election.Run":    func() error { return runRefused(t, db, name) },
			}
			for what, check := range checks {
				wantStandby(what, check())
			}
			if f, err := advisorylock.NewFence(db, name); err != nil {
				t.Fatal(err)
			} else if err := f.Check(ctx); !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "standby") {
				t.Fatalf("Fence.Check on a hot standby = %v, want ErrUnsupported saying hot standby", err)
			}
			mkLock := func() (*advisorylock.Lock, error) { return advisorylock.New(db, name) }
			wantStandby("TryLock", firstUse(mkLock, func(l *advisorylock.Lock) error {
				g, err := l.TryLock(ctx)
				if g != nil {
					_ = g.Release(ctx)
				}
				return err
			}))
			wantStandby("LockTimeout", firstUse(mkLock, func(l *advisorylock.Lock) error {
				g, err := l.LockTimeout(ctx, time.Second)
				if g != nil {
					_ = g.Release(ctx)
				}
				return err
			}))
			mkMux := func() (*advisorylock.Lock, error) {
				return advisorylock.New(db, name, advisorylock.WithMultiplexing(2))
			}
			wantStandby("multiplexed TryLock", firstUse(mkMux, func(l *advisorylock.Lock) error {
				g, err := l.TryLock(ctx)
				if g != nil {
					_ = g.Release(ctx)
				}
				return err
			}))
			mkSet := func() (*advisorylock.Lock, error) { return advisorylock.NewSet(db, []string{name, name + "/2"}) }
			wantStandby("set TryLock", firstUse(mkSet, func(l *advisorylock.Lock) error {
				g, err := l.TryLock(ctx)
				if g != nil {
					_ = g.Release(ctx)
				}
				return err
			}))
			wantStandby("TryRLock", firstUse(mkLock, func(l *advisorylock.Lock) error {
				g, err := l.TryRLock(ctx)
				if g != nil {
					_ = g.Release(ctx)
				}
				return err
			}))
			wantStandby("TryLockTx", firstUse(mkLock, func(l *advisorylock.Lock) error {
				// lib/pq begins READ WRITE, which a standby refuses at BEGIN.
				tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = tx.Rollback() }()
				_, err = l.TryLockTx(ctx, tx)
				return err
			}))
			wantStandby("LeaseLock.TryLock", firstUse(func() (*advisorylock.LeaseLock, error) { return advisorylock.NewLeaseLock(db, name) },
				func(l *advisorylock.LeaseLock) error {
					g, err := l.TryLock(ctx)
					if g != nil {
						_ = g.Release(ctx)
					}
					return err
				}))
			// A fence's table, made on the primary, reaches the standby;
			// admitting there is refused, not a raw 25006.
			fenced := testdb.UniqueName(t)
			onPrimary, err := advisorylock.NewFence(testdb.OpenPostgresDSN(t, drv, primary.DSN), fenced)
			if err != nil {
				t.Fatal(err)
			}
			if err := fenceAdmit(t, testdb.OpenPostgresDSN(t, drv, primary.DSN), onPrimary, 5); err != nil {
				t.Fatal(err)
			}
			standby.CatchUp(t, primary)
			onStandby, err := advisorylock.NewFence(db, fenced)
			if err != nil {
				t.Fatal(err)
			}
			// lib/pq begins READ WRITE, which a standby refuses at BEGIN.
			tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			if err := onStandby.Admit(ctx, tx, 6); !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "read-only") || !strings.Contains(err.Error(), fenced) {
				t.Fatalf("Fence.Admit on a hot standby = %v, want ErrUnsupported saying read-only and naming the fence", err)
			}
			if n := testdb.AdvisoryLocks(t, testdb.OpenPostgresDSN(t, "postgres", standby.DSN), nil); n != 0 {
				t.Fatalf("%d advisory locks left on the standby, want 0", n)
			}
		})
		t.Run(drv+"/reached-after-first-use", func(t *testing.T) {
			standbyReachedAfterFirstUse(t, drv, primary, standby)
		})
	}
}

// standbyReachedAfterFirstUse: a pool whose first use met the primary,
// and whose later connections reach the standby (an address moved to it
// without a promotion, or a multi-host DSN that picks it): the first-use
// check passed and is not run again, so each acquire refuses on its new
// connection's answer, naming the lock, and leaves nothing held there.
func standbyReachedAfterFirstUse(t *testing.T, drv string, primary, standby *testdb.Cluster) {
	front := testdb.NewProxy(t, testdb.HostPort(t, primary.DSN))
	db := testdb.OpenPostgresDSN(t, drv, front.DSN(primary.DSN))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	name := testdb.UniqueName(t)
	pinned := newLock(t, db, name, advisorylock.WithMultiplexing(0))
	muxed := newLock(t, db, name+"/shared-session") // the default
	set := newSet(t, db, []string{name + "/set/1", name + "/set/2"}, advisorylock.WithMultiplexing(0))
	sem := newSemaphore(t, db, name+"/semaphore", 2)
	lease := newLeaseLock(t, db, name+"/lease")
	type guard interface{ Release(context.Context) error }
	tries := []struct {
		what string
		try  func() (guard, error)
	}{
		{"pinned TryLock", func() (guard, error) { return pinned.TryLock(ctx) }},
		{"pinned LockTimeout", func() (guard, error) { return pinned.LockTimeout(ctx, time.Second) }},
		{"pinned TryRLock", func() (guard, error) { return pinned.TryRLock(ctx) }},
		{"multiplexed TryLock", func() (guard, error) { return muxed.TryLock(ctx) }},
		{"set TryLock", func() (guard, error) { return set.TryLock(ctx) }},
		{"Semaphore.TryAcquire", func() (guard, error) { return sem.TryAcquire(ctx) }},
		{"LeaseLock.TryLock", func() (guard, error) { return lease.TryLock(ctx) }},
	}
	for _, c := range tries { // first use, on the primary
		g, err := c.try()
		if err != nil {
			t.Fatalf("%s on the primary: %v", c.what, err)
		}
		mustRelease(t, g)
	}
	standby.CatchUp(t, primary) // the tables the first uses made are there
	front.Retarget(testdb.HostPort(t, standby.DSN))
	db.SetMaxIdleConns(0) // closes the pool's connections to the primary
	testdb.WaitFor(t, wait, func() bool { return db.Stats().OpenConnections == 0 }, "connections to the primary stayed open: %+v", db.Stats())
	db.SetMaxIdleConns(2)
	for _, c := range tries {
		g, err := c.try()
		if err == nil {
			_ = g.Release(ctx)
			t.Fatalf("%s granted on a connection that reached the hot standby", c.what)
		}
		if !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "standby") || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s on a connection that reached the hot standby = %v, want ErrUnsupported saying hot standby and naming the lock", c.what, err)
		}
	}
	if n := testdb.AdvisoryLocks(t, testdb.OpenPostgresDSN(t, "postgres", standby.DSN), nil); n != 0 {
		t.Fatalf("%d advisory locks left on the standby, want 0", n)
	}
}

func TestVanishedHolderIsFreedWithinTheDeadHolderTimeout(t *testing.T) {
	testdb.Slow(t, "iptables: blackholes a holder, waits out the dead-holder timeout")
	testdb.RequireIptables(t)
	const d = 3 * time.Second
	opts := []advisorylock.Option{advisorylock.WithDeadHolderTimeout(d), advisorylock.WithKeepAlive(time.Second), advisorylock.WithReleaseTimeout(time.Second)}
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		t.Parallel() // side by side: a name and a blackholed client port of its own
		dsn := testdb.PostgresDSN(t)
		holderDB, waiterDB := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
		name := testdb.UniqueName(t)
		holder, waiter := newLock(t, holderDB, name, opts...), newLock(t, waiterDB, name, opts...)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		g, err := holder.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = g.Release(context.Background()) }()
		h, err := waiter.Holder(ctx)
		if err != nil || h == nil || h.PID == 0 {
			t.Fatalf("Holder = %+v, %v; want the holder's session", h, err)
		}
		testdb.Blackhole(t, testdb.Port(t, dsn), testdb.ClientPort(t, testdb.OpenPostgres(t, "postgres"), h.PID))
		start := time.Now()
		wg, err := waiter.LockTimeout(ctx, 3*d)
		if err != nil {
			t.Fatalf("waiter: %v after %v; the vanished holder kept its lock (promise: freed within about %v)", err, time.Since(start), d)
		}
		t.Logf("waiter got the lock %v after the holder vanished", time.Since(start))
		defer func() { _ = wg.Release(context.Background()) }()
		select {
		case <-g.Lost():
		case <-time.After(wait):
			t.Fatal("the vanished holder's Lost() never closed")
		}
	})
}

func TestDeadHolderTimeoutMustExceedKeepAlivePlusReleaseTimeout(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	for _, opts := range [][]advisorylock.Option{
		{advisorylock.WithDeadHolderTimeout(15 * time.Second)}, // = 10s keep-alive + 5s release
		{advisorylock.WithDeadHolderTimeout(5 * time.Second), advisorylock.WithKeepAlive(5 * time.Second)},
	} {
		if _, err := advisorylock.New(db, testdb.UniqueName(t), opts...); err == nil || !strings.Contains(err.Error(), "WithDeadHolderTimeout") {
			t.Fatalf("New with a dead-holder timeout not above keep-alive + release timeout = %v, want an error naming WithDeadHolderTimeout", err)
		}
	}
	if _, err := advisorylock.New(db, testdb.UniqueName(t), advisorylock.WithDeadHolderTimeout(0)); err != nil {
		t.Fatalf("WithDeadHolderTimeout(0) leaves the server's settings: %v", err)
	}
}

func TestPinnedSessionGetsDeadHolderSettings(t *testing.T) {
	t.Parallel() // names and pools of its own
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		for _, checks := range []bool{true, false} {
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(1) // the guard's pinned connection is the pool's only one
			l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithDeadHolderTimeout(20*time.Second), advisorylock.WithServerChecks(checks))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			for range 2 { // a new session, then one that has the settings
				g, err := l.TryLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := g.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			var userTimeout, idle, idleSession string
			err := db.QueryRowContext(ctx, "SELECT current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_idle'), current_setting('idle_session_timeout')").Scan(&userTimeout, &idle, &idleSession)
			if err != nil {
				t.Fatal(err)
			}
			if userTimeout != "15000" || idle != "5" || idleSession != "0" {
				t.Fatalf("server checks %v: after a hold the session has tcp_user_timeout=%s tcp_keepalives_idle=%s idle_session_timeout=%s; want 15000, 5, 0", checks, userTimeout, idle, idleSession)
			}
			if key := advisorylock.Key(l.Name()); testdb.AdvisoryLocks(t, testdb.OpenPostgres(t, "postgres"), &key) != 0 {
				t.Fatal("the lock is still held after the releases")
			}
		}
	})
}

func TestShortStatementTimeoutDoesNotBreakLock(t *testing.T) {
	testdb.Slow(t, "waits across statement timeouts for seconds")
	t.Parallel() // names and pools of its own
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		dsn := testdb.WithParam(testdb.PostgresDSN(t), "options", "-c statement_timeout=300")
		holderDB, waiterDB := testdb.OpenPostgresDSN(t, drv, dsn), testdb.OpenPostgresDSN(t, drv, dsn)
		name := testdb.UniqueName(t)
		holder, waiter := newLock(t, holderDB, name), newLock(t, waiterDB, name)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		g, err := holder.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		released := make(chan error, 1)
		time.AfterFunc(1500*time.Millisecond, func() { released <- g.Release(context.Background()) })
		wg, err := waiter.LockTimeout(ctx, 6*time.Second)
		if err != nil {
			t.Fatalf("LockTimeout with statement_timeout=300ms while the holder releases at 1.5s: %v", err)
		}
		if err := <-released; err != nil {
			t.Fatal(err)
		}
		if err := wg.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestLockTimeoutHoldsOnADeadNetworkWithAWarmConnection(t *testing.T) {
	testdb.Slow(t, "fault: network cut under a LockTimeout")
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		t.Parallel() // side by side: a proxy and a name of its own
		db, proxy := testdb.OpenPostgresProxied(t, drv)
		db.SetMaxIdleConns(2)
		l := newLock(t, db, testdb.UniqueName(t))
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		if err := db.PingContext(ctx); err != nil { // a warm connection in the pool
			t.Fatal(err)
		}
		proxy.Cut()
		defer proxy.Heal()
		const d = time.Second
		start := time.Now()
		g, err := l.LockTimeout(ctx, d)
		took := time.Since(start)
		if g != nil {
			t.Fatal("acquired over a dead network")
		}
		if !errors.Is(err, advisorylock.ErrTimeout) {
			t.Fatalf("LockTimeout on a dead network = %v, want ErrTimeout", err)
		}
		if took > 3*d {
			t.Fatalf("LockTimeout(%v) on a dead network returned after %v, want no later than about %v", d, took, d)
		}
	})
}

// holdOnlyConnection checks out db's only connection (SetMaxOpenConns(1))
// and returns it to the pool at t.Cleanup.
func holdOnlyConnection(t *testing.T, db *sql.DB) {
	t.Helper()
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
}

// returnsWithin runs f and fails the test if it has not returned after
// limit (the goroutine is left to finish at cleanup, when the pool
// frees up).
func returnsWithin(t *testing.T, limit time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Errorf("%s still waiting after %v", what, limit)
		return nil
	}
}

func TestTryLockDoesNotWaitForAnExhaustedPool(t *testing.T) {
	testdb.Slow(t, "waits out pool waits, per kind and driver")
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		t.Parallel() // a pool and a name of its own
		db := testdb.OpenPostgres(t, drv)
		name := testdb.UniqueName(t)
		session := newLock(t, db, name)
		lease := newLeaseLock(t, db, name, advisorylock.WithPoolWait(300*time.Millisecond))
		holdOnlyConnection(t, db)
		for what, try := range map[string]func() error{
			"TryLock (default pool wait 1s)": func() error { _, err := session.TryLock(context.Background()); return err },
			"TryDo (default pool wait 1s)": func() error {
				_, err := session.TryDo(context.Background(), func(context.Context) error { return nil })
				return err
			},
			"LeaseLock.TryLock (pool wait 300ms)": func() error { _, err := lease.TryLock(context.Background()); return err },
		} {
			err := returnsWithin(t, 3*time.Second, what, try)
			if t.Failed() {
				return
			}
			if !errors.Is(err, advisorylock.ErrPoolUnavailable) {
				t.Fatalf("%s on an exhausted pool = %v, want ErrPoolUnavailable", what, err)
			}
		}
	})
}

func TestTokensOnlyGrowWhenLeaseRowsAreDeleted(t *testing.T) {
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		db := b.open(t)
		name := testdb.UniqueName(t)
		l := newLeaseLock(t, db, name)
		var last advisorylock.FencingToken
		for i := range 3 {
			g := tryLease(t, l)
			if g.Lease().Token() <= last {
				t.Fatalf("grant %d after deleting the row: token %d, want more than %d", i+1, g.Lease().Token(), last)
			}
			last = g.Lease().Token()
			releaseLease(t, g)
			if _, err := db.ExecContext(context.Background(), "DELETE FROM advisorylock_leases WHERE name = "+b.bindVar, name); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestReleasedLeaseReadsAsLostInEveryCopy(t *testing.T) {
	t.Parallel()
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		l := newLeaseLock(t, b.open(t), testdb.UniqueName(t))
		g := tryLease(t, l)
		lease := g.Lease()
		if isLost(lease) || isDone(lease.Lost()) {
			t.Fatal("a held lease reads as lost")
		}
		releaseLease(t, g)
		if !isLost(lease) || !isDone(lease.Lost()) || !isLost(g.Lease()) || !isDone(g.Lease().Lost()) {
			t.Fatalf("after Release: lease lost=%v Lost closed=%v, guard's lease lost=%v; want lost everywhere", isLost(lease), isDone(lease.Lost()), isLost(g.Lease()))
		}
		// Do returns fn's result for a section that ended normally, never
		// a lost-lease error caused by its own release.
		if err := l.Do(context.Background(), func(context.Context, advisorylock.Lease) error { return nil }); err != nil {
			t.Fatalf("Do of a section that ended normally = %v, want nil", err)
		}
	})
}

func TestForgottenLeaseReadsAsLost(t *testing.T) {
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		l := newLeaseLock(t, b.open(t), testdb.UniqueName(t))
		lease := forgetLease(t, l)
		testdb.WaitFor(t, wait, func() bool {
			runtime.GC()
			return isLost(lease) && isDone(lease.Lost())
		}, "a forgotten guard's lease still reads as held")
	})
}

// forgetLease takes a lease and drops its guard, keeping a copy of the
// lease only.
func forgetLease(t *testing.T, l *advisorylock.LeaseLock) advisorylock.Lease {
	g := tryLease(t, l)
	return g.Lease()
}

func TestReleasedSessionGuardReadsAsLost(t *testing.T) {
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		l := newLock(t, testdb.OpenPostgres(t, drv), testdb.UniqueName(t))
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		lost := g.Lost()
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !isDone(lost) {
			t.Fatal("a released Guard's Lost() is still open")
		}
		if err := l.Do(context.Background(), func(context.Context) error { return nil }); err != nil {
			t.Fatalf("Do of a section that ended normally = %v, want nil", err)
		}
	})
}

func TestDetectPoolerReturnsItsConnectionWhenTheContextEndsAtCheckout(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	ctx, cancel := context.WithCancel(context.Background())
	_, err := advisorylock.DetectPooler(ctx, cancelAfterConn{DB: db, cancel: cancel})
	if err == nil {
		t.Fatal("DetectPooler with a context that ended at checkout reported no error")
	}
	testdb.WaitFor(t, wait, func() bool { return db.Stats().InUse == 0 }, "DetectPooler leaked %d connections out of the pool", db.Stats().InUse)
}

// cancelAfterConn ends the caller's context just after each checkout
// returns, as a deadline that falls then would.
type cancelAfterConn struct {
	*sql.DB
	cancel context.CancelFunc
}

func (c cancelAfterConn) Conn(ctx context.Context) (*sql.Conn, error) {
	conn, err := c.DB.Conn(ctx)
	c.cancel()
	return conn, err
}

func TestLeaseWaitersBackOffAndStillSeeAnEarlyRelease(t *testing.T) {
	testdb.Slow(t, "waiters backing off for seconds")
	t.Parallel() // a name, pools and a proxy of its own
	db, proxy := testdb.OpenPostgresProxied(t, "pgx")
	holderDB := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	holder, waiter := newLeaseLock(t, holderDB, name), newLeaseLock(t, db, name)
	g := tryLease(t, holder)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	const held = 3 * time.Second
	var releasedAt time.Time
	time.AfterFunc(held, func() {
		releasedAt = time.Now()
		_ = g.Release(context.Background())
	})
	proxy.ResetCount()
	wg, err := waiter.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := time.Since(releasedAt)
	defer releaseLease(t, wg)
	polls := proxy.RoundTrips()
	// At a fixed 20ms a waiter polls 150 times in 3s; backing off it
	// polls a few dozen times at most.
	if polls > 60 {
		t.Fatalf("a lease waiter sent %d statements in %v, want it to back off (at most 60)", polls, held)
	}
	if seen > 2*time.Second {
		t.Fatalf("a lease released early was seen %v later, want within the poll cap", seen)
	}
	t.Logf("%d statements while waiting %v; release seen after %v", polls, held, seen)
}

func TestTokensStrictlyIncreaseAcrossAFailoverWithALaggingStandby(t *testing.T) {
	testdb.Slow(t, "failover: a private cluster and a lagging standby")
	t.Parallel()
	primary := testdb.OwnCluster(t)
	standby := testdb.StandbyOf(t, primary)
	name := testdb.UniqueName(t)
	grant := func(db *sql.DB) advisorylock.FencingToken {
		t.Helper()
		g := tryLease(t, newLeaseLock(t, db, name))
		releaseLease(t, g)
		return g.Lease().Token()
	}
	oldDB := testdb.OpenPostgresDSN(t, "postgres", primary.DSN)
	issued := []advisorylock.FencingToken{grant(oldDB)}
	standby.CatchUp(t, primary)
	standby.StopReceiving(t) // asynchronous replication falls behind
	issued = append(issued, grant(oldDB), grant(oldDB))
	last := issued[len(issued)-1]

	// The fenced resource lives elsewhere and survives the failover.
	resourceDB := testdb.OpenPostgres(t, "pgx")
	fence, err := advisorylock.NewFence(resourceDB, testdb.UniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := fenceAdmit(t, resourceDB, fence, last); err != nil {
		t.Fatalf("admitting the old primary's last token %d: %v", last, err)
	}

	primary.Crash(t)
	standby.Promote(t)
	newDB := testdb.OpenPostgresDSN(t, "pgx", standby.DSN)
	next := grant(newDB)
	for _, old := range issued {
		if next <= old {
			t.Fatalf("the promoted standby granted token %d, not above %d that the old primary issued (issued %v)", next, old, issued)
		}
	}
	if err := fenceAdmit(t, resourceDB, fence, next); err != nil {
		t.Fatalf("the fence that admitted %d refuses the new holder's %d: %v", last, next, err)
	}
	for _, old := range issued {
		if err := fenceAdmit(t, resourceDB, fence, old); !errors.Is(err, advisorylock.ErrStaleToken) {
			t.Fatalf("the fence admitted the old primary's token %d after %d: %v", old, next, err)
		}
	}
	if again := grant(newDB); again <= next {
		t.Fatalf("after the failover tokens went %d then %d, want strictly increasing", next, again)
	}
}

// A forgotten session guard's cleanup runs in the runtime's one cleanup
// goroutine; if it waited there for its keep-alive check, stuck on a dead
// network, every other cleanup of the process would wait too.
func TestForgottenGuardOnADeadNetworkDelaysNoOtherCleanup(t *testing.T) {
	testdb.Slow(t, "fault: a dead network under a forgotten guard")
	db, proxy := testdb.OpenPostgresProxied(t, "postgres")
	started := make(chan struct{}, 1)
	logger := slog.New(signalHandler{on: "never released", ch: started})
	const relTO = 3 * time.Second
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithKeepAlive(20*time.Millisecond),
		advisorylock.WithReleaseTimeout(relTO), advisorylock.WithDeadHolderTimeout(0), advisorylock.WithLogger(logger))
	forgetGuard(t, l)
	proxy.Cut()
	defer proxy.Heal()
	testdb.WaitFor(t, wait, func() bool { return proxy.Held() > 0 }, "no keep-alive check went into the cut")
	testdb.WaitFor(t, wait, func() bool {
		runtime.GC()
		return len(started) > 0
	}, "the forgotten guard's cleanup never ran")

	lease := forgetLease(t, newLeaseLock(t, testdb.OpenSQLite(t, testdb.SQLitePath(t), ""), testdb.UniqueName(t)))
	start := time.Now()
	testdb.WaitFor(t, wait, func() bool {
		runtime.GC()
		return isLost(lease)
	}, "a forgotten lease's cleanup never ran")
	if took := time.Since(start); took > relTO/2 {
		t.Fatalf("another guard's cleanup ran %v later: the cleanup goroutine waited for a keep-alive check on a dead network", took)
	}
}

// forgetGuard takes l and drops its guard.
func forgetGuard(t *testing.T, l *advisorylock.Lock) {
	if _, err := l.TryLock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// signalHandler is a slog.Handler that signals ch when a record's message
// contains on.
type signalHandler struct {
	on string
	ch chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h signalHandler) WithGroup(string) slog.Handler            { return h }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.on) {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}

// A missed try costs the same whatever the server holds: the question a
// first miss on a session asks reads no lock table (pg_locks holds every
// lock on the server, thousands on a per-entity fleet), it configures the
// session, and the session's later misses are the bare statement. The
// answer it reads is the try's own: a grant noted by one Lock's try does
// not make another Lock's later miss on that session a grant.
func TestMissedTryReadsNoLockTable(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			var mu sync.Mutex
			var sent []string
			db := testdb.OpenHooked(t, drv, testdb.PostgresDSN(t), testdb.Hooks{Before: func(q string, _ []any) {
				mu.Lock()
				sent = append(sent, q)
				mu.Unlock()
			}})
			db.SetMaxOpenConns(1)
			since := func() []string {
				mu.Lock()
				defer mu.Unlock()
				out := sent
				sent = nil
				return out
			}
			name := testdb.UniqueName(t)
			rival := newLock(t, testdb.OpenPostgres(t, drv), name)
			held, err := rival.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l := newLock(t, db, name, advisorylock.WithDeadHolderTimeout(20*time.Second))
			if err := l.Check(ctx); err != nil {
				t.Fatal(err)
			}
			since()
			for try := range 3 {
				if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
					t.Fatalf("try %d beside a holder: %v, want ErrNotAcquired", try, err)
				}
				qs := since()
				for _, q := range qs {
					if strings.Contains(q, "pg_locks") {
						t.Fatalf("try %d: a miss read the server's lock table: %s", try, q)
					}
				}
				if try > 0 && (len(qs) != 1 || strings.Contains(qs[0], "pg_is_in_recovery")) {
					t.Fatalf("try %d: a miss on a session that missed before sent %d statements, want the bare try: %q", try, len(qs), qs)
				}
			}
			var timeout string
			if err := db.QueryRowContext(ctx, "SELECT current_setting('tcp_user_timeout')").Scan(&timeout); err != nil {
				t.Fatal(err)
			}
			if timeout != "15s" && timeout != "15000" {
				t.Fatalf("tcp_user_timeout of a session whose tries missed = %q, want the dead-holder settings' 15s", timeout)
			}
			mustRelease(t, held)

			// Another Lock, with other settings, on the same session: its
			// first try is a grant on a session without its settings (noted),
			// then the name is taken by the rival, and the third Lock's
			// first try (its own settings again) must read its own miss.
			other := newLock(t, db, name, advisorylock.WithDeadHolderTimeout(40*time.Second))
			g, err := other.TryLock(ctx)
			if err != nil {
				t.Fatalf("a try on a free name: %v", err)
			}
			mustRelease(t, g)
			if held, err = rival.TryLock(ctx); err != nil {
				t.Fatal(err)
			}
			defer mustRelease(t, held)
			third := newLock(t, db, name, advisorylock.WithDeadHolderTimeout(60*time.Second))
			if g, err := third.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				if g != nil {
					_ = g.Release(ctx)
				}
				t.Fatalf("a try beside a holder, after another Lock's grant on the session: %v, want ErrNotAcquired", err)
			}
		})
	}
}

// A session that has passed the try's checks (not in recovery, dead-holder
// settings applied) is remembered: its later tries send the bare lock
// function, and a new session is checked (and configured) again.
// Both on a shared session (the default) and pinned, whose WithConn
// each forget what the session was known to have.
func TestRememberedSessionTriesWithoutItsChecks(t *testing.T) {
	t.Parallel() // names and pools of its own
	for _, drv := range testdb.Drivers {
		t.Run(drv+"/shared", func(t *testing.T) { rememberedSessionTriesWithoutItsChecks(t, drv) })
		t.Run(drv+"/pinned", func(t *testing.T) { rememberedSessionTriesWithoutItsChecks(t, drv, pinned) })
	}
}

func rememberedSessionTriesWithoutItsChecks(t *testing.T, drv string, mode ...advisorylock.Option) {
	ctx := context.Background()
	db, lastTry := testdb.OpenRecording(t, drv, testdb.PostgresDSN(t), "pg_try_advisory_lock")
	db.SetMaxOpenConns(1)
	l := newLock(t, db, testdb.UniqueName(t), append(mode, advisorylock.WithBackend(advisorylock.Postgres()),
		advisorylock.WithDeadHolderTimeout(20*time.Second))...)
	checked := func(q string) bool {
		return strings.Contains(q, "pg_is_in_recovery") && strings.Contains(q, "advisorylock.dead_holder")
	}
	userTimeout := func() string {
		var v string
		if err := db.QueryRowContext(ctx, "SELECT current_setting('tcp_user_timeout')").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	tryRelease := func() {
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, g)
	}
	for round := range 2 { // round 1 runs on a new session
		tryRelease()
		if q := lastTry(); !checked(q) {
			t.Fatalf("round %d: first try on a session skipped its checks: %s", round, q)
		}
		tryRelease()
		if q := lastTry(); checked(q) || strings.Contains(q, "pg_is_in_recovery") {
			t.Fatalf("round %d: a remembered session's try still checks: %s", round, q)
		}
		if v := userTimeout(); v != "15s" && v != "15000" {
			t.Fatalf("round %d: tcp_user_timeout on the lock's session = %q, want 15s", round, v)
		}
		db.SetMaxIdleConns(0) // close the session: the next round gets a new one
		db.SetMaxIdleConns(1)
	}
	// Statements of the user's on the lock's connection
	// (WithConn) may undo the session's settings: the next try
	// checks the session again and sends them again.
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = g.WithConn(ctx, func(c advisorylock.Conn) error {
		_, err := c.ExecContext(ctx, "RESET ALL")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	mustRelease(t, g)
	tryRelease()
	if q := lastTry(); !checked(q) {
		t.Fatalf("the first try after WithConn ran statements skipped its checks: %s", q)
	}
	if v := userTimeout(); v != "15s" && v != "15000" {
		t.Fatalf("tcp_user_timeout after RESET ALL in WithConn and a new try = %q, want 15s", v)
	}
	// Shared tries on a remembered session stay shared: beside
	// another shared holder, and refused beside an exclusive one.
	other := newLock(t, testdb.OpenPostgres(t, drv), l.Name())
	reader, err := other.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		g, err := l.TryRLock(ctx)
		if err != nil {
			t.Fatalf("a shared try beside a shared holder: %v", err)
		}
		mustRelease(t, g)
	}
	if q := lastTry(); checked(q) || !strings.Contains(q, "pg_try_advisory_lock_shared") {
		t.Fatalf("a remembered session's shared try: %s", q)
	}
	mustRelease(t, reader)
	writer, err := other.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := l.TryRLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		if g != nil {
			mustRelease(t, g)
		}
		t.Fatalf("a shared try beside an exclusive holder = %v, want ErrNotAcquired", err)
	}
	mustRelease(t, writer)
}
