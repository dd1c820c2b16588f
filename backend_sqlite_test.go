package advisorylock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"go.uber.org/goleak"
)

// sqliteWait bounds every wait in the SQLite tests.
const sqliteWait = 30 * time.Second

// sqliteJournals are the two journal modes every multi-process SQLite test
// runs in. busy_timeout(0) makes the driver report SQLITE_BUSY at once, so
// the package's own retry is what is tested.
var sqliteJournals = []struct{ name, options string }{
	{"wal", "_pragma=busy_timeout(0)&_pragma=journal_mode(WAL)"},
	{"rollback", "_pragma=busy_timeout(0)&_pragma=journal_mode(DELETE)"},
}

// sqliteFile opens a fresh database file, returning its path and handle.
func sqliteFile(t testing.TB, options string) (string, *sql.DB) {
	t.Helper()
	path := testdb.SQLitePath(t)
	return path, testdb.OpenSQLite(t, path, options)
}

func sqliteLock(t testing.TB, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.Lock {
	t.Helper()
	l, err := advisorylock.New(db, name, opts...)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return l
}

func sqliteLeaseLock(t testing.TB, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.LeaseLock {
	t.Helper()
	l, err := advisorylock.NewLeaseLock(db, name, opts...)
	if err != nil {
		t.Fatalf("NewLeaseLock(%q): %v", name, err)
	}
	return l
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestSQLiteTryLockIsNotReentrant(t *testing.T) {
	t.Parallel()
	path, db := sqliteFile(t, "")
	other := testdb.OpenSQLite(t, path, "")
	name := testdb.UniqueName(t)
	ctx := context.Background()

	l := sqliteLock(t, db, name)
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second TryLock on the same Lock: got %v, want ErrNotAcquired", err)
	}
	if _, err := sqliteLock(t, db, name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock on a second Lock, same handle: got %v, want ErrNotAcquired", err)
	}
	if _, err := sqliteLock(t, other, name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock on another handle of the file: got %v, want ErrNotAcquired", err)
	}
	if _, err := l.LockTimeout(ctx, 100*time.Millisecond); !errors.Is(err, advisorylock.ErrTimeout) {
		t.Fatalf("LockTimeout while held: got %v, want ErrTimeout", err)
	}
	if ran, err := l.TryDo(ctx, func(context.Context) error { return nil }); ran || err != nil {
		t.Fatalf("TryDo while held: ran=%v err=%v, want false, nil", ran, err)
	}
	mustRelease(t, g)
	g2, err := sqliteLock(t, other, name).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after release: %v", err)
	}
	mustRelease(t, g2)
}

func TestSQLiteRefusesInMemoryDatabase(t *testing.T) {
	for _, dsn := range []string{
		":memory:",
		"file::memory:",
		"file::memory:?cache=shared",
		"file:" + t.Name() + "?mode=memory",
		"file:" + t.Name() + "?mode=memory&cache=shared",
		"",
	} {
		t.Run(dsn, func(t *testing.T) {
			db, err := sql.Open("sqlite", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, advisorylock.ErrUnsupported) {
					t.Fatalf("%s: got %v, want ErrUnsupported", what, err)
				}
				for _, why := range []string{"in memory", "every connection", "exclude nothing", "database file"} {
					if !strings.Contains(err.Error(), why) {
						t.Errorf("%s: message %q does not say %q", what, err, why)
					}
				}
			}
			ctx := context.Background()
			l, err := advisorylock.New(db, "job")
			if err != nil {
				t.Fatalf("New: %v (it does no I/O, so it cannot know yet)", err)
			}
			_, err = l.TryLock(ctx)
			check("TryLock", err)
			check("Check", l.Check(ctx))
			lease, err := advisorylock.NewLeaseLock(db, "job")
			if err != nil {
				t.Fatalf("NewLeaseLock: %v", err)
			}
			_, err = lease.TryLock(ctx)
			check("LeaseLock.TryLock", err)
			fence, err := advisorylock.NewFence(db, "job")
			if err != nil {
				t.Fatalf("NewFence: %v", err)
			}
			check("Fence.Check", fence.Check(ctx))
			l, err = advisorylock.New(db, "job", advisorylock.WithBackend(advisorylock.SQLite()))
			if err != nil {
				t.Fatalf("New WithBackend: %v", err)
			}
			_, err = l.Holder(ctx)
			check("Holder WithBackend", err)
		})
	}
}

func TestSQLiteHolderReportsOwnerAndExpiry(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "")
	clock := testdb.NewFakeClock()
	ctx := context.Background()
	const ttl = 10 * time.Second

	t.Run("Lock", func(t *testing.T) {
		name := testdb.UniqueName(t)
		l := sqliteLock(t, db, name, advisorylock.WithOwner("worker-7"), advisorylock.WithClock(clock.Now), advisorylock.WithLeaseTTL(ttl))
		if h, err := l.Holder(ctx); h != nil || err != nil {
			t.Fatalf("Holder of a free lock: %+v, %v; want nil, nil", h, err)
		}
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer mustRelease(t, g)
		h, err := l.Holder(ctx)
		if err != nil || h == nil {
			t.Fatalf("Holder: %+v, %v", h, err)
		}
		want := advisorylock.Holder{Name: name, Owner: h.Owner, Since: clock.Now(), ExpiresAt: clock.Now().Add(ttl)}
		if !strings.HasPrefix(h.Owner, "worker-7/") {
			t.Errorf("Owner = %q, want the label worker-7 and a per-acquire suffix", h.Owner)
		}
		if !h.Since.Equal(want.Since) || !h.ExpiresAt.Equal(want.ExpiresAt) || h.Name != want.Name || h.PID != 0 || h.Client != "" || h.Token != 0 {
			t.Errorf("Holder = %+v, want %+v", *h, want)
		}
		later := sqliteLock(t, db, name, advisorylock.WithClock(testdb.FakeClockAt(clock.Now().Add(ttl)).Now))
		if h, err := later.Holder(ctx); h != nil || err != nil {
			t.Errorf("Holder as of the expiry: %+v, %v; want nil (expired)", h, err)
		}
	})
	t.Run("LeaseLock", func(t *testing.T) {
		name := testdb.UniqueName(t)
		l := sqliteLeaseLock(t, db, name, advisorylock.WithOwner("worker-8"), advisorylock.WithClock(clock.Now), advisorylock.WithLeaseTTL(ttl))
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.Holder(ctx)
		if err != nil || h == nil {
			t.Fatalf("Holder: %+v, %v", h, err)
		}
		if !strings.HasPrefix(h.Owner, "worker-8/") || h.Token != g.Lease().Token() || h.Token != 1 || !h.ExpiresAt.Equal(clock.Now().Add(ttl)) || !h.Since.Equal(clock.Now()) || h.Name != name {
			t.Errorf("Holder = %+v; want owner worker-8/…, token 1, expiry now+%v", *h, ttl)
		}
		mustRelease(t, g)
		if h, err := l.Holder(ctx); h != nil || err != nil {
			t.Errorf("Holder after release: %+v, %v; want nil", h, err)
		}
	})
}

// TestSQLiteTakenOverGuardIsLostAndCannotFreeItsSuccessor expires a
// holder's row deterministically: the holder's clock stands still (so its
// local deadline never passes and it keeps renewing), while the
// successor's clock is an hour ahead, so to the successor the row is
// expired and it takes it over.
func TestSQLiteTakenOverGuardIsLostAndCannotFreeItsSuccessor(t *testing.T) {
	testdb.Slow(t, "waits for renewals a second apart")
	t.Parallel() // a file of its own
	path, db := sqliteFile(t, "")
	other := testdb.OpenSQLite(t, path, "")
	ctx := context.Background()
	stale := testdb.NewFakeClock()
	ahead := testdb.FakeClockAt(stale.Now().Add(time.Hour))
	const ttl = 3 * time.Second // renewals every second

	t.Run("Lock", func(t *testing.T) {
		name := testdb.UniqueName(t)
		g, err := sqliteLock(t, db, name, advisorylock.WithClock(stale.Now), advisorylock.WithLeaseTTL(ttl)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		successor := sqliteLock(t, other, name, advisorylock.WithClock(ahead.Now), advisorylock.WithLeaseTTL(time.Hour))
		g2, err := successor.TryLock(ctx)
		if err != nil {
			t.Fatalf("successor TryLock on an expired row: %v", err)
		}
		defer mustRelease(t, g2)
		select {
		case <-g.Lost():
		case <-time.After(sqliteWait):
			t.Fatal("Lost() did not close after the row was taken over")
		}
		mustRelease(t, g)
		h, err := successor.Holder(ctx)
		if err != nil || h == nil {
			t.Fatalf("successor's Holder after the stale Release: %+v, %v; want the successor", h, err)
		}
		if isClosed(g2.Lost()) {
			t.Error("the successor's guard is lost")
		}
		if _, err := sqliteLock(t, db, name, advisorylock.WithClock(ahead.Now)).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Errorf("TryLock after the stale Release: %v, want ErrNotAcquired (the successor still holds it)", err)
		}
	})
	t.Run("LeaseLock", func(t *testing.T) {
		name := testdb.UniqueName(t)
		g, err := sqliteLeaseLock(t, db, name, advisorylock.WithClock(stale.Now), advisorylock.WithLeaseTTL(ttl)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		successor := sqliteLeaseLock(t, other, name, advisorylock.WithClock(ahead.Now), advisorylock.WithLeaseTTL(time.Hour))
		g2, err := successor.TryLock(ctx)
		if err != nil {
			t.Fatalf("successor TryLock on an expired lease: %v", err)
		}
		defer mustRelease(t, g2)
		if g2.Lease().Token() <= g.Lease().Token() {
			t.Fatalf("successor token %d, want > %d", g2.Lease().Token(), g.Lease().Token())
		}
		select {
		case <-g.Lease().Lost():
		case <-time.After(sqliteWait):
			t.Fatal("Lost() did not close after the lease was taken over")
		}
		if !isLost(g.Lease()) {
			t.Error("the lease reads not lost after Lost() closed")
		}
		mustRelease(t, g)
		h, err := successor.Holder(ctx)
		if err != nil || h == nil || h.Token != g2.Lease().Token() {
			t.Fatalf("Holder after the stale Release: %+v, %v; want the successor's token %d", h, err, g2.Lease().Token())
		}

		fence, err := advisorylock.NewFence(db, name)
		if err != nil {
			t.Fatal(err)
		}
		admit(t, db, fence, g2.Lease().Token())
		err = admitErr(t, db, fence, g.Lease().Token())
		if !isStale(err, name, g.Lease().Token(), g2.Lease().Token()) {
			t.Fatalf("stale holder's Admit: %v; want ErrStaleToken naming %q, token %d, highest %d", err, name, g.Lease().Token(), g2.Lease().Token())
		}
	})
}

// admit runs Fence.Admit in a transaction and commits; it fails the test
// on error.
func admit(t testing.TB, db *sql.DB, f *advisorylock.Fence, tok advisorylock.FencingToken) {
	t.Helper()
	if err := admitErr(t, db, f, tok); err != nil {
		t.Fatalf("Admit(%d): %v", tok, err)
	}
}

// admitErr runs Fence.Admit in a transaction, commits if it admitted and
// rolls back otherwise.
func admitErr(t testing.TB, db *sql.DB, f *advisorylock.Fence, tok advisorylock.FencingToken) error {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Admit(ctx, tx, tok); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return nil
}

func TestSQLiteLeaseGenerationsOnlyGoUp(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "")
	name := testdb.UniqueName(t)
	l := sqliteLeaseLock(t, db, name)
	ctx := context.Background()
	for want := advisorylock.FencingToken(1); want <= 3; want++ {
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if g.Lease().Token() != want {
			t.Fatalf("grant %d got token %d", want, g.Lease().Token())
		}
		if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock while held: %v, want ErrNotAcquired", err)
		}
		mustRelease(t, g)
		var owner sql.NullString
		var gen int64
		if err := db.QueryRow("SELECT owner, generation FROM advisorylock_leases WHERE name = ?", name).Scan(&owner, &gen); err != nil {
			t.Fatalf("the released row is gone: %v", err)
		}
		if owner.Valid || gen != int64(want) {
			t.Fatalf("released row: owner %v, generation %d; want NULL, %d", owner, gen, want)
		}
	}
}

func TestSQLiteFenceAdmitsEqualAndHigherTokens(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "")
	name := testdb.UniqueName(t)
	f, err := advisorylock.NewFence(db, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []advisorylock.FencingToken{1, 1, 5, 5, 7} {
		admit(t, db, f, tok)
	}
	err = admitErr(t, db, f, 6)
	if !isStale(err, name, 6, 7) {
		t.Fatalf("Admit(6) after 7: %v; want ErrStaleToken naming token 6, highest 7", err)
	}
	admit(t, db, f, 7)
}

// TestSQLiteWeirdNamesAreData takes locks whose names look like SQL or
// hold bytes a text column might choke on; the tables must survive and
// the lock must exclude.
func TestSQLiteWeirdNamesAreData(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "")
	ctx := context.Background()
	names := []string{
		" ", // the empty name is refused (TestConstructorsRefuseAnEmptyName)
		"'",
		`"quoted"`,
		"'); DROP TABLE advisorylock_locks; --",
		"x' OR '1'='1",
		"back\\slash",
		"nul\x00byte",
		"\xff\xfe not utf-8",
		"ünïcödé ✓",
		strings.Repeat("long", 4096),
	}
	for _, name := range names {
		l := sqliteLock(t, db, name)
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock(%q): %v", name, err)
		}
		if _, err := sqliteLock(t, db, name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("second TryLock(%q): %v, want ErrNotAcquired", name, err)
		}
		var stored []byte
		if err := db.QueryRow("SELECT name FROM advisorylock_locks WHERE key = ?", advisorylock.Key(l.Name())).Scan(&stored); err != nil {
			t.Fatalf("row of %q: %v", name, err)
		}
		if !bytes.Equal(stored, []byte(name)) {
			t.Errorf("stored name %q, want %q", stored, name)
		}
		if h, err := l.Holder(ctx); err != nil || h == nil || h.Name != name {
			t.Fatalf("Holder(%q): %+v, %v", name, h, err)
		}
		mustRelease(t, g)

		ll, err := advisorylock.NewLeaseLock(db, name)
		if strings.ContainsRune(name, 0) || !utf8.ValidString(name) {
			if err == nil {
				t.Errorf("NewLeaseLock(%q) accepted a name a text column cannot hold", name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("NewLeaseLock(%q): %v", name, err)
		}
		lg, err := ll.TryLock(ctx)
		if err != nil {
			t.Fatalf("LeaseLock TryLock(%q): %v", name, err)
		}
		if h, err := ll.Holder(ctx); err != nil || h == nil || h.Token != lg.Lease().Token() {
			t.Fatalf("LeaseLock Holder(%q): %+v, %v", name, h, err)
		}
		mustRelease(t, lg)
	}
	var tables int
	if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name LIKE 'advisorylock\\_%' ESCAPE '\\'").Scan(&tables); err != nil || tables != 8 {
		t.Fatalf("tables after weird names: %d, %v; want all 8", tables, err)
	}
}

func TestSQLiteSchemaIsCreatedOnFirstUseAndExported(t *testing.T) {
	testdb.Slow(t, "creates tables in several processes")
	_, db := sqliteFile(t, "")
	tables := func() []string {
		t.Helper()
		rows, err := db.Query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var names []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			names = append(names, n)
		}
		return names
	}
	want := "advisorylock_fences advisorylock_leases advisorylock_locks advisorylock_runs advisorylock_schema advisorylock_shared advisorylock_tokens advisorylock_writers"
	if got := strings.Join(tables(), " "); got != "" {
		t.Fatalf("fresh file has tables %q", got)
	}
	l := sqliteLock(t, db, testdb.UniqueName(t))
	if got := strings.Join(tables(), " "); got != "" {
		t.Fatalf("after New: tables %q, want none (New does no I/O)", got)
	}
	if err := l.Check(context.Background()); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := strings.Join(tables(), " "); got != want {
		t.Fatalf("after Check: tables %q, want %q", got, want)
	}

	// Dropped behind the package's back: the next statement recreates them.
	if _, err := db.Exec("DROP TABLE advisorylock_locks; DROP TABLE advisorylock_leases; DROP TABLE advisorylock_fences"); err != nil {
		t.Fatal(err)
	}
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatalf("TryLock with the tables dropped: %v", err)
	}
	mustRelease(t, g)
	if got := strings.Join(tables(), " "); got != want {
		t.Fatalf("after TryLock: tables %q, want %q", got, want)
	}

	ddl := advisorylock.Schema(advisorylock.SQLite())
	for _, table := range strings.Fields(want) {
		if !strings.Contains(ddl, "CREATE TABLE IF NOT EXISTS "+table) {
			t.Errorf("Schema lacks %s:\n%s", table, ddl)
		}
	}
	_, fresh := sqliteFile(t, "")
	for range 2 {
		if _, err := fresh.Exec(ddl); err != nil {
			t.Fatalf("running Schema on a fresh file: %v", err)
		}
	}
}

// TestSQLiteBusyIsWaitedOutNotReported holds SQLite's write lock from
// another connection while locks are taken, renewed and read with a
// driver that reports SQLITE_BUSY at once.
func TestSQLiteBusyIsWaitedOutNotReported(t *testing.T) {
	testdb.Slow(t, "holds SQLite's write lock for seconds")
	t.Parallel() // files of its own
	for _, j := range sqliteJournals {
		t.Run(j.name, func(t *testing.T) {
			t.Parallel() // a file of its own per journal mode
			path, db := sqliteFile(t, j.options)
			blocker := testdb.OpenSQLite(t, path, j.options)
			ctx := context.Background()
			name := testdb.UniqueName(t)
			const ttl = 3 * time.Second
			// An acquire cut short while busy frees, in the background,
			// whatever it may have granted; that waits out the busy spell
			// too, bounded by the release timeout: keep it short here.
			relTO := advisorylock.WithReleaseTimeout(500 * time.Millisecond)
			l := sqliteLock(t, db, name, advisorylock.WithLeaseTTL(ttl), relTO)
			ll := sqliteLeaseLock(t, db, name, advisorylock.WithLeaseTTL(ttl), relTO)
			held, err := ll.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}

			// EXCLUSIVE blocks readers too in rollback-journal mode.
			block := func() (unblock func()) {
				conn, err := blocker.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// busy_timeout(0): a renewal of held's lease in flight
				// makes BEGIN EXCLUSIVE fail at once, so try again.
				testdb.WaitFor(t, 0, func() bool {
					_, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE")
					return err == nil
				}, "BEGIN EXCLUSIVE never got the database")
				return func() {
					if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
						t.Error(err)
					}
					conn.Close()
				}
			}

			unblock := block()
			type result struct {
				g   *advisorylock.Guard
				err error
			}
			done := make(chan result, 1)
			go func() {
				g, err := l.TryLock(ctx)
				done <- result{g, err}
			}()
			// Longer than a renew interval, shorter than the local deadline:
			// the lease's renewal is retried, not lost.
			time.Sleep(1500 * time.Millisecond)
			select {
			case r := <-done:
				t.Fatalf("TryLock returned while the database was busy: %v", r.err)
			default:
			}
			unblock()
			r := <-done
			if r.err != nil {
				t.Fatalf("TryLock once the database was free: %v", r.err)
			}
			mustRelease(t, r.g)
			if isClosed(held.Lease().Lost()) {
				t.Fatal("a lease renewed across a busy spell was reported lost")
			}

			// A context that ends while busy gets the context's error, not
			// ErrNotAcquired.
			unblock = block()
			tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err = l.TryLock(tctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Errorf("TryLock with a context ending while busy: %v; want DeadlineExceeded", err)
			}
			_, err = l.LockTimeout(ctx, 200*time.Millisecond)
			if !errors.Is(err, advisorylock.ErrTimeout) {
				t.Errorf("LockTimeout while busy: %v; want ErrTimeout", err)
			}
			unblock()
			if h, err := l.Holder(ctx); h != nil || err != nil {
				t.Errorf("after the busy attempts: holder %+v, %v; want a free lock", h, err)
			}
			mustRelease(t, held)
		})
	}
}

// TestSQLiteReleasedGuardLeavesNoGoroutine checks that a guard's keeper
// stops with Release, for Lock, LeaseLock and Do.
func TestSQLiteReleasedGuardLeavesNoGoroutine(t *testing.T) {
	testdb.Slow(t, "waits for the keeper's goroutines to end")
	_, db := sqliteFile(t, "")
	ctx := context.Background()
	name := testdb.UniqueName(t)
	l := sqliteLock(t, db, name, advisorylock.WithLeaseTTL(time.Second))
	ll := sqliteLeaseLock(t, db, name, advisorylock.WithLeaseTTL(time.Second))
	before := goleak.IgnoreCurrent()

	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lg, err := ll.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // let the keepers renew
	mustRelease(t, g)
	mustRelease(t, lg)
	if err := l.Do(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := ll.Do(ctx, func(context.Context, advisorylock.Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := goleak.Find(before); err != nil {
		t.Fatal(err)
	}
}

// TestSQLiteFenceAdmitUnderBusy runs Fence.Admit in the caller's
// transaction while another connection writes.
func TestSQLiteFenceAdmitUnderBusy(t *testing.T) {
	testdb.Slow(t, "holds SQLite's write lock for seconds")
	t.Parallel() // files of its own
	ctx := context.Background()
	setup := func(t *testing.T, options string) (*sql.DB, *sql.Conn, *advisorylock.Fence) {
		path, db := sqliteFile(t, options)
		other, err := testdb.OpenSQLite(t, path, options).Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { other.Close() })
		f, err := advisorylock.NewFence(db, testdb.UniqueName(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Check(ctx); err != nil { // creates the tables the cases read
			t.Fatal(err)
		}
		return db, other, f
	}
	exec := func(t *testing.T, q sqliteQuerier, stmt string) error {
		t.Helper()
		_, err := q.ExecContext(ctx, stmt)
		return err
	}
	mustExec := func(t *testing.T, q sqliteQuerier, stmt string) {
		t.Helper()
		if err := exec(t, q, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	saysRollBack := func(t *testing.T, err error) {
		t.Helper()
		var coded interface{ Code() int }
		if err == nil || errors.Is(err, advisorylock.ErrStaleToken) || !strings.Contains(err.Error(), "roll back and retry") || !errors.As(err, &coded) {
			t.Fatalf("Admit: %v; want the driver's busy error and advice to roll back", err)
		}
	}

	for _, j := range sqliteJournals {
		t.Run(j.name+"/brief busy is waited out", func(t *testing.T) {
			db, other, f := setup(t, j.options)
			mustExec(t, other, "BEGIN EXCLUSIVE")
			go func() {
				time.Sleep(200 * time.Millisecond)
				_ = exec(t, other, "COMMIT")
			}()
			admit(t, db, f, 3)
		})
	}
	t.Run("wal/stale snapshot", func(t *testing.T) {
		db, other, f := setup(t, sqliteJournals[0].options)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		mustExec(t, tx, "SELECT count(*) FROM advisorylock_fences")
		mustExec(t, other, "INSERT INTO advisorylock_fences VALUES ('someone else', 1)")
		saysRollBack(t, f.Admit(ctx, tx, 3))
		_ = tx.Rollback()
		admit(t, db, f, 3)
	})
	t.Run("rollback/writer waiting for our read lock", func(t *testing.T) {
		db, other, f := setup(t, sqliteJournals[1].options)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		mustExec(t, tx, "SELECT count(*) FROM advisorylock_fences")
		mustExec(t, other, "BEGIN IMMEDIATE")
		mustExec(t, other, "INSERT INTO advisorylock_fences VALUES ('someone else', 1)")
		if err := exec(t, other, "COMMIT"); err == nil {
			t.Fatal("the writer committed past our read lock")
		}
		saysRollBack(t, f.Admit(ctx, tx, 3))
		_ = tx.Rollback()
		mustExec(t, other, "COMMIT")
		admit(t, db, f, 3)
	})
}

// sqliteQuerier is what *sql.Conn, *sql.Tx and *sql.DB share.
type sqliteQuerier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// TestSQLiteContextEndingAtTheStatementGrantsNothingFalse races the
// context's end against the acquire statement, on a lock nobody else
// takes: every outcome must be a real grant or the context's error, never
// "held elsewhere" and never a guard without its row. (A driver that
// skips a statement whose context just ended, and reports the previous
// statement's row count, fails this.)
func TestSQLiteContextEndingAtTheStatementGrantsNothingFalse(t *testing.T) {
	testdb.Slow(t, "1,000 acquires racing their context's end")
	t.Parallel() // a SQLite file of its own
	_, db := sqliteFile(t, "")
	db.SetMaxOpenConns(1) // every statement reports on the same connection
	l := sqliteLock(t, db, testdb.UniqueName(t), advisorylock.WithReleaseTimeout(sqliteWait))
	bg := context.Background()
	granted, ended := 0, 0
	for i := range 1000 {
		ctx, cancel := context.WithTimeout(bg, time.Duration(i%100)*5*time.Microsecond)
		g, err := l.TryLock(ctx)
		cancel()
		switch {
		case err == nil:
			granted++
			h, herr := l.Holder(bg)
			if herr != nil || h == nil {
				t.Fatalf("attempt %d: TryLock granted a guard, but the row is missing (holder %+v, %v)", i, h, herr)
			}
			mustRelease(t, g)
		case errors.Is(err, advisorylock.ErrNotAcquired):
			t.Fatalf("attempt %d: %v on a lock nobody holds", i, err)
		case errors.Is(err, context.DeadlineExceeded):
			ended++
			// A cut-short acquire frees its possible grant in the
			// background: wait for that before the next attempt.
			testdb.WaitFor(t, sqliteWait, func() bool {
				h, err := l.Holder(bg)
				return err == nil && h == nil
			}, "attempt %d: the lock stayed held after an acquire cut short", i)
		default:
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	t.Logf("%d granted, %d cut short", granted, ended)
}

// TestSQLiteReleaseIsBoundedWhileBusy holds the database's write lock from
// another connection while a Guard is released: the release retries until
// WithReleaseTimeout and then fails, whether the pool has a limit (which
// only a context can bound) or not. (With a busy_timeout longer
// than the release timeout both take the busy_timeout: an interrupt does
// not end SQLite's busy wait; WithReleaseTimeout says so.)
func TestSQLiteReleaseIsBoundedWhileBusy(t *testing.T) {
	testdb.Slow(t, "waits out release timeouts while SQLite is busy")
	const timeout = 400 * time.Millisecond
	for _, c := range []struct {
		name     string
		maxOpen  int
		busyWait string
	}{
		{"unlimited pool", 0, "100"},
		{"limited pool", 4, "100"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			path := testdb.SQLitePath(t)
			db := testdb.OpenSQLite(t, path, "_pragma=busy_timeout("+c.busyWait+")&_pragma=journal_mode(WAL)")
			db.SetMaxOpenConns(c.maxOpen)
			l, err := advisorylock.New(db, "busy-release", advisorylock.WithReleaseTimeout(timeout))
			if err != nil {
				t.Fatal(err)
			}
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			writer, err := testdb.OpenSQLite(t, path, "").Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer writer.Close()
			if _, err := writer.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = g.Release(ctx)
			took := time.Since(start)
			if _, rerr := writer.ExecContext(ctx, "ROLLBACK"); rerr != nil {
				t.Fatal(rerr)
			}
			t.Logf("release took %v: %v", took, err)
			if err == nil || !strings.Contains(err.Error(), "locked") {
				t.Fatalf("release while another connection writes returned %v, want the busy error", err)
			}
			if took < timeout {
				t.Fatalf("release gave up after %v, before its timeout of %v", took, timeout)
			}
			if bound := 3*timeout + time.Second; took > bound {
				t.Fatalf("release took %v, over %v for a release timeout of %v", took, bound, timeout)
			}
		})
	}
}

// TestSQLiteStatementsAreNotWatched runs a LeaseLock's and a Lock's
// acquire, holder read and release under contexts that can end, after the
// handle's first use (whose schema statements run once): none of their
// statements may reach the driver with a context that can end, for
// which the driver starts a goroutine per statement to interrupt it, an
// interrupt that cannot end the only wait such a statement makes (the
// busy handler's; see TestSQLiteReleaseIsBoundedWhileBusy).
func TestSQLiteStatementsAreNotWatched(t *testing.T) {
	var mu sync.Mutex
	var watched []string
	seen := 0
	db := testdb.OpenHooked(t, "sqlite", testdb.SQLitePath(t)+"?"+sqliteWAL, testdb.Hooks{Cancellable: func(q string, canEnd bool) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(q, "advisorylock_") {
			seen++
			if canEnd {
				watched = append(watched, q)
			}
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), sqliteWait)
	defer cancel()
	name := testdb.UniqueName(t)
	lease, err := advisorylock.NewLeaseLock(db, name+"/lease", advisorylock.WithBackend(advisorylock.SQLite()))
	if err != nil {
		t.Fatal(err)
	}
	l := sqliteLock(t, db, name+"/lock", advisorylock.WithBackend(advisorylock.SQLite()))
	mustRelease(t, mustTry(t, l)) // the first use's schema and checks, made once per handle
	mu.Lock()
	watched, seen = nil, 0
	mu.Unlock()
	for _, acquire := range []func(context.Context) (interface{ Release(context.Context) error }, error){
		func(ctx context.Context) (interface{ Release(context.Context) error }, error) {
			return lease.TryLock(ctx)
		},
		func(ctx context.Context) (interface{ Release(context.Context) error }, error) { return l.Lock(ctx) },
	} {
		g, err := acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Holder(ctx); err != nil {
			t.Fatal(err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if seen < 5 {
		t.Fatalf("saw %d statements on the tables, want the acquires, reads and releases", seen)
	}
	if len(watched) > 0 {
		t.Fatalf("%d of %d statements reached the driver with a context that can end: %q", len(watched), seen, watched)
	}
}
