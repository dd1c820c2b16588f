package mysqlbackend

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestMySQLBatchTriesAndUnlocksInOneStatement: a shared session's batch
// takes the keys it can, lets go of those it was asked to, and answers
// each; it runs only on a session whose try was granted; a key with a
// shared holder in is a miss, its GET_LOCK let go.
func TestMySQLBatchTriesAndUnlocksInOneStatement(t *testing.T) {
	ctx := context.Background()
	db := testdb.OpenMySQL(t)
	m := mysqlBackend{}.forDB(db)
	conns := make([]*sql.Conn, 3)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	conn, rival, reader := conns[0], conns[1], conns[2]
	k := []int64{rand.Int64(), rand.Int64(), rand.Int64(), rand.Int64(), rand.Int64()}
	// The rival's try creates the shared holders' table in this test's
	// fresh database: the batch's refusal below is the session's.
	if res, err := m.TryLockSession(ctx, rival, k[1]); err != nil || !res.OK {
		t.Fatalf("the rival's TryLockSession: %v, %v", res, err)
	}
	if _, _, err := m.TryUnlock(ctx, conn, k[:1], nil); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("a batch on a session with no try granted: %v, want backend.ErrUnsupported", err)
	}
	if res, err := m.TryLockSession(ctx, conn, k[2]); err != nil || !res.OK {
		t.Fatalf("TryLockSession: %v, %v", res, err)
	}
	if res, err := m.Shared().(mysqlBackend).TryLockSession(ctx, reader, k[4]); err != nil || !res.OK {
		t.Fatalf("the reader's TryLockSession: %v, %v", res, err)
	}
	granted, freed, err := m.TryUnlock(ctx, conn, []int64{k[0], k[1], k[4]}, k[2:4])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(granted, []bool{true, false, false}) || !slices.Equal(freed, []bool{true, false}) {
		t.Fatalf("granted %v freed %v; want [true false false] and [true false]", granted, freed)
	}
	held := make([]bool, len(k))
	for i, key := range k {
		name := mysqlLockName(key)
		if err := conn.QueryRowContext(ctx, "SELECT IS_USED_LOCK("+name+") <=> CONNECTION_ID()").Scan(&held[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(held, []bool{true, false, false, false, false}) {
		t.Fatalf("the session holds %v of its keys after the batch; want only the first", held)
	}
}
