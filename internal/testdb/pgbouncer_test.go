package testdb

import (
	"context"
	"database/sql"
	"testing"
)

// backendPIDs holds n connections of db open at once and returns the
// backend pid each one sees.
func backendPIDs(t *testing.T, db *sql.DB, n int) []int {
	t.Helper()
	ctx := context.Background()
	pids := make([]int, n)
	for i := range pids {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
	return pids
}

func distinct(xs []int) int {
	seen := map[int]bool{}
	for _, x := range xs {
		seen[x] = true
	}
	return len(seen)
}

func TestPgBouncerTransactionPoolMultiplexes(t *testing.T) {
	txDSN, _ := PgBouncer(t)
	db := OpenPostgresDSN(t, "postgres", txDSN)
	n := PgBouncerPoolSize + 3
	pids := backendPIDs(t, db, n)
	if d := distinct(pids); d > PgBouncerPoolSize {
		t.Fatalf("%d clients held at once saw %d backends, want at most the pool size %d: %v", n, d, PgBouncerPoolSize, pids)
	}
}

func TestPgBouncerSessionPoolPinsBackends(t *testing.T) {
	_, sessionDSN := PgBouncer(t)
	db := OpenPostgresDSN(t, "postgres", sessionDSN)
	n := PgBouncerPoolSize + 2 // more than the transaction pool has
	pids := backendPIDs(t, db, n)
	if d := distinct(pids); d != n {
		t.Fatalf("%d sessions held at once saw %d backends: %v", n, d, pids)
	}

	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET application_name = 'testdb-session'"); err != nil {
		t.Fatal(err)
	}
	var name string
	if err := conn.QueryRowContext(ctx, "SHOW application_name").Scan(&name); err != nil || name != "testdb-session" {
		t.Fatalf("session state lost: %q, %v", name, err)
	}
}

// TestPgBouncerAcceptsBothDrivers checks the startup parameters each driver
// sends are accepted, and that lib/pq's parameterized queries (unnamed
// prepared statements in one transaction-less exchange) work in session mode.
func TestPgBouncerAcceptsBothDrivers(t *testing.T) {
	txDSN, sessionDSN := PgBouncer(t)
	for _, driver := range Drivers {
		for name, dsn := range map[string]string{"txpool": txDSN, "sessionpool": sessionDSN} {
			t.Run(driver+"/"+name, func(t *testing.T) {
				if driver == "pgx" {
					// pgx caches prepared statements by default, which a
					// transaction pooler breaks; its docs say to use the
					// simple protocol there.
					dsn += "&default_query_exec_mode=simple_protocol"
				}
				db := OpenPostgresDSN(t, driver, dsn)
				var v int
				if err := db.QueryRow("SELECT 1").Scan(&v); err != nil || v != 1 {
					t.Fatalf("got %d, %v", v, err)
				}
			})
		}
	}
}

func TestPgBouncerIsShared(t *testing.T) {
	tx1, s1 := PgBouncer(t)
	tx2, s2 := PgBouncer(t)
	if tx1 != tx2 || s1 != s2 {
		t.Fatalf("PgBouncer started twice: %s %s / %s %s", tx1, s1, tx2, s2)
	}
}
