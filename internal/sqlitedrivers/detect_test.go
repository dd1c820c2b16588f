// Package sqlitedrivers_test proves that the library detects the SQLite
// drivers the README names besides glebarez/go-sqlite: modernc.org/sqlite
// (which registers "sqlite", as glebarez does, so it cannot share a test
// binary with the rest of the suite) and mattn/go-sqlite3 ("sqlite3",
// cgo). It imports neither testdb nor glebarez for that reason.
package sqlitedrivers_test

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"

	"github.com/advisorylock/advisorylock"
	_ "github.com/mattn/go-sqlite3" // registers "sqlite3"
	"go.uber.org/goleak"
	_ "modernc.org/sqlite" // registers "sqlite"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSQLiteDriversAreDetected opens one database file through two pools
// of each driver and takes a Lock and a LeaseLock on each without
// WithBackend: the library must recognise the driver as SQLite, and the
// locks must exclude each other across the pools.
func TestSQLiteDriversAreDetected(t *testing.T) {
	for _, c := range []struct{ driver, options string }{
		{"sqlite", "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"}, // modernc.org/sqlite
		{"sqlite3", "?_busy_timeout=5000&_journal_mode=WAL"},                // mattn/go-sqlite3
	} {
		t.Run(c.driver, func(t *testing.T) {
			ctx := context.Background()
			dsn := filepath.Join(t.TempDir(), "locks.db") + c.options
			a, b := open(t, c.driver, dsn), open(t, c.driver, dsn)
			la, err := advisorylock.New(a, "detected")
			if err != nil {
				t.Fatalf("New on %s without WithBackend: %v", c.driver, err)
			}
			lb, err := advisorylock.New(b, "detected")
			if err != nil {
				t.Fatal(err)
			}
			g, err := la.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock on %s: %v", c.driver, err)
			}
			if _, err := lb.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("second pool's TryLock while held = %v, want ErrNotAcquired", err)
			}
			if err := g.Release(ctx); err != nil {
				t.Fatal(err)
			}
			gb, err := lb.TryLock(ctx)
			if err != nil {
				t.Fatalf("second pool's TryLock after the release: %v", err)
			}
			if err := gb.Release(ctx); err != nil {
				t.Fatal(err)
			}

			ll, err := advisorylock.NewLeaseLock(a, "detected-lease")
			if err != nil {
				t.Fatalf("NewLeaseLock on %s without WithBackend: %v", c.driver, err)
			}
			lg, err := ll.TryLock(ctx)
			if err != nil {
				t.Fatalf("LeaseLock.TryLock on %s: %v", c.driver, err)
			}
			if err := lg.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func open(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("ping %s: %v", driver, err)
	}
	return db
}
