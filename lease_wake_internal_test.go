package advisorylock

import (
	"context"
	"database/sql"
	"testing"
	"time"
	"weak"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// wakeWait bounds every wait in the wake tests.
const wakeWait = testdb.HandoffWait

// farPoll: see testdb.FarPoll.
const farPoll = testdb.FarPoll

// openNamed opens the test server with drv under an application_name of
// its own, by which its sessions (the listener's among them) are found.
func openNamed(t *testing.T, drv string) (*sql.DB, string) {
	t.Helper()
	dsn, app := testdb.AppDSN(t, "alwake")
	return testdb.OpenPostgresDSN(t, drv, dsn), app
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

// holdAndWait makes a holder take name on db and a waiter, polling every
// poll, wait for it there (see testdb.HoldAndWait).
func holdAndWait(t *testing.T, db DB, name string, poll time.Duration) (release func() error, got <-chan error) {
	t.Helper()
	holder, err := NewLeaseLock(db, name)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := NewLeaseLock(db, name, WithPollInterval(poll))
	if err != nil {
		t.Fatal(err)
	}
	return testdb.HoldAndWait(t, holder.TryLock, waiter.Lock)
}

// TestLeaseWaiterWakesOnRelease: with pgx, a waiter blocked in Lock gets
// the lease within a few round trips of the release, long before its
// first poll could come: the release's notification woke it.
func TestLeaseWaiterWakesOnRelease(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	release, got := holdAndWait(t, db, testdb.UniqueName(t), farPoll)
	testdb.ListenerPID(t, admin, app, 0)
	testdb.WokenBy(t, got, release, "the waiter")
}

// TestLeaseWaiterSurvivesAKilledListener: the listener's session is
// terminated (its own pid only) while a waiter waits; the library listens
// again on a new session, and the next release still wakes the waiter.
func TestLeaseWaiterSurvivesAKilledListener(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	release, got := holdAndWait(t, db, testdb.UniqueName(t), farPoll)
	testdb.KillListener(t, admin, app, got)
	testdb.WokenBy(t, got, release, "after its listener was killed, the waiter")
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
			got := testdb.Waiting(waiter.Lock)
			if drv == "pgx" {
				testdb.ListenerPID(t, admin, app, 0)
			}
			if _, err := admin.Exec("UPDATE advisorylock_leases SET owner = NULL, expires_at = now() WHERE name = $1", name); err != nil {
				t.Fatal(err)
			}
			testdb.HandedOff(t, got, time.Now())
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
	release, got := holdAndWait(t, db, testdb.UniqueName(t), 50*time.Millisecond)
	waitWatchOff(t, db)
	if err := release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
	testdb.HandedOff(t, got, time.Now())
}

// holdSlots takes every slot of an n-slot semaphore on name, and starts a
// waiter on it, polling every poll, in a goroutine (see testdb.Waiting);
// it returns the holders' guards and where the waiter's outcome arrives.
func holdSlots(t *testing.T, db DB, name string, n int, poll time.Duration) ([]*Guard, <-chan error) {
	t.Helper()
	holder, err := NewSemaphore(db, name, n)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := NewSemaphore(db, name, n, WithPollInterval(poll))
	if err != nil {
		t.Fatal(err)
	}
	gs := make([]*Guard, n)
	for i := range gs {
		if gs[i], err = holder.TryAcquire(context.Background()); err != nil {
			t.Fatalf("TryAcquire %d of %d: %v", i+1, n, err)
		}
	}
	t.Cleanup(func() {
		for _, g := range gs {
			_ = g.Release(context.Background())
		}
	})
	return gs, testdb.Waiting(waiter.Acquire)
}

// TestSemaphoreWaiterWakesOnRelease: with pgx, a semaphore's waiter gets
// the slot a holder releases within a few round trips of the release,
// whichever slot it is, long before its first poll could come: the
// slot's release notified it. (A waiter on one slot server-side would
// see another slot's release only at its slice's end.)
func TestSemaphoreWaiterWakesOnRelease(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	gs, got := holdSlots(t, db, testdb.UniqueName(t), 3, farPoll)
	testdb.ListenerPID(t, admin, app, 0)
	testdb.WokenBy(t, got, func() error { return gs[1].Release(context.Background()) }, "the semaphore's waiter")
}

// TestSemaphoreWaiterSurvivesAKilledListener: the listener's session is
// terminated while a semaphore's waiter waits; the library listens again,
// and the next slot's release still wakes the waiter.
func TestSemaphoreWaiterSurvivesAKilledListener(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	gs, got := holdSlots(t, db, testdb.UniqueName(t), 2, farPoll)
	testdb.KillListener(t, admin, app, got)
	testdb.WokenBy(t, got, func() error { return gs[0].Release(context.Background()) }, "after its listener was killed, the semaphore's waiter")
}

// TestSemaphoreSlotFreedSilentlyStillHandsOff: a slot freed with no
// notification, by its holder's session ending (terminated by the
// server), still goes to a listening waiter, by its poll.
func TestSemaphoreSlotFreedSilentlyStillHandsOff(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	_, got := holdSlots(t, db, name, 2, 50*time.Millisecond)
	testdb.ListenerPID(t, admin, app, 0)
	s, err := NewSemaphore(db, name, 2)
	if err != nil {
		t.Fatal(err)
	}
	hs, err := s.Holders(context.Background())
	if err != nil || len(hs) != 2 || hs[0].PID == 0 {
		t.Fatalf("Holders = %v, %v; want two, with their sessions", hs, err)
	}
	var killed bool
	if err := admin.QueryRow("SELECT pg_terminate_backend($1)", hs[0].PID).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend(%d) = %v, %v", hs[0].PID, killed, err)
	}
	testdb.HandedOff(t, got, time.Now())
}

// TestSemaphoreWaiterWithoutNotificationsWaitsInSlices: lib/pq delivers
// no notifications to the pool, so the watch goes off and the waiter,
// whose polls come too late to matter, waits server-side in slices and
// still gets a released slot promptly.
func TestSemaphoreWaiterWithoutNotificationsWaitsInSlices(t *testing.T) {
	db, _ := openNamed(t, "postgres")
	gs, got := holdSlots(t, db, testdb.UniqueName(t), 2, farPoll)
	waitWatchOff(t, db)
	testdb.WokenBy(t, got, func() error { return gs[1].Release(context.Background()) }, "the semaphore's waiter in slices")
}
