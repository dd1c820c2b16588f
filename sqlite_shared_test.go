package advisorylock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// On SQLite, shared holders keep a summary row in advisorylock_locks
// (owner '', live until the latest shared expiry) that refuses exclusive
// grants as a holder's row does. These tests pin what that row must and
// must not do.

func TestSQLiteExclusiveGrantWaitsForTheLatestSharedExpiry(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "_pragma=busy_timeout(5000)")
	ctx := context.Background()
	const ttl = 10 * time.Second
	start := testdb.NewFakeClock()
	at := func(d time.Duration) advisorylock.Option {
		return advisorylock.WithClock(testdb.FakeClockAt(start.Now().Add(d)).Now)
	}
	name := testdb.UniqueName(t)
	lock := func(opts ...advisorylock.Option) *advisorylock.Lock {
		return sqliteLock(t, db, name, append(opts, advisorylock.WithLeaseTTL(ttl))...)
	}
	// Clocks that stand still: the readers' renewals never extend them.
	// The latest expiry is neither the first reader's nor the last's.
	for _, d := range []time.Duration{0, 5 * time.Second, 2 * time.Second} { // expire at +10s, +15s, +12s
		r, err := lock(at(d)).TryRLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer mustRelease(t, r)
	}
	if g, err := lock(at(14 * time.Second)).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock before the latest reader's expiry: %v, %v; want ErrNotAcquired", g, err)
	}
	g, err := lock(at(15 * time.Second)).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock once every reader's row expired: %v", err)
	}
	mustRelease(t, g)
}

func TestSQLiteRenewedReaderKeepsExclusiveGrantsOut(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "_pragma=busy_timeout(5000)")
	ctx := context.Background()
	const ttl = time.Second // renewed every 333ms
	clock := testdb.NewFakeClock()
	start := clock.Now()
	name := testdb.UniqueName(t)
	l := sqliteLock(t, db, name, advisorylock.WithClock(clock.Now), advisorylock.WithLeaseTTL(ttl))
	r, err := l.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, r)
	clock.Add(ttl / 2)
	testdb.WaitFor(t, wait, func() bool {
		hs, err := l.Holders(ctx)
		return err == nil && len(hs) == 1 && hs[0].ExpiresAt.Equal(start.Add(ttl/2+ttl))
	}, "the reader's row was not renewed")
	w := sqliteLock(t, db, name, advisorylock.WithClock(testdb.FakeClockAt(start.Add(ttl+ttl/4)).Now))
	if g, err := w.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock after the reader's first expiry, before its renewed one: %v, %v; want ErrNotAcquired", g, err)
	}
}

func TestSQLiteExclusiveGrantGoesInOnceTheLastReaderReleases(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "_pragma=busy_timeout(5000)")
	ctx := context.Background()
	start := testdb.NewFakeClock()
	at := func(d time.Duration) advisorylock.Option {
		return advisorylock.WithClock(testdb.FakeClockAt(start.Now().Add(d)).Now)
	}
	t.Run("the last one", func(t *testing.T) {
		name := testdb.UniqueName(t)
		r1, err := sqliteLock(t, db, name).TryRLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := sqliteLock(t, db, name).TryRLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		w := sqliteLock(t, db, name)
		mustRelease(t, r1)
		if g, err := w.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock beside the remaining reader: %v, %v; want ErrNotAcquired", g, err)
		}
		mustRelease(t, r2)
		g, err := w.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock right after the last reader released: %v", err)
		}
		mustRelease(t, g)
	})
	t.Run("the latest expiry", func(t *testing.T) {
		name := testdb.UniqueName(t)
		lock := func(d time.Duration) *advisorylock.Lock {
			return sqliteLock(t, db, name, at(d), advisorylock.WithLeaseTTL(10*time.Second))
		}
		late, err := lock(5 * time.Second).TryRLock(ctx) // expires at +15s
		if err != nil {
			t.Fatal(err)
		}
		early, err := lock(0).TryRLock(ctx) // expires at +10s
		if err != nil {
			t.Fatal(err)
		}
		defer mustRelease(t, early)
		mustRelease(t, late)
		g, err := lock(12 * time.Second).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after the remaining reader's expiry: %v (the released reader's still counted)", err)
		}
		mustRelease(t, g)
	})
}

func TestSQLiteSharedSummaryIsNeverReportedAsAHolder(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "_pragma=busy_timeout(5000)")
	ctx := context.Background()
	name := testdb.UniqueName(t)
	l := sqliteLock(t, db, name, advisorylock.WithOwner("reader-1"))
	r, err := l.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, r)
	hs, err := l.Holders(ctx)
	if err != nil || len(hs) != 1 || !hs[0].Shared || hs[0].Owner == "" {
		t.Fatalf("Holders of a name with one shared holder: %v, %v; want that holder alone", holderList(hs), err)
	}
	if h, err := l.Holder(ctx); err != nil || h == nil || !h.Shared || h.Owner != hs[0].Owner {
		t.Fatalf("Holder: %+v, %v; want the shared holder %q", h, err, hs[0].Owner)
	}
}

// TestSQLiteReadersGetInRightAfterAWaitingWritersRelease: the claim a
// writer made while it waited ends with its grant, not with the TTL.
func TestSQLiteReadersGetInRightAfterAWaitingWritersRelease(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "_pragma=busy_timeout(5000)")
	ctx := context.Background()
	name := testdb.UniqueName(t)
	r, err := sqliteLock(t, db, name, sharedOpts...).TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *advisorylock.Guard, 1)
	go func() {
		g, err := sqliteLock(t, db, name, sharedOpts...).LockTimeout(ctx, wait)
		if err != nil {
			t.Errorf("writer: %v", err)
		}
		got <- g
	}()
	testdb.WaitFor(t, wait, func() bool {
		g, err := sqliteLock(t, db, name).TryRLock(ctx)
		if err == nil {
			mustRelease(t, g)
		}
		return errors.Is(err, advisorylock.ErrNotAcquired)
	}, "the waiting writer's claim did not keep a new reader out")
	mustRelease(t, r)
	g := <-got
	if g == nil {
		t.FailNow()
	}
	mustRelease(t, g)
	r2, err := sqliteLock(t, db, name).TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock right after the writer released: %v (its claim outlived its grant)", err)
	}
	mustRelease(t, r2)
}

// TestSQLiteUncontendedLockWritesOnce: a waiting Lock granted at its
// first attempt made no claim, so it sends no withdrawal: its acquire is
// the one upsert a TryLock sends. A grant after a miss does withdraw
// (TestSQLiteReadersGetInRightAfterAWaitingWritersRelease).
func TestSQLiteUncontendedLockWritesOnce(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var sent []string
	db := testdb.OpenHooked(t, "sqlite", testdb.SQLitePath(t)+"?"+sqliteWAL, testdb.Hooks{Before: func(q string, _ []any) {
		mu.Lock()
		sent = append(sent, q)
		mu.Unlock()
	}})
	l := sqliteLock(t, db, testdb.UniqueName(t), advisorylock.WithBackend(advisorylock.SQLite()))
	mustRelease(t, mustTry(t, l)) // the first use's schema and checks
	mu.Lock()
	sent = nil
	mu.Unlock()
	g, err := l.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	during := sent
	mu.Unlock()
	mustRelease(t, g)
	if len(during) != 1 || !strings.Contains(during[0], "INSERT INTO advisorylock_locks") {
		t.Fatalf("an uncontended Lock sent %d statements, want its one upsert: %q", len(during), during)
	}
}

// TestSQLiteSchemaUpgradesAStepThreeFileLive upgrades a file of schema
// version 3 (shared locks without the summary row) holding a live shared
// row: the new code's exclusive grant must still be refused, and the
// writer-claim triggers that made every grant pay are gone.
func TestSQLiteSchemaUpgradesAStepThreeFileLive(t *testing.T) {
	_, db := sqliteFile(t, "_pragma=busy_timeout(5000)")
	ctx := context.Background()
	name := testdb.UniqueName(t)
	now := time.Now()
	for _, s := range []string{
		`CREATE TABLE advisorylock_schema (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`,
		`INSERT INTO advisorylock_schema VALUES (1, 0), (2, 0), (3, 0)`,
		`CREATE TABLE advisorylock_locks (key INTEGER PRIMARY KEY, name TEXT NOT NULL, owner TEXT NOT NULL, acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL)`,
		`CREATE TABLE advisorylock_shared (key INTEGER NOT NULL, owner TEXT NOT NULL, name TEXT NOT NULL, acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (key, owner))`,
		`CREATE TABLE advisorylock_writers (key INTEGER PRIMARY KEY, owner TEXT NOT NULL, expires_at INTEGER NOT NULL)`,
		`CREATE TRIGGER advisorylock_writers_insert AFTER INSERT ON advisorylock_locks
BEGIN DELETE FROM advisorylock_writers WHERE key = NEW.key AND owner = NEW.owner; END`,
		`CREATE TRIGGER advisorylock_writers_update AFTER UPDATE OF owner ON advisorylock_locks
BEGIN DELETE FROM advisorylock_writers WHERE key = NEW.key AND owner = NEW.owner; END`,
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO advisorylock_shared VALUES (?, 'old-reader/1', ?, ?, ?)`,
		advisorylock.Key(name), name, now.UnixMilli(), now.Add(time.Hour).UnixMilli()); err != nil {
		t.Fatal(err)
	}
	w := sqliteLock(t, db, name)
	if g, err := w.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock beside a shared row of the old schema: %v, %v; want ErrNotAcquired", g, err)
	}
	if hs, err := w.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Owner != "old-reader/1" || !hs[0].Shared {
		t.Fatalf("Holders after the upgrade: %v, %v; want the old shared holder alone", holderList(hs), err)
	}
	var triggers int
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'advisorylock_writers_%'").Scan(&triggers); err != nil || triggers != 0 {
		t.Fatalf("writer-claim triggers after the upgrade: %d, %v; want none", triggers, err)
	}
	r, err := sqliteLock(t, db, name).TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock beside the old shared holder: %v", err)
	}
	mustRelease(t, r)
	later := sqliteLock(t, db, name, advisorylock.WithClock(testdb.FakeClockAt(now.Add(time.Hour)).Now))
	g, err := later.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock once the old shared row expired: %v", err)
	}
	mustRelease(t, g)
}

// holderList shows holders for a failure message.
func holderList(hs []*advisorylock.Holder) []advisorylock.Holder {
	var out []advisorylock.Holder
	for _, h := range hs {
		out = append(out, *h)
	}
	return out
}
