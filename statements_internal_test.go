package advisorylock

import (
	"context"
	"testing"

	"github.com/advisorylock/advisorylock/internal/dbutil"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// The statements lib/pq keeps prepared keep their connections reachable,
// so the cache must not outgrow the pool: here every step gets a new
// connection (none stays idle), and the cache still holds at most the one
// open now.
func TestPreparedStatementsHoldNoMoreConnectionsThanThePoolHasOpen(t *testing.T) {
	t.Parallel() // a pool of its own
	ctx := context.Background()
	db := testdb.OpenPostgres(t, "postgres")
	db.SetMaxIdleConns(0) // a connection goes back to the pool only to be closed
	l, err := New(db, testdb.UniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	const steps = 10 // a leaking cache holds one connection's statements a step
	for range steps {
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	ps := dbutil.PreparedOf(db)
	if ps == nil {
		t.Fatal("lib/pq keeps no prepared statements")
	}
	if n := ps.Size(); n > 1 {
		t.Fatalf("the cache holds the statements of %d connections after %d steps on as many connections; the pool has %d open", n, steps, db.Stats().OpenConnections)
	}
}
