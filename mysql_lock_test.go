package advisorylock_test

// Lock on MySQL/MariaDB: GET_LOCK on a pinned connection. These tests run
// against the MariaDB of the harness (testdb.MySQLDSN).

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/go-sql-driver/mysql"
)

// mysqlLockName is the server-side name of name's lock.
func mysqlLockName(name string) string {
	return fmt.Sprintf("advisorylock:v1:%016x", uint64(advisorylock.Key(name)))
}

// mysqlHolder is the connection id that holds name's lock, 0 when free.
func mysqlHolder(t testing.TB, db *sql.DB, name string) int64 {
	return testdb.MySQLLockHolder(t, db, mysqlLockName(name))
}

// eachMySQLHandle runs f with *sql.DB handles on MariaDB and with handles
// that embed one (as *sqlx.DB does).
func eachMySQLHandle(t *testing.T, f func(t *testing.T, open func() advisorylock.DB)) {
	t.Run("sql", func(t *testing.T) {
		f(t, func() advisorylock.DB { return testdb.OpenMySQL(t) })
	})
	t.Run("embedded", func(t *testing.T) {
		f(t, func() advisorylock.DB { return embed(testdb.OpenMySQL(t), "mysql") })
	})
}

func TestMySQLTryLockIsExclusiveAcrossDBsAndInOneDB(t *testing.T) {
	t.Parallel()
	eachMySQLHandle(t, func(t *testing.T, open func() advisorylock.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		a, b := newLock(t, open(), name), newLock(t, open(), name)
		g, err := a.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, other := range []*advisorylock.Lock{a, b} {
			if _, err := other.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("second TryLock = %v, want ErrNotAcquired", err)
			}
		}
		mustRelease(t, g)
		g, err = b.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after release: %v", err)
		}
		if h, err := b.Holder(ctx); err != nil || h == nil || int64(h.PID) != mysqlHolder(t, testdb.OpenMySQL(t), name) {
			t.Fatalf("Holder = %+v, %v; want the mysql backend's, detected from the driver: GET_LOCK's holder", h, err)
		}
		mustRelease(t, g)
	})
}

// The server compares lock names without regard to case and allows 64
// characters: the name on the server is derived from the key, so names
// that differ in case only, or are very long, stay distinct locks.
func TestMySQLLockNameIsDerivedFromTheKey(t *testing.T) {
	ctx := context.Background()
	db := testdb.OpenMySQL(t)
	base := testdb.UniqueName(t)
	names := []string{base + "Job", base + "JOB", base + "job ", base + strings.Repeat("long", 5000), base + "x'; DO SLEEP(5); --", "\xff"}
	var guards []*advisorylock.Guard
	for _, n := range names {
		g, err := newLock(t, db, n).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock(%.40q) while the others are held: %v", n, err)
		}
		guards = append(guards, g)
		if id := mysqlHolder(t, db, n); id == 0 {
			t.Fatalf("no session holds %s for %.40q", mysqlLockName(n), n)
		}
		if len(mysqlLockName(n)) > 64 {
			t.Fatalf("server lock name %q is longer than 64 characters", mysqlLockName(n))
		}
	}
	for _, g := range guards {
		mustRelease(t, g)
	}
	for _, n := range names {
		if id := mysqlHolder(t, db, n); id != 0 {
			t.Fatalf("%.40q still held by connection %d after release", n, id)
		}
	}
}

// A blocked Lock waits on the server in slices (about one statement a
// second), and gets the lock promptly when the holder releases it.
func TestMySQLLockWaitsServerSideAndHandsOff(t *testing.T) {
	testdb.Slow(t, "counts statements over 1.5 s of waiting")
	t.Parallel() // a name, pools and a proxy of its own
	ctx := context.Background()
	name := testdb.UniqueName(t)
	dbA := testdb.OpenMySQL(t)
	dbB, proxy := testdb.OpenMySQLProxied(t)
	g, err := newLock(t, dbA, name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newLock(t, dbB, name)
	if err := waiter.Check(ctx); err != nil { // the first-use checks, done before counting
		t.Fatal(err)
	}
	proxy.ResetCount()
	type result struct {
		g   *advisorylock.Guard
		err error
	}
	got := make(chan result, 1)
	go func() {
		g, err := waiter.Lock(ctx)
		got <- result{g, err}
	}()
	t.Cleanup(func() {
		if r := <-got; r.g != nil {
			_ = r.g.Release(ctx)
		}
	})
	// Wait until at least two slices have passed: three statements (a try
	// and two waits) at the least.
	testdb.WaitFor(t, wait, func() bool { return proxy.RoundTrips() >= 3 }, "the waiter sent %d statements", proxy.RoundTrips())
	start := time.Now()
	sent := proxy.RoundTrips()
	time.Sleep(1500 * time.Millisecond) // a window to count statements in, not a synchronization
	if n := proxy.RoundTrips() - sent; n > 3 {
		t.Fatalf("the waiter sent %d statements in %v: it polls instead of waiting on the server", n, time.Since(start))
	}
	released := time.Now()
	mustRelease(t, g)
	testdb.WaitFor(t, wait, func() bool { return mysqlHolder(t, dbA, name) != 0 }, "the waiter never got the lock")
	if d := time.Since(released); d > 2*time.Second {
		t.Errorf("handoff took %v, want about one round trip", d)
	}
}

func TestMySQLLockTimeoutReturnsTimeoutErrorAndKeepsTheConnection(t *testing.T) {
	testdb.Slow(t, "waits out a LockTimeout budget")
	t.Parallel() // a name and pools of its own
	ctx := context.Background()
	name := testdb.UniqueName(t)
	dbA, dbB := testdb.OpenMySQL(t), testdb.OpenMySQL(t)
	g, err := newLock(t, dbA, name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	l := newLock(t, dbB, name)
	if err := l.Check(ctx); err != nil {
		t.Fatal(err)
	}
	open := dbB.Stats().OpenConnections
	for _, d := range []time.Duration{0, -time.Second, 300 * time.Millisecond, 1300 * time.Millisecond} {
		start := time.Now()
		_, err := l.LockTimeout(ctx, d)
		if !isTimeout(err, name) {
			t.Fatalf("LockTimeout(%v) = %v, want ErrTimeout naming the lock", d, err)
		}
		if took := time.Since(start); took > max(d, 0)*3+time.Second {
			t.Fatalf("LockTimeout(%v) took %v", d, took)
		}
		if s := dbB.Stats(); s.InUse != 0 || s.OpenConnections != open {
			t.Fatalf("after LockTimeout(%v): %+v; want its connection back in the pool (%d open before)", d, s, open)
		}
	}
}

func TestMySQLCancelledWaitLeavesNoLock(t *testing.T) {
	ctx := context.Background()
	name := testdb.UniqueName(t)
	dbA, dbB := testdb.OpenMySQL(t), testdb.OpenMySQL(t)
	g, err := newLock(t, dbA, name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newLock(t, dbB, name)
	if err := waiter.Check(ctx); err != nil {
		t.Fatal(err)
	}
	open := dbB.Stats().OpenConnections
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(wctx)
		done <- err
	}()
	testdb.WaitFor(t, wait, func() bool { return mysqlWaiters(t, dbA, name) == 1 }, "the waiter never waited in GET_LOCK")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Lock = %v, want context.Canceled", err)
	}
	if s := dbB.Stats(); s.InUse != 0 || s.OpenConnections != open-1 {
		t.Fatalf("after a cancelled Lock: %+v; want its connection discarded", s)
	}
	mustRelease(t, g)
	// The server may notice the closed socket only when its GET_LOCK
	// slice ends: the lock may be granted to the dead session for that
	// moment, and not after.
	testdb.WaitFor(t, wait, func() bool { return mysqlHolder(t, dbA, name) == 0 }, "a cancelled waiter's session kept the lock")
}

// TestMySQLReleaseOfALockTakenTwiceFreesIt: a session may take a named
// lock more than once (here a GET_LOCK of the held lock's name, run in
// WithConn), and one RELEASE_LOCK then leaves it held: Release must not
// put the connection back in the pool with the lock, so after it another
// pool takes the lock.
func TestMySQLReleaseOfALockTakenTwiceFreesIt(t *testing.T) {
	ctx := context.Background()
	name := testdb.UniqueName(t)
	db := testdb.OpenMySQL(t)
	g := mustTry(t, newLock(t, db, name))
	var again int
	err := g.WithConn(ctx, func(c advisorylock.Conn) error {
		return c.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", mysqlLockName(name)).Scan(&again)
	})
	if err != nil || again != 1 {
		t.Fatalf("GET_LOCK of the held lock on its own session = %d, %v; want 1", again, err)
	}
	_ = g.Release(ctx) // may say the session still held it; the lock must be freed either way
	other := testdb.OpenMySQL(t)
	testdb.WaitFor(t, wait, func() bool { return mysqlHolder(t, other, name) == 0 },
		"after Release a session still held the lock: its connection went back to the pool holding it")
	mustRelease(t, mustTry(t, newLock(t, other, name)))
}

// mysqlWaiters counts sessions waiting in GET_LOCK on name's lock.
func mysqlWaiters(t testing.TB, db *sql.DB, name string) int {
	return countRows(t, db, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND COMMAND = 'Query' AND INFO LIKE ?", "%GET_LOCK('"+mysqlLockName(name)+"', 1.000)%")
}

// Hundreds of acquires cancelled at random points leave no lock held and
// no connection checked out.
func TestMySQLCancelHammerLeavesNothingBehind(t *testing.T) {
	db := testdb.OpenMySQL(t)
	db.SetMaxOpenConns(12)
	names := []string{testdb.UniqueName(t), testdb.UniqueName(t)}
	var locks []*advisorylock.Lock
	for _, n := range names {
		locks = append(locks, newLock(t, db, n))
	}
	var wg sync.WaitGroup
	var acquired, cancelled sync.Map
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 11))
			for range 40 {
				l := locks[r.IntN(len(locks))]
				d := time.Duration(r.IntN(20000)) * time.Microsecond
				if r.IntN(4) == 0 {
					d = 5 * time.Second
				}
				ctx, cancel := context.WithTimeout(context.Background(), d)
				var g *advisorylock.Guard
				var err error
				switch r.IntN(3) {
				case 0:
					g, err = l.TryLock(ctx)
				case 1:
					g, err = l.Lock(ctx)
				default:
					g, err = l.LockTimeout(ctx, time.Duration(r.IntN(10000))*time.Microsecond)
				}
				cancel()
				switch {
				case err == nil:
					acquired.Store(w, true)
					if err := g.Release(context.Background()); err != nil {
						t.Errorf("Release: %v", err)
					}
				case errors.Is(err, context.DeadlineExceeded):
					cancelled.Store(w, true)
				}
			}
		})
	}
	wg.Wait()
	admin := testdb.OpenMySQL(t)
	for _, n := range names {
		testdb.WaitFor(t, wait, func() bool { return mysqlHolder(t, admin, n) == 0 }, "lock %q left held after the hammer", n)
	}
	if s := db.Stats(); s.InUse != 0 {
		t.Fatalf("%d connections left checked out", s.InUse)
	}
	for what, m := range map[string]*sync.Map{"acquired": &acquired, "was cancelled": &cancelled} {
		n := 0
		m.Range(func(any, any) bool { n++; return true })
		if n == 0 {
			t.Fatalf("no worker ever %s: the hammer proved nothing", what)
		}
	}
}

func TestMySQLKilledSessionClosesLostAndCancelsDo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, admin := testdb.OpenMySQL(t), testdb.OpenMySQL(t)
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithKeepAlive(100*time.Millisecond))
	kill := func() {
		t.Helper()
		h, err := l.Holder(ctx)
		if err != nil || h == nil || h.PID == 0 {
			t.Fatalf("Holder = %+v, %v; want the holding connection", h, err)
		}
		if _, err := admin.Exec(fmt.Sprintf("KILL %d", h.PID)); err != nil {
			t.Fatal(err)
		}
	}
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kill()
	select {
	case <-g.Lost():
	case <-time.After(wait):
		t.Fatal("Lost() did not close after KILL")
	}
	if err := g.Release(ctx); err != nil {
		t.Fatalf("Release of a lost guard: %v", err)
	}
	err = l.Do(ctx, func(fctx context.Context) error {
		kill()
		if err := awaitLoss(fctx); err != nil {
			return err
		}
		if !errors.Is(context.Cause(fctx), advisorylock.ErrLockLost) {
			t.Errorf("fn's context cause = %v, want ErrLockLost", context.Cause(fctx))
		}
		return fctx.Err()
	})
	if !errors.Is(err, advisorylock.ErrLockLost) {
		t.Fatalf("Do after KILL = %v, want ErrLockLost", err)
	}
	if s := db.Stats(); s.InUse != 0 {
		t.Fatalf("%d connections still checked out", s.InUse)
	}
}

func TestMySQLHolderReportsTheConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.OpenMySQL(t)
	name := testdb.UniqueName(t)
	l := newLock(t, db, name)
	if h, err := l.Holder(ctx); h != nil || err != nil {
		t.Fatalf("Holder of a free lock = %+v, %v; want nil, nil", h, err)
	}
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer mustRelease(t, g)
	h, err := l.Holder(ctx)
	if err != nil || h == nil {
		t.Fatalf("Holder = %+v, %v", h, err)
	}
	want := mysqlHolder(t, db, name)
	if int64(h.PID) != want || h.Name != name {
		t.Fatalf("Holder = %+v; want connection %d and the lock's name", h, want)
	}
	cfg, _ := mysql.ParseDSN(testdb.MySQLDSN(t))
	if !strings.HasPrefix(h.Client, cfg.User+"@127.0.0.1:") && !strings.HasPrefix(h.Client, cfg.User+"@localhost") {
		t.Fatalf("Holder = %+v; want user %q and the client's address (root has PROCESS)", h, cfg.User)
	}
}

// Each lock step is one statement on the wire (go-sql-driver sends one
// command and reads one answer), whatever the DSN's interpolateParams.
// The test also measures the statement forms of go-sql-driver: a
// statement with arguments costs two answered commands (prepare and
// execute) unless interpolateParams=true; text with literals costs one.
func TestMySQLEachStepIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	db, proxy := testdb.OpenMySQLProxied(t)
	db.SetMaxOpenConns(1)
	count := func(what string, want int64, f func() error) {
		t.Helper()
		proxy.ResetCount()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if n := proxy.RoundTrips(); n != want {
			t.Errorf("%s took %d round trips, want %d", what, n, want)
		}
	}
	name := testdb.UniqueName(t)
	l := newLock(t, db, name)
	if err := l.Check(ctx); err != nil { // first-use checks, once per *sql.DB
		t.Fatal(err)
	}
	// The try and the unlock are prepared once per connection: a warm-up
	// prepares them on the one connection the steps below run on (its
	// first try, as text, creates the table of shared holders it reads;
	// the second prepares).
	var g *advisorylock.Guard
	for range 2 {
		var err error
		if g, err = l.TryLock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, acquire := range []struct {
		name   string
		f      func(context.Context) (*advisorylock.Guard, error)
		rounds int64
	}{
		{"TryLock", l.TryLock, 1},
		{"Lock", l.Lock, 1},
	} {
		count(acquire.name, acquire.rounds, func() (err error) { g, err = acquire.f(ctx); return err })
		count("Release", 1, func() error { return g.Release(ctx) })
	}
	ll := newLeaseLock(t, db, name)
	mustRelease(t, tryLease(t, ll)) // creates the table
	var lg *advisorylock.LeaseGuard
	count("LeaseLock.TryLock", 1, func() (err error) { lg, err = ll.TryLock(ctx); return err })
	count("LeaseGuard.Release", 1, func() error { return lg.Release(ctx) })

	// The driver's statement forms, measured.
	lock := mysqlLockName(name)
	count("GET_LOCK with an argument", 2, func() error {
		return db.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0) + RELEASE_LOCK(?)", lock, lock).Scan(new(int))
	})
	count("GET_LOCK with a literal", 1, func() error {
		return db.QueryRowContext(ctx, "SELECT GET_LOCK('"+lock+"', 0) + RELEASE_LOCK('"+lock+"')").Scan(new(int))
	})
	cfg, err := mysql.ParseDSN(testdb.WithMySQLAddr(t, testdb.MySQLDSN(t), proxy.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	idb := testdb.OpenMySQLDSN(t, cfg.FormatDSN())
	idb.SetMaxOpenConns(1)
	count("GET_LOCK with an argument, interpolateParams=true", 1, func() error {
		return idb.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0) + RELEASE_LOCK(?)", lock, lock).Scan(new(int))
	})
}

// A network cut bounds every step: the keep-alive marks the held lock
// lost within its interval and the release timeout, a LockTimeout ends
// on time, and Release returns within its timeout.
func TestMySQLPartitionBoundsEveryStatement(t *testing.T) {
	testdb.Slow(t, "fault: network cut, every statement waits its bound")
	t.Parallel()
	testdb.CheckGoroutines(t)
	ctx := context.Background()
	db, proxy := testdb.OpenMySQLProxied(t)
	admin := testdb.OpenMySQL(t)
	held, other := testdb.UniqueName(t), testdb.UniqueName(t)
	const keepAlive, relTO = 200 * time.Millisecond, time.Second
	opts := []advisorylock.Option{advisorylock.WithKeepAlive(keepAlive), advisorylock.WithReleaseTimeout(relTO)}
	g, err := newLock(t, db, held, opts...).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	late := newLock(t, db, other, opts...)
	blocker, err := newLock(t, admin, other).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := late.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) { // leaves a warm connection in the pool
		t.Fatalf("TryLock of a held lock = %v", err)
	}
	proxy.Cut()
	start := time.Now()
	select {
	case <-g.Lost():
	case <-time.After(3 * (keepAlive + relTO + time.Second)):
		t.Fatal("Lost() did not close during the cut")
	}
	t.Logf("lost after %v", time.Since(start))
	// The first try of LockTimeout, on the warm connection (no ping),
	// is bounded by the budget too; then a TryLock by its context.
	start = time.Now()
	_, err = late.LockTimeout(ctx, 500*time.Millisecond)
	if err == nil {
		t.Fatal("LockTimeout through a cut network acquired a lock held elsewhere")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("LockTimeout(500ms) through a cut network took %v (err %v)", took, err)
	}
	start = time.Now()
	tctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = late.TryLock(tctx)
	cancel()
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("TryLock with a 500ms context through a cut network = %v after %v", err, time.Since(start))
	}
	start = time.Now()
	_ = g.Release(ctx)
	if took := time.Since(start); took > 3*relTO {
		t.Fatalf("Release through a cut network took %v", took)
	}
	proxy.Heal()
	mustRelease(t, blocker)
	testdb.WaitFor(t, wait, func() bool { return mysqlHolder(t, admin, held) == 0 }, "the cut holder's lock is still held after the heal")
	testdb.WaitFor(t, wait, func() bool { return db.Stats().InUse == 0 }, "%d connections left checked out", db.Stats().InUse)
}

// wrappedMySQL hides go-sql-driver's type, as instrumentation wrappers do.
type wrappedMySQL struct{ driver.Driver }

var registerWrappedMySQL sync.Once

func TestWrappedMySQLDriverIsDetectedByAskingTheDatabase(t *testing.T) {
	registerWrappedMySQL.Do(func() { sql.Register("wrapped-mysql", wrappedMySQL{&mysql.MySQLDriver{}}) })
	db, err := sql.Open("wrapped-mysql", testdb.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	name := testdb.UniqueName(t)
	l := newLock(t, db, name)
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := l.Holder(context.Background()); h == nil || int64(h.PID) != mysqlHolder(t, db, name) {
		t.Fatalf("Holder = %+v, want the mysql backend's: GET_LOCK's holder", h)
	}
	mustRelease(t, g)
}

// countingSessions is a SessionLocker written outside the package: it
// wraps the MySQL backend through the exported interface alone and
// counts the calls, proving that a session-lock backend plugs in.
type countingSessions struct {
	backend.SessionLocker
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingSessions) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[op]++
}

func (c *countingSessions) Name() string { return "counting" }

func (c *countingSessions) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	c.count("try")
	return c.SessionLocker.TryLockSession(ctx, conn, key)
}

func (c *countingSessions) WaitLockSession(ctx context.Context, conn *sql.Conn, key int64, slice time.Duration) (backend.SessionResult, error) {
	c.count("wait")
	return c.SessionLocker.WaitLockSession(ctx, conn, key, slice)
}

func (c *countingSessions) UnlockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	c.count("unlock")
	return c.SessionLocker.UnlockSession(ctx, conn, key)
}

func TestSessionLockerPlugsInOnMariaDB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	inner, ok := advisorylock.MySQL().(backend.SessionLocker)
	if !ok {
		t.Fatal("MySQL() is not a SessionLocker")
	}
	b := &countingSessions{SessionLocker: inner, calls: map[string]int{}}
	name := testdb.UniqueName(t)
	a := newLock(t, testdb.OpenMySQL(t), name, advisorylock.WithBackend(b))
	other := newLock(t, testdb.OpenMySQL(t), name, advisorylock.WithBackend(b))
	g, err := a.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.LockTimeout(ctx, 200*time.Millisecond); !errors.Is(err, advisorylock.ErrTimeout) {
		t.Fatalf("LockTimeout while held = %v, want ErrTimeout", err)
	}
	if h, err := a.Holder(ctx); err != nil || h == nil || h.PID == 0 {
		t.Fatalf("Holder = %+v, %v", h, err)
	}
	mustRelease(t, g)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.calls["try"] != 2 || b.calls["wait"] < 1 || b.calls["unlock"] != 1 {
		t.Fatalf("calls = %v; want 2 tries, at least 1 wait, 1 unlock", b.calls)
	}
}

// A Galera node, a multi-primary Group Replication member, a read-only
// server (a replica), TiDB and Vitess are refused at the first operation
// (go-sqlmock stands in for them, which cannot run here; a look-alike told
// by its version is not asked for variables it may not have); RELEASE_LOCK's
// 0 and NULL answers are told apart.
func TestMySQLRefusesGaleraAndTellsReleaseAnswersApart(t *testing.T) {
	ctx := context.Background()
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := newLock(t, db, "galera", advisorylock.WithBackend(advisorylock.MySQL()))
	server := func(version string, readOnly int64) { // @@version_comment NULL, as a proxy may answer
		mock.ExpectQuery("SELECT @@version, @@version_comment, @@read_only").
			WillReturnRows(sqlmock.NewRows([]string{"v", "c", "ro"}).AddRow(version, nil, readOnly))
	}
	for _, c := range []struct {
		version  string
		readOnly int64
		vars     [][2]string // nil: not asked
		refusal  string
	}{
		{"10.11.6-MariaDB", 0, [][2]string{{"wsrep_on", "ON"}}, "Galera"},
		{"8.0.36", 0, [][2]string{{"group_replication_single_primary_mode", "OFF"}}, "multi-primary"},
		{"8.0.36", 1, [][2]string{}, "read-only"},
		{"8.0.11-TiDB-v7.5.0", 0, nil, "TiDB"},
		{"8.0.30-Vitess", 0, nil, "Vitess"},
	} {
		server(c.version, c.readOnly)
		if c.vars != nil {
			rows := sqlmock.NewRows([]string{"Variable_name", "Value"})
			for _, v := range c.vars {
				rows.AddRow(v[0], v[1])
			}
			mock.ExpectQuery("SHOW GLOBAL VARIABLES WHERE Variable_name IN").WillReturnRows(rows)
		}
		if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), c.refusal) {
			t.Fatalf("TryLock on %s = %v, want ErrUnsupported naming %s", c.version, err, c.refusal)
		}
		if err := mock.ExpectationsWereMet(); err != nil {
			t.Fatalf("%s: %v", c.version, err)
		}
	}

	var logs syncBuffer
	m := newLock(t, db, "release", pinned, advisorylock.WithBackend(advisorylock.MySQL()), advisorylock.WithServerChecks(false),
		advisorylock.WithKeepAlive(0), advisorylock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	for _, tc := range []struct {
		answer  driver.Value
		wantErr error
	}{{nil, nil}, {int64(0), advisorylock.ErrTransactionPooler}} {
		mock.ExpectQuery("SELECT CASE GET_LOCK").WillReturnRows(sqlmock.NewRows([]string{"got", "id", "ro", "wt"}).AddRow(int64(1), int64(7), int64(0), int64(28800)))
		mock.ExpectQuery("SELECT RELEASE_LOCK").WillReturnRows(sqlmock.NewRows([]string{"released", "id", "holder"}).AddRow(tc.answer, int64(7), int64(9)))
		g, err := m.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		err = g.Release(ctx)
		if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
			t.Fatalf("Release when RELEASE_LOCK answers %v = %v, want %v", tc.answer, err, tc.wantErr)
		}
	}
	if !strings.Contains(logs.String(), "not held by its session") {
		t.Fatalf("RELEASE_LOCK NULL logged %q, want a warning", logs.String())
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}

	// A connection that reaches a replica (behind a VIP) is refused, and
	// discarded with whatever GET_LOCK granted on it.
	rdb, rmock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	r := newLock(t, rdb, "replica", advisorylock.WithBackend(advisorylock.MySQL()), advisorylock.WithServerChecks(false))
	rmock.ExpectQuery("SELECT CASE GET_LOCK").WillReturnRows(sqlmock.NewRows([]string{"got", "id", "ro", "wt"}).AddRow(int64(1), int64(8), int64(1), int64(28800)))
	if _, err := r.TryLock(ctx); !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("TryLock on a connection to a replica = %v, want ErrUnsupported naming read-only", err)
	}
	if s := rdb.Stats(); s.OpenConnections != 0 {
		t.Fatalf("the replica's connection was kept: %+v", s)
	}
}

// A first try that creates the library's tables and loses its connection
// on the way reports why, not only the schema lock's release that then
// fails ("bad connection"): both errors are reachable, and the lock is
// named. go-sqlmock stands in for a connection the server drops between
// two statements of the creation.
func TestMySQLFirstTryThatBreaksCreatingTablesSaysWhy(t *testing.T) {
	db, mock, err := sqlmock.New()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l := newLock(t, db, "schema", pinned, advisorylock.WithBackend(advisorylock.MySQL()), advisorylock.WithServerChecks(false), advisorylock.WithKeepAlive(0))
	mock.ExpectQuery("SELECT CASE GET_LOCK").WillReturnError(&mysql.MySQLError{Number: 1146, Message: "Table 'test.advisorylock_shared' doesn't exist"})
	mock.ExpectQuery(regexp.QuoteMeta("SELECT GET_LOCK('advisorylock:schema'")).WillReturnRows(sqlmock.NewRows([]string{"got"}).AddRow(int64(1)))
	mock.ExpectQuery(regexp.QuoteMeta("SELECT COALESCE(MAX(version), 0) FROM advisorylock_schema")).WillReturnError(mysql.ErrInvalidConn)
	mock.ExpectExec(regexp.QuoteMeta("DO RELEASE_LOCK('advisorylock:schema')")).WillReturnError(driver.ErrBadConn)
	_, err = l.TryLock(context.Background())
	if !errors.Is(err, mysql.ErrInvalidConn) || !errors.Is(err, driver.ErrBadConn) || !strings.Contains(err.Error(), `"schema"`) {
		t.Fatalf("TryLock whose table creation broke = %v, want the creation's error and the release's, naming the lock", err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}

// A server statement timeout shorter than a wait slice (MariaDB's
// max_statement_time, MySQL's max_execution_time) does not break Lock:
// each waiting statement lifts it for itself.
func TestMySQLShortServerStatementTimeoutDoesNotBreakLock(t *testing.T) {
	testdb.Slow(t, "waits across server statement timeouts")
	t.Parallel() // a name and pools of its own
	ctx := context.Background()
	admin := testdb.OpenMySQL(t)
	var version string
	if err := admin.QueryRow("SELECT @@version").Scan(&version); err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Params = map[string]string{"max_execution_time": "200"}
	if strings.Contains(version, "MariaDB") {
		cfg.Params = map[string]string{"max_statement_time": "0.2"}
	}
	db := testdb.OpenMySQLDSN(t, cfg.FormatDSN())
	name := testdb.UniqueName(t)
	g, err := newLock(t, admin, name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := newLock(t, db, name)
	if _, err := l.LockTimeout(ctx, 700*time.Millisecond); !errors.Is(err, advisorylock.ErrTimeout) {
		t.Fatalf("LockTimeout(700ms) under a 200ms server statement timeout = %v, want ErrTimeout", err)
	}
	got := make(chan error, 1)
	go func() {
		g, err := l.Lock(ctx)
		if err == nil {
			err = g.Release(ctx)
		}
		got <- err
	}()
	testdb.WaitFor(t, wait, func() bool { return mysqlWaiters(t, admin, name) == 1 }, "the waiter never waited")
	time.Sleep(1200 * time.Millisecond) // lets the waiter through more than one slice; not a synchronization
	mustRelease(t, g)
	if err := <-got; err != nil {
		t.Fatalf("Lock under a 200ms server statement timeout: %v", err)
	}
}

// TestMySQLDeadHolderTimeoutSetsWaitTimeout: with WithDeadHolderTimeout a
// Lock's session gets that wait_timeout at its first grant (and keeps it
// in the pool), so the server frees the lock of a holder cut off without
// a closed socket (a blackhole) within about that long, where it would
// otherwise wait for the server's wait_timeout (8 hours by default). A
// Lock without a keep-alive leaves wait_timeout alone: nothing would keep
// its idle holder's session alive.
func TestMySQLDeadHolderTimeoutSetsWaitTimeout(t *testing.T) {
	testdb.Slow(t, "about two seconds on 2 CPUs")
	ctx := context.Background()
	const deadHolder = 2 * time.Second
	opts := []advisorylock.Option{advisorylock.WithKeepAlive(200 * time.Millisecond), advisorylock.WithReleaseTimeout(500 * time.Millisecond), advisorylock.WithDeadHolderTimeout(deadHolder)}
	// On a pool of one connection, the lock's session answers afterwards.
	waitTimeoutAfter := func(db *sql.DB, opts ...advisorylock.Option) int64 {
		t.Helper()
		db.SetMaxOpenConns(1)
		mustRelease(t, mustTry(t, newLock(t, db, testdb.UniqueName(t), opts...)))
		var secs int64
		if err := db.QueryRowContext(ctx, "SELECT @@session.wait_timeout").Scan(&secs); err != nil {
			t.Fatal(err)
		}
		return secs
	}
	if secs := waitTimeoutAfter(testdb.OpenMySQL(t), opts...); secs != int64(deadHolder/time.Second) {
		t.Fatalf("wait_timeout of a Lock's session = %d s, want %v", secs, deadHolder)
	}
	if secs := waitTimeoutAfter(testdb.OpenMySQL(t), append(opts, advisorylock.WithMinHold(time.Millisecond))...); secs != int64(deadHolder/time.Second) {
		t.Fatalf("wait_timeout of a Lock's session with WithMinHold = %d s, want %v", secs, deadHolder)
	}
	if secs := waitTimeoutAfter(testdb.OpenMySQL(t), advisorylock.WithKeepAlive(0), advisorylock.WithDeadHolderTimeout(10*time.Second)); secs <= 10 {
		t.Fatalf("wait_timeout of a Lock without a keep-alive = %d s, want the server's", secs)
	}
	if secs := waitTimeoutAfter(testdb.OpenMySQL(t)); secs <= 20 {
		t.Fatalf("wait_timeout of a Lock with the default dead-holder timeout = %d s, want the server's (only an explicit WithDeadHolderTimeout sets it on MySQL)", secs)
	}

	db, proxy := testdb.OpenMySQLProxied(t)
	name := testdb.UniqueName(t)
	g := mustTry(t, newLock(t, db, name, opts...))
	other := newLock(t, testdb.OpenMySQL(t), name)
	if _, err := other.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock of a held lock = %v, want ErrNotAcquired", err)
	}
	proxy.Cut() // the holder vanishes: its socket stays open, nothing reaches the server
	cut := time.Now()
	var got *advisorylock.Guard
	testdb.WaitFor(t, 3*deadHolder+5*time.Second, func() bool {
		var err error
		got, err = other.TryLock(ctx)
		if err != nil && !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatal(err)
		}
		return err == nil
	}, "the server never freed the vanished holder's lock")
	t.Logf("freed %v after the cut", time.Since(cut))
	mustRelease(t, got)
	<-g.Lost()
}

// TestMySQLLockCreatesItsTablesOnceOrWorksWithout: on a fresh database a
// Lock's first grant creates the library's tables (so that an exclusive
// grab looks for shared holders in its own statement); a user who may not
// create them still takes, waits, reports and releases, and is still
// excluded by shared holders once an administrator made the tables.
// Those tables include advisorylock_windows, which a Lock with
// WithMinHold then uses.
func TestMySQLLockCreatesItsTablesOnceOrWorksWithout(t *testing.T) {
	ctx := context.Background()
	dsn := testdb.NewMySQLDatabase(t)
	db := testdb.OpenMySQLDSN(t, dsn)
	tables := func() int {
		return countRows(t, db, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")
	}
	takeEachWay := func(db *sql.DB, name string) {
		t.Helper()
		l := newLock(t, db, name)
		for _, acquire := range []func(context.Context) (*advisorylock.Guard, error){l.TryLock, l.Lock, l.TryLock} {
			g, err := acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h, err := l.Holder(ctx); err != nil || h == nil {
				t.Fatalf("Holder = %+v, %v", h, err)
			}
			mustRelease(t, g)
		}
	}
	ordinary, _ := mysqlOrdinaryUser(t, db, dsn)
	name := testdb.UniqueName(t)
	takeEachWay(ordinary, name)
	if n := tables(); n != 0 {
		t.Fatalf("a user without CREATE made %d tables", n)
	}
	takeEachWay(db, name)
	if n := tables(); n != 9 {
		t.Fatalf("a Lock's first grant made %d tables, want the library's 9", n)
	}
	reader, err := newLock(t, db, name).TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newLock(t, ordinary, name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock beside a shared holder, as a user without CREATE = %v, want ErrNotAcquired", err)
	}
	mustRelease(t, reader)
	if err := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Second)).Check(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countRows(t, db, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'advisorylock_windows'"); n != 1 {
		t.Fatal("no advisorylock_windows for a Lock with WithMinHold")
	}
}
