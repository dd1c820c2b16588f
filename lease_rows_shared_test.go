package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// Shared holds (RLock) of a Lock on lease rows (WithLeaseRows) on
// PostgreSQL and MariaDB: readers beside each other, apart from a writer,
// each shared grant with a token of its own, a reader lost at its local
// deadline before a writer is granted.

// sharedRowsServers are the row tests' servers (rowsServers) and
// PostgreSQL direct, on lib/pq and on pgx.
func sharedRowsServers() []rowsServer {
	direct := func(driver string) func(t *testing.T) *sql.DB {
		return func(t *testing.T) *sql.DB { t.Helper(); return testdb.OpenPostgres(t, driver) }
	}
	servers := []rowsServer{{name: "postgres lib/pq", open: direct("postgres")}, {name: "postgres pgx", open: direct("pgx")}}
	return append(servers, rowsServers()...)
}

// rowsGrant is the outcome of an acquire run in a goroutine, and when it
// returned.
type rowsGrant struct {
	g   *advisorylock.Guard
	err error
	at  time.Time
}

func grantOf(g *advisorylock.Guard, err error) rowsGrant { return rowsGrant{g, err, time.Now()} }

// TestLeaseRowsSharedHoldersExcludeWriters: two readers hold together,
// each with a token of its own; a waiting writer keeps a third reader
// out, waits for both readers and is granted once the last has gone, with
// a token above theirs; a reader waits for that writer.
func TestLeaseRowsSharedHoldersExcludeWriters(t *testing.T) {
	testdb.Slow(t, "shared rows on PostgreSQL, through PgBouncer and on MariaDB, seconds each")
	for _, srv := range sharedRowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel() // a name of its own on each server
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := "h-rows/" + testdb.UniqueName(t)
			r1, r2, r3, w := rowsLock(t, srv.open(t), name), rowsLock(t, srv.open(t), name), rowsLock(t, srv.open(t), name), rowsLock(t, srv.open(t), name)

			g1, err := r1.TryRLock(ctx)
			if err != nil {
				t.Fatalf("TryRLock of the first reader: %v", err)
			}
			g2, err := r2.TryRLock(ctx)
			if err != nil {
				t.Fatalf("TryRLock of a second reader beside the first = %v, want the shared hold", err)
			}
			hs, err := w.Holders(ctx)
			if err != nil || len(hs) != 2 || !hs[0].Shared || !hs[1].Shared {
				t.Fatalf("Holders with two readers in = %+v, %v; want two shared holders", hs, err)
			}
			if hs[0].Token == 0 || hs[1].Token == 0 || hs[0].Token == hs[1].Token {
				t.Fatalf("the readers' tokens are %d and %d, want two distinct tokens", hs[0].Token, hs[1].Token)
			}
			readersTop := max(hs[0].Token, hs[1].Token)
			if _, err := w.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock with readers in = %v, want ErrNotAcquired", err)
			}

			granted := make(chan rowsGrant, 1) // the goroutine never blocks, nor uses t
			go func() { granted <- grantOf(w.Lock(ctx)) }()
			// The waiting writer's claim keeps new readers out.
			for {
				g, err := r3.TryRLock(ctx)
				if errors.Is(err, advisorylock.ErrNotAcquired) {
					break
				}
				if err != nil {
					t.Fatalf("TryRLock of a third reader: %v", err)
				}
				if err := g.Release(ctx); err != nil {
					t.Fatalf("Release of the third reader: %v", err)
				}
				if ctx.Err() != nil {
					t.Fatalf("a waiting writer never kept a new reader out")
				}
			}
			if err := g1.Release(ctx); err != nil {
				t.Fatalf("Release of the first reader: %v", err)
			}
			// The second reader is still in: no writer may be.
			if _, err := r1.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock with one reader left = %v, want ErrNotAcquired", err)
			}
			select {
			case <-granted:
				t.Fatalf("the writer was granted while a reader held the lock")
			default:
			}
			if err := g2.Release(ctx); err != nil {
				t.Fatalf("Release of the second reader: %v", err)
			}
			var gw *advisorylock.Guard
			select {
			case w := <-granted:
				if w.err != nil {
					t.Fatalf("the writer's Lock: %v", w.err)
				}
				gw = w.g
			case <-time.After(rowsTTL):
				t.Fatalf("the writer was not granted within %v of the last reader's release", rowsTTL)
			}
			hs, err = r1.Holders(ctx)
			if err != nil || len(hs) != 1 || hs[0].Shared || hs[0].Token <= readersTop {
				t.Fatalf("Holders with the writer in = %+v, %v; want one exclusive holder with a token above %d", hs, err, readersTop)
			}

			// A reader waits for the writer.
			read := make(chan rowsGrant, 1)
			go func() { read <- grantOf(r3.RLock(ctx)) }()
			if _, err := r2.TryRLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryRLock with a writer in = %v, want ErrNotAcquired", err)
			}
			select {
			case <-read:
				t.Fatalf("a reader was granted while the writer held the lock")
			default:
			}
			if err := gw.Release(ctx); err != nil {
				t.Fatalf("Release of the writer: %v", err)
			}
			select {
			case r := <-read:
				if r.err != nil {
					t.Fatalf("the reader's RLock: %v", r.err)
				}
				_ = r.g.Release(ctx)
			case <-time.After(rowsTTL):
				t.Fatalf("the waiting reader was not granted within %v of the writer's release", rowsTTL)
			}
		})
	}
}

// TestLeaseRowsSharedHolderLostBeforeWriter: a reader's renewals keep a
// waiting writer out past the reader's TTL; once it stops renewing (its
// clock jumps past its local deadline, as a paused process's would) it is
// told its hold is lost (Lost closes) before the writer is granted, which
// happens once the reader's row expires on the database.
func TestLeaseRowsSharedHolderLostBeforeWriter(t *testing.T) {
	testdb.Slow(t, "waits out a reader's lease on each server")
	t.Parallel() // names of its own
	for _, srv := range sharedRowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel() // a name of its own on each server
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := "h-rows/" + testdb.UniqueName(t)
			clock := testdb.NewFakeClock()
			r, err := advisorylock.New(srv.open(t), name, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsTTL), advisorylock.WithClock(clock.Now))
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			w := rowsLock(t, srv.open(t), name)
			g, err := r.TryRLock(ctx)
			if err != nil {
				t.Fatalf("TryRLock: %v", err)
			}
			defer g.Release(ctx)

			granted := make(chan rowsGrant, 1) // the goroutine never blocks, nor uses t
			go func() { granted <- grantOf(w.Lock(ctx)) }()
			// Renewed, the reader keeps the writer out past its TTL.
			select {
			case w := <-granted:
				t.Fatalf("the writer was granted (%v) at %v while the reader renewed its hold", w.err, w.at)
			case <-g.Lost():
				t.Fatalf("the renewing reader lost its hold")
			case <-time.After(rowsTTL * 3 / 2):
			}
			clock.Add(rowsTTL) // past the reader's local deadline: it renews no more
			var lostAt time.Time
			select {
			case <-g.Lost():
				lostAt = time.Now()
			case w := <-granted:
				t.Fatalf("the writer was granted (%v) at %v while the reader had not been told of its loss", w.err, w.at)
			case <-time.After(2 * rowsTTL):
				t.Fatalf("the reader past its local deadline was not told within %v", 2*rowsTTL)
			}
			select {
			case w := <-granted:
				if w.err != nil {
					t.Fatalf("the writer's Lock: %v", w.err)
				}
				if w.at.Before(lostAt) {
					t.Fatalf("the writer was granted at %v, before the reader was told at %v", w.at, lostAt)
				}
				_ = w.g.Release(ctx)
			case <-time.After(2 * rowsTTL):
				t.Fatalf("the writer was not granted within %v of the reader's loss", 2*rowsTTL)
			}
		})
	}
}

// TestLeaseRowsSharedUnderContention: readers and writers on separate
// handles take one name over and over, waiting and trying; no writer
// ever holds beside anyone, and readers do hold together.
func TestLeaseRowsSharedUnderContention(t *testing.T) {
	testdb.Slow(t, "seconds of contention on each server")
	t.Parallel() // a name and pools of its own on each server
	const workers, rounds = 6, 25
	for _, srv := range sharedRowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := "h-rows/" + testdb.UniqueName(t)
			var mu sync.Mutex
			readers, writers, together := 0, 0, 0
			enter := func(shared bool) {
				mu.Lock()
				defer mu.Unlock()
				if shared {
					readers++
					if readers > 1 {
						together++
					}
				} else {
					writers++
				}
				if writers > 1 || writers == 1 && readers > 0 {
					t.Errorf("%d writers and %d readers hold at once", writers, readers)
				}
			}
			leave := func(shared bool) {
				mu.Lock()
				defer mu.Unlock()
				if shared {
					readers--
				} else {
					writers--
				}
			}
			locks := make([]*advisorylock.Lock, workers) // made before any goroutine, which a Fatal would outlive
			for i := range locks {
				locks[i] = rowsLock(t, srv.open(t), name)
			}
			var wg sync.WaitGroup
			for i, l := range locks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := range rounds {
						shared := (i+n)%3 != 0
						take := l.Lock
						if shared {
							take = l.RLock
						}
						if n%2 == 1 { // a try, which may miss
							take = l.TryLock
							if shared {
								take = l.TryRLock
							}
						}
						g, err := take(ctx)
						if errors.Is(err, advisorylock.ErrNotAcquired) {
							continue
						}
						if err != nil {
							t.Errorf("acquire (shared %v): %v", shared, err)
							return
						}
						enter(shared)
						time.Sleep(5 * time.Millisecond) // the work done while holding
						leave(shared)
						if err := g.Release(ctx); err != nil {
							t.Errorf("Release: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if together == 0 {
				t.Errorf("readers never held together")
			}
		})
	}
}
