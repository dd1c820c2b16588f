package postgresbackend

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"testing"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// A shared session's batch tries and unlocks in one statement, on both
// drivers, exclusive and shared, and only on a session that passed a
// try's checks.
func TestPostgresBatchTriesAndUnlocksInOneStatement(t *testing.T) {
	for _, drv := range testdb.Drivers {
		for _, shared := range []bool{false, true} {
			name := drv + "/exclusive"
			if shared {
				name = drv + "/shared"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				db := testdb.OpenPostgres(t, drv)
				var p backend.SessionLocker = New().(*postgres).forDB(db)
				if shared {
					p = p.(*postgres).Shared()
				}
				bl := p.(backend.BatchLocker)
				conn, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				rival, err := db.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer rival.Close()
				k := []int64{keyOf(testdb.UniqueName(t) + "/0"), keyOf(testdb.UniqueName(t) + "/1"), keyOf(testdb.UniqueName(t) + "/2"), keyOf(testdb.UniqueName(t) + "/3")}
				if _, _, err := bl.TryUnlock(ctx, conn, k[:1], nil); !errors.Is(err, backend.ErrUnsupported) {
					t.Fatalf("a batch on a session that passed no try's checks: %v, want backend.ErrUnsupported", err)
				}
				if res, err := p.TryLockSession(ctx, conn, k[2]); err != nil || !res.OK {
					t.Fatalf("TryLockSession: %v, %v", res, err)
				}
				// The rival holds k[1] exclusively: a shared try misses too.
				if _, err := rival.ExecContext(ctx, "SELECT pg_advisory_lock($1)", k[1]); err != nil {
					t.Fatal(err)
				}
				for range 2 { // the second runs prepared on lib/pq
					granted, freed, err := bl.TryUnlock(ctx, conn, k[:2], k[2:])
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(granted, []bool{true, false}) || !slices.Equal(freed, []bool{true, false}) {
						t.Fatalf("granted %v freed %v; want [true false] and [true false]", granted, freed)
					}
					mode := "ExclusiveLock"
					if shared {
						mode = "ShareLock"
					}
					held := heldIn(t, conn, mode, k)
					if !slices.Equal(held, []bool{true, false, false, false}) {
						t.Fatalf("the session holds %v of its keys after the batch; want only the first", held)
					}
					// Back as before: k[0] freed, k[2] taken again.
					if _, _, err := bl.TryUnlock(ctx, conn, k[2:3], k[:1]); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}

// heldIn reports, for each of keys, whether conn's session holds it in
// mode (ExclusiveLock, ShareLock).
func heldIn(t *testing.T, conn *sql.Conn, mode string, keys []int64) []bool {
	t.Helper()
	held := make([]bool, len(keys))
	for i, k := range keys {
		err := conn.QueryRowContext(context.Background(), `SELECT EXISTS (SELECT FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objsubid = 1
 AND l.pid = pg_backend_pid() AND l.granted AND l.mode = $1 AND ((l.classid::int8 << 32) | l.objid::int8) = $2)`, mode, k).Scan(&held[i])
		if err != nil {
			t.Fatal(err)
		}
	}
	return held
}
