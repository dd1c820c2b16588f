package advisorylockpq_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockpq"
	"github.com/advisorylock/advisorylock/internal/testdb"
	_ "github.com/lib/pq"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// wait bounds every wait in these tests.
const wait = 30 * time.Second

// farPoll is a poll interval whose first poll comes 5s after a wait
// starts at the earliest: a waiter that has the lease well within that
// was woken, not polled.
const farPoll = 10 * time.Second

// promptly bounds a woken handoff: generous for a loaded machine, and
// still well under farPoll's first poll.
const promptly = 2 * time.Second

var appSeq atomic.Int64

// wrapped opens dsn with lib/pq under an application_name of its own (by
// which its sessions, the listener's among them, are found) and wraps it.
func wrapped(t *testing.T, dsn string) (*advisorylockpq.DB, string) {
	t.Helper()
	app := fmt.Sprintf("alpq%d_%d", time.Now().UnixNano()%1e9, appSeq.Add(1))
	dsn += "&application_name=" + app
	return advisorylockpq.Wrap(testdb.OpenPostgresDSN(t, "postgres", dsn), dsn), app
}

// listenerPID waits until a session of app other than old has run its
// LISTEN and sits idle (listening), and returns its pid.
func listenerPID(t *testing.T, admin *sql.DB, app string, old int) int {
	t.Helper()
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		var pid int
		err := admin.QueryRow(`SELECT pid FROM pg_stat_activity
WHERE application_name = $1 AND query LIKE 'LISTEN %' AND state = 'idle' AND pid <> $2`, app, old).Scan(&pid)
		if err == nil {
			return pid
		}
		if err != sql.ErrNoRows {
			t.Fatalf("looking for the listener of %s: %v", app, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the server for the event
	}
	t.Fatalf("no listener of %s within %v", app, wait)
	return 0
}

// waitFor starts l.Lock in a goroutine and returns where its outcome
// arrives.
func waitFor(l *advisorylock.LeaseLock) <-chan error {
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		g, err := l.Lock(ctx)
		if err == nil {
			err = g.Release(context.Background())
		}
		got <- err
	}()
	return got
}

// handedOff waits for the waiter's outcome and returns how long after
// since it came.
func handedOff(t *testing.T, got <-chan error, since time.Time) time.Duration {
	t.Helper()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter: %v", err)
		}
		return time.Since(since)
	case <-time.After(wait):
		t.Fatalf("the waiter never got the lease")
		return 0
	}
}

// holdAndWait makes a holder take name on db and a waiter (first poll
// after 5s) wait for it there.
func holdAndWait(t *testing.T, db advisorylock.DB, name string) (advisorylock.Lease, func() error, <-chan error) {
	t.Helper()
	holder, err := advisorylock.NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := advisorylock.NewLeaseLock(db, name, advisorylock.WithPollInterval(farPoll))
	if err != nil {
		t.Fatal(err)
	}
	g, err := holder.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	return g.Lease(), func() error { return g.Release(context.Background()) }, waitFor(waiter)
}

// TestWaiterWakesOnRelease: on lib/pq, wrapped, a waiter blocked in Lock
// gets the lease within a few round trips of the release, long before its
// first poll could come: the release's notification, heard by the
// pq.Listener, woke it.
func TestWaiterWakesOnRelease(t *testing.T) {
	db, app := wrapped(t, testdb.PostgresDSN(t))
	admin := testdb.OpenPostgres(t, "postgres")
	_, release, got := holdAndWait(t, db, testdb.UniqueName(t))
	listenerPID(t, admin, app, 0)
	released := time.Now()
	if err := release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if d := handedOff(t, got, released); d > promptly {
		t.Fatalf("the waiter got the lease %v after the release; woken, it takes a few round trips (its first poll comes after 5s)", d)
	}
}

// TestWaiterWakesAfterItsListenerWasKilled: the listener's session is
// terminated while a waiter waits; a new listener LISTENs, and the next
// release still wakes the waiter.
func TestWaiterWakesAfterItsListenerWasKilled(t *testing.T) {
	db, app := wrapped(t, testdb.PostgresDSN(t))
	admin := testdb.OpenPostgres(t, "postgres")
	_, release, got := holdAndWait(t, db, testdb.UniqueName(t))
	pid := listenerPID(t, admin, app, 0)
	var killed bool
	if err := admin.QueryRow("SELECT pg_terminate_backend($1)", pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, killed, err)
	}
	listenerPID(t, admin, app, pid)
	select {
	case err := <-got:
		t.Fatalf("the waiter returned while the lease was held: %v", err)
	default:
	}
	released := time.Now()
	if err := release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if d := handedOff(t, got, released); d > promptly {
		t.Fatalf("after its listener was killed, the waiter got the lease %v after the release (its first poll comes after 5s)", d)
	}
}

// TestListenerTakesNoPoolConnection: the listener is a connection of its
// own, so a pool of one connection still has it free for the holder's
// release while a waiter waits (a listener from the pool would need a
// second one), and the waiter is still woken.
func TestListenerTakesNoPoolConnection(t *testing.T) {
	db, app := wrapped(t, testdb.PostgresDSN(t))
	db.SetMaxOpenConns(1)
	admin := testdb.OpenPostgres(t, "postgres")
	_, release, got := holdAndWait(t, db, testdb.UniqueName(t))
	listenerPID(t, admin, app, 0)
	if n := db.Stats().OpenConnections; n > 1 {
		t.Fatalf("the pool has %d connections open; want at most its limit, 1", n)
	}
	released := time.Now()
	if err := release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if d := handedOff(t, got, released); d > promptly {
		t.Fatalf("the waiter got the lease %v after the release (its first poll comes after 5s)", d)
	}
}

// TestThroughATransactionPoolerWaitersPoll: behind PgBouncer in
// transaction mode the library does not listen, wrapped or not, and a
// waiter gets the lease by its poll.
func TestThroughATransactionPoolerWaitersPoll(t *testing.T) {
	txDSN, _ := testdb.PgBouncer(t)
	db := advisorylockpq.Wrap(testdb.OpenPostgresDSN(t, "postgres", txDSN), txDSN)
	name := testdb.UniqueName(t)
	holder, err := advisorylock.NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := advisorylock.NewLeaseLock(db, name, advisorylock.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	g, err := holder.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	got := waitFor(waiter)
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	handedOff(t, got, time.Now())
}
