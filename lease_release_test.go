package advisorylock_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestLeaseReleaseCommitsWithoutWaitingForTheWAL: docs/fencing.md promises
// that a lease release commits with synchronous_commit = off for its own
// transaction. The release statement a LeaseLock sends is captured, then
// run again on the real server, inside a transaction of the test's that
// first marks the row held again: there synchronous_commit reads off, and
// after that transaction the session's setting is back on.
func TestLeaseReleaseCommitsWithoutWaitingForTheWAL(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			var mu sync.Mutex
			var release string
			var args []any
			db := testdb.OpenHooked(t, drv, testdb.PostgresDSN(t), testdb.Hooks{Before: func(q string, a []any) {
				if strings.HasPrefix(q, "UPDATE advisorylock_leases SET owner = CASE") { // the release
					mu.Lock()
					release, args = q, a
					mu.Unlock()
				}
			}})
			name := testdb.UniqueName(t)
			l := newLeaseLock(t, db, name, advisorylock.WithBackend(advisorylock.Postgres()))
			releaseLease(t, tryLease(t, l))
			mu.Lock()
			q, a := release, args
			mu.Unlock()
			if q == "" {
				t.Fatal("no release statement was seen")
			}
			admin := testdb.OpenPostgres(t, drv)
			conn, err := admin.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			tx, err := conn.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }() // after a failure; else done already
			if _, err := tx.ExecContext(ctx, "UPDATE advisorylock_leases SET owner = 'again', expires_at = now() + interval '1 minute' WHERE name = $1", name); err != nil {
				t.Fatal(err)
			}
			res, err := tx.ExecContext(ctx, q, a...)
			if err != nil {
				t.Fatalf("the release statement again: %v", err)
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				t.Fatalf("the release statement again released %d rows (%v), want 1", n, err)
			}
			var inside, after string
			if err := tx.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&inside); err != nil {
				t.Fatal(err)
			}
			if err := tx.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRowContext(ctx, "SHOW synchronous_commit").Scan(&after); err != nil {
				t.Fatal(err)
			}
			if inside != "off" || after != "on" {
				t.Fatalf("synchronous_commit in the release's transaction %q, after it %q; want off, then on", inside, after)
			}
		})
	}
}
