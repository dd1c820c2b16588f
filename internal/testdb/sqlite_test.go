package testdb

import (
	"strings"
	"testing"
)

func TestOpenSQLiteAppliesOptions(t *testing.T) {
	path := SQLitePath(t)
	if other := SQLitePath(t); other == path {
		t.Fatal("SQLitePath returned the same path twice")
	}
	db := OpenSQLite(t, path, "_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	var mode string
	var timeout int
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || !strings.EqualFold(mode, "wal") {
		t.Fatalf("journal_mode = %q, %v", mode, err)
	}
	if err := db.QueryRow("PRAGMA busy_timeout").Scan(&timeout); err != nil || timeout != 5000 {
		t.Fatalf("busy_timeout = %d, %v", timeout, err)
	}
	if _, err := db.Exec("CREATE TABLE t (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	// A second handle on the same file sees the table.
	other := OpenSQLite(t, path, "")
	var n int
	if err := other.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil {
		t.Fatal(err)
	}
}
