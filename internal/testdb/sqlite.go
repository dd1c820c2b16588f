package testdb

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite" // registers driver "sqlite"
)

// SQLitePath returns the path of a database file, not yet created, in a
// fresh t.TempDir().
func SQLitePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "test.db")
}

// OpenSQLite opens path with driver "sqlite" (github.com/glebarez/go-sqlite),
// appending options as the DSN's query (for example
// "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"), pings it, and
// closes it at t.Cleanup.
func OpenSQLite(t testing.TB, path, options string) *sql.DB {
	t.Helper()
	dsn := path
	if options = strings.TrimPrefix(options, "?"); options != "" {
		dsn += "?" + options
	}
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		t.Fatalf("testdb: open sqlite %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	// Connecting runs the DSN's pragmas, which another handle's writes
	// or WAL recovery can make busy: with busy_timeout(0) the driver says
	// so at once, and the ping tries again (the library does the same).
	for {
		err := db.PingContext(ctx)
		if err == nil {
			return db
		}
		if !strings.Contains(err.Error(), "database is locked") || ctx.Err() != nil {
			t.Fatalf("testdb: ping sqlite %s: %v", dsn, err)
		}
		time.Sleep(time.Millisecond)
	}
}
