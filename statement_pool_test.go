package advisorylock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestStatementPoolColumn proves docs/production.md's "What works where" column
// for a PgBouncer statement pool: a Lock is refused with
// ErrTransactionPooler; a LeaseLock works once the tables exist (created
// here through a direct connection); a Fence cannot admit, since statement
// mode allows no transaction.
func TestStatementPoolColumn(t *testing.T) {
	dsn := testdb.PgBouncerStatementPool(t)
	direct := testdb.OpenPostgres(t, "postgres")
	// The tables, created beforehand as docs/production.md says.
	releaseLease(t, tryLease(t, newLeaseLock(t, direct, testdb.UniqueName(t))))
	if _, err := advisorylock.NewFence(direct, testdb.UniqueName(t)); err != nil {
		t.Fatal(err)
	}
	for _, c := range leasePoolerClients[:2] { // lib/pq, and pgx in exec mode
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			a := testdb.OpenPostgresDSN(t, c.driver, dsn+c.params)
			b := testdb.OpenPostgresDSN(t, c.driver, dsn+c.params)

			l, err := advisorylock.New(a, testdb.UniqueName(t))
			if err == nil {
				var g *advisorylock.Guard
				if g, err = l.TryLock(ctx); err == nil {
					_ = g.Release(ctx)
				}
			}
			if !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Errorf("Lock through a statement pool: %v, want ErrTransactionPooler", err)
			}

			name := testdb.UniqueName(t)
			la := poolerLeaseLock(t, a, name)
			lb := poolerLeaseLock(t, b, name)
			g, err := la.TryLock(ctx)
			if err != nil {
				t.Fatalf("LeaseLock.TryLock through a statement pool: %v", err)
			}
			if _, err := lb.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("a second LeaseLock while held: %v, want ErrNotAcquired", err)
			}
			if h, err := lb.Holder(ctx); err != nil || h == nil || h.Token != g.Lease().Token() {
				t.Fatalf("Holder = %+v, %v; want token %d", h, err, g.Lease().Token())
			}
			releaseLease(t, g)
			gb, err := lb.TryLock(ctx)
			if err != nil {
				t.Fatalf("LeaseLock.TryLock after the release: %v", err)
			}
			if gb.Lease().Token() <= g.Lease().Token() {
				t.Fatalf("token %d after %d", gb.Lease().Token(), g.Lease().Token())
			}
			releaseLease(t, gb)

			f, err := advisorylock.NewFence(a, name)
			if err == nil {
				err = fencedWrite(ctx, a, f, nil, gb.Lease().Token())
			}
			if err == nil {
				t.Fatal("a Fence admitted a token through a statement pool, which allows no transaction")
			}
			t.Logf("Fence through a statement pool: %v", err)
		})
	}
}
