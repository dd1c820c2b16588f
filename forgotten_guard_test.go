package advisorylock_test

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestForgottenLeaseGuardIsCleanedUp drops a LeaseGuard without Release:
// the garbage collector's cleanup frees the lease row long before its TTL
// would, and a warning names the lease (docs/semantics.md: forgotten guards).
func TestForgottenLeaseGuardIsCleanedUp(t *testing.T) {
	t.Parallel()
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		db := b.open(t)
		name := testdb.UniqueName(t)
		var logs syncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		l := newLeaseLock(t, db, name, advisorylock.WithLogger(logger), advisorylock.WithLeaseTTL(time.Hour))
		dropGuard(t, func() any { return tryLease(t, l) })
		testdb.WaitFor(t, wait, func() bool {
			runtime.GC()
			h, err := l.Holder(context.Background())
			return err == nil && h == nil
		}, "a forgotten lease guard kept its lease (TTL one hour)")
		expectForgottenWarning(t, &logs, name)
	})
}

// TestForgottenSQLiteGuardIsCleanedUp drops a Lock guard on SQLite
// without Release: the cleanup frees the lock for the next TryLock.
func TestForgottenSQLiteGuardIsCleanedUp(t *testing.T) {
	path := testdb.SQLitePath(t)
	name := testdb.UniqueName(t)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	l := newLock(t, testdb.OpenSQLite(t, path, sqliteWAL), name, advisorylock.WithLogger(logger), advisorylock.WithLeaseTTL(time.Hour))
	other := newLock(t, testdb.OpenSQLite(t, path, sqliteWAL), name)
	dropGuard(t, func() any {
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return g
	})
	var g *advisorylock.Guard
	testdb.WaitFor(t, wait, func() bool {
		runtime.GC()
		var err error
		g, err = other.TryLock(context.Background())
		return err == nil
	}, "a forgotten SQLite guard kept its lock")
	mustRelease(t, g)
	expectForgottenWarning(t, &logs, name)
}

// dropGuard takes a guard and drops it without Release.
func dropGuard(t *testing.T, take func() any) {
	t.Helper()
	func() {
		g := take()
		_ = g
	}()
}

func expectForgottenWarning(t *testing.T, logs *syncBuffer, name string) {
	t.Helper()
	testdb.WaitFor(t, wait, func() bool {
		return strings.Contains(logs.String(), "never released") && strings.Contains(logs.String(), name)
	}, "no warning naming the lock was logged; got %q", logs.String())
}
