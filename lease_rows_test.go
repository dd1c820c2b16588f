package advisorylock_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// Locks, Semaphores and Elections on lease rows (WithLeaseRows), proven
// where session locks cannot work: through PgBouncer in transaction mode,
// on lib/pq and on pgx in exec mode, and on MariaDB.

// rowsTTL is the rows' TTL in these tests: long enough that renewals
// through a pooler on a loaded machine make their local deadline.
const rowsTTL = 3 * time.Second

// rowsServer is a server the row tests run on: open returns a new handle
// (each its own pool, as another process's would be), and expire ends a
// lock row's lease now, as a dead holder's TTL running out would.
type rowsServer struct {
	name   string
	open   func(t *testing.T) *sql.DB
	expire func(t *testing.T, key int64)
}

// rowsServers are the servers of the row tests: PgBouncer's transaction
// pool with each driver setting, its session pool, where rows work the
// same, and (last) MariaDB.
func rowsServers() []rowsServer {
	pgExpire := func(t *testing.T, key int64) {
		t.Helper()
		direct := testdb.OpenPostgres(t, "postgres")
		if _, err := direct.Exec("UPDATE advisorylock_locks SET expires_at = now() - interval '1 second' WHERE key = $1", key); err != nil {
			t.Fatalf("expiring the row: %v", err)
		}
	}
	var servers []rowsServer
	for _, p := range pooledEndpoints {
		servers = append(servers, rowsServer{p.name, p.open, pgExpire})
	}
	return append(servers, rowsServer{"mariadb", func(t *testing.T) *sql.DB { t.Helper(); return testdb.OpenMySQL(t) }, func(t *testing.T, key int64) {
		t.Helper()
		direct := testdb.OpenMySQL(t)
		if _, err := direct.Exec("UPDATE advisorylock_locks SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE lock_key = ?", key); err != nil {
			t.Fatalf("expiring the row: %v", err)
		}
	}})
}

// pooledEndpoint is one way through the test PgBouncer: a pool and a
// driver setting. A helper process opens it by backend and dsn (see
// openElectionDB).
type pooledEndpoint struct {
	name, driver, params string
	session              bool // the session pool, where rows work the same
}

// pooledEndpoints are PgBouncer's transaction pool with each driver
// setting (pgx in exec mode, as a transaction pooler needs) and its
// session pool.
var pooledEndpoints = []pooledEndpoint{
	{"pgbouncer transaction lib/pq", "postgres", "", false},
	{"pgbouncer transaction pgx exec", "pgx", "&default_query_exec_mode=exec", false},
	{"pgbouncer session lib/pq", "postgres", "", true},
}

func (p pooledEndpoint) dsn(t *testing.T) string {
	t.Helper()
	txDSN, sessionDSN := testdb.PgBouncer(t)
	if p.session {
		return sessionDSN + p.params
	}
	return txDSN + p.params
}

func (p pooledEndpoint) backend() string { return "pgbouncer/" + p.driver }

// open returns a new handle on the endpoint, each its own pool.
func (p pooledEndpoint) open(t *testing.T) *sql.DB {
	t.Helper()
	return testdb.OpenPostgresDSN(t, p.driver, p.dsn(t))
}

// TestLeaseRowsLockExcludesThroughAPooler: a Lock on rows is not refused
// behind a transaction pooler; it excludes across handles (TryLock misses
// while held), its Release frees the name at once, and a holder whose row
// is taken over after its expiry is told (Lost closes).
func TestLeaseRowsLockExcludesThroughAPooler(t *testing.T) {
	testdb.Slow(t, "lock rows through PgBouncer and on MariaDB, seconds each")
	t.Parallel() // names of its own
	for _, srv := range rowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel() // a name of its own on each server
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := testdb.UniqueName(t)
			la := rowsLock(t, srv.open(t), name)
			lb := rowsLock(t, srv.open(t), name)
			if err := la.Check(ctx); err != nil {
				t.Fatalf("Check with WithLeaseRows = %v, want nil (no pooler refusal)", err)
			}

			g, err := la.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			if _, err := lb.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock by another handle while held = %v, want ErrNotAcquired", err)
			}
			h, err := lb.Holder(ctx)
			if err != nil || h == nil {
				t.Fatalf("Holder while held = %v, %v; want the holder", h, err)
			}
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			g2, err := lb.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock right after the Release = %v, want the lock (a release frees at once)", err)
			}

			// The holder's row expires (as a stuck holder's would) and
			// another handle takes it: the holder's next renewal finds it
			// gone, and Lost closes.
			srv.expire(t, advisorylock.Key(lb.Name()))
			defer func() { _ = g2.Release(ctx) }()
			g3, err := la.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock of an expired row = %v, want the lock", err)
			}
			defer g3.Release(ctx)
			select {
			case <-g2.Lost():
			case <-time.After(2 * rowsTTL):
				t.Fatalf("the holder whose row was taken over was not told within %v", 2*rowsTTL)
			}
			select {
			case <-g3.Lost():
				t.Fatalf("the new holder lost its row")
			default:
			}
		})
	}
}

// TestLeaseRowsSemaphoreAdmitsAtMostItsSlots: a Semaphore of 3 on rows
// admits three tries from separate handles and refuses a fourth, and of 8
// concurrent waiting holders never more than 3 hold at once.
func TestLeaseRowsSemaphoreAdmitsAtMostItsSlots(t *testing.T) {
	testdb.Slow(t, "semaphore rows through PgBouncer and on MariaDB, seconds each")
	t.Parallel() // names of its own
	const slots, holders = 3, 8
	for _, srv := range rowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := testdb.UniqueName(t)
			sems := make([]*advisorylock.Semaphore, holders)
			for i := range sems {
				s, err := advisorylock.NewSemaphore(srv.open(t), name, slots, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsTTL))
				if err != nil {
					t.Fatalf("NewSemaphore: %v", err)
				}
				sems[i] = s
			}

			var held []*advisorylock.Guard
			for i := range slots {
				g, err := sems[i].TryAcquire(ctx)
				if err != nil {
					t.Fatalf("TryAcquire %d of %d: %v", i+1, slots, err)
				}
				held = append(held, g)
			}
			if _, err := sems[slots].TryAcquire(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryAcquire with every slot held = %v, want ErrNotAcquired", err)
			}
			for _, g := range held {
				if err := g.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}

			var active, most atomic.Int32
			var wg sync.WaitGroup
			errs := make(chan error, holders)
			for _, s := range sems {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- s.Do(ctx, func(ctx context.Context) error {
						n := active.Add(1)
						defer active.Add(-1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						time.Sleep(100 * time.Millisecond) // the work done while holding a slot
						return nil
					})
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("Do: %v", err)
				}
			}
			if m := most.Load(); m > slots {
				t.Fatalf("%d holders at once on a semaphore of %d", m, slots)
			}
		})
	}
}

// TestLeaseRowsElectionThroughAPooler: three candidates on separate
// handles behind a transaction pooler elect one leader at a time; a
// Resign hands over; terms strictly increase; and a Fence refuses the
// write of a leader whose term has passed.
func TestLeaseRowsElectionThroughAPooler(t *testing.T) {
	testdb.Slow(t, "an election through PgBouncer, several terms")
	for _, srv := range rowsServers()[:3] { // the PostgreSQL ones
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := testdb.UniqueName(t)
			type term struct {
				candidate int
				token     advisorylock.FencingToken
			}
			leading := make(chan term, 16)
			var active atomic.Int32
			overlap := make(chan int32, 1)
			runErrs := make(chan error, 3)
			elections := make([]*advisorylock.Election, 3)
			var wg sync.WaitGroup
			for i := range elections {
				e, err := advisorylock.NewElection(srv.open(t), name, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsTTL))
				if err != nil {
					t.Fatalf("NewElection: %v", err)
				}
				elections[i] = e
				wg.Add(1)
				go func() {
					defer wg.Done()
					err := e.Run(ctx, func(lctx context.Context, token advisorylock.FencingToken) error {
						if n := active.Add(1); n > 1 {
							select {
							case overlap <- n:
							default:
							}
						}
						defer active.Add(-1)
						leading <- term{i, token}
						<-lctx.Done()
						return nil
					})
					if ctx.Err() == nil {
						runErrs <- err
					}
				}()
			}
			defer func() { cancel(); wg.Wait() }()

			next := func(after term) term {
				t.Helper()
				select {
				case n := <-overlap:
					t.Fatalf("%d leaders at once", n)
				case err := <-runErrs:
					t.Fatalf("Run returned while the election went on: %v", err)
				case tm := <-leading:
					if tm.token <= after.token {
						t.Fatalf("term %d after term %d: terms must strictly increase", tm.token, after.token)
					}
					return tm
				case <-ctx.Done():
					t.Fatalf("no leader elected: %v", ctx.Err())
				}
				return term{}
			}
			first := next(term{})
			h, err := elections[(first.candidate+1)%3].Leader(ctx)
			if err != nil || h == nil || h.Token != first.token {
				t.Fatalf("Leader seen by another candidate = %+v, %v; want the leader of term %d", h, err, first.token)
			}
			if err := elections[first.candidate].Resign(ctx); err != nil {
				t.Fatalf("Resign: %v", err)
			}
			second := next(first)
			if err := elections[second.candidate].Resign(ctx); err != nil {
				t.Fatalf("Resign: %v", err)
			}
			third := next(second)

			db := srv.open(t)
			fence := checkedFence(t, db, name)
			admit := func(token advisorylock.FencingToken) error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatalf("BeginTx: %v", err)
				}
				defer tx.Rollback()
				if err := fence.Admit(ctx, tx, token); err != nil {
					return err
				}
				return tx.Commit()
			}
			if err := admit(third.token); err != nil {
				t.Fatalf("Admit of the leader's term %d: %v", third.token, err)
			}
			if err := admit(first.token); !errors.Is(err, advisorylock.ErrStaleToken) {
				t.Fatalf("Admit of a past leader's term %d after %d = %v, want ErrStaleToken", first.token, third.token, err)
			}
		})
	}
}

// TestLeaseRowsRefuseWhatRowsCannotKeep: rows are not multiplexed, and a
// LeaseLock is a row already.
func TestLeaseRowsRefuseWhatRowsCannotKeep(t *testing.T) {
	db := testdb.OpenPostgres(t, "postgres")
	if _, err := advisorylock.New(db, "x", advisorylock.WithLeaseRows(), advisorylock.WithMultiplexing(2)); err == nil {
		t.Fatalf("New with WithLeaseRows and WithMultiplexing = nil error, want a refusal")
	}
	if _, err := advisorylock.NewLeaseLock(db, "x", advisorylock.WithLeaseRows()); err == nil {
		t.Fatalf("NewLeaseLock with WithLeaseRows = nil error, want a refusal (a LeaseLock is a row already)")
	}
}

// rowsLock returns a Lock on name with WithLeaseRows and rowsTTL.
func rowsLock(t *testing.T, db *sql.DB, name string) *advisorylock.Lock {
	t.Helper()
	l, err := advisorylock.New(db, name, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsTTL))
	if err != nil {
		t.Fatalf("New(%q, WithLeaseRows): %v", name, err)
	}
	return l
}

// TestLeaseRowsElectionKilledLeaderProcessIsTakenOver: a leader process
// on rows behind PgBouncer's transaction pool is killed (SIGKILL); a
// candidate in this process takes over once the dead leader's lease runs
// out (not before a third of its TTL, and within the TTL and a poll), and
// its term exceeds the dead leader's.
func TestLeaseRowsElectionKilledLeaderProcessIsTakenOver(t *testing.T) {
	testdb.Slow(t, "kills a leader process, waits out its lease")
	t.Parallel() // names and a helper process of its own
	txDSN, _ := testdb.PgBouncer(t)
	for _, c := range []struct{ driver, params string }{{"postgres", ""}, {"pgx", "&default_query_exec_mode=exec"}} {
		t.Run(c.driver, func(t *testing.T) {
			name, dsn := testdb.UniqueName(t), txDSN+c.params
			job, err := json.Marshal(electionJob{Backend: "pgbouncer/" + c.driver, DSN: dsn, Name: name, TTL: electionSQLTTL, Rows: true})
			if err != nil {
				t.Fatal(err)
			}
			cmd := testdb.HelperCommand(t, "TestElectionHelperProcess", "rows-leader", electionHelperEnv+"="+string(job))
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			opts := []advisorylock.Option{advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(electionSQLTTL)}
			e := newElection(t, testdb.OpenPostgresDSN(t, c.driver, dsn), name, opts...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var dead *advisorylock.Holder
			testdb.WaitFor(t, 30*time.Second, func() bool {
				h, err := e.Leader(ctx)
				if err != nil {
					t.Fatal(err)
				}
				dead = h
				return h != nil && h.Owner == "helper"
			}, "the helper never led")

			terms := make(chan advisorylock.FencingToken, 1)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = e.Run(ctx, func(lctx context.Context, term advisorylock.FencingToken) error {
					terms <- term
					<-lctx.Done()
					return lctx.Err()
				})
			}()
			defer func() { cancel(); <-done }()
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed := time.Now()
			_ = cmd.Wait()
			select {
			case term := <-terms:
				took := time.Since(killed)
				t.Logf("rows takeover through PgBouncer after %v (TTL %v)", took, electionSQLTTL)
				if term <= dead.Token {
					t.Fatalf("term %v after the dead leader's %v", term, dead.Token)
				}
				if took < electionSQLTTL/3 || took > sqliteTakeoverIn {
					t.Fatalf("takeover after %v, want between %v and %v", took, electionSQLTTL/3, sqliteTakeoverIn)
				}
			case <-ctx.Done():
				t.Fatalf("no takeover after the leader was killed")
			}
		})
	}
}

// TestLeaseRowsKeepTheMinHoldWindow: a Lock on rows with WithMinHold keeps
// its name taken until the window's end, through its Release: another
// handle's TryLock misses until then, and takes it after.
func TestLeaseRowsKeepTheMinHoldWindow(t *testing.T) {
	testdb.Slow(t, "waits out a min-hold window on each server")
	t.Parallel() // names of its own
	const window = 2 * time.Second
	for _, srv := range rowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel() // a name of its own on each server
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := testdb.UniqueName(t)
			open := func() *advisorylock.Lock {
				l, err := advisorylock.New(srv.open(t), name, advisorylock.WithLeaseRows(), advisorylock.WithMinHold(window))
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return l
			}
			la, lb := open(), open()
			g, err := la.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock: %v", err)
			}
			granted := time.Now()
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if _, err := lb.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock inside the window after a Release = %v, want ErrNotAcquired", err)
			}
			var g2 *advisorylock.Guard
			testdb.WaitFor(t, 5*window, func() bool {
				g2, err = lb.TryLock(ctx)
				return err == nil
			}, "the name was not free after its window (%v)", window)
			defer g2.Release(ctx)
			if took := time.Since(granted); took < window-window/4 {
				t.Fatalf("taken again %v after the grant, inside its %v window", took, window)
			}
		})
	}
}

// TestLeaseRowsSetTakesAllOrNone: a set on rows holds all its names; a
// set sharing one of them misses while it is held, and takes them all
// after its Release.
func TestLeaseRowsSetTakesAllOrNone(t *testing.T) {
	testdb.Slow(t, "sets of rows through PgBouncer and on MariaDB")
	for _, srv := range rowsServers() {
		t.Run(srv.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			name := testdb.UniqueName(t)
			set := func(names ...string) *advisorylock.Lock {
				l, err := advisorylock.NewSet(srv.open(t), names, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsTTL))
				if err != nil {
					t.Fatalf("NewSet: %v", err)
				}
				return l
			}
			ab, bc, c := set(name+"/a", name+"/b"), set(name+"/b", name+"/c"), rowsLock(t, srv.open(t), name+"/c")
			g, err := ab.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock of {a, b}: %v", err)
			}
			if _, err := bc.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock of {b, c} while {a, b} is held = %v, want ErrNotAcquired", err)
			}
			gc, err := c.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock of c after {b, c} missed = %v, want it free (all or none)", err)
			}
			if err := gc.Release(ctx); err != nil {
				t.Fatalf("Release of c: %v", err)
			}
			if err := g.Release(ctx); err != nil {
				t.Fatalf("Release of {a, b}: %v", err)
			}
			g2, err := bc.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock of {b, c} after the Release = %v, want the set", err)
			}
			if err := g2.Release(ctx); err != nil {
				t.Fatalf("Release of {b, c}: %v", err)
			}
		})
	}
}
