package advisorylockpq_test

import (
	"context"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockpq"
	"github.com/advisorylock/advisorylock/internal/testdb"
	_ "github.com/lib/pq"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// wrapped opens the test server with lib/pq under an application_name of
// its own (by which its sessions, the listener's among them, are found)
// and wraps it.
func wrapped(t *testing.T) (*advisorylockpq.DB, string) {
	t.Helper()
	dsn, app := testdb.AppDSN(t, "alpq")
	return advisorylockpq.Wrap(testdb.OpenPostgresDSN(t, "postgres", dsn), dsn), app
}

// holdAndWait makes a holder take name on db and a waiter, polling every
// poll, wait for it there (see testdb.HoldAndWait).
func holdAndWait(t *testing.T, db advisorylock.DB, name string, poll time.Duration) (release func() error, got <-chan error) {
	t.Helper()
	holder, err := advisorylock.NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := advisorylock.NewLeaseLock(db, name, advisorylock.WithPollInterval(poll))
	if err != nil {
		t.Fatal(err)
	}
	return testdb.HoldAndWait(t, holder.TryLock, waiter.Lock)
}

// TestWaiterWakesOnRelease: on lib/pq, wrapped, a waiter blocked in Lock
// gets the lease within a few round trips of the release, long before its
// first poll could come: the release's notification, heard by the
// pq.Listener, woke it.
func TestWaiterWakesOnRelease(t *testing.T) {
	db, app := wrapped(t)
	admin := testdb.OpenPostgres(t, "postgres")
	release, got := holdAndWait(t, db, testdb.UniqueName(t), testdb.FarPoll)
	testdb.ListenerPID(t, admin, app, 0)
	testdb.WokenBy(t, got, release, "the waiter")
}

// TestWaiterWakesAfterItsListenerWasKilled: the listener's session is
// terminated while a waiter waits; a new listener LISTENs, and the next
// release still wakes the waiter.
func TestWaiterWakesAfterItsListenerWasKilled(t *testing.T) {
	db, app := wrapped(t)
	admin := testdb.OpenPostgres(t, "postgres")
	release, got := holdAndWait(t, db, testdb.UniqueName(t), testdb.FarPoll)
	testdb.KillListener(t, admin, app, got)
	testdb.WokenBy(t, got, release, "after its listener was killed, the waiter")
}

// TestSemaphoreWaiterWakesOnRelease: on lib/pq, wrapped, a semaphore's
// waiter is woken by the release of a slot, whichever it is, through the
// pq.Listener (unwrapped, it would wait server-side on one slot in
// slices, polling every FarPoll).
func TestSemaphoreWaiterWakesOnRelease(t *testing.T) {
	db, app := wrapped(t)
	admin := testdb.OpenPostgres(t, "postgres")
	name := testdb.UniqueName(t)
	holder, err := advisorylock.NewSemaphore(db, name, 2)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := advisorylock.NewSemaphore(db, name, 2, advisorylock.WithPollInterval(testdb.FarPoll))
	if err != nil {
		t.Fatal(err)
	}
	third, err := holder.TryAcquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = third.Release(context.Background()) }()
	release, got := testdb.HoldAndWait(t, holder.TryAcquire, waiter.Acquire)
	testdb.ListenerPID(t, admin, app, 0)
	testdb.WokenBy(t, got, release, "the semaphore's waiter")
}

// TestListenerTakesNoPoolConnection: the listener is a connection of its
// own, so a pool of one connection still has it free for the holder's
// release while a waiter waits (a listener from the pool would need a
// second one), and the waiter is still woken.
func TestListenerTakesNoPoolConnection(t *testing.T) {
	db, app := wrapped(t)
	db.SetMaxOpenConns(1)
	admin := testdb.OpenPostgres(t, "postgres")
	release, got := holdAndWait(t, db, testdb.UniqueName(t), testdb.FarPoll)
	testdb.ListenerPID(t, admin, app, 0)
	if n := db.Stats().OpenConnections; n > 1 {
		t.Fatalf("the pool has %d connections open; want at most its limit, 1", n)
	}
	testdb.WokenBy(t, got, release, "the waiter")
}

// TestThroughATransactionPoolerWaitersPoll: behind PgBouncer in
// transaction mode the library does not listen, wrapped or not, and a
// waiter gets the lease by its poll.
func TestThroughATransactionPoolerWaitersPoll(t *testing.T) {
	txDSN, _ := testdb.PgBouncer(t)
	db := advisorylockpq.Wrap(testdb.OpenPostgresDSN(t, "postgres", txDSN), txDSN)
	release, got := holdAndWait(t, db, testdb.UniqueName(t), 50*time.Millisecond)
	if err := release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	testdb.HandedOff(t, got, time.Now())
}
