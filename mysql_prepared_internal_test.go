package advisorylock

import (
	"context"
	"database/sql"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// stmtExecutions reads how many prepared statements conn's session has
// executed.
func stmtExecutions(t *testing.T, conn *sql.Conn) int64 {
	t.Helper()
	var name string
	var n int64
	if err := conn.QueryRowContext(context.Background(), "SHOW SESSION STATUS LIKE 'Com_stmt_execute'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMySQLTryAndUnlockRunPrepared: on go-sql-driver the exclusive try
// and the unlock run as statements prepared on the session, one
// execution each (counted by the server), once they are prepared.
func TestMySQLTryAndUnlockRunPrepared(t *testing.T) {
	ctx := context.Background()
	db := testdb.OpenMySQL(t)
	m := MySQL().(DriverTuner).ForDB(db).(mysqlBackend)
	if m.prepared == nil {
		t.Fatal("no prepared statements for go-sql-driver")
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key := Key(testdb.UniqueName(t))
	step := func(what string, wantPrepared int64) {
		t.Helper()
		before := stmtExecutions(t, conn)
		r, err := m.TryLockSession(ctx, conn, key)
		if err != nil || !r.OK {
			t.Fatalf("%s: TryLockSession = %+v, %v", what, r, err)
		}
		if r, err = m.UnlockSession(ctx, conn, key); err != nil || !r.OK {
			t.Fatalf("%s: UnlockSession = %+v, %v", what, r, err)
		}
		if got := stmtExecutions(t, conn) - before; wantPrepared >= 0 && got != wantPrepared {
			t.Fatalf("%s: %d prepared executions, want %d", what, got, wantPrepared)
		}
	}
	step("first", -1) // a try as text first creates the table of shared holders, if missing
	step("warm", 2)
	step("again", 2)
}
