package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// listeningMapBackend is a third party's LeaseStore that signals
// releases (a ReleaseListener): the map backend, whose releases it tells
// its listener of through a channel.
type listeningMapBackend struct {
	*mapBackend
	releases chan int64
	listen   chan struct{} // closed when the listener may say it is ready
	misses   *atomic.Int32 // acquires that found the lease held
}

func (m listeningMapBackend) AcquireLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	g, err := m.mapBackend.AcquireLease(ctx, db, r)
	if errors.Is(err, advisorylock.ErrNotAcquired) {
		m.misses.Add(1)
	}
	return g, err
}

var _ backend.ReleaseListener = listeningMapBackend{}

func (m listeningMapBackend) ReleaseLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	err := m.mapBackend.ReleaseLease(ctx, db, r)
	select {
	case m.releases <- r.Key:
	default: // a release nobody hears: the waiter's poll finds it
	}
	return err
}

func (m listeningMapBackend) ListenReleases(ctx context.Context, _ backend.DB, _ *sql.Conn, ready func(), released func(key int64)) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.listen:
	}
	ready()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case key := <-m.releases:
			released(key)
		}
	}
}

// TestThirdBackendWakesLeaseWaiters: a LeaseLock waiter on a third
// party's store that signals releases is woken by the release it hears,
// long before its first poll (5s at the earliest). The handle only lends
// the listener a connection.
func TestThirdBackendWakesLeaseWaiters(t *testing.T) {
	const farPoll, promptly = 10 * time.Second, 2 * time.Second
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
	b := listeningMapBackend{newMapBackend(), make(chan int64, 16), make(chan struct{}), new(atomic.Int32)}
	name := testdb.UniqueName(t)
	holder := newLeaseLock(t, db, name, advisorylock.WithBackend(b))
	waiter := newLeaseLock(t, db, name, advisorylock.WithBackend(b), advisorylock.WithPollInterval(farPoll))
	g := tryLease(t, holder)
	got := testdb.Waiting(waiter.Lock)
	// The waiter misses and waits; its listener then gets ready, which
	// wakes it to try again (a release may have gone unheard before), and
	// that miss leaves it waiting for its poll, or for a release heard.
	testdb.WaitFor(t, leaseWait, func() bool { return b.misses.Load() >= 1 }, "the waiter made no attempt")
	close(b.listen)
	testdb.WaitFor(t, leaseWait, func() bool { return b.misses.Load() >= 2 }, "the listener's readiness did not wake the waiter")
	released := time.Now()
	releaseLease(t, g)
	if d := testdb.HandedOff(t, got, released); d > promptly {
		t.Fatalf("the waiter got the lease %v after the release; woken, it takes a moment", d)
	}
}

// TestPassedOverWaiterQueuesWithoutTrying: two LeaseLock waiters wait for
// a held lease, the first in line; the release hands the lease to it, and
// the second, woken by the same release, takes the place next in line at
// once without trying to take the lease, which the handover holds again.
// The second runs through a third party's backend that counts its calls.
func TestPassedOverWaiterQueuesWithoutTrying(t *testing.T) {
	admin := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	g, err := newLeaseLock(t, admin, name).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testdb.HandoffWait)
	defer cancel()
	waitFor := func(l *advisorylock.LeaseLock) <-chan *advisorylock.LeaseGuard {
		got := make(chan *advisorylock.LeaseGuard, 1)
		go func() {
			g, err := l.Lock(ctx)
			if err != nil {
				t.Errorf("%s's waiter: %v", l.Name(), err)
			}
			got <- g
		}()
		return got
	}
	placed := func() (next string) {
		_ = admin.QueryRow("SELECT next_owner FROM advisorylock_leases WHERE name = $1 AND next_owner IS NOT NULL", name).Scan(&next)
		return next
	}

	first := newLeaseLock(t, testdb.OpenPostgres(t, "pgx"), name, advisorylock.WithPollInterval(testdb.FarPoll))
	gotFirst := waitFor(first)
	testdb.WaitFor(t, testdb.HandoffWait, func() bool { return placed() != "" }, "the first waiter never took its place in line")
	firstPlace := placed()

	c := &calls{n: map[string]int{}}
	dsn, app := testdb.AppDSN(t, "alpassed")
	second := newLeaseLock(t, testdb.OpenPostgresDSN(t, "pgx", dsn), name,
		advisorylock.WithBackend(party{inner: advisorylock.Postgres(), calls: c}), advisorylock.WithPollInterval(testdb.FarPoll))
	gotSecond := waitFor(second)
	testdb.ListenerPID(t, admin, app, 0)
	// The second waiter's first pass tries and asks for a place; the wake
	// its listener sends once it listens makes a second pass, which does
	// both again. Counted once that pass has been told no, so that no pass
	// is between its try and its place, nor waiting for its answer (a place
	// asked for before the release and answered after it is granted).
	var tries, queues int
	testdb.WaitFor(t, testdb.HandoffWait, func() bool {
		answered := c.count("LeaseQueuer.QueueLease returned")
		queues, tries = c.count("LeaseQueuer.QueueLease"), c.count("LeaseStore.AcquireLease")
		return answered >= 2 && answered == queues && tries == queues
	}, "the second waiter never asked for a place in line after its listener listened")

	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	gf := <-gotFirst
	if gf == nil {
		t.FailNow()
	}
	testdb.WaitFor(t, testdb.Promptly, func() bool { next := placed(); return next != "" && next != firstPlace },
		"the second waiter did not take the place next in line promptly after the handover")
	if n := c.count("LeaseStore.AcquireLease"); n != tries {
		t.Errorf("the passed-over waiter tried to take the lease %d times after the handover; want none", n-tries)
	}
	if n := c.count("LeaseQueuer.QueueLease"); n != queues+1 {
		t.Errorf("the passed-over waiter asked for a place %d times after the handover; want once", n-queues)
	}
	if err := gf.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if gs := <-gotSecond; gs != nil {
		_ = gs.Release(context.Background())
	}
}
