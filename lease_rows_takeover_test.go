package advisorylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestLeaseRowsLostHoldersRenewalLeavesTheNewOwnersRowAlone: a holder
// whose lock row another owner took over (here with a longer TTL, as a
// handle with its own WithLeaseTTL would) is told of the loss by its next
// renewal, and that renewal leaves the new owner's row as it is: were it
// to set the row's expiry from its own TTL, the new owner's row would
// expire early and a third holder could take the name while the new
// owner still holds it.
func TestLeaseRowsLostHoldersRenewalLeavesTheNewOwnersRowAlone(t *testing.T) {
	testdb.Slow(t, "a lock row taken over, one renewal period each")
	t.Parallel() // names of its own
	for _, srv := range rowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel() // a name of its own on each server
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := testdb.UniqueName(t)
			l := rowsLock(t, srv.open(t), name)
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			defer func() { _ = g.Release(ctx) }()

			// Another owner takes the row over in one statement, with a
			// lease ten times as long.
			takeOver := "UPDATE advisorylock_locks SET owner = 'h-mut-other', token = token + 1, expires_at = now() + interval '30 seconds' WHERE key = $1"
			direct := testdb.OpenPostgres(t, "postgres")
			if srv.name == "mariadb" {
				takeOver = "UPDATE advisorylock_locks SET owner = 'h-mut-other', token = token + 1, expires_at = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND WHERE lock_key = ?"
				direct = testdb.OpenMySQL(t)
			}
			if _, err := direct.ExecContext(ctx, takeOver, advisorylock.Key(l.Name())); err != nil {
				t.Fatalf("taking the row over: %v", err)
			}
			before, err := l.Holder(ctx)
			if err != nil || before == nil || before.Owner != "h-mut-other" {
				t.Fatalf("Holder after the takeover = %+v, %v; want the new owner", before, err)
			}

			select {
			case <-g.Lost():
			case <-time.After(2 * rowsTTL):
				t.Fatalf("the holder whose row was taken over was not told within %v", 2*rowsTTL)
			}
			after, err := l.Holder(ctx)
			if err != nil || after == nil || after.Owner != "h-mut-other" {
				t.Fatalf("Holder after the old holder's loss = %+v, %v; want the new owner", after, err)
			}
			if !after.ExpiresAt.Equal(before.ExpiresAt) {
				t.Fatalf("the lost holder's renewal moved the new owner's expiry from %v to %v", before.ExpiresAt, after.ExpiresAt)
			}
		})
	}
}
