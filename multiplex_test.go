package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// muxServer is one server that multiplexed locks are tested on: how to
// open a pool, and how to read, on the server, which session holds each
// key and to kill a session.
type muxServer struct {
	name string
	open func(t *testing.T) *sql.DB
	// sessions maps each key to the server session that holds it (absent:
	// free), read through admin.
	sessions func(t *testing.T, admin *sql.DB, keys []int64) map[int64]int64
	// kill ends server session id.
	kill func(t *testing.T, admin *sql.DB, id int64)
}

// muxServers are PostgreSQL through both drivers and MariaDB.
func muxServers() []muxServer {
	var out []muxServer
	for _, drv := range testdb.Drivers {
		out = append(out, muxServer{
			name:     "postgres/" + drv,
			open:     func(t *testing.T) *sql.DB { return testdb.OpenPostgres(t, drv) },
			sessions: pgKeySessions,
			kill: func(t *testing.T, admin *sql.DB, id int64) {
				t.Helper()
				if _, err := admin.Exec("SELECT pg_terminate_backend($1)", id); err != nil {
					t.Fatalf("pg_terminate_backend(%d): %v", id, err)
				}
			},
		})
	}
	out = append(out, muxServer{
		name:     "mysql",
		open:     func(t *testing.T) *sql.DB { return testdb.OpenMySQL(t) },
		sessions: mysqlKeySessions,
		kill: func(t *testing.T, admin *sql.DB, id int64) {
			t.Helper()
			if _, err := admin.Exec("KILL " + strconv.FormatInt(id, 10)); err != nil {
				t.Fatalf("KILL %d: %v", id, err)
			}
		},
	})
	return out
}

// pgKeySessions reads pg_locks: the backend pid holding each key.
func pgKeySessions(t *testing.T, admin *sql.DB, keys []int64) map[int64]int64 {
	t.Helper()
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = strconv.FormatInt(k, 10)
	}
	rows, err := admin.Query("SELECT (classid::int8 << 32) | objid::int8, pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND ((classid::int8 << 32) | objid::int8) = ANY($1::int8[])",
		"{"+strings.Join(parts, ",")+"}")
	if err != nil {
		t.Fatalf("reading pg_locks: %v", err)
	}
	defer rows.Close()
	out := map[int64]int64{}
	for rows.Next() {
		var k, pid int64
		if err := rows.Scan(&k, &pid); err != nil {
			t.Fatal(err)
		}
		out[k] = pid
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// mysqlKeySessions asks IS_USED_LOCK of each key.
func mysqlKeySessions(t *testing.T, admin *sql.DB, keys []int64) map[int64]int64 {
	t.Helper()
	out := map[int64]int64{}
	for start := 0; start < len(keys); start += 500 {
		chunk := keys[start:min(start+500, len(keys))]
		var q strings.Builder
		for i, k := range chunk {
			if i > 0 {
				q.WriteString(" UNION ALL ")
			}
			fmt.Fprintf(&q, "SELECT %d, IS_USED_LOCK('advisorylock:v1:%016x')", i, uint64(k))
		}
		rows, err := admin.Query(q.String())
		if err != nil {
			t.Fatalf("asking IS_USED_LOCK: %v", err)
		}
		for rows.Next() {
			var i int
			var id sql.NullInt64
			if err := rows.Scan(&i, &id); err != nil {
				t.Fatal(err)
			}
			if id.Valid {
				out[chunk[i]] = id.Int64
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return out
}

// distinct returns the distinct values of m.
func distinct(m map[int64]int64) map[int64]int {
	out := map[int64]int{}
	for _, v := range m {
		out[v]++
	}
	return out
}

// muxNames returns n names unique to the test, and their keys.
func muxNames(t *testing.T, n int) ([]string, []int64) {
	base := testdb.UniqueName(t)
	names := make([]string, n)
	keys := make([]int64, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s/%d", base, i)
		keys[i] = advisorylock.Key(names[i])
	}
	return names, keys
}

// holdAll takes each name with TryLock from workers goroutines at once,
// and fails the test unless every one is granted.
func holdAll(t *testing.T, db *sql.DB, names []string, workers int, opts ...advisorylock.Option) []*advisorylock.Guard {
	t.Helper()
	guards := make([]*advisorylock.Guard, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Go(func() {
			for i := range next {
				l, err := advisorylock.New(db, names[i], opts...)
				if err == nil {
					ctx, cancel := context.WithTimeout(context.Background(), wait)
					guards[i], err = l.TryLock(ctx)
					cancel()
				}
				errs[i] = err
			}
		})
	}
	for i := range names {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("holding %d names: %v", len(names), err)
	}
	return guards
}

// releaseAll releases every guard, failing on an error.
func releaseAll(t *testing.T, guards []*advisorylock.Guard) {
	t.Helper()
	for i, g := range guards {
		if err := g.Release(context.Background()); err != nil {
			t.Errorf("Release of guard %d: %v", i, err)
		}
	}
}

// TestMultiplexingHolds2000NamesOnFewSessions holds 2,000 names from one
// pool of 8 connections on the defaults (4 shared sessions): the server shows them
// held by at most 4 sessions, a rival process gets none of them, and
// after the release none is held.
func TestMultiplexingHolds2000NamesOnFewSessions(t *testing.T) {
	testdb.Slow(t, "2,000 names and a rival process, per server")
	t.Parallel() // names of its own; the server shows them per key
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			db := srv.open(t)
			db.SetMaxOpenConns(8)
			admin := srv.open(t)
			names, keys := muxNames(t, 2000)
			guards := holdAll(t, db, names, 16, quiet)

			held := srv.sessions(t, admin, keys)
			if len(held) != len(keys) {
				t.Fatalf("the server shows %d of %d names held", len(held), len(keys))
			}
			if s := distinct(held); len(s) > 4 {
				t.Fatalf("the names are held by %d server sessions, want at most 4: %v", len(s), s)
			}
			if open := db.Stats().OpenConnections; open > 8 {
				t.Fatalf("%d connections open, the pool's limit is 8", open)
			}

			result := t.TempDir() + "/rival"
			rival := testdb.HelperCommand(t, "TestHelperMultiplexRival", "rival", "MUX_SERVER="+srv.name,
				"MUX_NAMES="+names[0]+","+strconv.Itoa(len(names)), "MUX_OUT="+result)
			if err := rival.Run(); err != nil {
				t.Fatalf("rival process: %v", err)
			}
			out, err := os.ReadFile(result)
			if err != nil {
				t.Fatalf("rival process: %v", err)
			}
			if got := strings.TrimSpace(string(out)); got != "acquired 0 of 2000" {
				t.Fatalf("rival process: %q, want it refused every name", got)
			}

			releaseAll(t, guards)
			if left := srv.sessions(t, admin, keys); len(left) != 0 {
				t.Fatalf("%d names still held on the server after the release", len(left))
			}
		})
	}
}

// TestHelperMultiplexRival is the rival process of
// TestMultiplexingHolds2000NamesOnFewSessions: it tries each name (the
// first name's prefix, and a count) with a Lock of its own and prints how
// many it got.
func TestHelperMultiplexRival(t *testing.T) {
	if testdb.HelperRole() == "" {
		t.Skip("helper process")
	}
	var srv muxServer
	for _, s := range muxServers() {
		if s.name == os.Getenv("MUX_SERVER") {
			srv = s
		}
	}
	first, count, _ := strings.Cut(os.Getenv("MUX_NAMES"), ",")
	n, _ := strconv.Atoi(count)
	base := strings.TrimSuffix(first, "/0")
	db := srv.open(t)
	got := 0
	for i := range n {
		l := newLock(t, db, fmt.Sprintf("%s/%d", base, i), quiet)
		g, err := l.TryLock(context.Background())
		if err == nil {
			got++
			_ = g.Release(context.Background())
		} else if !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock: %v", err)
		}
	}
	if err := os.WriteFile(os.Getenv("MUX_OUT"), fmt.Appendf(nil, "acquired %d of %d\n", got, n), 0o600); err != nil {
		t.Fatal(err)
	}
}

// muxFaultOptions are the options of the fault tests' multiplexed locks
// (the default: 4 shared sessions): a keep-alive of 200ms, statements
// bounded by 1s.
var muxFaultOptions = []advisorylock.Option{quiet,
	advisorylock.WithKeepAlive(200 * time.Millisecond), advisorylock.WithReleaseTimeout(time.Second)}

// spread holds names until the server shows them on at least two
// sessions, and returns the guards with the session of each key.
func spread(t *testing.T, srv muxServer, db, admin *sql.DB, n int) ([]*advisorylock.Guard, []string, []int64, map[int64]int64) {
	t.Helper()
	for attempt := 0; attempt < 10; attempt++ {
		names, keys := muxNames(t, n)
		guards := holdAll(t, db, names, 8, muxFaultOptions...)
		held := srv.sessions(t, admin, keys)
		if len(held) != n {
			t.Fatalf("the server shows %d of %d names held", len(held), n)
		}
		if len(distinct(held)) >= 2 {
			return guards, names, keys, held
		}
		releaseAll(t, guards)
	}
	t.Fatal("the names never spread over two sessions")
	return nil, nil, nil, nil
}

// checkOnlyTheseLost waits for every guard whose key was on session
// victim to report lost, then checks that the others stay held and
// unreported through several keep-alive checks.
func checkOnlyTheseLost(t *testing.T, srv muxServer, admin *sql.DB, guards []*advisorylock.Guard, keys []int64, held map[int64]int64, victim int64) {
	t.Helper()
	deadline := time.After(wait)
	for i, g := range guards {
		if held[keys[i]] != victim {
			continue
		}
		select {
		case <-g.Lost():
		case <-deadline:
			t.Fatalf("lock of key %d, on the ended session %d, never reported lost", keys[i], victim)
		}
	}
	// Nothing must happen to the others: give their keep-alives (every
	// 200ms) several checks to get it wrong.
	time.Sleep(time.Second)
	now := srv.sessions(t, admin, keys)
	for i, g := range guards {
		if held[keys[i]] == victim {
			continue
		}
		select {
		case <-g.Lost():
			t.Fatalf("lock of key %d, on session %d, reported lost when session %d ended", keys[i], held[keys[i]], victim)
		default:
		}
		if now[keys[i]] != held[keys[i]] {
			t.Fatalf("lock of key %d: server shows session %d, was %d", keys[i], now[keys[i]], held[keys[i]])
		}
	}
}

// TestMultiplexingSessionKilledLosesOnlyItsLocks ends one shared session
// on the server (pg_terminate_backend, KILL): each of its locks reports
// lost within the keep-alive bound, and this process can take their names
// again on its shared sessions (the ended session left none reserved); the
// locks on the other sessions stay held and unreported, and release
// cleanly.
func TestMultiplexingSessionKilledLosesOnlyItsLocks(t *testing.T) {
	testdb.Slow(t, "waits for keep-alives to report the kill, per server")
	t.Parallel() // names and pools of its own; it ends only its own session
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			t.Parallel() // names and pools of its own; it kills only its own session
			db := srv.open(t)
			db.SetMaxOpenConns(8)
			admin := srv.open(t)
			guards, names, keys, held := spread(t, srv, db, admin, 200)
			var victim int64
			for _, s := range held {
				victim = s
				break
			}
			srv.kill(t, admin, victim)
			checkOnlyTheseLost(t, srv, admin, guards, keys, held, victim)
			for i := range guards {
				if held[keys[i]] != victim {
					continue
				}
				again, err := newLock(t, db, names[i], muxFaultOptions...).TryLock(context.Background())
				if err != nil {
					t.Fatalf("this process could not take %s again on its shared sessions after the killed one lost it: %v", names[i], err)
				}
				mustRelease(t, again)
			}
			releaseAll(t, guards)
			if left := srv.sessions(t, admin, keys); len(left) != 0 {
				t.Fatalf("%d names still held on the server after the release", len(left))
			}
		})
	}
}

// TestMultiplexingSessionBlackholedLosesOnlyItsLocks cuts one shared
// PostgreSQL session off (iptables drops its packets both ways): its locks
// report lost within the keep-alive and statement bounds, the others stay
// held.
func TestMultiplexingSessionBlackholedLosesOnlyItsLocks(t *testing.T) {
	testdb.Slow(t, "iptables: blackholes a shared session")
	t.Parallel()
	testdb.RequireIptables(t)
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			srv := muxServers()[0]
			srv.open = func(t *testing.T) *sql.DB { return testdb.OpenPostgres(t, drv) }
			db := srv.open(t)
			db.SetMaxOpenConns(8)
			admin := srv.open(t)
			guards, _, keys, held := spread(t, srv, db, admin, 100)
			var victim int64
			for _, s := range held {
				victim = s
				break
			}
			mark := testdb.Mark(t)
			heal := testdb.Blackhole(t, testdb.Port(t, testdb.PostgresDSN(t)), testdb.ClientPort(t, admin, int(victim)))
			checkOnlyTheseLost(t, srv, admin, guards, keys, held, victim)
			heal()
			var rest []*advisorylock.Guard
			for i, g := range guards {
				if held[keys[i]] != victim {
					rest = append(rest, g)
				}
			}
			releaseAll(t, rest)
			releaseAll(t, guards) // the lost ones: nothing left to free
			srv.kill(t, admin, victim)
			waitForReaders(t, mark)
		})
	}
}

// TestMultiplexingCancelledTriesSpareTheirNeighbours cancels tries on
// shared sessions at random moments: no held lock beside them is lost or
// freed, and no cancelled try leaves its key held.
func TestMultiplexingCancelledTriesSpareTheirNeighbours(t *testing.T) {
	testdb.Slow(t, "many cancelled tries, per server")
	t.Parallel() // names and pools of its own
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			db := srv.open(t)
			db.SetMaxOpenConns(8)
			admin := srv.open(t)
			names, keys := muxNames(t, 20)
			guards := holdAll(t, db, names, 8, muxFaultOptions...)
			tried, triedKeys := muxNames(t, 300)
			var wg sync.WaitGroup
			for w := range 6 {
				wg.Go(func() {
					for i := w; i < len(tried); i += 6 {
						l := newLock(t, db, tried[i], muxFaultOptions...)
						ctx, cancel := context.WithCancel(context.Background())
						time.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, cancel)
						g, err := l.TryLock(ctx)
						cancel()
						if err == nil {
							if err := g.Release(context.Background()); err != nil {
								t.Errorf("Release(%s): %v", tried[i], err)
							}
						}
					}
				})
			}
			wg.Wait()
			for i, g := range guards {
				select {
				case <-g.Lost():
					t.Fatalf("lock %s was lost while tries beside it were cancelled", names[i])
				default:
				}
			}
			if held := srv.sessions(t, admin, keys); len(held) != len(keys) {
				t.Fatalf("the server shows %d of %d held names", len(held), len(keys))
			}
			if left := srv.sessions(t, admin, triedKeys); len(left) != 0 {
				t.Fatalf("%d cancelled tries left their names held", len(left))
			}
			releaseAll(t, guards)
		})
	}
}

// TestMultiplexingExcludesInProcessAndHandsOff: a second Lock on a name
// that this process holds on a shared session misses at once (the
// session would grant it again), a pinned Lock is refused by the server,
// and a waiting Lock gets the name when the holder releases it.
func TestMultiplexingExcludesInProcessAndHandsOff(t *testing.T) {
	testdb.Slow(t, "waiters handed over, per server")
	t.Parallel() // names and pools of its own
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			db := srv.open(t)
			name := testdb.UniqueName(t)
			a := newLock(t, db, name, quiet, advisorylock.WithMultiplexing(2))
			b := newLock(t, db, name, quiet, advisorylock.WithMultiplexing(2))
			pinned := newLock(t, db, name, quiet)
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			g, err := a.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("second TryLock in the process: %v, want ErrNotAcquired", err)
			}
			if _, err := a.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("second TryLock of the same Lock: %v, want ErrNotAcquired", err)
			}
			if _, err := pinned.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("pinned TryLock: %v, want ErrNotAcquired", err)
			}
			if h, err := pinned.Holder(ctx); err != nil || h == nil {
				t.Fatalf("Holder = %v, %v; want the shared session", h, err)
			}
			got := make(chan *advisorylock.Guard, 1)
			go func() {
				g2, err := b.Lock(ctx)
				if err != nil {
					t.Errorf("waiting Lock: %v", err)
				}
				got <- g2
			}()
			select {
			case <-got:
				t.Fatal("the waiter got the name while it was held")
			case <-time.After(300 * time.Millisecond):
			}
			released := time.Now()
			if err := g.Release(ctx); err != nil {
				t.Fatal(err)
			}
			g2 := <-got
			if g2 == nil {
				return
			}
			t.Logf("handoff after %s", time.Since(released))
			if _, err := a.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock while the waiter holds it: %v, want ErrNotAcquired", err)
			}
			if err := g2.Release(ctx); err != nil {
				t.Fatal(err)
			}
			g3, err := a.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock after both released: %v", err)
			}
			if err := g3.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestMultiplexingOptionsAndRefusals: bounds and combinations that cannot
// work are refused at construction, shared locks at the call, and SQLite
// (whose Locks are rows) works as without the option.
func TestMultiplexingOptionsAndRefusals(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	for _, bad := range [][]advisorylock.Option{
		{advisorylock.WithMultiplexing(-1)},
		{advisorylock.WithMultiplexing(2), advisorylock.WithMinHold(time.Second)},
	} {
		if _, err := advisorylock.New(db, "x", bad...); err == nil {
			t.Errorf("New with %d bad options: no error", len(bad))
		}
	}
	for _, good := range [][]advisorylock.Option{
		{advisorylock.WithMultiplexing(0)},
		{advisorylock.WithMultiplexing(0), advisorylock.WithMinHold(time.Second)},
		{advisorylock.WithMinHold(time.Second)}, // pinned without an error
		{advisorylock.WithLeaseRows()},
	} {
		if _, err := advisorylock.New(db, "x", good...); err != nil {
			t.Errorf("New with %d options: %v", len(good), err)
		}
	}
	// WithMultiplexing(0) asks nothing of the other kinds: they take it.
	if _, err := advisorylock.NewSemaphore(db, "x", 2, advisorylock.WithMultiplexing(0)); err != nil {
		t.Errorf("NewSemaphore with WithMultiplexing(0): %v", err)
	}
	if _, err := advisorylock.NewLeaseLock(db, "x", advisorylock.WithMultiplexing(0)); err != nil {
		t.Errorf("NewLeaseLock with WithMultiplexing(0): %v", err)
	}
	if _, err := advisorylock.NewSemaphore(db, "x", 2, advisorylock.WithMultiplexing(2)); err == nil {
		t.Error("NewSemaphore took WithMultiplexing")
	}
	if _, err := advisorylock.NewLeaseLock(db, "x", advisorylock.WithMultiplexing(2)); err == nil {
		t.Error("NewLeaseLock took WithMultiplexing")
	}
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMultiplexing(2))
	if _, err := l.RLock(context.Background()); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("RLock with WithMultiplexing: %v, want ErrUnsupported", err)
	}

	_, sq := sqliteFile(t, sqliteWAL)
	name := testdb.UniqueName(t)
	s1 := newLock(t, sq, name, advisorylock.WithMultiplexing(2))
	s2 := newLock(t, sq, name, advisorylock.WithMultiplexing(2))
	g, err := s1.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("SQLite second TryLock: %v, want ErrNotAcquired", err)
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestMultiplexedLocksTellTheObserver: acquires, misses, releases and the
// loss of every lock on a killed shared session reach the Observer as for
// pinned locks, each loss with its lock's name, and the session's
// connection is discarded once, for the loss's cause.
func TestMultiplexedLocksTellTheObserver(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	admin := testdb.OpenPostgres(t, "pgx")
	rec := &observetest.Recorder{}
	opts := []advisorylock.Option{quiet, advisorylock.WithObserver(rec), advisorylock.WithMultiplexing(1),
		advisorylock.WithKeepAlive(50 * time.Millisecond), advisorylock.WithReleaseTimeout(time.Second)}
	ctx := context.Background()
	names, keys := muxNames(t, 3)
	var guards []*advisorylock.Guard
	for _, n := range names {
		g, err := newLock(t, db, n, opts...).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		guards = append(guards, g)
	}
	if _, err := newLock(t, db, names[0], opts...).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second TryLock: %v", err)
	}
	if err := guards[2].Release(ctx); err != nil {
		t.Fatal(err)
	}
	held := pgKeySessions(t, admin, keys[:2])
	if len(distinct(held)) != 1 {
		t.Fatalf("WithMultiplexing(1) used sessions %v", held)
	}
	if _, err := admin.Exec("SELECT pg_terminate_backend($1)", held[keys[0]]); err != nil {
		t.Fatal(err)
	}
	for i, g := range guards[:2] {
		select {
		case <-g.Lost():
		case <-time.After(wait):
			t.Fatalf("%s not reported lost", names[i])
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := rec.Count("acquire_end", "acquired"); n != 3 {
		t.Errorf("%d acquired events, want 3", n)
	}
	if n := rec.Count("acquire_end", "not_acquired"); n != 1 {
		t.Errorf("%d not_acquired events, want 1", n)
	}
	lost := map[string]bool{}
	for _, e := range rec.Events("loss") {
		if e.Value != "session_ended" {
			t.Errorf("loss of %s: cause %q, want session_ended", e.Name, e.Value)
		}
		lost[e.Name] = true
	}
	if len(lost) != 2 || !lost[names[0]] || !lost[names[1]] {
		t.Errorf("losses reported for %v, want %s and %s", lost, names[0], names[1])
	}
	if n, all := rec.Count("discard", "session_ended"), len(rec.Events("discard")); n != 1 || all != 1 {
		t.Errorf("%d discards of the killed session (session_ended), %d in all; want 1, 1", n, all)
	}
	if n := len(rec.Events("release")); n != 3 {
		t.Errorf("%d release events, want 3", n)
	}
}

// TestForgottenMultiplexedGuardIsCleanedUp drops a Guard of a lock on a
// shared session without Release: the cleanup unlocks its name (another
// handle can take it), warns, and leaves its neighbour on the session held.
func TestForgottenMultiplexedGuardIsCleanedUp(t *testing.T) {
	t.Parallel()
	for _, srv := range muxServers() {
		t.Run(srv.name, func(t *testing.T) {
			db, other, admin := srv.open(t), srv.open(t), srv.open(t)
			names, keys := muxNames(t, 2)
			var logs syncBuffer
			logger := advisorylock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil)))
			neighbour, err := newLock(t, db, names[1], logger, advisorylock.WithMultiplexing(1)).TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			dropGuard(t, func() any {
				g, err := newLock(t, db, names[0], logger, advisorylock.WithMultiplexing(1)).TryLock(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				return g
			})
			rival := newLock(t, other, names[0], quiet)
			var g *advisorylock.Guard
			testdb.WaitFor(t, wait, func() bool {
				runtime.GC()
				g, err = rival.TryLock(context.Background())
				return err == nil
			}, "a forgotten multiplexed guard kept its lock")
			mustRelease(t, g)
			expectForgottenWarning(t, &logs, names[0])
			select {
			case <-neighbour.Lost():
				t.Fatal("the neighbour of a forgotten guard was lost")
			default:
			}
			if held := srv.sessions(t, admin, keys[1:]); len(held) != 1 {
				t.Fatal("the neighbour of a forgotten guard is no longer held on the server")
			}
			mustRelease(t, neighbour)
		})
	}
}

// TestMultiplexedUnlockWithoutAnAnswerTellsTheNeighbours releases one of
// two locks on a shared session that a blackhole cut off: the unlock gets
// no answer, so the session's state is unknown; by the time Release
// returns its error, the neighbour has been told it is lost.
func TestMultiplexedUnlockWithoutAnAnswerTellsTheNeighbours(t *testing.T) {
	testdb.Slow(t, "iptables: blackholes a shared session")
	t.Parallel()
	testdb.RequireIptables(t)
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db, admin := testdb.OpenPostgres(t, drv), testdb.OpenPostgres(t, drv)
			names, keys := muxNames(t, 2)
			opts := []advisorylock.Option{quiet, advisorylock.WithMultiplexing(1), advisorylock.WithKeepAlive(0), advisorylock.WithReleaseTimeout(time.Second)}
			first, err := newLock(t, db, names[0], opts...).TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			neighbour, err := newLock(t, db, names[1], opts...).TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held := pgKeySessions(t, admin, keys)
			victim := held[keys[0]]
			if held[keys[1]] != victim {
				t.Fatalf("WithMultiplexing(1) used sessions %v", held)
			}
			mark := testdb.Mark(t)
			heal := testdb.Blackhole(t, testdb.Port(t, testdb.PostgresDSN(t)), testdb.ClientPort(t, admin, int(victim)))
			if err := first.Release(context.Background()); err == nil {
				t.Fatal("Release on a cut-off session returned nil")
			}
			select {
			case <-neighbour.Lost():
			default:
				t.Fatal("Release returned before the neighbour on its session was told it is lost")
			}
			if err := neighbour.Release(context.Background()); err != nil {
				t.Fatalf("Release of the lost neighbour: %v", err)
			}
			heal() // then end the server's side, so the driver's reader sees it go
			if _, err := admin.Exec("SELECT pg_terminate_backend($1)", victim); err != nil {
				t.Fatal(err)
			}
			waitForReaders(t, mark)
		})
	}
}

// waitForReaders waits until the goroutines the test started since mark
// are gone: a driver that gave up on a cut-off connection (pgx) reads it
// until the server's end closes, once the cut is healed and the session
// ended.
func waitForReaders(t *testing.T, mark string) {
	t.Helper()
	testdb.WaitFor(t, wait, func() bool { return testdb.Labelled(mark) == "" }, "a cut-off connection's reader never ended")
}

// TestMultiplexingAtTheServersLockTableLimit fills a PostgreSQL server's
// lock table (a cluster of its own with max_locks_per_transaction=10): the
// try that finds it full fails with the server's error and a hint, and
// the locks held beside it on the shared session stay held.
func TestMultiplexingAtTheServersLockTableLimit(t *testing.T) {
	testdb.Slow(t, "starts a private PostgreSQL cluster")
	c := testdb.OwnCluster(t, "max_locks_per_transaction=10", "max_connections=10")
	db := testdb.OpenPostgresDSN(t, "pgx", c.DSN)
	admin := testdb.OpenPostgresDSN(t, "pgx", c.DSN)
	names, keys := muxNames(t, 2000)
	var guards []*advisorylock.Guard
	var full error
	for _, n := range names {
		g, err := newLock(t, db, n, quiet, advisorylock.WithMultiplexing(1), advisorylock.WithKeepAlive(50*time.Millisecond)).TryLock(context.Background())
		if err != nil {
			full = err
			break
		}
		guards = append(guards, g)
	}
	if full == nil || !strings.Contains(full.Error(), "max_locks_per_transaction") {
		t.Fatalf("after %d names the try failed with %v, want the server's full lock table, with a hint", len(guards), full)
	}
	t.Logf("the lock table was full after %d names: %v", len(guards), full)
	held := pgKeySessions(t, admin, keys[:len(guards)])
	if len(held) != len(guards) {
		t.Fatalf("the server shows %d of the %d names held", len(held), len(guards))
	}
	// Give the keep-alive (every 50ms) a few checks to get it wrong.
	time.Sleep(300 * time.Millisecond)
	for i, g := range guards {
		select {
		case <-g.Lost():
			t.Fatalf("%s was lost when a try beside it found the lock table full", names[i])
		default:
		}
	}
	releaseAll(t, guards)
}

// TestMultiplexingLeavesThePoolAConnection holds 200 names from a pool of
// SetMaxOpenConns(2) on the defaults (4 shared sessions), taken 16 at a time: the
// shared sessions are bounded to one fewer than the pool's limit, so the
// held locks leave a connection for the application's own statements.
func TestMultiplexingLeavesThePoolAConnection(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(2)
			admin := testdb.OpenPostgres(t, drv)
			names, keys := muxNames(t, 200)
			guards := holdAll(t, db, names, 16, quiet)
			defer releaseAll(t, guards)

			if s := distinct(pgKeySessions(t, admin, keys)); len(s) != 1 {
				t.Errorf("the names are held by %d server sessions, want 1 (the pool's limit is 2): %v", len(s), s)
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			var one int
			if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
				t.Errorf("a statement beside the held locks: %v, want a free connection", err)
			}
		})
	}
}

// Many goroutines on few shared sessions, two handles contending for
// each name: the tries and releases that share a statement (see
// backend.BatchLocker) still exclude, and every one is granted in turn.
func TestMultiplexedBatchesExcludeUnderContention(t *testing.T) {
	for _, drv := range append(slices.Clone(testdb.Drivers), "mysql") {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			names, _ := muxNames(t, 8)
			const goroutines, rounds = 16, 25
			var inUse [8]atomic.Int32
			var overlaps, done atomic.Int32
			var wg sync.WaitGroup
			for range 2 {
				var db *sql.DB
				if drv == "mysql" {
					db = testdb.OpenMySQL(t)
				} else {
					db = testdb.OpenPostgres(t, drv)
				}
				locks := make([]*advisorylock.Lock, len(names))
				for i, n := range names {
					locks[i] = newLock(t, db, n, quiet, advisorylock.WithMultiplexing(2))
				}
				for g := range goroutines {
					wg.Go(func() {
						for r := range rounds {
							i := (g + r) % len(locks)
							guard, err := locks[i].Lock(ctx)
							if err != nil {
								t.Error(err)
								return
							}
							if inUse[i].Add(1) != 1 {
								overlaps.Add(1)
							}
							inUse[i].Add(-1)
							if err := guard.Release(ctx); err != nil {
								t.Error(err)
								return
							}
							done.Add(1)
						}
					})
				}
			}
			wg.Wait()
			if n := overlaps.Load(); n != 0 {
				t.Errorf("%d grants overlapped another holder's", n)
			}
			if n := done.Load(); n != 2*goroutines*rounds {
				t.Errorf("%d of %d rounds done", n, 2*goroutines*rounds)
			}
		})
	}
}
