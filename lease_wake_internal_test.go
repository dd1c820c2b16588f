package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/internal/testdb"

	"github.com/advisorylock/advisorylock/internal/dbutil"
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
	v, _ := dbutil.Decided(db, "release watch")
	w, _ := v.(*releaseWatch)
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
	t.Parallel() // a name and a pool of its own, found by its own application_name
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
	t.Parallel() // a name and a pool of its own, found by its own application_name
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
	t.Parallel() // a name and a pool of its own, found by its own application_name
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
			// The waiter has missed once it listens (pgx), or once its
			// watch found it cannot (lib/pq): only then is the row freed,
			// so its poll, not its first try, takes the lease.
			if drv == "pgx" {
				testdb.ListenerPID(t, admin, app, 0)
			} else {
				waitWatchOff(t, db)
			}
			if _, err := admin.Exec("UPDATE advisorylock_leases SET owner = NULL, expires_at = now() WHERE name = $1", name); err != nil {
				t.Fatal(err)
			}
			testdb.HandedOff(t, got, time.Now())
		})
	}
}

// TestLeaseWaiterThroughTransactionPoolPolls: behind a transaction-mode
// PgBouncer a LISTEN would stay on whichever server session ran it, so
// the waiter does not listen (the watch is off) and polls, and the
// handoff works.
func TestLeaseWaiterThroughTransactionPoolPolls(t *testing.T) {
	t.Parallel() // names and pools of its own
	txDSN, _ := testdb.PgBouncer(t)
	for drv, dsn := range map[string]string{"pgx": txDSN + "&default_query_exec_mode=exec", "postgres": txDSN} {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgresDSN(t, drv, dsn)
			release, got := holdAndWait(t, db, testdb.UniqueName(t), 50*time.Millisecond)
			waitWatchOff(t, db)
			if err := release(); err != nil {
				t.Fatalf("Release: %v", err)
			}
			testdb.HandedOff(t, got, time.Now())
		})
	}
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
	t.Parallel() // a name and a pool of its own, found by its own application_name
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
	t.Parallel() // a name and a pool of its own, found by its own application_name
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
	t.Parallel() // a name and a pool of its own, found by its own application_name
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
	t.Parallel() // a name and a pool of its own, found by its own application_name
	db, _ := openNamed(t, "postgres")
	gs, got := holdSlots(t, db, testdb.UniqueName(t), 2, farPoll)
	waitWatchOff(t, db)
	testdb.WokenBy(t, got, func() error { return gs[1].Release(context.Background()) }, "the semaphore's waiter in slices")
}

// queuedWaiter starts a waiter on name in a goroutine and waits until it
// has its place next in line (the row's next_owner), which it returns
// with the place's token and where the waiter's guard arrives.
func queuedWaiter(t *testing.T, admin *sql.DB, waiter *LeaseLock) (place string, token FencingToken, got <-chan *LeaseGuard) {
	t.Helper()
	out := make(chan *LeaseGuard, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wakeWait)
		defer cancel()
		g, err := waiter.Lock(ctx)
		if err != nil {
			t.Errorf("the queued waiter: %v", err)
		}
		out <- g
	}()
	testdb.WaitFor(t, wakeWait, func() bool {
		err := admin.QueryRow("SELECT next_owner, next_generation FROM advisorylock_leases WHERE name = $1 AND next_owner IS NOT NULL", waiter.Name()).Scan(&place, &token)
		return err == nil
	}, "the waiter never took its place in line")
	return place, token, out
}

// holdThenQueue takes name on holderDB (a lease of holderTTL) and queues
// a waiter on waiterDB (of waiterTTL, polling every poll; see
// queuedWaiter); it returns the holder's guard and the waiter's place,
// token and outcome.
func holdThenQueue(t *testing.T, admin, holderDB, waiterDB *sql.DB, name string, holderTTL, waiterTTL, poll time.Duration) (*LeaseGuard, string, FencingToken, <-chan *LeaseGuard) {
	t.Helper()
	holder, err := NewLeaseLock(holderDB, name, WithLeaseTTL(holderTTL))
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := NewLeaseLock(waiterDB, name, WithLeaseTTL(waiterTTL), WithPollInterval(poll))
	if err != nil {
		t.Fatal(err)
	}
	g, err := holder.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	place, token, got := queuedWaiter(t, admin, waiter)
	return g, place, token, got
}

// handedOver releases ga and returns the guard its waiter gets from got,
// failing unless it arrives within testdb.Promptly of the release.
func handedOver(t *testing.T, ga *LeaseGuard, got <-chan *LeaseGuard, waiter string) *LeaseGuard {
	t.Helper()
	released := time.Now()
	if err := ga.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case gb := <-got:
		if gb == nil {
			t.FailNow()
		}
		t.Logf("handed over in %v", time.Since(released))
		return gb
	case <-time.After(testdb.Promptly):
		t.Fatalf("%s did not have the lease %v after the release", waiter, testdb.Promptly)
	}
	return nil
}

// leaseRow reads name's row: owner ("" when free), token, place.
func leaseRow(t *testing.T, admin *sql.DB, name string) (owner string, token FencingToken, next string) {
	t.Helper()
	var o, n sql.NullString
	if err := admin.QueryRow("SELECT owner, generation, next_owner FROM advisorylock_leases WHERE name = $1", name).Scan(&o, &token, &n); err != nil {
		t.Fatalf("reading the row of %s: %v", name, err)
	}
	return o.String, token, n.String
}

// TestLeaseReleaseHandsOverToTheQueuedWaiter: with pgx, a waiter blocked
// in Lock takes the place next in line, and the holder's release hands it
// the lease: it returns within a few round trips, long before its first
// poll, holding the token its place drew (a lease it took itself would
// carry a new one), and its lease renews and releases as any other.
func TestLeaseReleaseHandsOverToTheQueuedWaiter(t *testing.T) {
	db, app := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	const ttl = 1500 * time.Millisecond // renewals every 500ms
	ga, place, token, got := holdThenQueue(t, admin, admin, db, name, ttl, ttl, farPoll)
	testdb.ListenerPID(t, admin, app, 0)
	gb := handedOver(t, ga, got, "the queued waiter")
	if gb.Lease().Token() != token || token <= ga.Lease().Token() {
		t.Fatalf("handed over with token %d; its place drew %d, the holder's was %d", gb.Lease().Token(), token, ga.Lease().Token())
	}
	if owner, rowToken, next := leaseRow(t, admin, name); owner != place || rowToken != token || next != "" {
		t.Fatalf("row after the handover: owner %q token %d next %q; want %q, %d and no place", owner, rowToken, next, place, token)
	}
	var renewed bool
	testdb.WaitFor(t, wakeWait, func() bool {
		err := admin.QueryRow("SELECT expires_at > acquired_at + $2::interval FROM advisorylock_leases WHERE name = $1", name, ttl.String()).Scan(&renewed)
		return err == nil && renewed
	}, "the handed-over lease was never renewed")
	if leaseLost(gb.Lease()) {
		t.Fatal("the handed-over lease reads lost after a renewal")
	}
	if err := gb.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if owner, _, _ := leaseRow(t, admin, name); owner != "" {
		t.Fatalf("the handed-over lease is still held by %q after its release", owner)
	}
}

// waiterOnHeldLease returns a waiter, with opts, for a new name that
// holder holds (see leaseHeldBy), on a pool of its own (see openNamed),
// with that pool's application_name and an admin pool.
func waiterOnHeldLease(t *testing.T, holder string, opts ...Option) (waiter *LeaseLock, app string, admin *sql.DB) {
	t.Helper()
	db, app := openNamed(t, "pgx")
	admin = testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	leaseHeldBy(t, admin, name, holder)
	waiter, err := NewLeaseLock(db, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return waiter, app, admin
}

// leaseHeldBy writes name's row as held by owner for a minute, with a
// token of the sequence's, as a holder elsewhere would.
func leaseHeldBy(t *testing.T, admin *sql.DB, name, owner string) {
	t.Helper()
	if _, err := admin.Exec(`INSERT INTO advisorylock_leases (name, owner, generation, acquired_at, expires_at)
VALUES ($1, $2, nextval('advisorylock_token_seq'), now(), now() + interval '1 minute')`, name, owner); err != nil {
		t.Fatal(err)
	}
}

// handOverUnheard hands name's lease to the waiter whose place is in its
// row, as a release does, without a notification.
func handOverUnheard(t *testing.T, admin *sql.DB, name string) {
	t.Helper()
	if _, err := admin.Exec(`UPDATE advisorylock_leases SET owner = next_owner, generation = next_generation, acquired_at = now(),
	expires_at = next_expires_at, next_owner = NULL, next_generation = NULL, next_expires_at = NULL WHERE name = $1`, name); err != nil {
		t.Fatal(err)
	}
}

// TestUnheardHandoverIsFoundByThePoll: the lease is handed over to the
// queued waiter without a notification (the row written directly, as if
// the notification were lost); the waiter's poll reads that the lease is
// its own and returns with it.
func TestUnheardHandoverIsFoundByThePoll(t *testing.T) {
	t.Parallel() // a name and a pool of its own, found by its own application_name
	waiter, app, admin := waiterOnHeldLease(t, "gone", WithPollInterval(50*time.Millisecond))
	name := waiter.Name()
	_, token, got := queuedWaiter(t, admin, waiter)
	testdb.ListenerPID(t, admin, app, 0)
	handOverUnheard(t, admin, name)
	select {
	case g := <-got:
		if g == nil {
			t.FailNow()
		}
		if g.Lease().Token() != token {
			t.Fatalf("found the handover with token %d; its place drew %d", g.Lease().Token(), token)
		}
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	case <-time.After(wakeWait):
		t.Fatal("the waiter never found the lease handed over to it")
	}
}

// TestGrantHeardForAnEarlierPlaceIsRead: a waiter whose place was
// consumed without its knowing (handed over, expired, the lease taken by
// another) queues again and draws a new token; the signal of that old
// handover, heard only now (a listener's connection can lag), names the
// waiter but not the new place. The waiter reads the row instead of
// taking the signal's word, so it does not hold a lease that another
// holds; it gets the lease when that holder lets it go.
func TestGrantHeardForAnEarlierPlaceIsRead(t *testing.T) {
	t.Parallel() // a name and a pool of its own, found by its own application_name
	// A TTL of a second: the place is renewed every 333ms.
	waiter, app, admin := waiterOnHeldLease(t, "first", WithLeaseTTL(time.Second), WithPollInterval(farPoll))
	name := waiter.Name()
	place, first, got := queuedWaiter(t, admin, waiter)
	testdb.ListenerPID(t, admin, app, 0)
	// The place was handed over and the grant ran out unnoticed; another
	// took the lease. The waiter's next renewal finds no place of its own.
	if _, err := admin.Exec(`UPDATE advisorylock_leases SET owner = 'other', generation = nextval('advisorylock_token_seq'), acquired_at = now(),
	expires_at = now() + interval '1 minute', next_owner = NULL, next_generation = NULL, next_expires_at = NULL WHERE name = $1`, name); err != nil {
		t.Fatal(err)
	}
	var second FencingToken
	testdb.WaitFor(t, wakeWait, func() bool {
		err := admin.QueryRow("SELECT next_generation FROM advisorylock_leases WHERE name = $1 AND next_owner = $2", name, place).Scan(&second)
		return err == nil && second != first
	}, "the waiter never queued again")
	var placed time.Time
	if err := admin.QueryRow("SELECT next_expires_at FROM advisorylock_leases WHERE name = $1", name).Scan(&placed); err != nil {
		t.Fatal(err)
	}
	// The old handover's signal arrives now.
	if _, err := admin.Exec("SELECT pg_notify('advisorylock_leases', $1)", fmt.Sprintf("%d %s", Key(name), place)); err != nil {
		t.Fatal(err)
	}
	// A renewal of the new place after the signal: the pass the signal
	// woke has run, and had it taken the lease there would be no place.
	var early *LeaseGuard
	testdb.WaitFor(t, wakeWait, func() bool {
		select {
		case early = <-got:
			return true
		default:
		}
		var renewed bool
		err := admin.QueryRow("SELECT next_expires_at > $2 FROM advisorylock_leases WHERE name = $1 AND next_owner IS NOT NULL", name, placed).Scan(&renewed)
		return err == nil && renewed
	}, "the waiter stopped renewing its place")
	if early != nil {
		owner, token, _ := leaseRow(t, admin, name)
		_ = early.Release(context.Background())
		t.Fatalf("the waiter took the lease with token %d on an old signal; the row says %q holds %d", early.Lease().Token(), owner, token)
	}
	handOverUnheard(t, admin, name)
	select {
	case g := <-got:
		if g == nil {
			t.FailNow()
		}
		if owner, token, _ := leaseRow(t, admin, name); owner != place || token != g.Lease().Token() {
			t.Fatalf("the waiter holds token %d; the row says %q holds %d", g.Lease().Token(), owner, token)
		}
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	case <-time.After(wakeWait):
		t.Fatal("the waiter never found the lease handed over to its new place")
	}
}

// TestHandedOverLeaseWithLittleLeftRenewsInTime: a lease handed over on
// a place sent one renew interval before (the place was due for renewal
// when the release came) has one interval left, not two; its keeper
// renews it halfway there rather than at its deadline, where it would
// only find it lost.
func TestHandedOverLeaseWithLittleLeftRenewsInTime(t *testing.T) {
	t.Parallel() // a name of its own
	db := testdb.OpenPostgres(t, "pgx")
	const ttl = 3 * time.Second // renew every second; the local deadline 2s after sending
	ll, err := NewLeaseLock(db, testdb.UniqueName(t), WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g, err := ll.TryLock(ctx) // the row the handover would have written
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Release(ctx) }()
	store, err := ll.store(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s := keepLease(store, db, &ll.cfg, g.lease.s.req, time.Now().Add(-renewInterval(ttl)))
	defer s.stop()
	first := s.localDeadline()
	testdb.WaitFor(t, wakeWait, func() bool {
		gone, _ := s.isLost()
		return gone || s.localDeadline().After(first)
	}, "the handed-over lease was neither renewed nor lost")
	if gone, why := s.isLost(); gone {
		t.Fatalf("the handed-over lease was lost before its first renewal: %v", why)
	}
}

// TestWaiterThatGivesUpLeavesNoPlace: a waiter whose LockTimeout ends
// withdraws its place, so the holder's release frees the lease instead of
// handing it to nobody; and where the release comes just as the waiter
// gives up (run many times, the two race), either the waiter returns
// with the lease or the lease ends free: never held or queued for by a
// waiter that has gone.
func TestWaiterThatGivesUpLeavesNoPlace(t *testing.T) {
	testdb.Slow(t, "20 LockTimeouts of 300 ms")
	t.Parallel() // names and pools of its own
	db, _ := openNamed(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	type outcome struct {
		g   *LeaseGuard
		err error
	}
	for i := range 20 {
		name := testdb.UniqueName(t)
		holder, err := NewLeaseLock(admin, name)
		if err != nil {
			t.Fatal(err)
		}
		waiter, err := NewLeaseLock(db, name, WithPollInterval(farPoll))
		if err != nil {
			t.Fatal(err)
		}
		g, err := holder.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		gave := make(chan outcome, 1)
		go func() {
			g, err := waiter.LockTimeout(context.Background(), 300*time.Millisecond)
			gave <- outcome{g, err}
		}()
		var o outcome
		returned := false
		testdb.WaitFor(t, wakeWait, func() bool {
			if _, _, next := leaseRow(t, admin, name); next != "" {
				return true
			}
			select {
			case o = <-gave:
				returned = true
				return true
			default:
				return false
			}
		}, "the waiter neither took its place nor returned")
		switch {
		case returned:
			// A loaded machine spent the 300 ms before the waiter reached
			// the queue: there is no place to withdraw, nothing to race.
			if o.err == nil {
				t.Fatal("the waiter got a held lease")
			}
		case i == 0: // the wait ends first
			if o = <-gave; o.err == nil {
				t.Fatal("the waiter got a held lease")
			}
		default:
			time.Sleep(time.Duration(250+3*i) * time.Millisecond) // placing the release about the timeout, not synchronizing
		}
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if i > 0 && !returned {
			if o = <-gave; o.err == nil {
				if err := o.g.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
		}
		testdb.WaitFor(t, wakeWait, func() bool { owner, _, next := leaseRow(t, admin, name); return owner == "" && next == "" },
			"after the waiter returned (%v), the lease is still held or queued for", o.err)
		ng, err := holder.TryLock(context.Background())
		if err != nil {
			t.Fatalf("after the waiter returned (%v): %v", o.err, err)
		}
		_ = ng.Release(context.Background())
	}
}

// TestHandoverLostInACrashStillKeepsOthersOut: a handover commits without
// waiting for the WAL flush, so a crash right after it can take it back
// (here it nearly always does: the WAL writer sleeps for 10 s). The
// waiter it woke holds the lease already; the place it queued with was
// durable, so once the server is back and the old holder's short lease
// has expired, no one else is granted the lease while the waiter's local
// deadline lasts: the place keeps them out (or, where the handover
// survived, the waiter's lease does).
func TestHandoverLostInACrashStillKeepsOthersOut(t *testing.T) {
	testdb.Slow(t, "server kill: crashes a private PostgreSQL")
	t.Parallel()
	c := testdb.OwnCluster(t, "synchronous_commit=on", "wal_writer_delay=10000")
	open := func() *sql.DB { return testdb.OpenPostgresDSN(t, "pgx", c.DSN) }
	admin, other := open(), open()
	admin.SetMaxIdleConns(-1) // a fresh session per query: none is left dead by the crash
	other.SetMaxIdleConns(-1)
	name := testdb.UniqueName(t)
	ga, _, _, got := holdThenQueue(t, admin, open(), open(), name, time.Second, time.Minute, farPoll)
	if err := ga.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	gb := <-got
	if gb == nil {
		t.FailNow()
	}
	c.Crash(t)
	c.Restart(t)
	owner, _, next := leaseRow(t, admin, name)
	t.Logf("after the crash: owner %q, place %q (a handover %s)", owner, next, map[bool]string{true: "lost", false: "kept"}[next != ""])
	var expired bool
	testdb.WaitFor(t, wakeWait, func() bool {
		return admin.QueryRow("SELECT expires_at <= now() OR owner = next_owner FROM advisorylock_leases WHERE name = $1", name).Scan(&expired) == nil && expired
	}, "the old holder's 1s lease never expired")
	someone, err := NewLeaseLock(other, name)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := someone.TryLock(context.Background()); !errors.Is(err, ErrNotAcquired) {
		if err == nil {
			_ = g.Release(context.Background())
		}
		t.Fatalf("after the crash, someone else's TryLock = %v while the waiter believes it holds the lease (lost: %v)", err, leaseLost(gb.Lease()))
	}
	if leaseLost(gb.Lease()) {
		t.Fatal("the waiter's lease reads lost well within its local deadline")
	}
	_ = gb.Release(context.Background())
}

// sleeperPID waits until a session of application app sleeps in line (a
// LeaseLock waiter's sleep on the server; see leaseSleeper) and returns
// its pid.
func sleeperPID(t *testing.T, admin *sql.DB, app string) int {
	t.Helper()
	var pid int
	testdb.WaitFor(t, wakeWait, func() bool {
		err := admin.QueryRow(`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'
	AND wait_event = 'PgSleep'`, app).Scan(&pid)
		return err == nil
	}, "no session of %s ever slept in line", app)
	return pid
}

// TestPlainLibPQWaiterSleepsInLine: a plain lib/pq handle hears no
// releases, so its LeaseLock waiter sleeps in line on the server, on the
// connection it took its place on, and the release that hands it the
// lease wakes it: it returns within a few round trips, long before its
// first poll, holding its place's token.
func TestPlainLibPQWaiterSleepsInLine(t *testing.T) {
	t.Parallel() // a name and a pool of its own, found by its own application_name
	db, app := openNamed(t, "postgres")
	admin := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	ga, place, _, got := holdThenQueue(t, admin, admin, db, name, time.Minute, time.Minute, farPoll)
	waitWatchOff(t, db)
	pid := sleeperPID(t, admin, app)
	var nextPID int
	var token FencingToken
	if err := admin.QueryRow("SELECT next_pid, next_generation FROM advisorylock_leases WHERE name = $1 AND next_owner = $2", name, place).Scan(&nextPID, &token); err != nil || nextPID != pid {
		t.Fatalf("the place's backend is %d (%v); the waiter sleeps on %d", nextPID, err, pid)
	}
	gb := handedOver(t, ga, got, "the waiter sleeping in line")
	if gb.Lease().Token() != token {
		t.Fatalf("handed over with token %d; its place drew %d", gb.Lease().Token(), token)
	}
	if err := gb.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestHandoverSignalsOnlyASessionSleepingInLine: a place whose recorded
// backend is not sleeping in line (its waiter gone, the pid now serving
// someone else's statement) gets the lease handed over, and that
// backend's statement is not cancelled: it ends by its own
// statement_timeout, not by a cancel.
func TestHandoverSignalsOnlyASessionSleepingInLine(t *testing.T) {
	testdb.Slow(t, "waits out a statement_timeout")
	t.Parallel() // a name and sessions of its own
	admin := testdb.OpenPostgres(t, "pgx")
	ctx, cancel := context.WithTimeout(context.Background(), wakeWait)
	defer cancel()
	other, err := testdb.OpenPostgres(t, "pgx").Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var pid int
	if err := other.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := other.ExecContext(ctx, "SET statement_timeout = '2s'"); err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() {
		_, err := other.ExecContext(ctx, "SELECT pg_sleep(30)")
		ended <- err
	}()
	testdb.WaitFor(t, wakeWait, func() bool {
		var active bool
		err := admin.QueryRow("SELECT state = 'active' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&active)
		return err == nil && active
	}, "the other session's statement never started")

	name := testdb.UniqueName(t)
	holder, err := NewLeaseLock(admin, name, WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	g, err := holder.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(`UPDATE advisorylock_leases SET next_owner = 'gone', next_generation = generation + 1000,
	next_expires_at = now() + interval '1 minute', next_pid = $2 WHERE name = $1`, name, pid); err != nil {
		t.Fatal(err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if owner, _, _ := leaseRow(t, admin, name); owner != "gone" {
		t.Fatalf("the release handed the lease to %q, want the place's owner", owner)
	}
	err = <-ended
	if dbutil.SQLState(err) != "57014" || !strings.Contains(err.Error(), "statement timeout") {
		t.Fatalf("the other session's statement ended with %v; want its own statement timeout, not a cancel", err)
	}
}

// TestSleeperWhoseConnectionDiesStillGetsTheLease: the backend a waiter
// sleeps in line on is terminated; the waiter polls from then on, and
// the release's handover to its place, which wakes no one, is found by
// its next poll.
func TestSleeperWhoseConnectionDiesStillGetsTheLease(t *testing.T) {
	t.Parallel() // a name and a pool of its own, found by its own application_name
	db, app := openNamed(t, "postgres")
	admin := testdb.OpenPostgres(t, "pgx")
	g, _, token, got := holdThenQueue(t, admin, admin, db, testdb.UniqueName(t), time.Minute, time.Minute, 50*time.Millisecond)
	pid := sleeperPID(t, admin, app)
	if _, err := admin.Exec("SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case gb := <-got:
		if gb == nil {
			t.FailNow()
		}
		if gb.Lease().Token() < token {
			t.Fatalf("the waiter got token %d, below its place's %d", gb.Lease().Token(), token)
		}
		if err := gb.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	case <-time.After(wakeWait):
		t.Fatalf("the waiter whose sleeping connection died never got the lease")
	}
	if n := len(sleepSlots(context.Background(), db)); n != 0 {
		t.Fatalf("%d sleepers' slots still held after the wait ended", n)
	}
}

// TestSleepersInLineAreBounded: on a pool of four connections one waiter
// at a time sleeps in line (a quarter of the pool: holders' releases must
// still find connections); a second waiter, on another key, polls, and
// both get their leases. Their slots are returned once they have.
func TestSleepersInLineAreBounded(t *testing.T) {
	t.Parallel() // a name and a pool of its own, found by its own application_name
	db, app := openNamed(t, "postgres")
	db.SetMaxOpenConns(4)
	admin := testdb.OpenPostgres(t, "pgx")
	slots := sleepSlots(context.Background(), db)
	if cap(slots) != 1 {
		t.Fatalf("a pool of 4 connections lets %d waiters sleep in line; want 1", cap(slots))
	}
	var guards []*LeaseGuard
	var gots []<-chan *LeaseGuard
	for range 2 {
		g, _, _, got := holdThenQueue(t, admin, admin, db, testdb.UniqueName(t), time.Minute, time.Minute, 50*time.Millisecond)
		guards, gots = append(guards, g), append(gots, got)
	}
	sleeperPID(t, admin, app)
	if n := len(slots); n != 1 {
		t.Fatalf("%d waiters hold a sleepers' slot; want 1", n)
	}
	for i, g := range guards {
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case gb := <-gots[i]:
			if gb == nil {
				t.FailNow()
			}
			_ = gb.Release(context.Background())
		case <-time.After(wakeWait):
			t.Fatalf("waiter %d never got its lease", i)
		}
	}
	if n := len(slots); n != 0 {
		t.Fatalf("%d sleepers' slots still held after every wait ended", n)
	}
}

// leaseLost reports, without blocking, whether lease's Lost channel is
// closed: the check a holder makes before an action.
func leaseLost(lease Lease) bool {
	select {
	case <-lease.Lost():
		return true
	default:
		return false
	}
}

// TestLeaseLockThatNeedsNoWaitOpensNoListener: Lock and Do on a free
// lease join the release watch but start no listener: no connection of
// the pool and no LISTEN for a wait that never came (through go-sqlmock,
// such a listener took the one connection the expected statements need).
func TestLeaseLockThatNeedsNoWaitOpensNoListener(t *testing.T) {
	t.Parallel() // a name and a pool of its own, found by its own application_name
	db, _ := openNamed(t, "pgx")
	l, err := NewLeaseLock(db, testdb.UniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g, err := l.Lock(ctx)
	if err != nil {
		t.Fatalf("Lock of a free lease: %v", err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Do(ctx, func(context.Context, Lease) error { return nil }); err != nil {
		t.Fatalf("Do on a free lease: %v", err)
	}
	w := watchOf(db)
	if w == nil {
		t.Fatal("no release watch: the acquires did not join one, so this test proves nothing")
	}
	w.mu.Lock()
	running := w.running
	w.mu.Unlock()
	if running {
		t.Error("a listener runs after two acquires that never waited")
	}
}
