package advisorylock_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// The SQLite tests in this file run real processes (the test binary,
// re-executed by testdb.HelperCommand) against one database file.

// sqliteHelperEnv carries a helper process's sqliteJob, as JSON.
const sqliteHelperEnv = "ADVISORYLOCK_SQLITE_JOB"

// sqliteJob tells a helper process what to do.
type sqliteJob struct {
	Do      string        // what: see TestSQLiteHelperProcess
	Path    string        // the database file
	Options string        // its DSN query
	Name    string        // the lock's name; "own" jobs append their pid
	Dir     string        // where to write marks and markers
	Iters   int           // loop count
	TTL     time.Duration // WithLeaseTTL
	Hold    time.Duration // how long to hold, or to loop
}

func (j sqliteJob) file(name string) string { return filepath.Join(j.Dir, name) }

// startHelpers starts n helper processes running job, then fires the
// starting gun (the "go" file) so they begin together.
func startHelpers(t *testing.T, n int, job sqliteJob) []*exec.Cmd {
	t.Helper()
	env, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmds := make([]*exec.Cmd, n)
	for i := range cmds {
		cmds[i] = testdb.HelperCommand(t, "TestSQLiteHelperProcess", fmt.Sprintf("%s-%d", job.Do, i), sqliteHelperEnv+"="+string(env))
		if err := cmds[i].Start(); err != nil {
			t.Fatalf("start helper: %v", err)
		}
	}
	if err := os.WriteFile(job.file("go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return cmds
}

// waitHelpers waits for every helper and fails the test for each that
// did not exit 0 (its output is in the test log).
func waitHelpers(t *testing.T, cmds []*exec.Cmd) {
	t.Helper()
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Errorf("helper %d: %v (its output is above)", i, err)
		}
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestSQLiteHelperProcess is the body of the helper processes; it skips
// in a normal run.
func TestSQLiteHelperProcess(t *testing.T) {
	if testdb.HelperRole() == "" {
		t.Skip("helper process only")
	}
	var job sqliteJob
	if err := json.Unmarshal([]byte(os.Getenv(sqliteHelperEnv)), &job); err != nil {
		t.Fatalf("helper process: bad %s: %v", sqliteHelperEnv, err)
	}
	// Opened without a ping: the package must cope with a busy open.
	db, err := sql.Open("sqlite", job.Path+"?"+job.Options)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	testdb.WaitFor(t, sqliteWait, func() bool { return fileExists(job.file("go")) }, "no starting gun")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	switch job.Do {
	case "exclusive":
		helpExclusive(ctx, t, db, job)
	case "own":
		helpOwnNames(ctx, t, db, job)
	case "create":
		helpCreate(ctx, t, db, job)
	case "hold":
		helpHold(ctx, t, db, job)
	case "semhold":
		helpSemaphoreHold(ctx, t, db, job)
	default:
		t.Fatalf("helper process: unknown job %q", job.Do)
	}
}

// helpExclusive alternates TryDo and Do on one name, marking entry and
// exit of the critical section in a shared log.
func helpExclusive(ctx context.Context, t *testing.T, db *sql.DB, job sqliteJob) {
	l := sqliteLock(t, db, job.Name, advisorylock.WithPollInterval(2*time.Millisecond))
	log, err := os.OpenFile(job.file("log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	pid := os.Getpid()
	mark := func(what string) {
		if _, err := log.WriteString(fmt.Sprintf("%s %d\n", what, pid)); err != nil {
			t.Fatal(err)
		}
	}
	section := func(how string) func(context.Context) error {
		return func(ctx context.Context) error {
			mark("enter-" + how)
			time.Sleep(time.Millisecond)
			if ctx.Err() != nil {
				return fmt.Errorf("lock lost inside the section: %w", context.Cause(ctx))
			}
			mark("exit")
			return nil
		}
	}
	for i := range job.Iters {
		if i%2 == 0 {
			if _, err := l.TryDo(ctx, section("try")); err != nil {
				t.Fatalf("TryDo: %v", err)
			}
		} else if err := l.Do(ctx, section("do")); err != nil {
			t.Fatalf("Do: %v", err)
		}
	}
}

// helpOwnNames hammers locks that nobody else ever takes, so every
// acquire must succeed: a "not acquired", a lost lease or an error could
// only come from SQLITE_BUSY leaking out.
func helpOwnNames(ctx context.Context, t *testing.T, db *sql.DB, job sqliteJob) {
	name := job.Name + "/" + strconv.Itoa(os.Getpid())
	ttl := advisorylock.WithLeaseTTL(job.TTL)
	held, err := sqliteLeaseLock(t, db, name+"/held", ttl).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock of the long-held lease: %v", err)
	}
	l := sqliteLock(t, db, name, ttl)
	ll := sqliteLeaseLock(t, db, name, ttl)
	n := 0
	var lastToken advisorylock.FencingToken
	for end := time.Now().Add(job.Hold); time.Now().Before(end); n++ {
		g, err := l.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock of a lock nobody else takes: %v", err)
		}
		if h, err := l.Holder(ctx); err != nil || h == nil {
			t.Fatalf("Holder of a held lock: %+v, %v", h, err)
		}
		if err := g.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		lg, err := ll.TryLock(ctx)
		if err != nil {
			t.Fatalf("LeaseLock TryLock of a lease nobody else takes: %v", err)
		}
		if lg.Lease().Token() <= lastToken { // tokens strictly increase per name (not consecutive)
			t.Fatalf("grant %d has token %d, not above the previous %d", n+1, lg.Lease().Token(), lastToken)
		}
		lastToken = lg.Lease().Token()
		if err := lg.Release(ctx); err != nil {
			t.Fatalf("LeaseLock Release: %v", err)
		}
	}
	if isClosed(held.Lease().Lost()) || isLost(held.Lease()) {
		t.Fatal("a lease held through the contention was lost")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release of the long-held lease: %v", err)
	}
	fmt.Printf("%d rounds\n", n)
}

// helpCreate is a first user of a file that has no tables yet.
func helpCreate(ctx context.Context, t *testing.T, db *sql.DB, job sqliteJob) {
	name := job.Name + "/" + strconv.Itoa(os.Getpid())
	g, err := sqliteLock(t, db, name).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lg, err := sqliteLeaseLock(t, db, name).TryLock(ctx)
	if err != nil {
		t.Fatalf("LeaseLock TryLock: %v", err)
	}
	if err := lg.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := advisorylock.NewFence(db, name); err != nil {
		t.Fatalf("NewFence: %v", err)
	}
}

// helpHold takes the lock and writes the "held" marker. With Hold > 0 it
// stays in Do that long, writes "releasing" and releases; with Hold 0 it
// waits to be killed.
func helpHold(ctx context.Context, t *testing.T, db *sql.DB, job sqliteJob) {
	l := sqliteLock(t, db, job.Name, advisorylock.WithLeaseTTL(job.TTL), advisorylock.WithOwner("helper-"+strconv.Itoa(os.Getpid())))
	err := l.Do(ctx, func(ctx context.Context) error {
		if err := os.WriteFile(job.file("held"), nil, 0o644); err != nil {
			return err
		}
		if job.Hold == 0 {
			time.Sleep(time.Hour) // until SIGKILL
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("lost while holding: %w", context.Cause(ctx))
		case <-time.After(job.Hold):
		}
		return os.WriteFile(job.file("releasing"), nil, 0o644)
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
}

// TestSQLiteLockIsExclusiveAcrossProcesses runs processes that alternate
// TryDo and Do on one name: the shared log of the critical section must
// show no overlap, and every process must have got in under Do.
func TestSQLiteLockIsExclusiveAcrossProcesses(t *testing.T) {
	testdb.Slow(t, "several processes on one SQLite file")
	t.Parallel() // files and helper processes of its own
	const procs, iters = 5, 24
	for _, j := range sqliteJournals {
		t.Run(j.name, func(t *testing.T) {
			job := sqliteJob{Do: "exclusive", Options: j.options, Name: testdb.UniqueName(t), Dir: t.TempDir(), Iters: iters}
			job.Path, _ = sqliteFile(t, j.options)
			waitHelpers(t, startHelpers(t, procs, job))

			f, err := os.Open(job.file("log"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			inside := "" // pid in the section, "" if none
			viaDo := map[string]int{}
			sections := 0
			sc := bufio.NewScanner(f)
			for line := 1; sc.Scan(); line++ {
				what, pid, _ := strings.Cut(sc.Text(), " ")
				switch {
				case strings.HasPrefix(what, "enter-") && inside == "":
					inside = pid
					sections++
					if what == "enter-do" {
						viaDo[pid]++
					}
				case what == "exit" && inside == pid:
					inside = ""
				default:
					t.Fatalf("log line %d %q: overlap (process %s is inside)", line, sc.Text(), inside)
				}
			}
			if inside != "" {
				t.Fatalf("process %s never left the section", inside)
			}
			if len(viaDo) != procs {
				t.Fatalf("%d of %d processes got the lock under Do: %v", len(viaDo), procs, viaDo)
			}
			for pid, n := range viaDo {
				if n != iters/2 {
					t.Errorf("process %s ran %d sections under Do, want %d", pid, n, iters/2)
				}
			}
			t.Logf("%d sections, none overlapping", sections)
		})
	}
}

// TestSQLiteBusyNeverSurfacesUnderContention has many processes take
// and release locks nobody else takes, with busy_timeout(0), in WAL and
// rollback-journal modes: SQLITE_BUSY is everywhere, and must never come
// out as "not acquired", "lost" or an error.
func TestSQLiteBusyNeverSurfacesUnderContention(t *testing.T) {
	testdb.Slow(t, "processes contending for one SQLite file for seconds")
	// Alone, though its files and processes are its own: a lease held
	// through the contention must be renewed within its TTL, and with the
	// fault tests beside it (in CI, with -race) the helpers went without
	// the CPU long enough to lose one, which is not what it tests.
	const procs = 6
	for _, j := range sqliteJournals {
		t.Run(j.name, func(t *testing.T) {
			job := sqliteJob{Do: "own", Options: j.options, Name: testdb.UniqueName(t), Dir: t.TempDir(), TTL: 6 * time.Second, Hold: 5 * time.Second}
			job.Path, _ = sqliteFile(t, j.options)
			waitHelpers(t, startHelpers(t, procs, job))
		})
	}
}

// TestSQLiteTablesAreCreatedConcurrentlyByProcesses starts processes at
// once on a file without tables.
func TestSQLiteTablesAreCreatedConcurrentlyByProcesses(t *testing.T) {
	testdb.Slow(t, "several processes on one SQLite file")
	t.Parallel() // files and helper processes of its own
	const procs = 6
	for _, j := range sqliteJournals {
		t.Run(j.name, func(t *testing.T) {
			job := sqliteJob{Do: "create", Path: testdb.SQLitePath(t), Options: j.options, Name: testdb.UniqueName(t), Dir: t.TempDir()}
			waitHelpers(t, startHelpers(t, procs, job))
			db := testdb.OpenSQLite(t, job.Path, "")
			var n int
			if err := db.QueryRow("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('advisorylock_locks', 'advisorylock_leases', 'advisorylock_fences')").Scan(&n); err != nil || n != 3 {
				t.Fatalf("tables: %d, %v; want 3", n, err)
			}
		})
	}
}

// TestSQLiteKilledHolderFreesTheLockAtExpiry kills a holder with SIGKILL:
// every attempt before the row's expiry must miss, and the lock must be
// free from the expiry on.
func TestSQLiteKilledHolderFreesTheLockAtExpiry(t *testing.T) {
	testdb.Slow(t, "kills a holder process, waits out its TTL")
	t.Parallel() // a file and a helper process of its own
	const ttl = 2 * time.Second
	path, db := sqliteFile(t, "")
	ctx := context.Background()
	job := sqliteJob{Do: "hold", Path: path, Name: testdb.UniqueName(t), Dir: t.TempDir(), TTL: ttl}
	l := sqliteLock(t, db, job.Name)
	cmd := startHelpers(t, 1, job)[0]
	testdb.WaitFor(t, sqliteWait, func() bool { return fileExists(job.file("held")) }, "the helper did not take the lock")

	h, err := l.Holder(ctx)
	if err != nil || h == nil || !strings.HasPrefix(h.Owner, fmt.Sprintf("helper-%d/", cmd.Process.Pid)) {
		t.Fatalf("Holder while the helper holds: %+v, %v", h, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("helper exit: %v, want killed", err)
	}
	// The dead holder renews no more: its row's expiry is final.
	var ms int64
	if err := db.QueryRow("SELECT expires_at FROM advisorylock_locks WHERE key = ?", advisorylock.Key(l.Name())).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	expiry := time.UnixMilli(ms)

	missed := 0
	deadline := time.Now().Add(sqliteWait)
	for {
		sent := time.Now()
		g, err := l.TryLock(ctx)
		returned := time.Now()
		if err == nil {
			if returned.Before(expiry) {
				t.Fatalf("acquired at %v, before the dead holder's expiry %v", returned, expiry)
			}
			mustRelease(t, g)
			break
		}
		if !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock: %v", err)
		}
		if !sent.Before(expiry) {
			t.Fatalf("TryLock sent at %v, after the expiry %v, missed", sent, expiry)
		}
		missed++
		if time.Now().After(deadline) {
			t.Fatal("the lock was never freed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if missed == 0 {
		t.Fatal("no attempt ran between the kill and the expiry; cannot tell the lock was kept until then")
	}
}

// TestSQLiteLiveHolderKeepsTheLockAcrossTTLs has a helper hold the lock
// in Do for three TTLs; renewal keeps it, so no attempt here succeeds
// until the helper is done, and its context is never cancelled.
func TestSQLiteLiveHolderKeepsTheLockAcrossTTLs(t *testing.T) {
	testdb.Slow(t, "holds a lock across several TTLs")
	t.Parallel() // a file and helper process of its own; mostly waiting
	const ttl = 2 * time.Second
	path, db := sqliteFile(t, "")
	ctx := context.Background()
	job := sqliteJob{Do: "hold", Path: path, Name: testdb.UniqueName(t), Dir: t.TempDir(), TTL: ttl, Hold: 3 * ttl}
	l := sqliteLock(t, db, job.Name)
	cmd := startHelpers(t, 1, job)[0]
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	testdb.WaitFor(t, sqliteWait, func() bool { return fileExists(job.file("held")) }, "the helper did not take the lock")
	start := time.Now()

	misses := 0
	for {
		g, err := l.TryLock(ctx)
		if err == nil {
			if !fileExists(job.file("releasing")) {
				t.Fatalf("acquired %v after the helper took the lock, while it still held it", time.Since(start))
			}
			mustRelease(t, g)
			break
		}
		if !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock: %v", err)
		}
		misses++
		select {
		case err := <-exited:
			exited <- err
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(start) > 3*ttl+sqliteWait {
			t.Fatal("the helper never released")
		}
	}
	if err := <-exited; err != nil {
		t.Fatalf("helper: %v (its output is above)", err)
	}
	t.Logf("%d attempts missed during the %v hold", misses, 3*ttl)
}
