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

func (w *releaseWatch) isOff() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.off
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
