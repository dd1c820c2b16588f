package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// Guard.WithConn on a lock held on a shared session (WithMultiplexing):
// the session is lent to fn, its other locks wait for fn, and what fn
// did to the session's locks is told before WithConn returns.

// sharedConnLocks returns two Locks whose holds share the one shared
// session of a handle of srv's, and that handle; their keep-alive is
// long, so that only WithConn's own check can tell a loss within a test.
func sharedConnLocks(t *testing.T, srv muxServer) (db *sql.DB, a, b *advisorylock.Lock) {
	t.Helper()
	db = srv.open(t)
	opts := []advisorylock.Option{quiet, advisorylock.WithMultiplexing(1), advisorylock.WithKeepAlive(10 * time.Second)}
	base := "h-mux/" + testdb.UniqueName(t)
	return db, newLock(t, db, base+"/a", opts...), newLock(t, db, base+"/b", opts...)
}

// isPostgres reports whether srv is a PostgreSQL server.
func isPostgres(srv muxServer) bool { return strings.HasPrefix(srv.name, "postgres") }

// unlockSQL is the statement that frees key on the session that runs it,
// whoever took it there.
func unlockSQL(srv muxServer, key int64) string {
	if isPostgres(srv) {
		return fmt.Sprintf("SELECT pg_advisory_unlock(%d)", key)
	}
	return fmt.Sprintf("SELECT RELEASE_LOCK('advisorylock:v1:%016x')", uint64(key))
}

// TestWithConnOnASharedSessionRunsOnTheHolder: fn's statements run on the
// server session that holds the lock (the holder pg_locks and
// IS_USED_LOCK show), and the lock is still held, and the session still
// serves its locks, when WithConn returns.
func TestWithConnOnASharedSessionRunsOnTheHolder(t *testing.T) {
	t.Parallel()
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			db, a, b := sharedConnLocks(t, srv)
			admin := srv.open(t)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g := mustTry(t, a)
			defer mustRelease(t, g)
			idQuery := "SELECT CONNECTION_ID()"
			if isPostgres(srv) {
				idQuery = "SELECT pg_backend_pid()"
			}
			var inFn int64
			if err := g.WithConn(ctx, func(c advisorylock.Conn) error {
				return c.QueryRowContext(ctx, idQuery).Scan(&inFn)
			}); err != nil {
				t.Fatalf("WithConn: %v", err)
			}
			holder := srv.sessions(t, admin, []int64{advisorylock.Key(a.Name())})[advisorylock.Key(a.Name())]
			if holder == 0 || inFn != holder {
				t.Fatalf("fn ran on session %d; the lock is held by session %d", inFn, holder)
			}
			if isClosed(g.Lost()) {
				t.Fatal("the lock is lost after WithConn")
			}
			gb := mustTry(t, b) // the same session, after fn
			defer mustRelease(t, gb)
			if got := srv.sessions(t, admin, []int64{advisorylock.Key(b.Name())})[advisorylock.Key(b.Name())]; got != holder {
				t.Fatalf("the neighbour is held by session %d, want the shared session %d", got, holder)
			}
			_ = db
		})
	}
}

// TestWithConnOnASharedSessionHoldsItsNeighboursBack: while fn runs, the
// tries of other Locks on the same shared session wait, and run once fn
// has returned.
func TestWithConnOnASharedSessionHoldsItsNeighboursBack(t *testing.T) {
	t.Parallel()
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			db, a, b := sharedConnLocks(t, srv)
			c := newLock(t, db, b.Name()+"/c", quiet, advisorylock.WithMultiplexing(1), advisorylock.WithKeepAlive(10*time.Second))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g := mustTry(t, a)
			defer mustRelease(t, g)
			var fnReturned atomic.Bool
			type result struct {
				g         *advisorylock.Guard
				err       error
				afterFn   bool
				lockAfter string
			}
			results := make(chan result, 2)
			try := func(l *advisorylock.Lock) {
				g, err := l.TryLock(ctx)
				results <- result{g: g, err: err, afterFn: fnReturned.Load(), lockAfter: l.Name()}
			}
			err := g.WithConn(ctx, func(conn advisorylock.Conn) error {
				go try(b)
				go try(c)
				// One of them leads the session's next statement and
				// waits for the session; the other queues behind it.
				testdb.WaitFor(t, 0, func() bool { return advisorylock.MuxQueued(a) == 1 }, "a try queued on the shared session")
				for range 5 { // round trips in which a try not held back would end
					if _, err := conn.ExecContext(ctx, "SELECT 1"); err != nil {
						return err
					}
				}
				select {
				case r := <-results:
					return fmt.Errorf("%s's try ended while fn ran: %v", r.lockAfter, r.err)
				default:
				}
				fnReturned.Store(true)
				return nil
			})
			if err != nil {
				t.Fatalf("WithConn: %v", err)
			}
			for range 2 {
				r := <-results
				if r.err != nil {
					t.Fatalf("%s's try: %v", r.lockAfter, r.err)
				}
				defer mustRelease(t, r.g)
				if !r.afterFn {
					t.Errorf("%s's try ended before fn returned", r.lockAfter)
				}
			}
		})
	}
}

// TestWithConnOnASharedSessionTellsTheLocksFnFreed: fn that frees
// another Lock's key on the shared session gets that Lock's Lost closed
// before WithConn returns (not at the next keep-alive, which is long);
// the lock that lent the session stays held.
func TestWithConnOnASharedSessionTellsTheLocksFnFreed(t *testing.T) {
	t.Parallel()
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			_, a, b := sharedConnLocks(t, srv)
			admin := srv.open(t)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			ga, gb := mustTry(t, a), mustTry(t, b)
			defer mustRelease(t, ga)
			defer mustRelease(t, gb)
			if err := ga.WithConn(ctx, func(c advisorylock.Conn) error {
				var freed bool
				return c.QueryRowContext(ctx, unlockSQL(srv, advisorylock.Key(b.Name()))).Scan(&freed)
			}); err != nil {
				t.Fatalf("WithConn: %v", err)
			}
			if !isClosed(gb.Lost()) {
				t.Fatal("the lock fn freed: Lost still open when WithConn returned")
			}
			if isClosed(ga.Lost()) {
				t.Fatal("the lock that lent its session is lost")
			}
			if held := srv.sessions(t, admin, []int64{advisorylock.Key(a.Name()), advisorylock.Key(b.Name())}); held[advisorylock.Key(a.Name())] == 0 || held[advisorylock.Key(b.Name())] != 0 {
				t.Fatalf("the server holds %v; want only the lender's key", held)
			}
			gb2, err := b.TryLock(ctx) // the freed name is free in the process too
			if err != nil {
				t.Fatalf("TryLock of the freed name: %v", err)
			}
			mustRelease(t, gb2)
		})
	}
}

// TestWithConnOnASharedSessionRollsBackWhatFnLeftOpen: a transaction fn
// leaves open is rolled back when fn returns (its write is not kept), and
// the session's locks are still held.
func TestWithConnOnASharedSessionRollsBackWhatFnLeftOpen(t *testing.T) {
	t.Parallel()
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			_, a, b := sharedConnLocks(t, srv)
			admin := srv.open(t)
			table := fmt.Sprintf("hmux_rollback_%x", uint64(advisorylock.Key(a.Name())))
			if _, err := admin.Exec("CREATE TABLE " + table + " (v int)"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _, _ = admin.Exec("DROP TABLE " + table) })
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			ga, gb := mustTry(t, a), mustTry(t, b)
			defer mustRelease(t, ga)
			defer mustRelease(t, gb)
			if err := ga.WithConn(ctx, func(c advisorylock.Conn) error {
				tx, err := c.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				_, err = tx.ExecContext(ctx, "INSERT INTO "+table+" VALUES (1)")
				return err // the transaction left open
			}); err != nil {
				t.Fatalf("WithConn: %v", err)
			}
			var n int
			if err := admin.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("%d rows written by the transaction fn left open; want it rolled back", n)
			}
			if isClosed(ga.Lost()) || isClosed(gb.Lost()) {
				t.Fatal("a lock of the session is lost after the rollback")
			}
			if held := srv.sessions(t, admin, []int64{advisorylock.Key(a.Name()), advisorylock.Key(b.Name())}); len(held) != 2 {
				t.Fatalf("the server holds %v; want both keys", held)
			}
			if err := ga.WithConn(ctx, func(advisorylock.Conn) error { return errors.New("fn's own") }); err == nil || err.Error() != "fn's own" {
				t.Fatalf("WithConn = %v, want fn's error as it is", err)
			}
		})
	}
}
