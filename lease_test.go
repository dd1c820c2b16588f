package advisorylock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"go.uber.org/goleak"
)

// leaseWait bounds every wait in the lease tests.
const leaseWait = 30 * time.Second

// leaseBackend is one database a LeaseLock runs on. Every open of one row
// opens a new handle on the same database.
type leaseBackend struct {
	name    string
	open    func(t testing.TB) *sql.DB
	sqlite  bool
	mysql   bool
	bindVar string // the first bind variable: $1 or ?
}

// expire ends the named lease's row now, as if its holder had stopped
// renewing long ago.
func (b leaseBackend) expire(t testing.TB, db *sql.DB, name string) {
	t.Helper()
	q := "UPDATE advisorylock_leases SET expires_at = now() - interval '1 second' WHERE name = $1"
	switch {
	case b.sqlite:
		q = "UPDATE advisorylock_leases SET expires_at = 0 WHERE name = ?"
	case b.mysql:
		q = "UPDATE advisorylock_leases SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?"
	}
	res, err := db.ExecContext(context.Background(), q, name)
	if err != nil {
		t.Fatalf("expiring %q: %v", name, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("expiring %q changed %d rows, want 1", name, n)
	}
}

// row reads the lease's row as stored: its name, generation and whether
// it is free.
func (b leaseBackend) row(t testing.TB, db *sql.DB, name string) (stored string, generation int64, free bool) {
	t.Helper()
	q := "SELECT name, generation, owner IS NULL FROM advisorylock_leases WHERE name = " + b.bindVar
	if err := db.QueryRowContext(context.Background(), q, name).Scan(&stored, &generation, &free); err != nil {
		t.Fatalf("reading the row of %q: %v", name, err)
	}
	return stored, generation, free
}

// eachLeaseBackend runs f on PostgreSQL through lib/pq and pgx, and on a
// fresh SQLite file.
func eachLeaseBackend(t *testing.T, f func(t *testing.T, b leaseBackend)) {
	for _, drv := range testdb.Drivers {
		t.Run("postgres/"+drv, func(t *testing.T) {
			f(t, leaseBackend{name: "postgres", bindVar: "$1", open: func(t testing.TB) *sql.DB { return testdb.OpenPostgres(t, drv) }})
		})
	}
	t.Run("mysql", func(t *testing.T) {
		f(t, leaseBackend{name: "mysql", mysql: true, bindVar: "?", open: func(t testing.TB) *sql.DB { return testdb.OpenMySQL(t) }})
	})
	t.Run("sqlite", func(t *testing.T) {
		path := testdb.SQLitePath(t)
		f(t, leaseBackend{name: "sqlite", sqlite: true, bindVar: "?", open: func(t testing.TB) *sql.DB {
			return testdb.OpenSQLite(t, path, sqliteWAL)
		}})
	})
}

// eachPostgresDriver runs f on PostgreSQL through lib/pq and pgx.
func eachPostgresDriver(t *testing.T, f func(t *testing.T, drv string)) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) { f(t, drv) })
	}
}

func newLeaseLock(t testing.TB, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.LeaseLock {
	t.Helper()
	l, err := advisorylock.NewLeaseLock(db, name, opts...)
	if err != nil {
		t.Fatalf("NewLeaseLock(%.40q): %v", name, err)
	}
	return l
}

func tryLease(t testing.TB, l *advisorylock.LeaseLock) *advisorylock.LeaseGuard {
	t.Helper()
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock(%.40q): %v", l.Name(), err)
	}
	return g
}

func releaseLease(t testing.TB, g *advisorylock.LeaseGuard) {
	t.Helper()
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func assertHeldElsewhere(t testing.TB, l *advisorylock.LeaseLock) {
	t.Helper()
	g, err := l.TryLock(context.Background())
	if !errors.Is(err, advisorylock.ErrNotAcquired) {
		if g != nil {
			_ = g.Release(context.Background())
		}
		t.Fatalf("TryLock(%.40q) = %v, want ErrNotAcquired", l.Name(), err)
	}
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestLeaseTokensOnlyGrow: tokens strictly increase per name, are not
// consecutive (the first need not be 1), and the row's
// generation column stores the full token.
func TestLeaseTokensOnlyGrow(t *testing.T) {
	t.Parallel()
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		dbA, dbB := b.open(t), b.open(t)
		name, other := testdb.UniqueName(t), testdb.UniqueName(t)
		a, bb := newLeaseLock(t, dbA, name), newLeaseLock(t, dbB, name)
		var last advisorylock.FencingToken
		for i, l := range []*advisorylock.LeaseLock{a, bb, a, bb} {
			g := tryLease(t, l)
			if g.Lease().Token() <= last {
				t.Fatalf("grant %d: token %d, want more than %d", i+1, g.Lease().Token(), last)
			}
			last = g.Lease().Token()
			releaseLease(t, g)
			stored, gen, free := b.row(t, dbA, name)
			if stored != name || gen != int64(last) || !free {
				t.Fatalf("after release %d the row is (%q, %d, free=%v), want (%q, %d, free)", i+1, stored, gen, free, name, last)
			}
		}
		g := tryLease(t, newLeaseLock(t, dbB, other))
		defer releaseLease(t, g)
		if g.Lease().Token() < 1 {
			t.Fatalf("first grant of another name: token %d, want at least 1", g.Lease().Token())
		}
	})
}

// TestLeaseIsExclusiveAndRenewalOutlivesTheTTL holds a lease for 2.5 TTLs.
// The TTL is long enough that the full suite under the race detector on
// two loaded CPUs does not stall its renewals past the local deadline
// (with 2s, a stall of about a second during a concurrent compile lost
// the lease once, as the library must when it cannot renew in time).
func TestLeaseIsExclusiveAndRenewalOutlivesTheTTL(t *testing.T) {
	testdb.Slow(t, "holds leases for 2.5 TTLs of 4 s")
	t.Parallel() // names of its own
	const ttl = 4 * time.Second
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		t.Parallel()
		name := testdb.UniqueName(t)
		a := newLeaseLock(t, b.open(t), name, advisorylock.WithLeaseTTL(ttl))
		other := newLeaseLock(t, b.open(t), name, advisorylock.WithLeaseTTL(ttl))
		g := tryLease(t, a)
		assertHeldElsewhere(t, other)
		assertHeldElsewhere(t, a) // not re-entrant
		until := time.Now().Add(5 * ttl / 2)
		for time.Now().Before(until) {
			time.Sleep(ttl / 4) // lets time pass; what is asserted does not depend on when
			assertHeldElsewhere(t, other)
		}
		if isLost(g.Lease()) || isDone(g.Lease().Lost()) {
			t.Fatalf("lease lost while renewed for %v with a TTL of %v", 5*ttl/2, ttl)
		}
		h, err := other.Holder(context.Background())
		if err != nil || h == nil || h.Token != g.Lease().Token() {
			t.Fatalf("Holder = %+v, %v; want the first grant (token %d) still held", h, err, g.Lease().Token())
		}
		releaseLease(t, g)
		g2 := tryLease(t, other)
		defer releaseLease(t, g2)
		if g2.Lease().Token() <= g.Lease().Token() { // strictly increasing, not consecutive
			t.Fatalf("next token %d, want more than %d", g2.Lease().Token(), g.Lease().Token())
		}
	})
}

func TestTakenOverLeaseIsLostAndEndsDo(t *testing.T) {
	t.Parallel() // names of its own
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		t.Parallel()
		for _, via := range []string{"Do", "TryDo"} {
			t.Run(via, func(t *testing.T) {
				db := b.open(t)
				name := testdb.UniqueName(t)
				a := newLeaseLock(t, db, name, advisorylock.WithLeaseTTL(time.Second))
				successor := newLeaseLock(t, b.open(t), name)
				var lease advisorylock.Lease
				var cause error
				var next *advisorylock.LeaseGuard
				fn := func(ctx context.Context, l advisorylock.Lease) error {
					lease = l
					b.expire(t, db, name)
					next = tryLease(t, successor)
					select {
					case <-ctx.Done():
					case <-time.After(leaseWait):
						t.Error("fn's context was not cancelled after the lease was taken over")
					}
					cause = context.Cause(ctx)
					if via == "TryDo" {
						return cause // fn returns the cause itself
					}
					return ctx.Err()
				}
				var err error
				if via == "Do" {
					err = a.Do(context.Background(), fn)
				} else {
					var ran bool
					ran, err = a.TryDo(context.Background(), fn)
					if !ran {
						t.Fatal("TryDo did not run fn")
					}
				}
				if next == nil {
					t.Fatal("the successor did not acquire")
				}
				defer releaseLease(t, next)
				if !isLeaseLoss(cause, name, lease.Token()) {
					t.Fatalf("fn's context cause = %v, want ErrLockLost naming the lease and token %d", cause, lease.Token())
				}
				if !isLeaseLoss(err, name, lease.Token()) {
					t.Fatalf("%s = %v, want ErrLockLost naming the lease", via, err)
				}
				if !isLost(lease) || !isDone(lease.Lost()) {
					t.Fatal("the lease does not report itself lost")
				}
				if next.Lease().Token() <= lease.Token() {
					t.Fatalf("successor's token %d is not above %d", next.Lease().Token(), lease.Token())
				}
				h, err := successor.Holder(context.Background())
				if err != nil || h == nil || h.Token != next.Lease().Token() {
					t.Fatalf("after the lost holder released: Holder = %+v, %v; want the successor (token %d)", h, err, next.Lease().Token())
				}
			})
		}
	})
}

func TestPartitionedHolderGivesUpBeforeItsSuccessorGetsIn(t *testing.T) {
	testdb.Slow(t, "fault: partitions a holder and waits out a 3 s TTL")
	const ttl = 3 * time.Second
	// Each case opens the holder's handle through a cuttable proxy and the
	// successor's directly.
	cases := map[string]func(t *testing.T) (*sql.DB, *testdb.Proxy, *sql.DB){
		"mysql": func(t *testing.T) (*sql.DB, *testdb.Proxy, *sql.DB) {
			db, proxy := testdb.OpenMySQLProxied(t)
			return db, proxy, testdb.OpenMySQL(t)
		},
	}
	for _, drv := range testdb.Drivers {
		cases["postgres/"+drv] = func(t *testing.T) (*sql.DB, *testdb.Proxy, *sql.DB) {
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			return db, proxy, testdb.OpenPostgres(t, drv)
		}
	}
	for backend, open := range cases {
		t.Run(backend, func(t *testing.T) { partitionedHolderGivesUp(t, ttl, open) })
	}
}

// partitionedHolderGivesUp cuts a lease holder off, sees it give up
// while the database still counts its lease, and its successor get a
// larger token that the fence prefers.
func partitionedHolderGivesUp(t *testing.T, ttl time.Duration, open func(t *testing.T) (*sql.DB, *testdb.Proxy, *sql.DB)) {
	t.Parallel()
	ctx := context.Background()
	dbA, proxy, dbB := open(t)
	name, resource := testdb.UniqueName(t), testdb.UniqueName(t)
	a := newLeaseLock(t, dbA, name, advisorylock.WithLeaseTTL(ttl))
	b := newLeaseLock(t, dbB, name, advisorylock.WithLeaseTTL(ttl), advisorylock.WithPollInterval(10*time.Millisecond))
	fence, err := advisorylock.NewFence(dbB, resource)
	if err != nil {
		t.Fatal(err)
	}
	ga := tryLease(t, a)

	proxy.Cut()
	healed := false
	defer func() {
		if !healed {
			proxy.Heal()
		}
	}()
	select {
	case <-ga.Lease().Lost():
	case <-time.After(leaseWait):
		t.Fatal("the cut-off holder never noticed")
	}
	if !isLost(ga.Lease()) {
		t.Fatal("Lost() closed but the lease reads not lost")
	}
	assertHeldElsewhere(t, b) // the database still counts A's lease: A gave up first

	gb, err := b.LockTimeout(ctx, leaseWait)
	if err != nil {
		t.Fatalf("successor: %v", err)
	}
	defer releaseLease(t, gb)
	if gb.Lease().Token() <= ga.Lease().Token() {
		t.Fatalf("successor's token %d is not above %d", gb.Lease().Token(), ga.Lease().Token())
	}
	if err := fenceAdmit(t, dbB, fence, gb.Lease().Token()); err != nil {
		t.Fatalf("Admit(successor's %d): %v", gb.Lease().Token(), err)
	}
	err = fenceAdmit(t, dbB, fence, ga.Lease().Token())
	if !isStale(err, resource, ga.Lease().Token(), gb.Lease().Token()) {
		t.Fatalf("Admit(stale %d) = %v, want ErrStaleToken with highest %d", ga.Lease().Token(), err, gb.Lease().Token())
	}

	proxy.Heal()
	healed = true
	rctx, cancel := context.WithTimeout(ctx, leaseWait)
	defer cancel()
	_ = ga.Release(rctx) // may fail on a connection the cut broke; it must not free B's lease
	h, err := b.Holder(ctx)
	if err != nil || h == nil || h.Token != gb.Lease().Token() {
		t.Fatalf("after the stale holder's release: Holder = %+v, %v; want the successor (token %d)", h, err, gb.Lease().Token())
	}
	if isLost(gb.Lease()) {
		t.Fatal("the successor's lease is lost")
	}
}

func TestLeaseTimesOnPostgresComeFromTheDatabaseClock(t *testing.T) {
	testdb.Slow(t, "waits through renewals for two TTLs of 2 s")
	t.Parallel() // names of its own
	const ttl = 2 * time.Second
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		t.Parallel()
		ctx := context.Background()
		db := testdb.OpenPostgres(t, drv)
		ahead, behind := testdb.SkewedClock(6*time.Hour), testdb.SkewedClock(-6*time.Hour)
		name := testdb.UniqueName(t)
		a := newLeaseLock(t, db, name, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(ahead.Now))
		b := newLeaseLock(t, testdb.OpenPostgres(t, drv), name, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(behind.Now))

		dbNow := func() time.Time {
			var now time.Time
			if err := db.QueryRowContext(ctx, "SELECT now()").Scan(&now); err != nil {
				t.Fatal(err)
			}
			return now
		}
		before := dbNow()
		g := tryLease(t, a)
		after := dbNow()
		h, err := b.Holder(ctx)
		if err != nil || h == nil {
			t.Fatalf("Holder = %v, %v", h, err)
		}
		if h.Since.Before(before) || h.Since.After(after) {
			t.Fatalf("acquired_at %v is not between the database's %v and %v", h.Since, before, after)
		}
		if h.ExpiresAt.Before(h.Since.Add(ttl)) || h.ExpiresAt.After(dbNow().Add(ttl)) {
			t.Fatalf("expires_at %v is not a TTL after the database's now (acquired at %v)", h.ExpiresAt, h.Since)
		}
		assertHeldElsewhere(t, b) // six hours behind, B still sees it held
		time.Sleep(2 * ttl)       // lets renewals happen; what is asserted does not depend on when
		if isLost(g.Lease()) {
			t.Fatal("a clock six hours ahead lost a renewed lease")
		}
		assertHeldElsewhere(t, b)
		releaseLease(t, g)

		// A holder that stops renewing: its lease ends TTL after the
		// database granted it, whatever the application clock said.
		store := advisorylock.Postgres().(backend.LeaseStore)
		dead := backend.LeaseRequest{Kind: "lease", Name: name, Owner: "dead holder", TTL: ttl, Now: behind.Now()}
		token, err := store.AcquireLease(ctx, db, dead)
		if err != nil {
			t.Fatalf("AcquireLease: %v", err)
		}
		granted := time.Now()
		if token <= uint64(g.Lease().Token()) {
			t.Fatalf("grant token %d, want more than %d", token, g.Lease().Token())
		}
		assertHeldElsewhere(t, b)
		var gb *advisorylock.LeaseGuard
		testdb.WaitFor(t, leaseWait, func() bool {
			gb, err = b.TryLock(ctx)
			return err == nil
		}, "the abandoned lease never expired (last: %v)", err)
		defer releaseLease(t, gb)
		if waited := time.Since(granted); waited < ttl-100*time.Millisecond {
			t.Fatalf("the abandoned lease was taken after %v, before its TTL %v", waited, ttl)
		}
	})
}

// TestMissedLeaseTryLeavesTheHoldersRowAlone: a TryLock that finds the
// lease held writes nothing to its row, not even a row lock, which would
// hold up the holder's release or renewal until the try committed and
// make the try wait for a WAL flush. A row lock sets the row's xmax to
// the locker's transaction; the holder's own grant leaves it 0.
func TestMissedLeaseTryLeavesTheHoldersRowAlone(t *testing.T) {
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		t.Parallel()
		ctx := context.Background()
		db := testdb.OpenPostgres(t, drv)
		name := testdb.UniqueName(t)
		ttl := advisorylock.WithLeaseTTL(time.Minute) // no renewal during the test
		g := tryLease(t, newLeaseLock(t, db, name, ttl))
		defer releaseLease(t, g)
		xmax := func() string {
			var x string
			if err := db.QueryRowContext(ctx, "SELECT xmax::text FROM advisorylock_leases WHERE name = $1", name).Scan(&x); err != nil {
				t.Fatal(err)
			}
			return x
		}
		if x := xmax(); x != "0" {
			t.Fatalf("the granted row's xmax is %s, want 0", x)
		}
		other := newLeaseLock(t, testdb.OpenPostgres(t, drv), name, ttl)
		for range 3 {
			assertHeldElsewhere(t, other)
		}
		if x := xmax(); x != "0" {
			t.Fatalf("after tries that missed, the row's xmax is %s: a try locked the holder's row", x)
		}
	})
}

func TestLeaseExpiryOnSQLiteFollowsTheClock(t *testing.T) {
	testdb.Slow(t, "waits out lease TTLs of seconds")
	t.Parallel()
	const ttl = 30 * time.Second // renewals every 10s of real time: none runs before the clock moves
	path := testdb.SQLitePath(t)
	open := func() *sql.DB {
		return testdb.OpenSQLite(t, path, sqliteWAL)
	}
	clock := testdb.NewFakeClock()
	name := testdb.UniqueName(t)
	a := newLeaseLock(t, open(), name, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now))
	b := newLeaseLock(t, open(), name, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now))
	g := tryLease(t, a)
	h, err := b.Holder(context.Background())
	if err != nil || h == nil || !h.Since.Equal(clock.Now()) || !h.ExpiresAt.Equal(clock.Now().Add(ttl)) {
		t.Fatalf("Holder = %+v, %v; want acquired at the clock's %v, expiring a TTL later", h, err, clock.Now())
	}
	clock.Add(ttl - time.Millisecond)
	assertHeldElsewhere(t, b)
	if !isLost(g.Lease()) {
		t.Fatal("the lease is not lost locally past its local deadline")
	}
	clock.Add(time.Millisecond)
	gb := tryLease(t, b) // no real time passed: the clock alone expired it
	defer releaseLease(t, gb)
	if gb.Lease().Token() <= g.Lease().Token() {
		t.Fatalf("token %d, want more than %d", gb.Lease().Token(), g.Lease().Token())
	}
	select {
	case <-g.Lease().Lost():
	case <-time.After(leaseWait):
		t.Fatal("the expired holder's Lost() never closed")
	}
	releaseLease(t, g)
	if h, err := b.Holder(context.Background()); err != nil || h == nil || h.Token != gb.Lease().Token() {
		t.Fatalf("after the expired holder's release: Holder = %+v, %v; want token %d", h, err, gb.Lease().Token())
	}
}

func TestLeaseIsLostAtTheLocalDeadlineWithoutAnyGoroutine(t *testing.T) {
	const ttl = 30 * time.Second // renewals every 10s of real time: none runs during the test
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		clock := testdb.NewFakeClock()
		g := tryLease(t, newLeaseLock(t, b.open(t), testdb.UniqueName(t), quiet, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now)))
		defer releaseLease(t, g)
		lease := g.Lease()
		clock.Add(ttl - ttl/3 - time.Millisecond)
		if isLost(lease) || isLost(g.Lease()) {
			t.Fatal("lost before the local deadline (TTL minus one renew interval)")
		}
		clock.Add(time.Millisecond)
		if !isLost(lease) || !isLost(g.Lease()) {
			t.Fatal("not lost at the local deadline")
		}
	})
}

func TestLeaseLockTimeoutReturnsTimeoutError(t *testing.T) {
	t.Parallel() // names of its own
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		t.Parallel()
		ctx := context.Background()
		name := testdb.UniqueName(t)
		held := tryLease(t, newLeaseLock(t, b.open(t), name))
		defer releaseLease(t, held)
		l := newLeaseLock(t, b.open(t), name)
		for _, d := range []time.Duration{0, -time.Second, 300 * time.Millisecond} {
			start := time.Now()
			g, err := l.LockTimeout(ctx, d)
			if g != nil || !isTimeout(err, name) {
				t.Fatalf("LockTimeout(%v) = %v, %v; want ErrTimeout naming the lease", d, g, err)
			}
			if took := time.Since(start); took < d {
				t.Fatalf("LockTimeout(%v) gave up after %v", d, took)
			}
		}
		err := l.DoTimeout(ctx, 100*time.Millisecond, func(context.Context, advisorylock.Lease) error {
			t.Error("fn ran without the lease")
			return nil
		})
		if !errors.Is(err, advisorylock.ErrTimeout) {
			t.Fatalf("DoTimeout = %v, want ErrTimeout", err)
		}
	})
}

func TestLeaseLockTimeoutWhenPoolExhausted(t *testing.T) {
	const d = 300 * time.Millisecond
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		t.Parallel()
		ctx := context.Background()
		db := b.open(t)
		l := newLeaseLock(t, db, testdb.UniqueName(t), advisorylock.WithReleaseTimeout(leaseWait))
		db.SetMaxOpenConns(1)
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		g, err := l.LockTimeout(ctx, d)
		took := time.Since(start)
		_ = conn.Close()
		if g != nil || !errors.Is(err, advisorylock.ErrTimeout) {
			t.Fatalf("LockTimeout with the pool exhausted = %v, %v; want ErrTimeout", g, err)
		}
		if took > d+5*time.Second { // not the release timeout (30s) nor a wait for the pool
			t.Fatalf("LockTimeout(%v) with the pool exhausted took %v", d, took)
		}
		g = tryLease(t, l) // the pool is usable again and nothing was left held
		releaseLease(t, g)
	})
}

func TestLeaseHolderShowsOwnerTokenAndExpiry(t *testing.T) {
	t.Parallel()
	const ttl = 10 * time.Second
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		l := newLeaseLock(t, b.open(t), name, advisorylock.WithLeaseTTL(ttl), advisorylock.WithOwner("worker-7"))
		if h, err := l.Holder(ctx); err != nil || h != nil {
			t.Fatalf("Holder of a free lease = %+v, %v; want nil, nil", h, err)
		}
		g := tryLease(t, l)
		h, err := l.Holder(ctx)
		if err != nil || h == nil {
			t.Fatalf("Holder = %v, %v", h, err)
		}
		switch {
		case h.Name != name:
			t.Fatalf("Holder names %q, want %q", h.Name, name)
		case !strings.HasPrefix(h.Owner, "worker-7/"):
			t.Fatalf("Holder.Owner = %q, want the label worker-7 and a unique suffix", h.Owner)
		case h.Token != g.Lease().Token():
			t.Fatalf("Holder.Token = %d, want %d", h.Token, g.Lease().Token())
		case h.Since.IsZero() || h.ExpiresAt.Sub(h.Since) < ttl-time.Millisecond || h.ExpiresAt.Sub(h.Since) > ttl+leaseWait:
			t.Fatalf("Holder since %v expires %v, want about one TTL (%v) apart", h.Since, h.ExpiresAt, ttl)
		}
		name2 := testdb.UniqueName(t)
		g2 := tryLease(t, newLeaseLock(t, b.open(t), name2, advisorylock.WithOwner("worker-7")))
		defer releaseLease(t, g2)
		h2, err := newLeaseLock(t, b.open(t), name2).Holder(ctx)
		if err != nil || h2 == nil || h2.Owner == h.Owner {
			t.Fatalf("two acquires share the owner label %q (%v)", h.Owner, err)
		}
		releaseLease(t, g)
		if h, err := l.Holder(ctx); err != nil || h != nil {
			t.Fatalf("Holder after release = %+v, %v; want nil, nil", h, err)
		}
	})
}

// weirdNames are names that must reach the database only as data.
var weirdNames = []string{
	"",
	" ",
	"x'; DROP TABLE advisorylock_leases; --",
	`'); DELETE FROM advisorylock_fences; --`,
	`back\slash \' \\' E'\x41'`,
	`"quoted" ''doubled'' $$dollar$$ $1 ?`,
	"emoji 🎉 snowman ☃ RTL \u202e",
	strings.Repeat("long name ", 1024), // 10 KiB
}

func TestLeaseNamesAreData(t *testing.T) {
	testdb.Slow(t, "about a second on 2 CPUs, over every backend")
	t.Parallel() // names of its own
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		db := b.open(t)
		suffix := testdb.UniqueName(t)
		for i, weird := range weirdNames {
			name := weird + suffix // unique per run; the weird part comes first
			l := newLeaseLock(t, db, name)
			g := tryLease(t, l)
			h, err := l.Holder(context.Background())
			if err != nil || h == nil || h.Name != name || h.Token != g.Lease().Token() {
				t.Fatalf("name %d: Holder = %+v, %v", i, h, err)
			}
			if stored, _, _ := b.row(t, db, name); stored != name {
				t.Fatalf("name %d stored as %q", i, stored)
			}
			resource := name
			f, err := advisorylock.NewFence(db, resource)
			if err != nil {
				t.Fatalf("NewFence(name %d): %v", i, err)
			}
			if err := fenceAdmit(t, db, f, g.Lease().Token()); err != nil {
				t.Fatalf("Admit on resource %d: %v", i, err)
			}
			releaseLease(t, g)
		}
		for _, table := range []string{"advisorylock_leases", "advisorylock_fences"} {
			var n int
			if err := db.QueryRowContext(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil || n == 0 {
				t.Fatalf("%s: %d rows, %v", table, n, err)
			}
		}
	})
}

func TestLeaseNameTooLongForAnIndexIsAClearError(t *testing.T) {
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		random := make([]byte, 5000)
		_, _ = rand.Read(random)
		name := fmt.Sprintf("%x", random) // 10 KB that does not compress
		_, err := newLeaseLock(t, testdb.OpenPostgres(t, drv), name).TryLock(context.Background())
		if !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "too long") {
			t.Fatalf("TryLock with an incompressible 10 KB name = %v, want ErrUnsupported saying it is too long", err)
		}
	})
}

func TestNewLeaseLockRefusesWhatTheDatabaseCannotStore(t *testing.T) {
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		db := b.open(t)
		for _, bad := range []string{"nul\x00byte", "\x00", "invalid \xff utf-8", "\xc3"} {
			if l, err := advisorylock.NewLeaseLock(db, bad); err == nil || !strings.HasPrefix(err.Error(), "advisorylock: ") {
				t.Errorf("NewLeaseLock(%q) = %v, %v; want an advisorylock error", bad, l, err)
			}
			if f, err := advisorylock.NewFence(db, bad); err == nil || !strings.HasPrefix(err.Error(), "advisorylock: ") {
				t.Errorf("NewFence(%q) = %v, %v; want an advisorylock error", bad, f, err)
			}
		}
		if l, err := advisorylock.NewLeaseLock(db, "fine", advisorylock.WithOwner("bad\x00owner")); err == nil {
			t.Errorf("NewLeaseLock with a NUL in the owner label = %v, nil; want an error", l)
		}
	})
}

func TestReleasedLeaseLeavesNoGoroutine(t *testing.T) {
	testdb.Slow(t, "waits for the keeper's goroutines to end, per backend")
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		ctx := context.Background()
		db := b.open(t)
		name := testdb.UniqueName(t)
		l := newLeaseLock(t, db, name, advisorylock.WithLeaseTTL(time.Second))
		releaseLease(t, tryLease(t, l)) // warm the pool before the snapshot
		ignore := goleak.IgnoreCurrent()

		g := tryLease(t, l)
		time.Sleep(500 * time.Millisecond) // past one renewal; not a synchronization
		releaseLease(t, g)
		if err := l.Do(ctx, func(context.Context, advisorylock.Lease) error { return nil }); err != nil {
			t.Fatalf("Do: %v", err)
		}
		g = tryLease(t, l)
		b.expire(t, db, name)
		select {
		case <-g.Lease().Lost():
		case <-time.After(leaseWait):
			t.Fatal("the expired lease was never lost")
		}
		releaseLease(t, g)
		// A connection the pool opened meanwhile (go-sql-driver watches
		// each of its connections with a goroutine) is the pool's, not ours.
		goleak.VerifyNone(t, ignore, goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1"))
	})
}

func TestLeaseSchemaIsCreatedOnFirstUseByConcurrentCallers(t *testing.T) {
	testdb.Slow(t, "creates a fresh database")
	t.Parallel() // databases of its own
	ctx := context.Background()
	admin := testdb.OpenPostgres(t, "postgres")
	fresh := freshDatabase(t, admin)
	dbs := map[string]*sql.DB{}
	for _, drv := range testdb.Drivers {
		dbs[drv] = testdb.OpenPostgresDSN(t, drv, testdb.WithDatabase(testdb.PostgresDSN(t), fresh))
	}
	const callers = 24
	shared := testdb.UniqueName(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var winners []*advisorylock.LeaseGuard
	var sharedWinners int
	errs := make(chan error, 2*callers)
	for i := range callers {
		db := dbs[testdb.Drivers[i%len(testdb.Drivers)]]
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := shared
			if i%2 == 1 {
				name = fmt.Sprintf("%s/%d", shared, i)
			}
			l, err := advisorylock.NewLeaseLock(db, name)
			if err != nil {
				errs <- err
				return
			}
			g, err := l.TryLock(ctx)
			if errors.Is(err, advisorylock.ErrNotAcquired) {
				return
			}
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			winners = append(winners, g)
			if name == shared {
				sharedWinners++
			}
			mu.Unlock()
			if _, err := advisorylock.NewFence(db, name); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent first use: %v", err)
	}
	for _, g := range winners {
		releaseLease(t, g)
	}
	if sharedWinners != 1 || len(winners) != 1+callers/2 {
		t.Fatalf("%d callers won the shared name and %d in all, want 1 and %d", sharedWinners, len(winners), 1+callers/2)
	}

	// The exported DDL makes the same tables for a migration tool.
	ddl := advisorylock.Schema(advisorylock.Postgres())
	for _, want := range []string{"advisorylock_leases", "advisorylock_fences", "generation", "expires_at"} {
		if !strings.Contains(ddl, want) {
			t.Fatalf("Schema(Postgres()) lacks %q:\n%s", want, ddl)
		}
	}
	migrated := testdb.OpenPostgresDSN(t, "postgres", testdb.WithDatabase(testdb.PostgresDSN(t), freshDatabase(t, admin)))
	if _, err := migrated.ExecContext(ctx, ddl); err != nil {
		t.Fatalf("running the exported DDL: %v", err)
	}
	if got, want := tableColumns(t, migrated), tableColumns(t, dbs["postgres"]); got != want {
		t.Fatalf("the exported DDL makes\n%s\nbut first use makes\n%s", got, want)
	}
	releaseLease(t, tryLease(t, newLeaseLock(t, migrated, shared)))

	// A Fence used before any lease creates the tables itself: Admit runs
	// in the caller's transaction, where a missing table could not be.
	fenceFirst := freshDatabase(t, admin)
	for _, drv := range testdb.Drivers {
		db := testdb.OpenPostgresDSN(t, drv, testdb.WithDatabase(testdb.PostgresDSN(t), fenceFirst))
		f, err := advisorylock.NewFence(db, shared)
		if err != nil {
			t.Fatalf("%s: NewFence on a fresh database: %v", drv, err)
		}
		if err := fenceAdmit(t, db, f, 1); err != nil {
			t.Fatalf("%s: Admit on a fresh database: %v", drv, err)
		}
	}
}

// freshDatabase creates an empty database with a unique name, dropped at
// cleanup, and returns its name.
func freshDatabase(t *testing.T, admin *sql.DB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("advisorylock_fresh_%x", b)
	if _, err := admin.ExecContext(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("CREATE DATABASE: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("DROP DATABASE %s: %v", name, err)
		}
	})
	return name
}

// tableColumns describes the lease and fence tables' columns.
func tableColumns(t *testing.T, db *sql.DB) string {
	t.Helper()
	var s string
	err := db.QueryRowContext(context.Background(), `SELECT string_agg(table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable, E'\n' ORDER BY table_name, ordinal_position)
FROM information_schema.columns WHERE table_name IN ('advisorylock_leases', 'advisorylock_fences')`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPostgresKeepsSharedRows: PostgreSQL keeps "lock" rows and shared
// holders' rows (for WithLeaseRows), each grant with a token, and stays
// a SessionLocker.
func TestPostgresKeepsSharedRows(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	store := advisorylock.Postgres().(backend.SharedRowStore)
	name := testdb.UniqueName(t)
	req := backend.LeaseRequest{Kind: "shared", Name: name, Key: advisorylock.Key(name), Owner: name, TTL: time.Second}
	token, err := store.AcquireLease(context.Background(), db, req)
	if err != nil || token == 0 {
		t.Fatalf("AcquireLease of a \"shared\" row on PostgreSQL = %d, %v; want a token", token, err)
	}
	if err := store.ReleaseLease(context.Background(), db, req); err != nil {
		t.Fatalf("ReleaseLease of the shared row: %v", err)
	}
	if _, ok := advisorylock.Postgres().(backend.SessionLocker); !ok {
		t.Fatal("Postgres() is no longer a SessionLocker")
	}
}

// TestLeaseOnAnUnreachableServerIsPoolUnavailable: when no connection can
// be made (the server refuses them), an acquire reports ErrPoolUnavailable,
// with the driver's dial error reachable: nothing was sent.
func TestLeaseOnAnUnreachableServerIsPoolUnavailable(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			l := newLeaseLock(t, db, testdb.UniqueName(t), quiet)
			proxy.Close()
			g, err := l.TryLock(context.Background())
			var op *net.OpError
			if g != nil || !errors.Is(err, advisorylock.ErrPoolUnavailable) || !errors.As(err, &op) || op.Op != "dial" {
				t.Fatalf("TryLock with the server refusing connections = %v, %v; want ErrPoolUnavailable wrapping the dial error", g, err)
			}
			if !strings.Contains(err.Error(), l.Name()) {
				t.Fatalf("error %q does not name the lock", err)
			}
		})
	}
}

// TestLeaseSchemaCreationIgnoresLockNames: the tables are created under a
// transaction-scoped advisory lock that no Lock name can reach, so a Lock
// held on any name (here the schema lock's own label) never blocks a first
// use.
func TestLeaseSchemaCreationIgnoresLockNames(t *testing.T) {
	testdb.Slow(t, "creates a fresh database")
	ctx := context.Background()
	admin := testdb.OpenPostgres(t, "postgres")
	db := testdb.OpenPostgresDSN(t, "pgx", testdb.WithDatabase(testdb.PostgresDSN(t), freshDatabase(t, admin)))
	held, err := newLock(t, db, "advisorylock:schema").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, held)
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := newLeaseLock(t, db, testdb.UniqueName(t)).TryLock(tctx)
	if err != nil {
		t.Fatalf("first use with a Lock held on %q: %v", "advisorylock:schema", err)
	}
	releaseLease(t, g)
}

// TestFirstUsesOnAFreshDatabaseShareASmallPool: 16 LeaseLocks' first
// tries at once, on a database without the tables and a pool of one or two
// connections, all succeed. The try that finds a table missing gives its
// connection back before the upgrade takes one: held while it asked for
// another, every try of the burst failed (each waiting for the pool).
func TestFirstUsesOnAFreshDatabaseShareASmallPool(t *testing.T) {
	testdb.Slow(t, "a fresh database per pool size")
	admin := testdb.OpenPostgres(t, "pgx")
	for _, drv := range testdb.Drivers {
		for _, size := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/pool %d", drv, size), func(t *testing.T) {
				db := testdb.OpenPostgresDSN(t, drv, testdb.WithDatabase(testdb.PostgresDSN(t), freshDatabase(t, admin)))
				db.SetMaxOpenConns(size)
				errs := make([]error, 16)
				var wg sync.WaitGroup
				for i := range errs {
					wg.Go(func() {
						l, err := advisorylock.NewLeaseLock(db, fmt.Sprintf("%s/%d", testdb.UniqueName(t), i))
						if err == nil {
							ctx, cancel := context.WithTimeout(context.Background(), wait)
							defer cancel()
							_, err = l.TryDo(ctx, func(context.Context, advisorylock.Lease) error { return nil })
						}
						errs[i] = err
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatalf("first tries on a fresh database, pool of %d: %v", size, err)
				}
			})
		}
	}
}
