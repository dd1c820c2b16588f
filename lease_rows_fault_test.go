package advisorylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestRowsHolderCutOffIsToldBeforeARival cuts the network (a proxy that
// stops forwarding, sockets left open) under a Lock held on lease rows,
// exclusive and shared, on lib/pq and pgx, while a rival on a direct
// handle waits for the name: the cut-off holder's renewals get no answer,
// and its Lost closes at its local deadline, while its row is still
// unexpired in the database, before the rival is granted.
func TestRowsHolderCutOffIsToldBeforeARival(t *testing.T) {
	testdb.Slow(t, "fault: network cuts, waits out lease expiry")
	for _, drv := range testdb.Drivers {
		for _, shared := range []bool{false, true} {
			kind := "exclusive"
			if shared {
				kind = "shared"
			}
			t.Run(drv+"/"+kind, func(t *testing.T) {
				t.Parallel() // a proxy and a name of its own
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				db, proxy := testdb.OpenPostgresProxied(t, drv)
				admin := testdb.OpenPostgres(t, drv)
				name := "h-rows/" + testdb.UniqueName(t)
				opts := []advisorylock.Option{quiet, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsTTL), advisorylock.WithReleaseTimeout(time.Second)}
				holder := newLock(t, db, name, opts...)
				take := holder.TryLock
				if shared {
					take = holder.TryRLock
				}
				g, err := take(ctx)
				if err != nil {
					t.Fatalf("the holder's try: %v", err)
				}
				t.Cleanup(func() { proxy.Heal(); _ = g.Release(context.Background()) })

				granted := make(chan rowsGrant, 1) // the goroutine never blocks, nor uses t
				rival := newLock(t, admin, name, opts...)
				go func() { granted <- grantOf(rival.Lock(ctx)) }()
				proxy.Cut()
				cut := time.Now()
				select {
				case <-g.Lost():
				case w := <-granted:
					t.Fatalf("the rival was granted (%v) while the cut-off holder had not been told", w.err)
				case <-time.After(2 * rowsTTL):
					t.Fatalf("the cut-off holder was not told within %v", 2*rowsTTL)
				}
				lostAt := time.Now()
				table := "advisorylock_locks WHERE key = $1 AND owner <> ''"
				if shared {
					table = "advisorylock_shared WHERE key = $1"
				}
				if n := countRows(t, admin, "SELECT count(*) FROM "+table+" AND expires_at > now()", advisorylock.Key(holder.Name())); n != 1 {
					t.Fatalf("when the holder was told (%v after the cut) its row had expired: it was told after the database could grant the name", lostAt.Sub(cut))
				}
				select {
				case w := <-granted:
					if w.err != nil {
						t.Fatalf("the rival's Lock: %v", w.err)
					}
					if w.at.Before(lostAt) {
						t.Fatalf("the rival was granted at %v, before the holder was told at %v", w.at, lostAt)
					}
					_ = w.g.Release(ctx)
				case <-time.After(2 * rowsTTL):
					t.Fatalf("the rival was not granted within %v of the holder's loss", 2*rowsTTL)
				}
			})
		}
	}
}
