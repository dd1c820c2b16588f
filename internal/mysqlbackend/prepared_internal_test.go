package mysqlbackend

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/advisorylock/advisorylock/internal/dbutil"
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
	m := mysqlBackend{}.forDB(db)
	if m.prepared == nil {
		t.Fatal("no prepared statements for go-sql-driver")
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	step := tryAndUnlockStep(t, m, db, conn, uniqueKey())
	step("first", -1) // a try as text first creates the table of shared holders, if missing
	step("warm", 2)
	step("again", 2)
}

// TestMySQLSessionThatLostItsPreparedStatementsPreparesThemAgain: a
// session that lost the statements prepared on it (as a
// COM_RESET_CONNECTION or a proxy that moved the session would make it;
// here they are closed on the server behind the cache's back) answers the
// next execution with 1243. The try and the unlock still do their work, as
// text, and the statements are prepared again for the step after.
func TestMySQLSessionThatLostItsPreparedStatementsPreparesThemAgain(t *testing.T) {
	ctx := context.Background()
	db := testdb.OpenMySQL(t)
	m := mysqlBackend{}.forDB(db)
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	step := tryAndUnlockStep(t, m, db, conn, uniqueKey())
	step("first", -1)
	step("warm", 2)

	// Close the session's statements on the server, keeping the cache's
	// handles: a copy of each handle sends COM_STMT_CLOSE for its id.
	closed := 0
	if err := conn.Raw(func(dc any) error {
		cached := m.prepared.Cached(dc)
		if cached == nil {
			return errors.New("no statements cached for the connection")
		}
		for _, st := range cached {
			v := reflect.ValueOf(st).Elem()
			cp := reflect.New(v.Type())
			cp.Elem().Set(v)
			if err := cp.Interface().(driver.Stmt).Close(); err != nil {
				return err
			}
			closed++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if closed != 2 {
		t.Fatalf("closed %d statements on the server, want the try's and the unlock's", closed)
	}
	var errno1243 bool
	if err := conn.Raw(func(dc any) error {
		st := m.prepared.Cached(dc)[myUnlockPrepared]
		_, err := st.(driver.StmtQueryContext).QueryContext(ctx, []driver.NamedValue{{Ordinal: 1, Value: "x"}, {Ordinal: 2, Value: "x"}})
		errno1243 = dbutil.MySQLErrno(err) == mysqlUnknownStatement
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !errno1243 {
		t.Fatal("the server still knows the closed statement: the test did not make the session lose it")
	}

	step("after the loss", -1)
	step("prepared again", 2)
}

// uniqueKey returns a key no other test or run uses: the server's lock
// name is the key's.
func uniqueKey() int64 { return int64(rand.Uint64()) }

// usedBy is the connection id holding key's MySQL lock, 0 if free, read
// on a connection of its own.
func usedBy(t *testing.T, db *sql.DB, key int64) int64 {
	t.Helper()
	var id sql.NullInt64
	if err := db.QueryRowContext(context.Background(), "SELECT IS_USED_LOCK("+mysqlLockName(key)+")").Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id.Int64
}

// tryAndUnlockStep returns a step that takes key on conn's session and
// lets it go (each read back from another session of db), failing t
// unless conn's session ran wantPrepared prepared executions in it (any
// number if wantPrepared is negative).
func tryAndUnlockStep(t *testing.T, m mysqlBackend, db *sql.DB, conn *sql.Conn, key int64) func(what string, wantPrepared int64) {
	ctx := context.Background()
	return func(what string, wantPrepared int64) {
		t.Helper()
		before := stmtExecutions(t, conn)
		r, err := m.TryLockSession(ctx, conn, key)
		if err != nil || !r.OK {
			t.Fatalf("%s: TryLockSession = %+v, %v", what, r, err)
		}
		if used := usedBy(t, db, key); used != r.Session {
			t.Fatalf("%s: after the try the lock is held by session %d, want %d", what, used, r.Session)
		}
		if r, err = m.UnlockSession(ctx, conn, key); err != nil || !r.OK {
			t.Fatalf("%s: UnlockSession = %+v, %v", what, r, err)
		}
		if used := usedBy(t, db, key); used != 0 {
			t.Fatalf("%s: after the unlock the lock is held by session %d", what, used)
		}
		if got := stmtExecutions(t, conn) - before; wantPrepared >= 0 && got != wantPrepared {
			t.Fatalf("%s: %d prepared executions, want %d", what, got, wantPrepared)
		}
	}
}
