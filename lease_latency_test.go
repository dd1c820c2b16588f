package advisorylock_test

// A lease holder's local deadline counts from when its acquire or renew
// was sent, not from when the answer came (docs/fencing.md): the answer
// can come late, and the database started the lease's time when it ran
// the statement. These tests make answers late, on a real network (a
// proxy that holds answers back) and on a clock that moves during the
// call.

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestSlowGrantIsLostBeforeItsDatabaseExpiry: the answer to an acquire
// comes back 1.2s after PostgreSQL granted a 1.5s lease. The holder must
// count its second of local deadline from when it sent the acquire, so
// the lease reads lost as it arrives; cut off after that, the holder is
// still told before anyone else is granted the lease.
func TestSlowGrantIsLostBeforeItsDatabaseExpiry(t *testing.T) {
	testdb.Slow(t, "fault: answers held back and the network cut")
	t.Parallel()
	testdb.CheckGoroutines(t) // on the whole test: its subtests run side by side
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel() // a proxy and names of its own
			ctx := context.Background()
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			admin := testdb.OpenPostgres(t, drv)
			name := testdb.UniqueName(t)
			ll := newLeaseLock(t, db, name, quiet, advisorylock.WithLeaseTTL(leaseTTL), advisorylock.WithReleaseTimeout(time.Second))
			// The tables exist and the pool holds a connection before the
			// network slows down.
			releaseLease(t, tryLease(t, newLeaseLock(t, db, testdb.UniqueName(t), quiet)))

			proxy.SetDelay(1200 * time.Millisecond)
			g, err := ll.TryLock(ctx)
			if errors.Is(err, advisorylock.ErrLockLost) {
				return // lost on arrival and said so: as good
			}
			if err != nil {
				t.Fatalf("TryLock over a slow network: %v", err)
			}
			t.Cleanup(func() { proxy.SetDelay(0); proxy.Heal(); _ = g.Release(ctx) })
			if !isLost(g.Lease()) {
				t.Fatal("a lease whose grant took 1.2s of a 1.5s TTL to arrive does not read lost: its deadline counts from the answer, not from the acquire")
			}
			proxy.Cut()
			next := newLeaseLock(t, admin, name, quiet, advisorylock.WithPollInterval(20*time.Millisecond))
			ng, err := next.LockTimeout(ctx, wait)
			if err != nil {
				t.Fatalf("successor: %v", err)
			}
			defer releaseLease(t, ng)
			if !isLost(g.Lease()) {
				t.Fatal("a successor was granted the lease while its cut-off holder believed it held it")
			}
			select {
			case <-g.Lease().Lost():
			case <-time.After(wait):
				t.Fatal("the slow grant's Lost() never closed")
			}
		})
	}
}

// TestLeaseDeadlineCountsFromTheSentAcquire moves the clock during the
// acquire statement on SQLite, where lease times come from the clock: a
// lease whose grant took most of its TTL to arrive is lost on arrival,
// and when the database lets a successor in, the first holder already
// reads lost.
func TestLeaseDeadlineCountsFromTheSentAcquire(t *testing.T) {
	const ttl = 30 * time.Second // renewals every 10s of real time: none runs during the test
	ctx := context.Background()
	clock := testdb.NewFakeClock()
	db, path, during := clockMovedDuring(t, clock, "advisorylock_leases")
	other := testdb.OpenSQLite(t, path, sqliteWAL)
	name := testdb.UniqueName(t)
	sqlite := advisorylock.WithBackend(advisorylock.SQLite())
	a := newLeaseLock(t, db, name, quiet, sqlite, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now))
	b := newLeaseLock(t, other, name, quiet, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now))
	releaseLease(t, tryLease(t, newLeaseLock(t, db, testdb.UniqueName(t), quiet, sqlite, advisorylock.WithClock(clock.Now))))

	const slow = ttl * 5 / 6 // past the local deadline (TTL minus a third), short of the expiry
	during.Store(int64(slow))
	g, err := a.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Release(ctx) }()
	if during.Load() != 0 {
		t.Fatal("the clock never moved during the acquire: nothing was tested")
	}
	if !isLost(g.Lease()) {
		t.Fatalf("a lease granted %v into its %v TTL does not read lost: its deadline counts from the answer", slow, ttl)
	}
	// Lost() closes at the deadline too, not at the first renewal (a
	// third of the TTL later, in real time).
	select {
	case <-g.Lease().Lost():
	case <-time.After(ttl / 6):
		t.Fatalf("Lost() still open %v after a grant that arrived past its deadline", ttl/6)
	}
	assertHeldElsewhere(t, b)
	clock.Add(ttl - slow)
	gb := tryLease(t, b)
	defer releaseLease(t, gb)
	if !isLost(g.Lease()) {
		t.Fatal("a successor was granted the lease while the first holder believed it held it")
	}
}

// TestLateGrantIsLostBeforeTheSectionBegins: a SQLite Lock whose grant
// arrived past its local deadline (the upsert waited on the file's write
// lock most of the TTL, as it can under load) is lost when Do gets it: Do
// does not run its function at all and says the lock was lost; TryDo says
// it did not run it, and why. Before, a goroutine noticed an instant
// later, and a function could run unwarned while a successor was let in
// once the row expired (the soak saw it under CI's load).
func TestLateGrantIsLostBeforeTheSectionBegins(t *testing.T) {
	const ttl = 30 * time.Second
	clock := testdb.NewFakeClock()
	db, _, during := clockMovedDuring(t, clock, "INSERT INTO advisorylock_locks")
	l := newLock(t, db, testdb.UniqueName(t), quiet, advisorylock.WithBackend(advisorylock.SQLite()),
		advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now))
	mustRelease(t, mustTry(t, l)) // the schema, before the clock moves

	during.Store(int64(ttl * 5 / 6)) // past the local deadline (TTL minus a third)
	ran := false
	err := l.Do(context.Background(), func(ctx context.Context) error {
		ran = true
		return nil
	})
	if during.Load() != 0 {
		t.Fatal("the clock never moved during the acquire: nothing was tested")
	}
	if ran || !errors.Is(err, advisorylock.ErrLockLost) {
		t.Fatalf("Do with a grant that arrived past its deadline: function ran %v, Do returned %v; want it not run and ErrLockLost", ran, err)
	}
	// TryDo says the function did not run, and why.
	during.Store(int64(ttl * 5 / 6))
	said, err := l.TryDo(context.Background(), func(ctx context.Context) error {
		ran = true
		return nil
	})
	if ran || said || !errors.Is(err, advisorylock.ErrLockLost) {
		t.Fatalf("TryDo with a grant that arrived past its deadline: function ran %v, TryDo returned (%v, %v); want it not run and (false, ErrLockLost)", ran, said, err)
	}
	// The lock is free again: Do and TryDo released the rows they never used.
	mustRelease(t, mustTry(t, l))
}

// TestLeaseWhoseDeadlinePassedBeforeTheSectionDoesNotRunIt: a grant
// that arrived in time but whose local deadline has passed by the time
// Do would start its function (the caller held up between the two: here
// the Observer's acquire event moves the clock) does not run it, though
// no goroutine of the library has noticed yet: Do returns the loss, as
// Lost would have said.
func TestLeaseWhoseDeadlinePassedBeforeTheSectionDoesNotRunIt(t *testing.T) {
	const ttl = 30 * time.Second // renewals every 10s of real time: none runs during the test
	clock := testdb.NewFakeClock()
	late := &clockMover{clock: clock}
	l := newLeaseLock(t, testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL), testdb.UniqueName(t), quiet,
		advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now), advisorylock.WithObserver(late))
	late.by.Store(int64(ttl * 5 / 6)) // past the local deadline (TTL minus a third)
	ran := false
	err := l.Do(context.Background(), func(context.Context, advisorylock.Lease) error {
		ran = true
		return nil
	})
	if late.by.Load() != 0 {
		t.Fatal("the clock never moved after the acquire: nothing was tested")
	}
	if ran || !errors.Is(err, advisorylock.ErrLockLost) {
		t.Fatalf("Do with a lease whose deadline passed before its function: ran %v, returned %v; want it not run and ErrLockLost", ran, err)
	}
}

// TestRowGuardReadsLostAtItsDeadline: a Lock kept as a lease row (SQLite),
// and a set of such rows, read lost from the local deadline on, as a
// Lease does, though no goroutine of the library has noticed (the
// keeper's timers run on real time, a third of the TTL away).
func TestRowGuardReadsLostAtItsDeadline(t *testing.T) {
	const ttl = 30 * time.Second
	clock := testdb.NewFakeClock()
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
	opts := []advisorylock.Option{quiet, advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now)}
	one := mustTry(t, newLock(t, db, testdb.UniqueName(t), opts...))
	defer mustRelease(t, one)
	set := mustTry(t, newSet(t, db, []string{testdb.UniqueName(t), testdb.UniqueName(t)}, opts...))
	defer mustRelease(t, set)
	for what, g := range map[string]*advisorylock.Guard{"a row": one, "a set of rows": set} {
		if isClosed(g.Lost()) {
			t.Fatalf("%s reads lost as granted", what)
		}
	}
	clock.Add(ttl * 5 / 6) // past the local deadline (TTL minus a third), short of the expiry
	for what, g := range map[string]*advisorylock.Guard{"a row": one, "a set of rows": set} {
		if !isClosed(g.Lost()) {
			t.Errorf("%s past its local deadline does not read lost", what)
		}
	}
}

// clockMover moves clock by the amount stored in by (once: by is zeroed)
// when an acquire ends with a grant, before the caller gets it.
type clockMover struct {
	clock *testdb.FakeClock
	by    atomic.Int64
}

func (m *clockMover) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	if e.Type == advisorylock.EventAcquireEnd && e.Outcome == advisorylock.OutcomeAcquired {
		m.clock.Add(time.Duration(m.by.Swap(0)))
	}
	return ctx
}

// clockMovedDuring opens a new SQLite file whose statements containing
// part move clock, before they run, by the amount stored in the returned
// counter (once: the counter is zeroed), to make an answer arrive late
// by the library's clock. It returns the pool and the file's path.
func clockMovedDuring(t *testing.T, clock *testdb.FakeClock, part string) (*sql.DB, string, *atomic.Int64) {
	t.Helper()
	during := new(atomic.Int64)
	path := testdb.SQLitePath(t)
	db := testdb.OpenHooked(t, "sqlite", path+"?"+sqliteWAL, testdb.Hooks{Before: func(q string, _ []any) {
		if strings.Contains(q, part) {
			clock.Add(time.Duration(during.Swap(0)))
		}
	}})
	return db, path, during
}
