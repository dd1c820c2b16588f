package advisorylock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

const wait = 30 * time.Second

// Generous upper bounds on the timing promises of the README and docs/semantics.md (about 2-3x
// each promise, so that a loaded 2-CPU machine does not flake):
const (
	// LockTimeout returns within about a second of its budget.
	timeoutSlack = 2500 * time.Millisecond
	// A release lets a waiter in within about one round trip.
	handoffWithin = 2 * time.Second
	// A wait slice lasts about a second, so nothing waiting for the
	// waiter's statements to end (CREATE INDEX CONCURRENTLY, measured at
	// one slice here) waits much longer than a slice or two.
	slicesWithin = 4 * time.Second
)

// embedding is a handle of sqlx.DB's shape: a struct that embeds the
// *sql.DB and adds methods of its own; the library finds the *sql.DB
// inside. (The real sqlx is tested in internal/sqlxcompat, a module of
// its own, so that it stays out of this module's requirements.)
type embedding struct {
	*sql.DB
	driverName string
}

func (h *embedding) DriverName() string { return h.driverName }

// embed wraps db as sqlx.NewDb(db, driverName) would.
func embed(db *sql.DB, driverName string) advisorylock.DB {
	return &embedding{DB: db, driverName: driverName}
}

// handles opens two independent handles per driver: *sql.DB and one that
// embeds it (as *sqlx.DB does).
func eachHandle(t *testing.T, f func(t *testing.T, open func() advisorylock.DB, raw func() *sql.DB)) {
	for _, drv := range testdb.Drivers {
		t.Run(drv+"/sql", func(t *testing.T) {
			var last *sql.DB
			f(t, func() advisorylock.DB { last = testdb.OpenPostgres(t, drv); return last }, func() *sql.DB { return last })
		})
		t.Run(drv+"/embedded", func(t *testing.T) {
			var last *sql.DB
			f(t, func() advisorylock.DB {
				last = testdb.OpenPostgres(t, drv)
				return embed(last, drv)
			}, func() *sql.DB { return last })
		})
	}
}

// sqliteWAL is the DSN options of a SQLite file that several pools of a
// test share: WAL, and a busy wait long enough for any test's contention.
const sqliteWAL = "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"

func newLock(t testing.TB, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.Lock {
	t.Helper()
	l, err := advisorylock.New(db, name, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return l
}

// mustTry takes l or fails the test.
func mustTry(t testing.TB, l *advisorylock.Lock) *advisorylock.Guard {
	t.Helper()
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock(%q): %v", l.Name(), err)
	}
	return g
}

func mustRelease(t testing.TB, g interface{ Release(context.Context) error }) {
	t.Helper()
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func locksHeld(t testing.TB, db *sql.DB, name string) int {
	k := advisorylock.Key(name)
	return testdb.AdvisoryLocks(t, db, &k)
}

func TestTryLockIsExclusiveAcrossDBs(t *testing.T) {
	t.Parallel()
	eachHandle(t, func(t *testing.T, open func() advisorylock.DB, raw func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		a := newLock(t, open(), name)
		b := newLock(t, open(), name)
		g, err := a.TryLock(ctx)
		if err != nil {
			t.Fatalf("first TryLock: %v", err)
		}
		if _, err := b.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock on another handle = %v, want ErrNotAcquired", err)
		}
		if _, err := a.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("second TryLock in one process = %v, want ErrNotAcquired", err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatalf("second Release = %v, want nil", err)
		}
		g2, err := b.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after release: %v", err)
		}
		mustRelease(t, g2)
	})
}

func TestErrorNamesTheLock(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	name := testdb.UniqueName(t)
	g, err := newLock(t, db, name).TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	_, err = newLock(t, db, name).TryLock(context.Background())
	if !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) || !strings.HasPrefix(err.Error(), "advisorylock: ") {
		t.Fatalf("error %q does not name lock %q with the package prefix", err, name)
	}
}

func TestHeldLockPinsOneConnection(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			l := newLock(t, db, testdb.UniqueName(t))
			g, err := l.TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if s := db.Stats(); s.InUse != 1 {
				t.Fatalf("while held: InUse = %d, want 1", s.InUse)
			}
			mustRelease(t, g)
			if s := db.Stats(); s.InUse != 0 || s.Idle < 1 {
				t.Fatalf("after release: InUse = %d, Idle = %d; want 0 and >= 1", s.InUse, s.Idle)
			}
		})
	}
}

func TestAnyNameIsValid(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	for _, name := range []string{"", " ", "x'; DROP TABLE pg_class; --", `back\slash`, "nul\x00byte", "\xff\xfe", strings.Repeat("long", 5000), "ünïcødé 🔒"} {
		g, err := newLock(t, db, name+testdb.UniqueName(t)).TryLock(context.Background())
		if err != nil {
			t.Fatalf("TryLock(%q): %v", name, err)
		}
		mustRelease(t, g)
	}
}

func TestLockWaitsServerSideAndHandsOff(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			name := testdb.UniqueName(t)
			dbA, dbB := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			g, err := newLock(t, dbA, name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *advisorylock.Guard, 1)
			go func() {
				gb, err := newLock(t, dbB, name).Lock(ctx)
				if err != nil {
					t.Errorf("waiter: %v", err)
				}
				got <- gb
			}()
			testdb.WaitFor(t, wait, func() bool { return waitingOn(t, dbA, name) == 1 }, "waiter never queued server-side on the lock")
			select {
			case <-got:
				t.Fatal("waiter acquired while the lock was held")
			default:
			}
			mustRelease(t, g)
			select {
			case gb := <-got:
				if gb != nil {
					mustRelease(t, gb)
				}
			case <-time.After(handoffWithin):
				t.Fatalf("waiter did not get the lock within %v of the release", handoffWithin)
			}
		})
	}
}

// eventually polls cond until it holds or wait passes.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// describeHolders says which sessions hold the named lock, for failures.
func describeHolders(t testing.TB, name string) string {
	admin := testdb.OpenPostgres(t, "postgres")
	k := uint64(advisorylock.Key(name))
	rows, err := admin.Query(fmt.Sprintf(`SELECT l.pid, coalesce(a.state, '?'), coalesce(a.query, '?'), coalesce(a.backend_start::text, '?'), coalesce(a.state_change::text, '?')
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %d AND l.objid = %d AND l.objsubid = 1`, k>>32, k&0xFFFFFFFF))
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var pid int
		var state, query, started, changed string
		if err := rows.Scan(&pid, &state, &query, &started, &changed); err != nil {
			return err.Error()
		}
		out = append(out, fmt.Sprintf("pid %d state %s since %s (session from %s) last query %q", pid, state, changed, started, query))
	}
	return strings.Join(out, "; ")
}

// waitingOn counts sessions waiting in pg_locks for the named lock.
func waitingOn(t testing.TB, db *sql.DB, name string) int {
	k := uint64(advisorylock.Key(name))
	var n int
	err := db.QueryRow(fmt.Sprintf(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND classid = %d AND objid = %d AND objsubid = 1`, k>>32, k&0xFFFFFFFF)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A waiter must not hold one snapshot for the whole wait, or CREATE INDEX
// CONCURRENTLY (which waits out older snapshots) would hang until it stops.
func TestWaiterDoesNotStallCreateIndexConcurrently(t *testing.T) {
	testdb.Slow(t, "waits across wait slices of a second")
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			name := testdb.UniqueName(t)
			dbA, dbB := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			table := fmt.Sprintf("cic_%d", rand.Uint32())
			if _, err := dbA.Exec("CREATE TABLE " + table + " (id int)"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = dbA.Exec("DROP TABLE IF EXISTS " + table) })
			g, err := newLock(t, dbA, name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wctx, stop := context.WithCancel(ctx)
			waited := make(chan error, 1)
			go func() {
				gb, err := newLock(t, dbB, name).Lock(wctx)
				if gb != nil {
					_ = gb.Release(ctx)
				}
				waited <- err
			}()
			testdb.WaitFor(t, wait, func() bool { return waitingOn(t, dbA, name) == 1 }, "waiter never queued")
			cic := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := dbA.Exec("CREATE INDEX CONCURRENTLY " + table + "_idx ON " + table + " (id)")
				cic <- err
			}()
			select {
			case err := <-cic:
				if err != nil {
					t.Fatalf("CREATE INDEX CONCURRENTLY: %v", err)
				}
				t.Logf("CREATE INDEX CONCURRENTLY took %v beside a waiting Lock", time.Since(start))
			case <-time.After(slicesWithin):
				t.Fatalf("CREATE INDEX CONCURRENTLY stalled behind a waiting Lock for %v: wait slices are about a second", slicesWithin)
			}
			select {
			case err := <-waited:
				t.Fatalf("waiter returned before release: %v", err)
			default:
			}
			stop()
			if err := <-waited; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled waiter = %v, want context.Canceled", err)
			}
			mustRelease(t, g)
		})
	}
}

func TestLockTimeoutReturnsTimeoutErrorAndKeepsTheConnection(t *testing.T) {
	testdb.Slow(t, "waits out a LockTimeout budget")
	t.Parallel() // names and pools of its own
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel() // pools and a name of its own
			ctx := context.Background()
			name := testdb.UniqueName(t)
			dbA, dbB := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			dbB.SetMaxOpenConns(1)
			g, err := newLock(t, dbA, name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer mustRelease(t, g)
			var pidBefore, pidAfter int
			if err := dbB.QueryRow("SELECT pg_backend_pid()").Scan(&pidBefore); err != nil {
				t.Fatal(err)
			}
			lb := newLock(t, dbB, name)
			const d = 1500 * time.Millisecond // spans more than one wait slice
			start := time.Now()
			_, err = lb.LockTimeout(ctx, d)
			elapsed := time.Since(start)
			if !isTimeout(err, name) {
				t.Fatalf("LockTimeout = %v, want ErrTimeout for %q", err, name)
			}
			if elapsed < d {
				t.Fatalf("LockTimeout returned after %v, before its budget %v", elapsed, d)
			}
			if elapsed > d+timeoutSlack {
				t.Fatalf("LockTimeout returned after %v: its budget %v plus about a second is promised", elapsed, d)
			}
			if err := dbB.QueryRow("SELECT pg_backend_pid()").Scan(&pidAfter); err != nil {
				t.Fatal(err)
			}
			if pidAfter != pidBefore {
				t.Fatalf("timeout discarded the connection: backend %d became %d", pidBefore, pidAfter)
			}
			for _, zero := range []time.Duration{0, -time.Second} {
				if _, err := lb.LockTimeout(ctx, zero); !isTimeout(err, name) {
					t.Fatalf("LockTimeout(%v) = %v, want ErrTimeout after one attempt", zero, err)
				}
			}
		})
	}
}

func TestLockTimeoutWhenPoolExhausted(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(1)
			g, err := newLock(t, db, testdb.UniqueName(t), pinned).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer mustRelease(t, g)
			other := newLock(t, db, testdb.UniqueName(t), pinned)
			_, err = other.LockTimeout(ctx, 200*time.Millisecond)
			if !errors.Is(err, advisorylock.ErrTimeout) {
				t.Fatalf("LockTimeout with the pool exhausted = %v, want ErrTimeout", err)
			}
			if s := db.Stats(); s.InUse != 1 || s.OpenConnections != 1 {
				t.Fatalf("pool after the timeout: InUse %d, Open %d; want 1, 1", s.InUse, s.OpenConnections)
			}
		})
	}
}

func TestDoneContextTouchesNoConnection(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	l := newLock(t, db, testdb.UniqueName(t))
	before := db.Stats().OpenConnections
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, acquire := range []func() error{
		func() error { _, err := l.TryLock(ctx); return err },
		func() error { _, err := l.Lock(ctx); return err },
		func() error { _, err := l.LockTimeout(ctx, time.Second); return err },
	} {
		if err := acquire(); !errors.Is(err, context.Canceled) {
			t.Fatalf("acquire with a done context = %v, want context.Canceled", err)
		}
	}
	if s := db.Stats(); s.OpenConnections != before || s.InUse != 0 {
		t.Fatalf("a done context touched the pool: open %d -> %d, in use %d", before, s.OpenConnections, s.InUse)
	}
}

func TestCancelledWaitLeavesNoLock(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			name := testdb.UniqueName(t)
			dbA, dbB := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			g, err := newLock(t, dbA, name).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := newLock(t, dbB, name).Lock(wctx)
				done <- err
			}()
			testdb.WaitFor(t, wait, func() bool { return waitingOn(t, dbA, name) == 1 }, "waiter never queued")
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Lock = %v, want context.Canceled", err)
			}
			if n := dbB.Stats().InUse; n != 0 {
				t.Fatalf("cancelled Lock left %d connections checked out", n)
			}
			mustRelease(t, g)
			// pgx closes the socket on cancel; its backend may linger in the
			// lock queue for a few ms and be granted the lock briefly.
			testdb.WaitFor(t, wait, func() bool { return locksHeld(t, dbA, name) == 0 }, "a cancelled waiter's session kept the lock")
		})
	}
}

// Hundreds of acquires cancelled at random points — before, while waiting,
// as the lock is granted — must leave no lock held and no connection out.
func TestCancelHammerLeavesNothingBehind(t *testing.T) {
	testdb.Slow(t, "hundreds of cancelled acquires")
	t.Parallel() // names and pools of its own
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(12)
			names := []string{testdb.UniqueName(t), testdb.UniqueName(t)}
			var locks []*advisorylock.Lock
			for _, n := range names {
				locks = append(locks, newLock(t, db, n))
			}
			var wg sync.WaitGroup
			var acquired sync.Map
			for w := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), 7))
					for range 40 {
						l := locks[r.IntN(len(locks))]
						// Mostly cancelled within 20ms (before, during or just
						// as the lock is granted); one in four gets time to
						// succeed, so success and handover are hammered too.
						d := time.Duration(r.IntN(20000)) * time.Microsecond
						if r.IntN(4) == 0 {
							d = 5 * time.Second
						}
						ctx, cancel := context.WithTimeout(context.Background(), d)
						var g *advisorylock.Guard
						var err error
						switch r.IntN(3) {
						case 0:
							g, err = l.TryLock(ctx)
						case 1:
							g, err = l.Lock(ctx)
						default:
							g, err = l.LockTimeout(ctx, time.Duration(r.IntN(10000))*time.Microsecond)
						}
						cancel()
						if err == nil {
							acquired.Store(w, true)
							if r.IntN(2) == 0 {
								time.Sleep(time.Duration(r.IntN(500)) * time.Microsecond) // hold it a moment
							}
							if err := g.Release(context.Background()); err != nil {
								t.Errorf("Release: %v", err)
							}
						}
					}
				}()
			}
			wg.Wait()
			for _, n := range names {
				if !eventually(func() bool { return locksHeld(t, db, n) == 0 }) {
					t.Fatalf("lock %q left held after the hammer by: %s", n, describeHolders(t, n))
				}
			}
			// A connection that arrived after its acquire was cancelled goes
			// back to the pool from the goroutine that waited for it (lib/pq's
			// checkout is bounded that way): soon, not at once.
			if !eventually(func() bool { return db.Stats().InUse == 0 }) {
				t.Fatalf("%d connections left checked out", db.Stats().InUse)
			}
			// The hammer must have exercised success too, or it proved nothing.
			n := 0
			acquired.Range(func(any, any) bool { n++; return true })
			if n == 0 {
				t.Fatal("no worker ever acquired a lock")
			}
		})
	}
}

func TestReleaseWithCancelledContextStillReleases(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			name := testdb.UniqueName(t)
			g, err := newLock(t, db, name).TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release with a cancelled context: %v", err)
			}
			if n := locksHeld(t, db, name); n != 0 {
				t.Fatalf("lock still held by %d sessions", n)
			}
			if s := db.Stats(); s.InUse != 0 || s.Idle < 1 {
				t.Fatalf("connection not recycled: InUse %d, Idle %d", s.InUse, s.Idle)
			}
		})
	}
}

func TestDoReleasesOnReturnErrorAndPanic(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.OpenPostgres(t, drv)
			name := testdb.UniqueName(t)
			l := newLock(t, db, name)
			other := newLock(t, testdb.OpenPostgres(t, drv), name)
			free := func(when string) {
				t.Helper()
				g, err := other.TryLock(ctx)
				if err != nil {
					t.Fatalf("after %s the lock is not free: %v", when, err)
				}
				mustRelease(t, g)
			}
			boom := errors.New("boom")
			ran := false
			if err := l.Do(ctx, func(context.Context) error {
				ran = true
				if _, err := other.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
					t.Errorf("inside Do the lock is not held: %v", err)
				}
				return nil
			}); err != nil || !ran {
				t.Fatalf("Do = %v, ran %v", err, ran)
			}
			free("Do returned")
			if err := l.DoTimeout(ctx, time.Second, func(context.Context) error { return boom }); err != boom {
				t.Fatalf("DoTimeout = %v, want fn's error as is", err)
			}
			free("DoTimeout failed")
			func() {
				defer func() {
					if r := recover(); r != "panic in fn" {
						t.Fatalf("recovered %v, want the re-raised panic", r)
					}
				}()
				_, _ = l.TryDo(ctx, func(context.Context) error { panic("panic in fn") })
			}()
			free("TryDo panicked")
			if s := db.Stats(); s.InUse != 0 {
				t.Fatalf("%d connections still checked out", s.InUse)
			}
		})
	}
}

func TestTryDoReportsNotRunWhenHeldElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := testdb.UniqueName(t)
	g, err := newLock(t, testdb.OpenPostgres(t, "pgx"), name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	ran, err := newLock(t, testdb.OpenPostgres(t, "postgres"), name).TryDo(ctx, func(context.Context) error {
		t.Error("fn ran while the lock was held elsewhere")
		return nil
	})
	if ran || err != nil {
		t.Fatalf("TryDo = (%v, %v), want (false, nil)", ran, err)
	}
}

// awaitLoss waits, within wait, for a Do's fn context to end: the loss
// of its lock told to fn. It returns an error if that never comes.
func awaitLoss(fctx context.Context) error {
	select {
	case <-fctx.Done():
		return nil
	case <-time.After(wait):
		return errors.New("fn's context was not cancelled after its session ended")
	}
}

func TestKilledSessionClosesLostAndCancelsDo(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.OpenPostgres(t, drv)
			admin := testdb.OpenPostgres(t, "postgres")
			name := testdb.UniqueName(t)
			l := newLock(t, db, name, advisorylock.WithKeepAlive(100*time.Millisecond))

			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			observetest.TerminateHolder(t, admin, l)
			select {
			case <-g.Lost():
			case <-time.After(wait):
				t.Fatal("Lost() did not close after the session was terminated")
			}
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release of a lost guard: %v", err)
			}

			err = l.Do(ctx, func(fctx context.Context) error {
				observetest.TerminateHolder(t, admin, l)
				if err := awaitLoss(fctx); err != nil {
					return err
				}
				if !errors.Is(context.Cause(fctx), advisorylock.ErrLockLost) {
					t.Errorf("fn's context cause = %v, want ErrLockLost", context.Cause(fctx))
				}
				return fctx.Err()
			})
			if !errors.Is(err, advisorylock.ErrLockLost) {
				t.Fatalf("Do after the session was killed = %v, want ErrLockLost", err)
			}
			if s := db.Stats(); s.InUse != 0 {
				t.Fatalf("%d connections still checked out", s.InUse)
			}
		})
	}
}

func TestForgottenGuardIsCleanedUp(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	name := testdb.UniqueName(t)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	l := newLock(t, db, name, advisorylock.WithLogger(logger))
	func() {
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		_ = g // dropped without Release
	}()
	testdb.WaitFor(t, wait, func() bool {
		runtime.GC()
		return locksHeld(t, db, name) == 0 && db.Stats().InUse == 0
	}, "a forgotten guard kept its lock or connection")
	testdb.WaitFor(t, wait, func() bool {
		return strings.Contains(logs.String(), "never released") && strings.Contains(logs.String(), name)
	}, "no warning naming the lock was logged; got %q", logs.String())
}

// syncBuffer is a bytes.Buffer safe for a logger writing from a cleanup.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestHolderReportsTheSession(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	l := newLock(t, db, name)
	if h, err := l.Holder(context.Background()); h != nil || err != nil {
		t.Fatalf("Holder of a free lock = %+v, %v; want nil, nil", h, err)
	}
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	h, err := l.Holder(context.Background())
	if err != nil || h == nil {
		t.Fatalf("Holder = %v, %v", h, err)
	}
	var pid int
	if err := db.QueryRow("SELECT pid FROM pg_stat_activity WHERE pid = $1", h.PID).Scan(&pid); err != nil {
		t.Fatalf("Holder PID %d is not a live session: %v", h.PID, err)
	}
	if h.Name != name || h.Since.IsZero() || h.Token != 0 {
		t.Fatalf("Holder = %+v", h)
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	if _, err := advisorylock.New(nil, "x"); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("New(nil) = %v, want ErrUnsupported", err)
	}
	var nilDB *sql.DB
	if _, err := advisorylock.New(nilDB, "x"); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("New((*sql.DB)(nil)) = %v, want ErrUnsupported", err)
	}
}

// openPgxpool opens a pgxpool on the test server (maxConns, or pgxpool's
// default for 0) and a *sql.DB over it (stdlib.OpenDBFromPool), both
// closed at cleanup, the handle first.
func openPgxpool(t *testing.T, maxConns int32) (*pgxpool.Pool, *sql.DB) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = db.Close() })
	return pool, db
}

// A lock that pgx's database/sql adapter over a pgxpool holds is freed
// when its connection is discarded (here, a forgotten guard's cleanup):
// closing the database/sql connection alone would hand the pgx connection,
// its session and its lock back to the pgxpool.
func TestDiscardedLockOnAPgxpoolIsFreed(t *testing.T) {
	ctx := context.Background()
	_, db := openPgxpool(t, 0)
	name := testdb.UniqueName(t)
	forgetGuard(t, newLock(t, db, name, pinned)) // a pinned hold's forgetting discards its connection
	rival := newLock(t, testdb.OpenPostgres(t, "pgx"), name)
	testdb.WaitFor(t, wait, func() bool {
		runtime.GC()
		g, err := rival.TryLock(ctx)
		if err != nil {
			return false
		}
		mustRelease(t, g)
		return true
	}, "a forgotten guard's lock taken through a pgxpool was never freed (its session went back to the pgxpool)")
}

// TestLocksOnAPgxpoolCountAgainstItsMaxConns: through pgx's
// stdlib.OpenDBFromPool (docs/drivers-and-orms.md) the backend is found
// without WithBackend, locks exclude across handles, each held lock keeps
// one pgxpool connection acquired, and a try on a pool whose MaxConns are
// all held returns ErrPoolUnavailable after WithPoolWait instead of waiting
// for the caller's context.
func TestLocksOnAPgxpoolCountAgainstItsMaxConns(t *testing.T) {
	ctx := context.Background()
	pool, db := openPgxpool(t, 2)
	name := testdb.UniqueName(t)
	take := func(l *advisorylock.Lock) *advisorylock.Guard {
		t.Helper()
		g := mustTry(t, l)
		if g == nil {
			t.Fatalf("TryLock(%q) through the pgxpool missed a free name", l.Name())
		}
		return g
	}
	held := []*advisorylock.Guard{take(newLock(t, db, name+"/a", pinned)), take(newLock(t, db, name+"/b", pinned))}
	defer func() { // before pool.Close, which waits for every acquired connection
		for _, g := range held {
			_ = g.Release(ctx)
		}
	}()
	if n := pool.Stat().AcquiredConns(); n != 2 {
		t.Fatalf("two held locks keep %d pgxpool connections acquired, want 2", n)
	}
	if g, err := newLock(t, testdb.OpenPostgres(t, "pgx"), name+"/a").TryLock(ctx); g != nil || err == nil {
		t.Fatalf("another handle's TryLock of a name held through the pgxpool = %v, %v; want held elsewhere", g, err)
	}

	third := newLock(t, db, name+"/c", advisorylock.WithPoolWait(200*time.Millisecond))
	tctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := third.TryLock(tctx); !errors.Is(err, advisorylock.ErrPoolUnavailable) || time.Since(start) > 5*time.Second {
		t.Fatalf("TryLock with every pgxpool connection held = %v after %v, want ErrPoolUnavailable after about 200ms", err, time.Since(start))
	}
	mustRelease(t, held[0])
	mustRelease(t, take(third))
}
