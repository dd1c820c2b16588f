package testdb

import (
	"context"
	"testing"
)

// A killed server comes back on its port with what it committed.
func TestOwnMariaDBSurvivesAKill(t *testing.T) {
	Slow(t, "server kill: kills a private MariaDB")
	m := OwnMariaDB(t)
	if m.DSN == MySQLDSN(t) {
		t.Fatal("OwnMariaDB returned the shared server's database")
	}
	db := OpenMySQLDSN(t, m.DSN)
	db.SetMaxIdleConns(-1) // a fresh session per query: none is left dead by the kill
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	for _, stmt := range []string{"CREATE TABLE kept (n INT) ENGINE=InnoDB", "INSERT INTO kept VALUES (7)"} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	m.Kill(t)
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("a killed server still answers")
	}
	m.Kill(t) // killing twice is harmless
	m.Start(t)
	var got int
	WaitFor(t, 0, func() bool { return db.QueryRowContext(ctx, "SELECT n FROM kept").Scan(&got) == nil }, "no answer after the restart")
	if got != 7 {
		t.Fatalf("after the restart the committed row reads %d, want 7", got)
	}
}
