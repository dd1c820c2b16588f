package advisorylock_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// The once-per-window tests (WithMinHold): replicas whose cron
// fires a little apart run a short job once per window.

const (
	minHoldWindow   = 2 * time.Second
	minHoldReplicas = 5
	minHoldSkew     = 100 * time.Millisecond
	minHoldJobTime  = 10 * time.Millisecond
)

// windowLock is a Lock or a LeaseLock, seen through what these tests use.
type windowLock struct {
	check func(ctx context.Context) error
	tryDo func(ctx context.Context, job func()) (bool, error)
	try   func(ctx context.Context) (release func() error, err error)
	lock  func(ctx context.Context) (release func() error, err error)
	// lockTimeout is LockTimeout; its release is nil on an error.
	lockTimeout func(ctx context.Context, d time.Duration) (release func() error, err error)
	holder      func(ctx context.Context) (*advisorylock.Holder, error)
}

// newWindowLock makes a lock of kind ("lock" or "lease") on name.
func newWindowLock(t testing.TB, kind string, db advisorylock.DB, name string, opts ...advisorylock.Option) windowLock {
	t.Helper()
	if kind == "lease" {
		l := newLeaseLock(t, db, name, opts...)
		return windowLockOf(l.Check, l.TryLock, l.Lock, l.LockTimeout, l.Holder, func(ctx context.Context, job func()) (bool, error) {
			return l.TryDo(ctx, func(context.Context, advisorylock.Lease) error { job(); return nil })
		})
	}
	l := newLock(t, db, name, opts...)
	return windowLockOf(l.Check, l.TryLock, l.Lock, l.LockTimeout, l.Holder, func(ctx context.Context, job func()) (bool, error) {
		return l.TryDo(ctx, func(context.Context) error { job(); return nil })
	})
}

// windowLockOf is a windowLock of a kind's methods.
func windowLockOf[G interface{ Release(context.Context) error }](
	check func(context.Context) error,
	try, lock func(context.Context) (G, error),
	lockTimeout func(context.Context, time.Duration) (G, error),
	holder func(context.Context) (*advisorylock.Holder, error),
	tryDo func(ctx context.Context, job func()) (bool, error),
) windowLock {
	return windowLock{
		check:       check,
		tryDo:       tryDo,
		try:         func(ctx context.Context) (func() error, error) { return releaser(try(ctx)) },
		lock:        func(ctx context.Context) (func() error, error) { return releaser(lock(ctx)) },
		lockTimeout: func(ctx context.Context, d time.Duration) (func() error, error) { return releaser(lockTimeout(ctx, d)) },
		holder:      holder,
	}
}

func releaser[G interface{ Release(context.Context) error }](g G, err error) (func() error, error) {
	if err != nil {
		return nil, err
	}
	return func() error { return g.Release(context.Background()) }, nil
}

// windowKinds are the kinds of lock that take WithMinHold.
var windowKinds = []string{"lock", "lease"}

// eachPostgresWindowLock runs f for every kind on both drivers.
func eachPostgresWindowLock(t *testing.T, f func(t *testing.T, kind, drv string)) {
	for _, kind := range windowKinds {
		for _, drv := range testdb.Drivers {
			t.Run(kind+"/"+drv, func(t *testing.T) { f(t, kind, drv) })
		}
	}
}

// eachServerWindowLock runs f for every kind on PostgreSQL (both
// drivers) and on MySQL; open opens a new handle (a *sql.DB of its own, as
// a replica has) on the same database.
func eachServerWindowLock(t *testing.T, f func(t *testing.T, kind string, open func() *sql.DB)) {
	eachPostgresWindowLock(t, func(t *testing.T, kind, drv string) {
		f(t, kind, func() *sql.DB { return testdb.OpenPostgres(t, drv) })
	})
	for _, kind := range windowKinds {
		t.Run(kind+"/mysql", func(t *testing.T) {
			f(t, kind, func() *sql.DB { return testdb.OpenMySQL(t) })
		})
	}
}

// eachWindowLock runs f for every kind on PostgreSQL (both drivers), on
// MySQL and on a SQLite file; open opens a new handle on the same database.
func eachWindowLock(t *testing.T, f func(t *testing.T, kind string, open func() *sql.DB)) {
	eachServerWindowLock(t, f)
	for _, kind := range windowKinds {
		t.Run(kind+"/sqlite", func(t *testing.T) {
			path := testdb.SQLitePath(t)
			f(t, kind, func() *sql.DB {
				return testdb.OpenSQLite(t, path, sqliteWAL)
			})
		})
	}
}

// waitWindowOver polls Holder until nobody holds the name.
func waitWindowOver(t *testing.T, l windowLock) {
	t.Helper()
	testdb.WaitFor(t, wait, func() bool {
		h, err := l.holder(context.Background())
		if err != nil {
			t.Fatalf("Holder: %v", err)
		}
		return h == nil
	}, "the window never ended")
}

// checkWindowHolder asserts that Holder shows a grant whose window ends
// between notBefore and notAfter, and returns it.
func checkWindowHolder(t *testing.T, l windowLock, name string, notBefore, notAfter time.Time) *advisorylock.Holder {
	t.Helper()
	h, err := l.holder(context.Background())
	if err != nil || h == nil {
		t.Fatalf("Holder during the window = %+v, %v; want the last holder", h, err)
	}
	if h.Name != name || h.ExpiresAt.Before(notBefore) || h.ExpiresAt.After(notAfter) {
		t.Fatalf("Holder during the window = %+v; want name %q and ExpiresAt in [%v, %v]", h, name, notBefore, notAfter)
	}
	return h
}

// TestMinHoldRunsASkewedJobOncePerWindowOnPostgresAndMySQL fires five replicas
// (separate *sql.DBs) 100 ms apart, each TryDo of a 10 ms job: without
// the option the job would run five times; with a 2 s window it runs
// once, Holder shows the last holder until the window's end, and the
// next firing after the window runs it again.
func TestMinHoldRunsASkewedJobOncePerWindowOnPostgresAndMySQL(t *testing.T) {
	testdb.Slow(t, "waits out min-hold windows of seconds")
	t.Parallel() // names of its own
	eachServerWindowLock(t, func(t *testing.T, kind string, open func() *sql.DB) {
		t.Parallel() // a name (and SQLite file) of its own; mostly waiting out the window
		ctx := context.Background()
		name := testdb.UniqueName(t)
		locks := make([]windowLock, minHoldReplicas)
		for i := range locks {
			locks[i] = newWindowLock(t, kind, open(), name, advisorylock.WithMinHold(minHoldWindow))
			if err := locks[i].check(ctx); err != nil {
				t.Fatal(err)
			}
		}
		var runs atomic.Int32
		fire := func() time.Time {
			start := time.Now()
			var wg sync.WaitGroup
			for i, l := range locks {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(time.Duration(i) * minHoldSkew) // the replicas' cron fires this far apart
					if _, err := l.tryDo(ctx, func() { runs.Add(1); time.Sleep(minHoldJobTime) }); err != nil {
						t.Errorf("replica %d: TryDo: %v", i, err)
					}
				}()
			}
			wg.Wait()
			return start
		}
		start := fire()
		if n := runs.Load(); n != 1 {
			t.Fatalf("the job ran %d times in one window, want 1", n)
		}
		checkWindowHolder(t, locks[0], name, start.Add(minHoldWindow-time.Second), time.Now().Add(minHoldWindow+time.Second))
		waitWindowOver(t, locks[0])
		fire()
		if n := runs.Load(); n != 2 {
			t.Fatalf("the job ran %d times in two windows, want 2", n)
		}
	})
}

// TestMinHoldLockWaitsForTheWindow: Lock waits until the window's end
// (and not a whole window longer), after a holder that released at once;
// Lock and LockTimeout bounded shorter than the window give up.
func TestMinHoldLockWaitsForTheWindow(t *testing.T) {
	testdb.Slow(t, "waits out min-hold windows of seconds")
	t.Parallel() // names and files of its own
	eachWindowLock(t, func(t *testing.T, kind string, open func() *sql.DB) {
		t.Parallel() // a name (and SQLite file) of its own; mostly waiting out the window
		ctx := context.Background()
		name := testdb.UniqueName(t)
		a := newWindowLock(t, kind, open(), name, advisorylock.WithMinHold(minHoldWindow), advisorylock.WithPollInterval(5*time.Millisecond))
		b := newWindowLock(t, kind, open(), name, advisorylock.WithMinHold(minHoldWindow), advisorylock.WithPollInterval(5*time.Millisecond))
		if err := b.check(ctx); err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		release, err := a.try(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := release(); err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		if _, err := b.try(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock in the window = %v, want ErrNotAcquired", err)
		}
		short, cancel := context.WithTimeout(ctx, minHoldWindow/4)
		_, err = b.lock(short)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock bounded by a quarter of the window = %v, want context.DeadlineExceeded", err)
		}
		if _, err := b.lockTimeout(ctx, minHoldWindow/4); !errors.Is(err, advisorylock.ErrTimeout) {
			t.Fatalf("LockTimeout of a quarter of the window = %v, want ErrTimeout", err)
		}
		release, err = b.lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := time.Now()
		if err := release(); err != nil {
			t.Fatal(err)
		}
		if got.Before(before.Add(minHoldWindow)) || got.After(after.Add(2*minHoldWindow)) {
			t.Fatalf("Lock got the name %v after the grant, want about %v", got.Sub(before), minHoldWindow)
		}
	})
}

// TestMinHoldWaiterAfterALongHolderClaimsANewWindow: a holder that keeps
// the lock past its window hands off to a waiting Lock (server-side), and
// that grant opens a window of its own.
func TestMinHoldWaiterAfterALongHolderClaimsANewWindow(t *testing.T) {
	testdb.Slow(t, "waits out min-hold windows of seconds")
	t.Parallel() // names of its own
	for _, drv := range append(slices.Clone(testdb.Drivers), "mysql") {
		t.Run(drv, func(t *testing.T) {
			t.Parallel() // a name of its own; mostly waiting out the windows
			ctx := context.Background()
			name := testdb.UniqueName(t)
			window := 2 * time.Second // the waiter's window must outlast its release and a try under load
			open := func() *sql.DB {
				if drv == "mysql" {
					return testdb.OpenMySQL(t)
				}
				return testdb.OpenPostgres(t, drv)
			}
			a := newLock(t, open(), name, advisorylock.WithMinHold(window))
			b := newLock(t, open(), name, advisorylock.WithMinHold(window))
			c := newLock(t, open(), name, advisorylock.WithMinHold(window))
			ga, err := a.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *advisorylock.Guard, 1)
			go func() {
				g, err := b.Lock(ctx)
				if err != nil {
					t.Errorf("Lock: %v", err)
				}
				got <- g
			}()
			testdb.WaitFor(t, wait, func() bool {
				h, err := a.Holder(ctx)
				return err == nil && h != nil && h.ExpiresAt.IsZero() // the window is over, a still holds
			}, "the first window never ended")
			mustRelease(t, ga)
			gb := <-got
			if gb == nil {
				t.FailNow()
			}
			mustRelease(t, gb)
			if _, err := c.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("TryLock right after the waiter's release = %v, want ErrNotAcquired (its own window)", err)
			}
			h, err := c.Holder(ctx)
			if err != nil || h == nil || h.ExpiresAt.IsZero() {
				t.Fatalf("Holder in the waiter's window = %+v, %v; want the window", h, err)
			}
		})
	}
}

// TestMinHoldWindowIsTheDatabaseClocks: replicas whose clocks are an
// hour off either way still get a window of the database's clock, on
// PostgreSQL and MySQL.
func TestMinHoldWindowIsTheDatabaseClocks(t *testing.T) {
	testdb.Slow(t, "waits out min-hold windows of seconds")
	t.Parallel() // names of its own
	eachServerWindowLock(t, func(t *testing.T, kind string, open func() *sql.DB) {
		t.Parallel() // a name (and SQLite file) of its own; mostly waiting out the window
		ctx := context.Background()
		name := testdb.UniqueName(t)
		late := newWindowLock(t, kind, open(), name, advisorylock.WithMinHold(minHoldWindow), advisorylock.WithClock(testdb.SkewedClock(-time.Hour).Now))
		early := newWindowLock(t, kind, open(), name, advisorylock.WithMinHold(minHoldWindow), advisorylock.WithClock(testdb.SkewedClock(time.Hour).Now))
		before := time.Now()
		ran, err := late.tryDo(ctx, func() {})
		if err != nil || !ran {
			t.Fatalf("TryDo = %v, %v", ran, err)
		}
		if ran, err := early.tryDo(ctx, func() {}); err != nil || ran {
			t.Fatalf("TryDo an hour ahead, in the window = %v, %v; want not run", ran, err)
		}
		checkWindowHolder(t, early, name, before.Add(minHoldWindow-time.Second), time.Now().Add(minHoldWindow+time.Second))
		waitWindowOver(t, late)
		if got := time.Since(before); got < minHoldWindow-100*time.Millisecond {
			t.Fatalf("the window ended %v after the grant, want %v", got, minHoldWindow)
		}
		if ran, err := early.tryDo(ctx, func() {}); err != nil || !ran {
			t.Fatalf("TryDo after the window = %v, %v; want run", ran, err)
		}
	})
}

// TestLockWithoutMinHoldNeverTouchesTheWindowsTable: in a fresh database
// a Lock without the option takes, waits, reports and releases without
// creating advisorylock_windows; with the option its first use creates it.
func TestLockWithoutMinHoldNeverTouchesTheWindowsTable(t *testing.T) {
	testdb.Slow(t, "creates a fresh database")
	t.Parallel() // a database of its own
	admin := testdb.OpenPostgres(t, "pgx")
	fresh := freshDatabase(t, admin)
	for _, drv := range testdb.Drivers {
		db := testdb.OpenPostgresDSN(t, drv, testdb.WithDatabase(testdb.PostgresDSN(t), fresh))
		ctx := context.Background()
		l := newLock(t, db, testdb.UniqueName(t))
		for _, acquire := range []func(context.Context) (*advisorylock.Guard, error){l.TryLock, l.Lock} {
			g, err := acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h, err := l.Holder(ctx); err != nil || h == nil {
				t.Fatalf("Holder = %+v, %v", h, err)
			}
			mustRelease(t, g)
		}
		if windowsTableExists(t, db) {
			t.Fatalf("%s: a Lock without WithMinHold created advisorylock_windows", drv)
		}
	}
	db := testdb.OpenPostgresDSN(t, "pgx", testdb.WithDatabase(testdb.PostgresDSN(t), fresh))
	if err := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Second)).Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !windowsTableExists(t, db) {
		t.Fatal("a Lock with WithMinHold did not create advisorylock_windows at its first use")
	}
}

func windowsTableExists(t *testing.T, db *sql.DB) bool {
	t.Helper()
	var exists bool
	if err := db.QueryRow("SELECT to_regclass('advisorylock_windows') IS NOT NULL").Scan(&exists); err != nil {
		t.Fatal(err)
	}
	return exists
}

// TestMinHoldOnABackendWithoutWindowsIsUnsupported: a plugged-in backend
// that does not keep windows refuses WithMinHold at the first operation.
func TestMinHoldOnABackendWithoutWindowsIsUnsupported(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	b := advisorylock.WithBackend(newMapBackend())
	ctx := context.Background()
	l := newLock(t, db, "x", b, advisorylock.WithMinHold(time.Second))
	if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("Lock.TryLock = %v, want ErrUnsupported", err)
	}
	ll := newLeaseLock(t, db, "x", b, advisorylock.WithMinHold(time.Second))
	if _, err := ll.TryLock(ctx); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("LeaseLock.TryLock = %v, want ErrUnsupported", err)
	}
	g, err := newLeaseLock(t, db, "x", b).TryLock(ctx)
	if err != nil {
		t.Fatalf("the same backend without WithMinHold: %v", err)
	}
	mustRelease(t, g)
}

// ---------------------------------------------------------------------------
// In separate processes: SQLite replicas, and holders that die.

// minHoldJobEnv carries a helper process's minHoldTask, as JSON.
const minHoldJobEnv = "ADVISORYLOCK_MINHOLD_JOB"

// minHoldTask tells a helper process what to do.
type minHoldTask struct {
	Do     string        // "fire": one TryDo at Gun+Delay; "hold": take the lock and hold it until killed
	Kind   string        // "lock" or "lease"
	Driver string        // "postgres", "pgx", "mysql" or "sqlite"
	Path   string        // the SQLite file
	MySQL  string        // the MySQL DSN
	Name   string        // the lock's name
	Window time.Duration // WithMinHold
	TTL    time.Duration // WithLeaseTTL
	Delay  time.Duration // after the gun
	Dir    string        // markers: ready-N, gun, runs, held
	ID     int
	Renew  bool // "hold": mark held only once a renewal has kept the lease
}

func (j minHoldTask) open(t testing.TB) *sql.DB {
	switch j.Driver {
	case "sqlite":
		return testdb.OpenSQLite(t, j.Path, sqliteWAL)
	case "mysql":
		return testdb.OpenMySQLDSN(t, j.MySQL)
	}
	return testdb.OpenPostgres(t, j.Driver)
}

func (j minHoldTask) lock(t testing.TB, db *sql.DB, opts ...advisorylock.Option) windowLock {
	return newWindowLock(t, j.Kind, db, j.Name, append([]advisorylock.Option{advisorylock.WithMinHold(j.Window), advisorylock.WithLeaseTTL(j.TTL)}, opts...)...)
}

// renewTeller closes renewed at the first renewal that kept the lease.
type renewTeller struct {
	once    sync.Once
	renewed chan struct{}
}

func (r *renewTeller) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	if e.Type == advisorylock.EventRenew && e.Err == nil {
		r.once.Do(func() { close(r.renewed) })
	}
	return ctx
}

// startMinHoldHelper starts a helper process running job.
func startMinHoldHelper(t *testing.T, job minHoldTask) *exec.Cmd {
	t.Helper()
	env, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmd := testdb.HelperCommand(t, "TestMinHoldHelperProcess", fmt.Sprintf("%s-%d", job.Do, job.ID), minHoldJobEnv+"="+string(env))
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	return cmd
}

// TestMinHoldHelperProcess is the body of the helper processes; it skips
// in a normal run.
func TestMinHoldHelperProcess(t *testing.T) {
	if testdb.HelperRole() == "" {
		t.Skip("helper process only")
	}
	var job minHoldTask
	if err := json.Unmarshal([]byte(os.Getenv(minHoldJobEnv)), &job); err != nil {
		t.Fatalf("bad %s: %v", minHoldJobEnv, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	renewals := &renewTeller{renewed: make(chan struct{})}
	l := job.lock(t, job.open(t), advisorylock.WithObserver(renewals))
	if err := l.check(ctx); err != nil {
		t.Fatal(err)
	}
	switch job.Do {
	case "fire":
		touch(t, filepath.Join(job.Dir, "ready-"+strconv.Itoa(job.ID)), "")
		var gun time.Time
		testdb.WaitFor(t, time.Minute, func() bool {
			b, err := os.ReadFile(filepath.Join(job.Dir, "gun"))
			if err != nil || len(b) == 0 {
				return false
			}
			ms, err := strconv.ParseInt(string(b), 10, 64)
			gun = time.UnixMilli(ms)
			return err == nil
		}, "no starting gun")
		time.Sleep(time.Until(gun.Add(job.Delay))) // this replica's cron fires now
		if _, err := l.tryDo(ctx, func() {
			appendLine(t, filepath.Join(job.Dir, "runs"), strconv.Itoa(job.ID))
			time.Sleep(minHoldJobTime)
		}); err != nil {
			t.Fatal(err)
		}
	case "hold":
		release, err := l.lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if job.Renew {
			select {
			case <-renewals.renewed:
			case <-ctx.Done():
				t.Fatal("the lease was never renewed")
			}
		}
		touch(t, filepath.Join(job.Dir, "held"), "")
		<-ctx.Done()               // until killed
		runtime.KeepAlive(release) // a forgotten guard would be released
	default:
		t.Fatalf("unknown job %q", job.Do)
	}
}

func touch(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func appendLine(t testing.TB, path, line string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		t.Fatal(err)
	}
}

func countLines(t testing.TB, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// TestMinHoldRunsASkewedJobOncePerWindowAcrossSQLiteProcesses is the
// skewed-replicas test with each replica a process of its own on one
// SQLite file (a 3 s window: five processes on a busy machine can start
// their job late).
func TestMinHoldRunsASkewedJobOncePerWindowAcrossSQLiteProcesses(t *testing.T) {
	testdb.Slow(t, "processes waiting out 3 s windows")
	t.Parallel() // files and helper processes of its own
	for _, kind := range windowKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel() // a file of its own; the processes start before the gun
			path := testdb.SQLitePath(t)
			job := minHoldTask{Do: "fire", Kind: kind, Driver: "sqlite", Path: path, Name: testdb.UniqueName(t), Window: 3 * time.Second, TTL: 30 * time.Second}
			l := job.lock(t, job.open(t))
			fire := func() time.Time {
				job.Dir = t.TempDir()
				cmds := make([]*exec.Cmd, minHoldReplicas)
				for i := range cmds {
					job.ID, job.Delay = i, time.Duration(i)*minHoldSkew
					cmds[i] = startMinHoldHelper(t, job)
				}
				testdb.WaitFor(t, time.Minute, func() bool {
					for i := range cmds {
						if _, err := os.Stat(filepath.Join(job.Dir, "ready-"+strconv.Itoa(i))); err != nil {
							return false
						}
					}
					return true
				}, "helpers not ready")
				gun := time.Now().Add(200 * time.Millisecond)
				touch(t, filepath.Join(job.Dir, "gun"), strconv.FormatInt(gun.UnixMilli(), 10))
				for i, c := range cmds {
					if err := c.Wait(); err != nil {
						t.Fatalf("helper %d: %v (its output is above)", i, err)
					}
				}
				return gun
			}
			gun := fire()
			if n := countLines(t, filepath.Join(job.Dir, "runs")); n != 1 {
				t.Fatalf("the job ran %d times in one window, want 1", n)
			}
			checkWindowHolder(t, l, job.Name, gun.Add(job.Window-time.Second), time.Now().Add(job.Window+time.Second))
			waitWindowOver(t, l)
			fire()
			if n := countLines(t, filepath.Join(job.Dir, "runs")); n != 1 {
				t.Fatalf("the job ran %d times in the next window, want 1", n)
			}
		})
	}
}

// TestMinHoldWindowOutlivesAKilledHolder: a holder process killed right
// after its grant keeps the name until the window's end, also when the
// window is longer than the lease TTL (1 s here, window 3 s), on every
// backend and kind; a LeaseLock's holder also when killed after it
// renewed the lease (a renewal never ends the window early). The window is kept on the database's clock, so the
// next grant is measured on it too: Holder's Since is a grant's time as
// the database recorded it, read for the dead holder's grant and for the
// test's own while it holds the name.
func TestMinHoldWindowOutlivesAKilledHolder(t *testing.T) {
	testdb.Slow(t, "kills holder processes and waits out 3 s windows")
	t.Parallel() // names, files and helper processes of its own
	const window = 3 * time.Second
	type setup struct {
		kind, driver string
		renew        bool
	}
	var setups []setup
	for _, kind := range windowKinds {
		for _, drv := range append([]string{"sqlite", "mysql"}, testdb.Drivers...) {
			setups = append(setups, setup{kind, drv, false})
			if kind == "lease" {
				setups = append(setups, setup{kind, drv, true})
			}
		}
	}
	for _, s := range setups {
		name := s.kind + "/" + s.driver
		if s.renew {
			name += "/renewed"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel() // own name, file and helper process; most of it is waiting out the window
			job := minHoldTask{Do: "hold", Kind: s.kind, Driver: s.driver, Name: testdb.UniqueName(t), Window: window, TTL: time.Second, Dir: t.TempDir(), Renew: s.renew}
			switch s.driver {
			case "sqlite":
				job.Path = testdb.SQLitePath(t)
			case "mysql":
				job.MySQL = testdb.MySQLDSN(t)
			}
			l := job.lock(t, job.open(t))
			if err := l.check(context.Background()); err != nil {
				t.Fatal(err)
			}
			started := time.Now() // before the grant
			cmd := startMinHoldHelper(t, job)
			testdb.WaitFor(t, time.Minute, func() bool { return fileExists(filepath.Join(job.Dir, "held")) }, "the holder never held")
			held := time.Now() // after the grant
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			dead := checkWindowHolder(t, l, job.Name, started.Add(window-time.Second), held.Add(window+time.Second))
			if end := dead.Since.Add(window); dead.ExpiresAt.Before(end) {
				t.Fatalf("the dead holder's grant at %v keeps the name until %v, before its %v window ends at %v", dead.Since, dead.ExpiresAt, window, end)
			}
			var next *advisorylock.Holder // the test's grant, as the database recorded it
			testdb.WaitFor(t, wait, func() bool {
				release, err := l.try(context.Background())
				if errors.Is(err, advisorylock.ErrNotAcquired) {
					return false
				}
				if err != nil {
					t.Fatal(err)
				}
				next, err = l.holder(context.Background())
				if err != nil || next == nil {
					t.Fatalf("Holder while the test holds the name = %+v, %v", next, err)
				}
				if err := release(); err != nil {
					t.Fatal(err)
				}
				return true
			}, "never acquired after the window")
			if next.Since.Before(dead.Since.Add(window)) {
				t.Fatalf("granted again %v after the dead holder's grant (by the database's clock), before its %v window ended", next.Since.Sub(dead.Since), window)
			}
		})
	}
}

// TestMinHoldTryLockAndReleaseAreOneRoundTripEach counts the round trips
// through a proxy: the window is checked and recorded in the try's one
// statement, and the release is unchanged.
func TestMinHoldTryLockAndReleaseAreOneRoundTripEach(t *testing.T) {
	drivers := append(slices.Clone(testdb.Drivers), "mysql")
	for _, kind := range windowKinds {
		for _, drv := range drivers {
			t.Run(kind+"/"+drv, func(t *testing.T) { checkMinHoldRoundTrips(t, kind, drv) })
		}
	}
}

// checkMinHoldRoundTrips is TestMinHoldTryLockAndReleaseAreOneRoundTripEach
// for one kind and driver (on MySQL, a key's first try ever takes two
// round trips: the warm-up makes it).
func checkMinHoldRoundTrips(t *testing.T, kind, drv string) {
	var db *sql.DB
	var proxy *testdb.Proxy
	if drv == "mysql" {
		db, proxy = testdb.OpenMySQLProxied(t)
	} else {
		db, proxy = testdb.OpenPostgresProxied(t, drv)
	}
	db.SetMaxOpenConns(1) // the warm-up prepares the measured connection's statements (pgx)
	ctx := context.Background()
	l := newWindowLock(t, kind, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Millisecond))
	for attempt := range 2 { // a warm-up, then the measurement
		waitWindowOver(t, l)
		proxy.ResetCount()
		release, err := l.try(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tries := proxy.RoundTrips()
		proxy.ResetCount()
		if err := release(); err != nil {
			t.Fatal(err)
		}
		releases := proxy.RoundTrips()
		if attempt == 1 && (tries != 1 || releases != 1) {
			t.Fatalf("TryLock took %d round trips and Release %d, want 1 each", tries, releases)
		}
	}
}

// TestWithoutMinHoldASkewedJobRunsOnSeveralReplicas is the problem
// WithMinHold solves: the same replicas without the option run the short
// job more than once per tick.
func TestWithoutMinHoldASkewedJobRunsOnSeveralReplicas(t *testing.T) {
	ctx := context.Background()
	name := testdb.UniqueName(t)
	var runs atomic.Int32
	var wg sync.WaitGroup
	for i := range minHoldReplicas {
		l := newLock(t, testdb.OpenPostgres(t, "pgx"), name)
		if err := l.Check(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * minHoldSkew)
			if _, err := l.TryDo(ctx, func(context.Context) error { runs.Add(1); time.Sleep(minHoldJobTime); return nil }); err != nil {
				t.Errorf("replica %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if n := runs.Load(); n < 2 {
		t.Fatalf("without WithMinHold the job ran %d times, want several (each replica releases before the next fires)", n)
	}
}

// TestMinHoldRunsOnTheTableFromSchema: Schema's DDL holds
// advisorylock_windows, and a Lock with WithMinHold runs on the table an
// operator made from it.
func TestMinHoldRunsOnTheTableFromSchema(t *testing.T) {
	testdb.Slow(t, "creates a fresh database")
	t.Parallel() // a database of its own
	ddl := advisorylock.Schema(advisorylock.Postgres())
	if !strings.Contains(ddl, "advisorylock_windows") {
		t.Fatalf("Schema(Postgres()) lacks advisorylock_windows:\n%s", ddl)
	}
	admin := testdb.OpenPostgres(t, "pgx")
	db := testdb.OpenPostgresDSN(t, "pgx", testdb.WithDatabase(testdb.PostgresDSN(t), freshDatabase(t, admin)))
	if _, err := db.Exec(ddl); err != nil {
		t.Fatalf("running the exported DDL: %v", err)
	}
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Minute))
	if ran, err := l.TryDo(context.Background(), func(context.Context) error { return nil }); err != nil || !ran {
		t.Fatalf("TryDo = %v, %v", ran, err)
	}
	if ran, err := l.TryDo(context.Background(), func(context.Context) error { return nil }); err != nil || ran {
		t.Fatalf("TryDo in the window = %v, %v; want not run", ran, err)
	}
}

// TestMinHoldGrantsAreAWindowApartUnderContention: replicas that try and
// wait for one name over and over, with no skew at all, get grants at
// least a window apart by the database's clock (each run reads its grant's
// time from its window's row, which only the lock's holder can write), and
// keep getting them.
func TestMinHoldGrantsAreAWindowApartUnderContention(t *testing.T) {
	testdb.Slow(t, "waits out min-hold windows of seconds")
	t.Parallel() // names of its own
	const window = 150 * time.Millisecond
	for _, drv := range append(slices.Clone(testdb.Drivers), "mysql") {
		t.Run(drv, func(t *testing.T) {
			t.Parallel() // a name of its own; gaps are read on the database's clock
			name := testdb.UniqueName(t)
			open := func() *sql.DB { return testdb.OpenPostgres(t, drv) }
			grantOf := "SELECT (extract(epoch FROM acquired_at) * 1e6)::bigint FROM advisorylock_windows WHERE key = $1"
			if drv == "mysql" {
				open = func() *sql.DB { return testdb.OpenMySQL(t) }
				grantOf = "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', acquired_at) FROM advisorylock_windows WHERE lock_key = ?"
			}
			admin := open()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var mu sync.Mutex
			var grants []time.Time
			var wg sync.WaitGroup
			for i := range 6 {
				l := newLock(t, open(), name, advisorylock.WithMinHold(window))
				wg.Add(1)
				go func() {
					defer wg.Done()
					job := func(ctx context.Context) error {
						var micros int64
						err := admin.QueryRowContext(ctx, grantOf, advisorylock.Key(name)).Scan(&micros)
						if err != nil {
							return fmt.Errorf("reading the grant's window: %w", err)
						}
						mu.Lock()
						grants = append(grants, time.UnixMicro(micros))
						mu.Unlock()
						return nil
					}
					for ctx.Err() == nil {
						var err error
						if i%2 == 0 {
							_, err = l.TryDo(ctx, job)
						} else {
							err = l.Do(ctx, job)
						}
						if err != nil && ctx.Err() == nil {
							t.Errorf("worker %d: %v", i, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			slices.SortFunc(grants, time.Time.Compare)
			t.Logf("%d grants", len(grants))
			if len(grants) < 3 {
				t.Fatalf("%d grants in 2s of %v windows, want several", len(grants), window)
			}
			for i := 1; i < len(grants); i++ {
				if gap := grants[i].Sub(grants[i-1]); gap < window {
					t.Fatalf("grants %v apart (of %d), want at least the window %v", gap, len(grants), window)
				}
			}
		})
	}
}

// TestMinHoldLockTimeoutHoldsOnADeadNetwork: a LockTimeout waiting out a
// window returns its ErrTimeout about on time when the network dies
// under it (its statements are bounded as wait slices are).
func TestMinHoldLockTimeoutHoldsOnADeadNetwork(t *testing.T) {
	testdb.Slow(t, "fault: network cut under a LockTimeout of seconds")
	const budget = 2 * time.Second
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel() // side by side: a proxy and a name of its own
			ctx := context.Background()
			name := testdb.UniqueName(t)
			first := newLock(t, testdb.OpenPostgres(t, drv), name, advisorylock.WithMinHold(time.Minute))
			if ran, err := first.TryDo(ctx, func(context.Context) error { return nil }); err != nil || !ran {
				t.Fatalf("TryDo = %v, %v", ran, err)
			}
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			waiter := newLock(t, db, name, advisorylock.WithMinHold(time.Minute))
			if err := waiter.Check(ctx); err != nil {
				t.Fatal(err)
			}
			proxy.ResetCount()
			start := time.Now()
			done := make(chan error, 1)
			go func() {
				_, err := waiter.LockTimeout(ctx, budget)
				done <- err
			}()
			// The try and the first question about the window went through:
			// the waiter sleeps out the window now.
			testdb.WaitFor(t, wait, func() bool { return proxy.RoundTrips() >= 2 }, "the waiter never asked")
			proxy.Cut()
			t.Cleanup(proxy.Heal)
			err := <-done
			if !errors.Is(err, advisorylock.ErrTimeout) {
				t.Fatalf("LockTimeout on a dead network = %v, want ErrTimeout", err)
			}
			if took := time.Since(start); took > budget+3*time.Second {
				t.Fatalf("LockTimeout(%v) on a dead network returned after %v", budget, took)
			}
		})
	}
}

// TestMinHoldOnSQLiteFollowsTheClock: on SQLite the window is the Clock's:
// taken until exactly the grant plus the window.
func TestMinHoldOnSQLiteFollowsTheClock(t *testing.T) {
	t.Parallel()
	const window = time.Minute
	for _, kind := range windowKinds {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			clock := testdb.NewFakeClock()
			db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
			l := newWindowLock(t, kind, db, testdb.UniqueName(t), advisorylock.WithMinHold(window), advisorylock.WithClock(clock.Now))
			grant := clock.Now()
			if ran, err := l.tryDo(ctx, func() {}); err != nil || !ran {
				t.Fatalf("TryDo = %v, %v", ran, err)
			}
			h, err := l.holder(ctx)
			if err != nil || h == nil || !h.ExpiresAt.Equal(grant.Add(window).Truncate(time.Millisecond)) {
				t.Fatalf("Holder after the release = %+v, %v; want ExpiresAt at %v", h, err, grant.Add(window))
			}
			clock.Add(window - time.Millisecond)
			if ran, err := l.tryDo(ctx, func() {}); err != nil || ran {
				t.Fatalf("TryDo a millisecond before the window's end = %v, %v; want not run", ran, err)
			}
			clock.Add(time.Millisecond)
			if ran, err := l.tryDo(ctx, func() {}); err != nil || !ran {
				t.Fatalf("TryDo at the window's end = %v, %v; want run", ran, err)
			}
		})
	}
}

// TestMinHoldPinnedSessionGetsDeadHolderSettings: the windowed try sends
// the dead-holder settings to a session that lacks them, as the plain try
// does.
func TestMinHoldPinnedSessionGetsDeadHolderSettings(t *testing.T) {
	t.Parallel() // names and pools of its own
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(1) // the guard's pinned connection is the pool's only one
			ctx := context.Background()
			l := newWindowLock(t, "lock", db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Millisecond), advisorylock.WithDeadHolderTimeout(20*time.Second))
			for range 2 { // a new session, then one that has the settings
				waitWindowOver(t, l)
				release, err := l.try(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := release(); err != nil {
					t.Fatal(err)
				}
			}
			var userTimeout, idle string
			if err := db.QueryRowContext(ctx, "SELECT current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_idle')").Scan(&userTimeout, &idle); err != nil {
				t.Fatal(err)
			}
			if userTimeout != "15000" || idle != "5" {
				t.Fatalf("after a windowed hold the session has tcp_user_timeout=%s tcp_keepalives_idle=%s; want 15000, 5", userTimeout, idle)
			}
		})
	}
}

// TestMinHoldOnAHotStandbyIsUnsupported: a Lock with WithMinHold on a
// standby is refused as a plain Lock is.
func TestMinHoldOnAHotStandbyIsUnsupported(t *testing.T) {
	testdb.Slow(t, "standby: a private cluster and its standby")
	t.Parallel()
	primary := testdb.OwnCluster(t)
	standby := testdb.StandbyOf(t, primary)
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgresDSN(t, drv, standby.DSN)
			l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Second))
			_, err := l.TryLock(context.Background())
			if !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), "standby") {
				t.Fatalf("TryLock with WithMinHold on a hot standby = %v, want ErrUnsupported saying hot standby", err)
			}
		})
	}
}

// TestMinHoldOnMySQLRecordsTheWindowAtTheGrant: on MySQL, a Lock's
// window is a row written by the try that takes GET_LOCK (schema step 2,
// also in Schema's DDL): after the holder's release the name stays taken,
// Holder reports the grant's session with the window's end as ExpiresAt,
// and the lock is not held on the server meanwhile.
func TestMinHoldOnMySQLRecordsTheWindowAtTheGrant(t *testing.T) {
	ddl := advisorylock.Schema(advisorylock.MySQL())
	if !strings.Contains(ddl, "advisorylock_windows") {
		t.Fatalf("Schema(MySQL()) lacks advisorylock_windows:\n%s", ddl)
	}
	db := testdb.OpenMySQL(t)
	ctx := context.Background()
	name := testdb.UniqueName(t)
	a := newLock(t, db, name, advisorylock.WithMinHold(time.Minute))
	b := newLock(t, testdb.OpenMySQL(t), name, advisorylock.WithMinHold(time.Minute))
	before := time.Now()
	g, err := a.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id int
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysqlServerLockName(name)).Scan(&id); err != nil || id == 0 {
		t.Fatalf("IS_USED_LOCK while held = %d, %v; want the holder's connection id", id, err)
	}
	mustRelease(t, g)
	if _, err := b.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock in the window = %v, want ErrNotAcquired", err)
	}
	h, err := b.Holder(ctx)
	if err != nil || h == nil {
		t.Fatalf("Holder in the window = %+v, %v", h, err)
	}
	var user string // the grant's user, as the window records it
	if err := db.QueryRowContext(ctx, "SELECT SUBSTRING_INDEX(USER(), '@', 1)").Scan(&user); err != nil {
		t.Fatal(err)
	}
	if h.Name != name || h.PID != id || h.Client != user && !strings.HasPrefix(h.Client, user+"@") || h.ExpiresAt.Before(before.Add(time.Minute-time.Second)) || h.ExpiresAt.After(time.Now().Add(time.Minute+time.Second)) {
		t.Fatalf("Holder in the window = %+v; want %q, connection %d, a user, ExpiresAt a minute after the grant", h, name, id)
	}
	var free sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", mysqlServerLockName(name)).Scan(&free); err != nil || free.Valid {
		t.Fatalf("IS_USED_LOCK in the window after the release = %v, %v; want NULL (the window is the row)", free, err)
	}
	var version int
	if err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM advisorylock_schema").Scan(&version); err != nil || version < 2 {
		t.Fatalf("schema version = %d, %v; want 2 (the windows table)", version, err)
	}
}

// mysqlServerLockName is the server-side name of name's MySQL lock.
func mysqlServerLockName(name string) string {
	return fmt.Sprintf("advisorylock:v1:%016x", uint64(advisorylock.Key(name)))
}

// TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow: on SQLite the
// name stays taken until exactly the grant plus WithMinHold, wherever the
// release and the renewals fall: a release a second after the grant, with
// a TTL longer than the window, does not count the window from the
// release; renewals by the keep-alive, with a TTL shorter than the window,
// do not cut the window short.
func TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow(t *testing.T) {
	testdb.Slow(t, "waits out min-hold windows of seconds")
	t.Parallel() // files of its own, on a fake clock
	const window = 3 * time.Second
	cases := []struct {
		name         string
		ttl          time.Duration
		releaseAfter time.Duration // on the Clock
		renewed      bool          // released after a renewal
	}{
		{"released-a-second-in", 10 * time.Second, time.Second, false},
		{"renewed-with-a-shorter-ttl", time.Second, 0, true},
	}
	for _, kind := range windowKinds {
		for _, c := range cases {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				ctx := context.Background()
				clock := testdb.NewFakeClock()
				rec := &observetest.Recorder{}
				db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
				l := newWindowLock(t, kind, db, testdb.UniqueName(t), advisorylock.WithMinHold(window), advisorylock.WithClock(clock.Now),
					advisorylock.WithLeaseTTL(c.ttl), advisorylock.WithObserver(rec))
				grant := clock.Now()
				release, err := l.try(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if c.renewed {
					testdb.WaitFor(t, wait, func() bool { return rec.Count("renew", "renewed") > 0 }, "the keep-alive never renewed")
				}
				clock.Add(c.releaseAfter)
				if err := release(); err != nil {
					t.Fatal(err)
				}
				end := grant.Add(window)
				h, err := l.holder(ctx)
				if err != nil || h == nil || !h.ExpiresAt.Equal(end) {
					t.Fatalf("Holder after the release = %+v, %v; want ExpiresAt at the grant plus the window, %v", h, err, end)
				}
				clock.Add(end.Add(-time.Millisecond).Sub(clock.Now()))
				if _, err := l.try(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
					t.Fatalf("TryLock a millisecond before the window's end = %v, want ErrNotAcquired", err)
				}
				clock.Add(time.Millisecond)
				release, err = l.try(ctx)
				if err != nil {
					t.Fatalf("TryLock at the window's end = %v, want the grant", err)
				}
				if err := release(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
