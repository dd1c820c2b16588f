package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// sharedBackend opens independent handles on one database of a backend
// that takes shared locks.
type sharedBackend struct {
	name string
	open func(t *testing.T) func() *sql.DB
}

// sharedBackends are PostgreSQL (both drivers), MariaDB and a SQLite file.
var sharedBackends = []sharedBackend{
	{"postgres", func(t *testing.T) func() *sql.DB { return func() *sql.DB { return testdb.OpenPostgres(t, "postgres") } }},
	{"pgx", func(t *testing.T) func() *sql.DB { return func() *sql.DB { return testdb.OpenPostgres(t, "pgx") } }},
	{"mysql", func(t *testing.T) func() *sql.DB { return func() *sql.DB { return testdb.OpenMySQL(t) } }},
	{"sqlite", func(t *testing.T) func() *sql.DB {
		path := testdb.SQLitePath(t)
		return func() *sql.DB { return testdb.OpenSQLite(t, path, "_pragma=busy_timeout(0)&_pragma=journal_mode(WAL)") }
	}},
}

// eachSharedBackend runs f on every backend with shared locks, the
// backends' subtests in parallel with each other: each uses a name of its
// own and touches nothing process-wide.
func eachSharedBackend(t *testing.T, f func(t *testing.T, open func() *sql.DB)) {
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b.open(t))
		})
	}
}

// sharedOpts are the options of the tests' Locks: a short poll (SQLite)
// and keep-alive, so that waits and losses show soon.
var sharedOpts = []advisorylock.Option{advisorylock.WithPollInterval(5 * time.Millisecond), advisorylock.WithKeepAlive(200 * time.Millisecond)}

func TestSharedHoldersCoexistAndExcludeWriters(t *testing.T) {
	testdb.Slow(t, "waits out 300 ms timeouts, per backend")
	t.Parallel() // names of its own
	eachSharedBackend(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		a, b, w := newLock(t, open(), name, sharedOpts...), newLock(t, open(), name, sharedOpts...), newLock(t, open(), name, sharedOpts...)
		ra, err := a.TryRLock(ctx)
		if err != nil {
			t.Fatalf("first TryRLock: %v", err)
		}
		rb, err := b.TryRLock(ctx)
		if err != nil {
			t.Fatalf("second TryRLock on another *sql.DB, beside a shared holder: %v", err)
		}
		if g, err := w.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock beside two shared holders = %v, %v; want ErrNotAcquired", g, err)
		}
		if _, err := w.LockTimeout(ctx, 300*time.Millisecond); !errors.Is(err, advisorylock.ErrTimeout) {
			t.Fatalf("LockTimeout beside shared holders = %v; want ErrTimeout", err)
		}
		// The writer that gave up no longer keeps readers out.
		rc, err := newLock(t, open(), name, sharedOpts...).TryRLock(ctx)
		if err != nil {
			t.Fatalf("TryRLock once a waiting writer gave up: %v", err)
		}
		mustRelease(t, rc)
		mustRelease(t, ra)
		if _, err := w.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock beside one shared holder = %v; want ErrNotAcquired", err)
		}
		mustRelease(t, rb)
		g, err := w.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock once the shared holders left: %v", err)
		}
		if r, err := a.TryRLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryRLock beside an exclusive holder = %v, %v; want ErrNotAcquired", r, err)
		}
		bounded, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = b.RLock(bounded)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("RLock with a deadline beside an exclusive holder = %v; want context.DeadlineExceeded", err)
		}
		mustRelease(t, g)
		r, err := a.TryRLock(ctx)
		if err != nil {
			t.Fatalf("TryRLock after the writer left: %v", err)
		}
		mustRelease(t, r)
	})
}

func TestWaitingWriterGetsInWhenTheReadersLeave(t *testing.T) {
	testdb.Slow(t, "waiters handed over, per backend")
	t.Parallel() // names of its own
	eachSharedBackend(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		r1, r2, w := newLock(t, open(), name, sharedOpts...), newLock(t, open(), name, sharedOpts...), newLock(t, open(), name, sharedOpts...)
		g1, err := r1.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g2, err := r2.RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *advisorylock.Guard, 1)
		go func() {
			g, err := w.LockTimeout(ctx, wait)
			if err != nil {
				t.Errorf("writer: %v", err)
			}
			got <- g
		}()
		// A waiting writer keeps new readers out (it is not starved).
		testdb.WaitFor(t, wait, func() bool {
			r, err := newLock(t, open(), name).TryRLock(ctx)
			if err == nil {
				mustRelease(t, r)
			}
			return errors.Is(err, advisorylock.ErrNotAcquired)
		}, "a new reader still gets in while a writer waits")
		mustRelease(t, g1)
		select {
		case g := <-got:
			t.Fatalf("writer got in beside a reader: %v", g)
		case <-time.After(100 * time.Millisecond):
		}
		mustRelease(t, g2)
		select {
		case g := <-got:
			if g != nil {
				mustRelease(t, g)
			}
		case <-time.After(wait):
			t.Fatal("the writer did not get in after the readers left")
		}
	})
}

func TestWaitingReadersGetInWhenTheWriterLeaves(t *testing.T) {
	testdb.Slow(t, "waiters handed over, per backend")
	t.Parallel() // names of its own
	eachSharedBackend(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		w := newLock(t, open(), name, sharedOpts...)
		g, err := w.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var in atomic.Int32
		var wg sync.WaitGroup
		release := make(chan struct{})
		for range 3 {
			r := newLock(t, open(), name, sharedOpts...)
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := r.RLock(ctx)
				if err != nil {
					t.Errorf("RLock: %v", err)
					return
				}
				in.Add(1)
				<-release
				if err := g.Release(ctx); err != nil {
					t.Errorf("Release: %v", err)
				}
			}()
		}
		time.Sleep(200 * time.Millisecond) // let them queue (a test of nothing if they have not: they must wait either way)
		if n := in.Load(); n != 0 {
			t.Fatalf("%d readers got in beside the writer", n)
		}
		mustRelease(t, g)
		testdb.WaitFor(t, wait, func() bool { return in.Load() == 3 }, "the three waiting readers are not all in at once after the writer left (in: %d)", in.Load())
		close(release)
		wg.Wait()
	})
}

func TestHoldersListsSharedAndExclusiveHolders(t *testing.T) {
	t.Parallel()
	eachSharedBackend(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		l := newLock(t, open(), name, sharedOpts...)
		if hs, err := l.Holders(ctx); err != nil || len(hs) != 0 {
			t.Fatalf("Holders of a free lock = %v, %v", hs, err)
		}
		var gs []*advisorylock.Guard
		for range 3 {
			g, err := newLock(t, open(), name, sharedOpts...).TryRLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			gs = append(gs, g)
		}
		hs, err := l.Holders(ctx)
		if err != nil || len(hs) != 3 {
			t.Fatalf("Holders of 3 shared holders = %d holders, %v", len(hs), err)
		}
		for _, h := range hs {
			if !h.Shared || h.Name != name {
				t.Fatalf("holder %+v: want shared, named %q", h, name)
			}
		}
		if h, err := l.Holder(ctx); err != nil || h == nil || !h.Shared {
			t.Fatalf("Holder of a shared lock = %+v, %v; want one shared holder", h, err)
		}
		for _, g := range gs {
			mustRelease(t, g)
		}
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer mustRelease(t, g)
		hs, err = l.Holders(ctx)
		if err != nil || len(hs) != 1 || hs[0].Shared {
			t.Fatalf("Holders of an exclusive lock = %v, %v; want one exclusive holder", hs, err)
		}
	})
}

// TestKilledSharedHolderFreesTheLock ends a shared holder's session on
// the server: the writer waiting behind it gets in, and the holder's Lost
// closes.
func TestKilledSharedHolderFreesTheLock(t *testing.T) {
	t.Parallel() // names of its own; it ends only its holder's session
	for _, b := range sharedBackends[:3] {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			open := b.open(t)
			admin := open()
			name := testdb.UniqueName(t)
			r := newLock(t, open(), name, sharedOpts...)
			g, err := r.RLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hs, err := r.Holders(ctx)
			if err != nil || len(hs) != 1 || hs[0].PID == 0 {
				t.Fatalf("Holders = %v, %v; want the shared holder's session", hs, err)
			}
			kill := fmt.Sprintf("SELECT pg_terminate_backend(%d)", hs[0].PID)
			if b.name == "mysql" {
				kill = fmt.Sprintf("KILL %d", hs[0].PID)
			}
			w := newLock(t, open(), name, sharedOpts...)
			got := make(chan error, 1)
			go func() {
				g, err := w.LockTimeout(ctx, wait)
				if err == nil {
					mustRelease(t, g)
				}
				got <- err
			}()
			if _, err := admin.ExecContext(ctx, kill); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("writer after the shared holder was killed: %v", err)
			}
			select {
			case <-g.Lost():
			case <-time.After(wait):
				t.Fatal("Lost() did not close for the killed shared holder")
			}
			_ = g.Release(ctx)
			if b.name == "mysql" { // the dead holder's row goes at the key's next shared release
				g, err := r.TryRLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				mustRelease(t, g)
				if n := countRows(t, admin, "SELECT COUNT(*) FROM advisorylock_shared WHERE lock_key = ?", advisorylock.Key(r.Name())); n != 0 {
					t.Fatalf("%d shared rows left for the key after a release", n)
				}
			}
		})
	}
}

// TestSharedAndExclusiveHoldersNeverOverlap runs the soak's shared row
// (see sharedLoad: readers and writers of one name, each on its own
// *sql.DB, through RLock, Do, TryRLock and TryDo) until it has made a few
// hundred grants with readers inside together, and counts a writer beside
// anyone as a violation.
func TestSharedAndExclusiveHoldersNeverOverlap(t *testing.T) {
	testdb.Slow(t, "readers and writers under load for seconds")
	t.Parallel() // names of its own
	for _, b := range sharedBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel() // a name of its own on each backend
			l := startSharedLoad(t, b.name, b.open(t))
			testdb.WaitFor(t, wait, func() bool { return l.f.acquired.Load() >= 200 && l.together.Load() >= 5 },
				"the shared load made %d grants, readers together %d times", l.f.acquired.Load(), l.together.Load())
			l.halt(t)
			t.Log(l)
			l.check(t)
		})
	}
}

// TestObserverSeesSharedHoldsAsKindShared: a shared hold's acquire,
// release and loss reach the Observer as kind "shared", an exclusive
// hold's of the same Lock as kind "lock".
func TestObserverSeesSharedHoldsAsKindShared(t *testing.T) {
	t.Parallel()
	eachSharedBackend(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		rec := &observetest.Recorder{}
		name := testdb.UniqueName(t)
		l := newLock(t, open(), name, append(sharedOpts, advisorylock.WithObserver(rec))...)
		g, err := l.TryRLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := newLock(t, open(), name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock beside a shared holder: %v", err)
		}
		mustRelease(t, g)
		g, err = l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, g)
		kinds := map[string]int{}
		for _, e := range rec.Events("acquire_end") {
			if e.Value != "acquired" {
				t.Errorf("acquire_end %+v, want acquired", e)
			}
			kinds[e.Kind]++
		}
		for _, e := range rec.Events("release") {
			kinds[e.Kind] += 10
		}
		if kinds["shared"] != 11 || kinds["lock"] != 11 {
			t.Fatalf("acquires (1 each) and releases (10 each) by kind: %v; want one shared and one exclusive hold", kinds)
		}
	})
}

// TestLiveSharedHolderIsNotLost: the keep-alive of a shared hold finds
// its session's ShareLock (PostgreSQL) or holder lock and row (MySQL) and
// reports nothing: once the check has run on the holder's session (seen
// in pg_stat_activity; on MySQL, ten periods), Lost stays open.
func TestLiveSharedHolderIsNotLost(t *testing.T) {
	testdb.Slow(t, "holds through ten keep-alive periods, per backend")
	t.Parallel() // names of its own
	for _, b := range sharedBackends[:3] {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel() // a name of its own on each backend
			ctx := context.Background()
			open := b.open(t)
			admin := open()
			l := newLock(t, open(), testdb.UniqueName(t), advisorylock.WithKeepAlive(50*time.Millisecond))
			g, err := l.TryRLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer mustRelease(t, g)
			hs, err := l.Holders(ctx)
			if err != nil || len(hs) != 1 {
				t.Fatalf("Holders = %v, %v", hs, err)
			}
			if b.name != "mysql" { // MySQL does not show an idle session's last statement
				q := "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%pg_locks%'"
				testdb.WaitFor(t, wait, func() bool { return countRows(t, admin, q, hs[0].PID) == 1 }, "the keep-alive never ran on the holder's session")
			}
			select {
			case <-g.Lost():
				t.Fatal("the keep-alive reported a live shared hold lost")
			case <-time.After(500 * time.Millisecond): // ten keep-alive periods
			}
		})
	}
}

// TestCancelledSharedWaitLeavesNothing: readers whose wait behind a
// writer is cancelled, or times out, leave nothing behind (no row, no
// lock on a pooled session): once the writer is gone, another writer
// gets in at once, and every pool has all its connections back.
func TestCancelledSharedWaitLeavesNothing(t *testing.T) {
	testdb.Slow(t, "hundreds of cancelled waits")
	t.Parallel() // names of its own
	eachSharedBackend(t, func(t *testing.T, open func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		w := newLock(t, open(), name, sharedOpts...)
		g, err := w.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rdb := open()
		r := newLock(t, rdb, name, sharedOpts...)
		for range 3 {
			cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			if _, err := r.RLock(cctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("RLock behind a writer, cancelled = %v", err)
			}
			cancel()
		}
		mustRelease(t, g)
		g, err = newLock(t, open(), name).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after the cancelled shared waits: %v", err)
		}
		mustRelease(t, g)
		if s := rdb.Stats(); s.InUse != 0 {
			t.Fatalf("%d of the readers' connections still checked out", s.InUse)
		}
	})
}
