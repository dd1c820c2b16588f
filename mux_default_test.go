package advisorylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestMultiplexingIsTheDefault: 2,000 names held by Locks made with New's
// defaults on one handle (lib/pq, no SetMaxOpenConns) are held on the
// server by at most 4 sessions; with WithMultiplexing(0) each held name
// pins a session of its own.
func TestMultiplexingIsTheDefault(t *testing.T) {
	testdb.Slow(t, "2,000 names held on one handle")
	t.Parallel() // names of its own; the server shows them per key
	db := testdb.OpenPostgres(t, "postgres")
	admin := testdb.OpenPostgres(t, "postgres")

	names, keys := muxNames(t, 2000)
	guards := holdAll(t, db, names, 16, quiet)
	held := pgKeySessions(t, admin, keys)
	sessions := distinct(held)
	releaseAll(t, guards)
	if len(held) != len(keys) {
		t.Fatalf("the server holds %d of the %d names", len(held), len(keys))
	}
	if len(sessions) > 4 {
		t.Fatalf("2,000 names held by default on %d server sessions, want at most 4", len(sessions))
	}
	t.Logf("2,000 names held by default on %d server sessions", len(sessions))

	names, keys = muxNames(t, 20)
	guards = holdAll(t, db, names, 4, quiet, advisorylock.WithMultiplexing(0))
	held = pgKeySessions(t, admin, keys)
	releaseAll(t, guards)
	if n := len(distinct(held)); len(held) != 20 || n != 20 {
		t.Fatalf("20 names held with WithMultiplexing(0): %d held, on %d server sessions; want 20 on 20", len(held), n)
	}
}

// TestKindsThatCannotShareStayPinnedByDefault: on New's defaults a Lock's
// shared side (RLock), a Lock with WithMinHold and a Semaphore's slots
// work, without an error, and each hold pins a session of its own, where
// plain Locks taken one after another share one session.
func TestKindsThatCannotShareStayPinnedByDefault(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			admin := testdb.OpenPostgres(t, drv)
			base := "h-mux/" + testdb.UniqueName(t)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			sem, err := advisorylock.NewSemaphore(db, base+"/sem", 3, quiet)
			if err != nil {
				t.Fatal(err)
			}
			named := func(kind string, i int) string { return base + "/" + kind + "/" + string(rune('a'+i)) }
			lockKey := func(kind string) func(int, *advisorylock.Guard) int64 {
				return func(i int, _ *advisorylock.Guard) int64 { return advisorylock.Key(named(kind, i)) }
			}
			for _, kind := range []struct {
				name   string
				shared bool // plain Locks: their holds share a session
				take   func(i int) (*advisorylock.Guard, error)
				key    func(i int, g *advisorylock.Guard) int64 // the key g holds
			}{
				{"Lock", true, func(i int) (*advisorylock.Guard, error) {
					return newLock(t, db, named("lock", i), quiet).TryLock(ctx)
				}, lockKey("lock")},
				{"RLock", false, func(i int) (*advisorylock.Guard, error) {
					return newLock(t, db, named("rlock", i), quiet).TryRLock(ctx)
				}, lockKey("rlock")},
				{"WithMinHold", false, func(i int) (*advisorylock.Guard, error) {
					return newLock(t, db, named("minhold", i), quiet, advisorylock.WithMinHold(time.Millisecond)).TryLock(ctx)
				}, lockKey("minhold")},
				{"Semaphore", false, func(int) (*advisorylock.Guard, error) { return sem.TryAcquire(ctx) },
					func(_ int, g *advisorylock.Guard) int64 { return advisorylock.SlotKey(sem.Name(), g.Slot()) }},
			} {
				var keys []int64
				for i := range 3 {
					g, err := kind.take(i)
					if err != nil {
						t.Fatalf("%s %d: %v", kind.name, i, err)
					}
					defer mustRelease(t, g)
					keys = append(keys, kind.key(i, g))
				}
				held := pgKeySessions(t, admin, keys)
				want := 3
				if kind.shared {
					want = 1
				}
				if n := len(distinct(held)); len(held) != 3 || n != want {
					t.Errorf("3 holds of %s: %d held, on %d server sessions; want 3 on %d", kind.name, len(held), n, want)
				}
			}
		})
	}
}
