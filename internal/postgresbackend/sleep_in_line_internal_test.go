package postgresbackend

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// A waiter sleeping in line (backend.LeaseSleeper), tested on the
// backend's own steps: the handover that wakes it, and the read in the
// sleep's message that tells it the lease is its own.

// wakeWait bounds every wait in these tests.
const wakeWait = testdb.HandoffWait

// leaseOwner reads the owner of name's lease row, "" when it is free.
func leaseOwner(t *testing.T, admin *sql.DB, name string) string {
	t.Helper()
	var owner sql.NullString
	if err := admin.QueryRow("SELECT owner FROM advisorylock_leases WHERE name = $1", name).Scan(&owner); err != nil {
		t.Fatalf("reading the row of %s: %v", name, err)
	}
	return owner.String
}

// inLinePlace is a lease held by admin and a waiter's place next in line,
// taken on conn (a connection of db's, backend pid) where it may sleep.
type inLinePlace struct {
	store          *postgres
	holder, waiter backend.LeaseRequest // with their tokens
	conn           *sql.Conn
	pid            int
}

// placeInLine has admin take a lease of a fresh name and a waiter on db
// take the place next in line on a connection it keeps (closed at the
// test's end), as a plain lib/pq waiter does before it sleeps in line.
func placeInLine(ctx context.Context, t *testing.T, db, admin *sql.DB) inLinePlace {
	t.Helper()
	name := testdb.UniqueName(t)
	l := inLinePlace{store: (&postgres{}).forDB(db)}
	l.holder = backend.LeaseRequest{Kind: backend.KindLease, Name: name, Key: keyOf(name), Owner: "holder", TTL: time.Minute}
	l.waiter = l.holder
	l.waiter.Owner = "waiter in line"
	var err error
	if l.holder.Token, err = l.store.AcquireLease(ctx, admin, l.holder); err != nil {
		t.Fatal(err)
	}
	if l.conn, err = db.Conn(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.conn.Close() })
	if err := l.conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&l.pid); err != nil {
		t.Fatal(err)
	}
	if l.waiter.Token, err = l.store.QueueLease(ctx, db, l.conn, l.waiter); err != nil {
		t.Fatal(err)
	}
	return l
}

// releaseUncommitted runs the holder's release in a transaction that
// commits when the test says (rolled back at its end otherwise).
func (l inLinePlace) releaseUncommitted(ctx context.Context, t *testing.T, admin *sql.DB) *sql.Tx {
	t.Helper()
	release, err := admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = release.Rollback() })
	if _, err := release.ExecContext(ctx, pgReleaseLease, l.holder.Name, int64(l.holder.Token), strconv.FormatInt(l.holder.Key, 10)); err != nil {
		t.Fatal(err)
	}
	return release
}

// waitsForALock reports whether the waiter's backend waits for a lock.
func (l inLinePlace) waitsForALock(admin *sql.DB) bool {
	var waits bool
	err := admin.QueryRow("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", l.pid).Scan(&waits)
	return err == nil && waits
}

// TestHandoverBeforeTheSleepInLineDoesNotWaitForIt: a handover that
// lands after the waiter took its place but before its sleep holds the
// place's key has no sleeper to wake: committed before the sleep began,
// or committing while the sleep waits for the key (the handover's test of
// the key holds it until the commit). Either way the sleep finds the lease
// already the waiter's and does not sleep its slice holding it.
func TestHandoverBeforeTheSleepInLineDoesNotWaitForIt(t *testing.T) {
	for _, committed := range []bool{true, false} {
		t.Run(fmt.Sprintf("committed=%v", committed), func(t *testing.T) {
			db := testdb.OpenPostgres(t, "postgres")
			admin := testdb.OpenPostgres(t, "pgx")
			ctx, cancel := context.WithTimeout(context.Background(), wakeWait)
			defer cancel()
			l := placeInLine(ctx, t, db, admin)
			store, waiter, conn, name := l.store, l.waiter, l.conn, l.holder.Name
			release := l.releaseUncommitted(ctx, t, admin)
			if committed {
				if err := release.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			slept := make(chan error, 1)
			go func() {
				_, err := store.SleepInLine(ctx, db, conn, waiter, wakeWait/2)
				slept <- err
			}()
			if !committed {
				testdb.WaitFor(t, wakeWait, func() bool { return l.waitsForALock(admin) },
					"the sleep never waited for the key the handover holds")
				if err := release.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-slept:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(testdb.Promptly):
				t.Fatalf("the waiter slept in line over %v while the lease was already its own", testdb.Promptly)
			}
			t.Logf("returned in %v", time.Since(start))
			if owner := leaseOwner(t, admin, name); owner != waiter.Owner {
				t.Fatalf("the release left the lease to %q, not handed over to the place", owner)
			}
		})
	}
}

// TestWokenSleeperLearnsItsGrantInTheSleepsMessage: the handover's
// cancel ends the sleep inside the message the waiter slept in, which
// then reads the row once the release has committed: the waiter learns
// it holds the lease with no round trip after the release's, on both
// drivers. The release commits at once, or only once the woken sleep's
// read waits for it (a release that is slow to commit: the read must
// wait for the row, not read its old version and report no grant). And a
// sleep that ends on its own reports no grant.
func TestWokenSleeperLearnsItsGrantInTheSleepsMessage(t *testing.T) {
	for _, drv := range []string{"postgres", "pgx"} {
		for _, slow := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/slow_commit=%v", drv, slow), func(t *testing.T) {
				wokenSleeperLearnsItsGrant(t, drv, slow)
			})
		}
	}
}

func wokenSleeperLearnsItsGrant(t *testing.T, drv string, slowCommit bool) {
	db, proxy := testdb.OpenPostgresProxied(t, drv)
	admin := testdb.OpenPostgres(t, "pgx")
	ctx, cancel := context.WithTimeout(context.Background(), wakeWait)
	defer cancel()
	l := placeInLine(ctx, t, db, admin)
	store, holder, waiter, conn, pid, name := l.store, l.holder, l.waiter, l.conn, l.pid, l.holder.Name
	if granted, err := store.SleepInLine(ctx, db, conn, waiter, 50*time.Millisecond); err != nil || granted {
		t.Fatalf("a sleep that nothing woke: granted %v, %v; want neither", granted, err)
	}
	type slept struct {
		granted bool
		err     error
	}
	done := make(chan slept, 1)
	proxy.ResetCount()
	go func() {
		granted, err := store.SleepInLine(ctx, db, conn, waiter, wakeWait/2)
		done <- slept{granted, err}
	}()
	testdb.WaitFor(t, wakeWait, func() bool {
		var sleeps bool
		err := admin.QueryRow("SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = $1", pid).Scan(&sleeps)
		return err == nil && sleeps
	}, "the waiter never slept in line")
	if !slowCommit {
		if err := store.ReleaseLease(ctx, admin, holder); err != nil {
			t.Fatal(err)
		}
	} else {
		release := l.releaseUncommitted(ctx, t, admin)
		testdb.WaitFor(t, wakeWait, func() bool {
			select {
			case s := <-done:
				t.Fatalf("the woken sleep answered (granted %v, %v) before the handover committed", s.granted, s.err)
			default:
			}
			return l.waitsForALock(admin)
		}, "the woken sleep never waited for the handover to commit")
		if err := release.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case s := <-done:
		if s.err != nil || !s.granted {
			t.Fatalf("woken by the handover: granted %v, %v; want granted", s.granted, s.err)
		}
	case <-time.After(testdb.Promptly):
		t.Fatalf("the handover did not wake the waiter within %v", testdb.Promptly)
	}
	if n := proxy.RoundTrips(); n != 1 {
		t.Fatalf("the woken sleep took %d round trips, want 1: its own message", n)
	}
	if owner := leaseOwner(t, admin, name); owner != waiter.Owner {
		t.Fatalf("the lease is %q's, want the waiter's", owner)
	}
}
