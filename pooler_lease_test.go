package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// leasePoolerClients are the driver settings LeaseLock is proven with
// behind a PgBouncer transaction pool without prepared-statement support:
// lib/pq as it comes (the lease statements carry no arguments for it), and
// pgx in each mode its documentation names for PgBouncer.
var leasePoolerClients = []struct {
	name, driver, params string
}{
	{"lib/pq defaults", "postgres", ""},
	{"pgx exec", "pgx", "&default_query_exec_mode=exec"},
	{"pgx simple_protocol", "pgx", "&default_query_exec_mode=simple_protocol"},
	{"pgx cache_describe", "pgx", "&default_query_exec_mode=cache_describe"},
}

// TestLeaseLockThroughTransactionPool: every LeaseLock step is one
// autocommit statement and holds no connection, so a lease is acquired,
// renewed over several TTLs, contended and released through a transaction
// pool while other clients keep the pool busy (each statement may land on
// any server session), and each grant's token is larger than the last.
// A Fence admits the tokens there too.
func TestLeaseLockThroughTransactionPool(t *testing.T) {
	testdb.Slow(t, "leases through PgBouncer under load, tens of seconds")
	txDSN, _ := testdb.PgBouncer(t)
	for _, c := range leasePoolerClients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // names and pools of its own; the busier the pool, the more it proves
			dsn := txDSN + c.params
			direct := testdb.OpenPostgres(t, "postgres")
			a := testdb.OpenPostgresDSN(t, c.driver, dsn)
			b := testdb.OpenPostgresDSN(t, c.driver, dsn)
			testdb.KeepBusy(t, c.driver, dsn, testdb.PgBouncerPoolSize)
			name := testdb.UniqueName(t)
			// Long enough that renewals queued behind KeepBusy's clients on
			// a loaded CI machine make their local deadline (with 1s, one
			// was lost in CI, as the library must when it cannot renew).
			const ttl = 3 * time.Second
			la := poolerLeaseLock(t, a, name, advisorylock.WithLeaseTTL(ttl))
			lb := poolerLeaseLock(t, b, name, advisorylock.WithLeaseTTL(ttl))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			g, err := la.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			first := g.Lease().Token()
			_, expires0 := leaseRow(t, direct, name)
			// Several renewals: until the row's expiry has moved more than
			// two TTLs past the grant's, which only renewals after two TTLs
			// of holding can do.
			var gen int64
			var expires1 time.Time
			testdb.WaitFor(t, 10*ttl, func() bool {
				gen, expires1 = leaseRow(t, direct, name)
				return isLost(g.Lease()) || expires1.After(expires0.Add(2*ttl))
			}, "the lease row's expiry never moved two TTLs (%v) past the grant's through the pool", 2*ttl)
			if isLost(g.Lease()) {
				t.Fatalf("lease lost while renewed through the pool over %v (TTL %v)", expires1.Sub(expires0), ttl)
			}
			if gen != int64(first) {
				t.Fatalf("after renewals: row generation %d (token %d); want the grant's row renewed", gen, first)
			}
			if _, err := lb.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock by another client while held = %v, want ErrNotAcquired", err)
			}
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}

			last := first
			for i, l := range []*advisorylock.LeaseLock{lb, la, lb} {
				g, err := l.TryLock(ctx)
				if err != nil {
					t.Fatalf("TryLock %d after Release: %v", i, err)
				}
				if g.Lease().Token() <= last {
					t.Fatalf("token %d after token %d: tokens must increase", g.Lease().Token(), last)
				}
				last = g.Lease().Token()
				if err := g.Release(ctx); err != nil {
					t.Fatalf("Release %d: %v", i, err)
				}
			}
			if h, err := la.Holder(ctx); err != nil || h != nil {
				t.Fatalf("Holder after the last Release = %+v, %v; want nil, nil", h, err)
			}

			// The fence runs in the caller's transaction, which the pooler
			// keeps on one server session until it ends.
			f := checkedFence(t, a, testdb.UniqueName(t))
			for _, c := range []struct {
				token advisorylock.FencingToken
				stale bool
			}{{last, false}, {first, true}, {last, false}} {
				if err := admitOnce(ctx, a, f, c.token); errors.Is(err, advisorylock.ErrStaleToken) != c.stale || (err != nil && !c.stale) {
					t.Fatalf("Admit(%d) through the pool = %v, stale expected: %v", c.token, err, c.stale)
				}
			}
		})
	}
}

func poolerLeaseLock(t *testing.T, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.LeaseLock {
	t.Helper()
	l, err := advisorylock.NewLeaseLock(db, name, opts...)
	if err != nil {
		t.Fatalf("NewLeaseLock(%q): %v", name, err)
	}
	return l
}

// leaseRow reads the lease's generation and expiry, seen directly.
func leaseRow(t *testing.T, direct *sql.DB, name string) (generation int64, expires time.Time) {
	t.Helper()
	if err := direct.QueryRow("SELECT generation, expires_at FROM advisorylock_leases WHERE name = $1", name).Scan(&generation, &expires); err != nil {
		t.Fatalf("reading the lease row: %v", err)
	}
	return generation, expires
}

// checkedFence is NewFence with its first-use work done (Check), as
// Check's documentation asks where the pool's connections may all be in
// transactions: behind the test PgBouncer's transaction pool of
// PgBouncerPoolSize server sessions, parallel first Admits each held one
// in its transaction and waited for another (query_wait_timeout).
func checkedFence(t *testing.T, db *sql.DB, resource string) *advisorylock.Fence {
	t.Helper()
	f, err := advisorylock.NewFence(db, resource)
	if err != nil {
		t.Fatalf("NewFence: %v", err)
	}
	if err := f.Check(context.Background()); err != nil {
		t.Fatalf("Fence.Check: %v", err)
	}
	return f
}

// admitOnce admits token in a transaction of its own, committed when
// admitted and rolled back otherwise.
func admitOnce(ctx context.Context, db *sql.DB, f *advisorylock.Fence, token advisorylock.FencingToken) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f.Admit(ctx, tx, token); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestLeaseLockThroughTransactionPoolWithPgxDefaultsSaysWhatToSet: pgx
// as it comes caches prepared statements per connection, which a
// transaction pool moves between server sessions, so a lease's statement
// fails (SQLSTATE 26000, "stmtcache_…" does not exist). The error says
// what to set, and keeps the driver's error reachable.
func TestLeaseLockThroughTransactionPoolWithPgxDefaultsSaysWhatToSet(t *testing.T) {
	txDSN, _ := testdb.PgBouncer(t)
	db := testdb.OpenPostgresDSN(t, "pgx", txDSN)
	testdb.KeepBusy(t, "postgres", txDSN, testdb.PgBouncerPoolSize)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 200 {
		l := poolerLeaseLock(t, db, testdb.UniqueName(t))
		g, err := l.TryLock(ctx)
		if err == nil {
			if err := g.Release(ctx); err != nil && !strings.Contains(err.Error(), "stmtcache_") {
				t.Fatalf("Release: %v", err)
			}
			continue
		}
		var s interface{ SQLState() string }
		// 26000 where the server session lacks the statement; 42P05 where
		// it has one of that name already (an earlier client's, through
		// the same pooler: a second run of the test in one binary).
		if !errors.As(err, &s) || s.SQLState() != "26000" && s.SQLState() != "42P05" || !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
			t.Fatalf("TryLock through a transaction pool with pgx's statement cache: %v; want the driver's 26000 or 42P05, reachable, and what to set", err)
		}
		t.Logf("the error: %v", err)
		return
	}
	t.Fatal("200 tries through the transaction pool never lost a prepared statement: the pooler did not move one")
}
