package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// wakeWait bounds every wait in the wake tests.
const wakeWait = 30 * time.Second

// farPoll is a poll interval whose first poll comes 5s after a wait
// starts at the earliest (see pollPause): a waiter that has the lease
// well within that was woken, not polled.
const farPoll = 10 * time.Second

// promptly bounds a woken handoff: generous for a loaded machine, and
// still well under farPoll's first poll.
const promptly = 2 * time.Second

var appSeq atomic.Int64

// openNamed opens the test server with drv under an application_name of
// its own, by which its sessions (the listener's among them) are found.
func openNamed(t *testing.T, drv string) (*sql.DB, string) {
	t.Helper()
	app := fmt.Sprintf("alwake%d_%d", time.Now().UnixNano()%1e9, appSeq.Add(1))
	return testdb.OpenPostgresDSN(t, drv, testdb.PostgresDSN(t)+"&application_name="+app), app
}

// listenerPID waits until a session of app has run its LISTEN and sits
// idle (listening), other than old, and returns its pid.
func listenerPID(t *testing.T, admin *sql.DB, app string, old int) int {
	t.Helper()
	deadline := time.Now().Add(wakeWait)
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
	t.Fatalf("no listener of %s within %v", app, wakeWait)
	return 0
}

// waitFor starts l.Lock in a goroutine and returns where its outcome
// arrives.
func waitFor(l *LeaseLock) <-chan error {
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wakeWait)
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
	case <-time.After(wakeWait):
		t.Fatalf("the waiter never got the lease")
		return 0
	}
}

// watchOf returns db's release watch, nil if none was made.
func watchOf(db *sql.DB) *releaseWatch {
	verdicts.mu.Lock()
	v := verdicts.m[weak.Make(db)]["release watch"]
	verdicts.mu.Unlock()
	if v == nil {
		return nil
	}
	<-v.done
	w, _ := v.val.(*releaseWatch)
	return w
}

// waitWatchOff waits until db's release watch is off: its store said it
// cannot listen there.
func waitWatchOff(t *testing.T, db *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(wakeWait)
	for w := watchOf(db); w == nil || !w.isOff(); w = watchOf(db) {
		if time.Now().After(deadline) {
			t.Fatalf("the release watch is %+v after %v; want it off", w, wakeWait)
		}
		time.Sleep(10 * time.Millisecond) // polling for the event
	}
}

func (w *releaseWatch) isOff() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.off
}

// TestLeaseWaiterWakesOnRelease: with pgx, a waiter blocked in Lock gets
// the lease within a few round trips of the release, long before its
// first poll could come: the release's notification woke it.
func TestLeaseWaiterWakesOnRelease(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	holder, err := NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := NewLeaseLock(db, name, WithPollInterval(farPoll))
	if err != nil {
		t.Fatal(err)
	}
	g, err := holder.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	got := waitFor(waiter)
	listenerPID(t, admin, app, 0)
	released := time.Now()
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if d := handedOff(t, got, released); d > promptly {
		t.Fatalf("the waiter got the lease %v after the release; woken, it takes a few round trips (its first poll comes after 5s)", d)
	}
}

// TestLeaseWaiterSurvivesAKilledListener: the listener's session is
// terminated (its own pid only) while a waiter waits; the library listens
// again on a new session, and the next release still wakes the waiter.
func TestLeaseWaiterSurvivesAKilledListener(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	holder, err := NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := NewLeaseLock(db, name, WithPollInterval(farPoll))
	if err != nil {
		t.Fatal(err)
	}
	g, err := holder.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	got := waitFor(waiter)
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
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if d := handedOff(t, got, released); d > promptly {
		t.Fatalf("after its listener was killed, the waiter got the lease %v after the release (its first poll comes after 5s)", d)
	}
}

// TestLeaseHandoffWithoutNotificationPolls: a lease freed without a
// notification (as if it were lost: the row written directly) still goes
// to the waiter, by its poll, on both drivers; lib/pq, which delivers no
// notifications, never listens.
func TestLeaseHandoffWithoutNotificationPolls(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, app := openNamed(t, drv)
			admin := testdb.OpenPostgres(t, drv)
			name := testdb.UniqueName(t)
			holder, err := NewLeaseLock(db, name, WithLeaseTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			waiter, err := NewLeaseLock(db, name, WithPollInterval(50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			g, err := holder.TryLock(context.Background())
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			defer func() { _ = g.Release(context.Background()) }()
			got := waitFor(waiter)
			if drv == "pgx" {
				listenerPID(t, admin, app, 0)
			}
			if _, err := admin.Exec("UPDATE advisorylock_leases SET owner = NULL, expires_at = now() WHERE name = $1", name); err != nil {
				t.Fatal(err)
			}
			handedOff(t, got, time.Now())
			if drv != "pgx" {
				waitWatchOff(t, db)
			}
		})
	}
}

// TestLeaseWaiterThroughTransactionPoolPolls: behind a transaction-mode
// PgBouncer a LISTEN would stay on whichever server session ran it, so
// the waiter does not listen (the watch is off) and polls, and the
// handoff works.
func TestLeaseWaiterThroughTransactionPoolPolls(t *testing.T) {
	txDSN, _ := testdb.PgBouncer(t)
	db := testdb.OpenPostgresDSN(t, "pgx", txDSN+"&default_query_exec_mode=exec")
	name := testdb.UniqueName(t)
	holder, err := NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := NewLeaseLock(db, name, WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	g, err := holder.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	got := waitFor(waiter)
	waitWatchOff(t, db)
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	handedOff(t, got, time.Now())
}
