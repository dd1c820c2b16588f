package advisorylock_test

// Lock.TryDoOnce: a run key runs once across replicas and over time.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// replicasOnce has replicas call TryDoOnce(run) on name, each on a pool of
// its own, the i-th starting i*spread after the first (clocks and
// schedulers apart), with a 10 ms job; it returns how many ran it.
func replicasOnce(t *testing.T, edb electionDB, name, run string, replicas int, spread time.Duration) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	locks := make([]*advisorylock.Lock, replicas)
	for i := range locks {
		locks[i] = newLock(t, edb.open(t), name, edb.opts...)
		if err := locks[i].Check(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var fnRuns, reported atomic.Int32
	var wg sync.WaitGroup
	for i, l := range locks {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * spread) // this replica fires later
			ran, err := l.TryDoOnce(ctx, run, func(context.Context) error {
				fnRuns.Add(1)
				time.Sleep(10 * time.Millisecond) // the job
				return nil
			})
			if err != nil {
				t.Errorf("replica %d: TryDoOnce(%q): %v", i, run, err)
			}
			if ran {
				reported.Add(1)
			}
		})
	}
	wg.Wait()
	if fnRuns.Load() != reported.Load() {
		t.Fatalf("fn ran %d times but TryDoOnce reported %d runs", fnRuns.Load(), reported.Load())
	}
	return int(fnRuns.Load())
}

// TestTryDoOnceRunsARunOnceAcrossReplicas: five replicas whose calls are
// up to 300 ms apart, one run key, a 10 ms job: exactly one runs it (a
// plain TryDo runs it on several, see TestWithoutMinHoldASkewedJob...);
// the same key later: none; the next key: one.
func TestTryDoOnceRunsARunOnceAcrossReplicas(t *testing.T) {
	testdb.Slow(t, "replicas firing across several runs")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		for _, c := range []struct {
			run  string
			want int
		}{{"02:00", 1}, {"02:00", 0}, {"02:01", 1}} {
			if got := replicasOnce(t, edb, name, c.run, 5, 75*time.Millisecond); got != c.want {
				t.Fatalf("run %q: %d replicas ran it, want %d", c.run, got, c.want)
			}
		}
	})
}

// TestTryDoOnceRunsAFailedRunAgain: a run whose fn failed is not done:
// the error comes back, the next arrival runs it, and after that success
// nobody does.
func TestTryDoOnceRunsAFailedRunAgain(t *testing.T) {
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		ctx := context.Background()
		l := newLock(t, edb.open(t), testdb.UniqueName(t), edb.opts...)
		boom := errors.New("boom")
		runs := 0
		for i, want := range []struct {
			err error
			ran bool
		}{{boom, true}, {nil, true}, {nil, false}} {
			ran, err := l.TryDoOnce(ctx, "nightly", func(context.Context) error {
				runs++
				if i == 0 {
					return boom
				}
				return nil
			})
			if ran != want.ran || !errors.Is(err, want.err) {
				t.Fatalf("call %d: TryDoOnce = %v, %v; want %v, %v", i, ran, err, want.ran, want.err)
			}
		}
		if runs != 2 {
			t.Fatalf("fn ran %d times, want 2 (the failure, then its retry)", runs)
		}
	})
}

// onceHelperEnv carries a helper process's onceJob, as JSON.
const onceHelperEnv = "ADVISORYLOCK_ONCE_JOB"

// onceJob tells a once helper process which run to start.
type onceJob struct {
	Backend, DSN, Name, Run string
	TTL                     time.Duration // WithLeaseTTL (SQLite)
}

// TestOnceHelperProcess is the body of the helper processes: it starts
// the job's run and works at it until it is killed. It skips in a normal
// run.
func TestOnceHelperProcess(t *testing.T) {
	if testdb.HelperRole() == "" {
		t.Skip("helper process only")
	}
	var job onceJob
	if err := json.Unmarshal([]byte(os.Getenv(onceHelperEnv)), &job); err != nil {
		t.Fatalf("helper process: bad %s: %v", onceHelperEnv, err)
	}
	l := newLock(t, openElectionDB(t, job.Backend, job.DSN), job.Name, advisorylock.WithLeaseTTL(job.TTL))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ran, err := l.TryDoOnce(ctx, job.Run, func(ctx context.Context) error {
		<-ctx.Done() // work until killed
		return ctx.Err()
	})
	t.Fatalf("helper's TryDoOnce returned: %v, %v", ran, err)
}

// TestTryDoOnceRunsARunWhoseHolderWasKilled: a holder killed (SIGKILL of
// its process) in the middle of a run never recorded it, so the next
// arrival runs it (on PostgreSQL and MySQL as soon as the server frees
// the dead session's lock; on SQLite once its lease runs out), and the
// one after does not.
func TestTryDoOnceRunsARunWhoseHolderWasKilled(t *testing.T) {
	testdb.Slow(t, "kills a holder process, waits out its TTL")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		job, err := json.Marshal(onceJob{Backend: edb.name, DSN: edb.dsn, Name: name, Run: "deploy-42", TTL: electionSQLTTL})
		if err != nil {
			t.Fatal(err)
		}
		cmd := testdb.HelperCommand(t, "TestOnceHelperProcess", "once-holder", onceHelperEnv+"="+string(job))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		l := newLock(t, edb.open(t), name, edb.opts...)
		testdb.WaitFor(t, wait, func() bool {
			h, err := l.Holder(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return h != nil
		}, "the helper never took the lock")
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		var ran bool
		testdb.WaitFor(t, wait, func() bool {
			ran, err = l.TryDoOnce(ctx, "deploy-42", func(context.Context) error { return nil })
			if err != nil {
				t.Fatal(err)
			}
			return ran
		}, "the run of a killed holder never ran again")
		if ran, err := l.TryDoOnce(ctx, "deploy-42", func(context.Context) error { return nil }); ran || err != nil {
			t.Fatalf("after its rerun the run ran again: %v, %v", ran, err)
		}
	})
}

// TestTryDoOncePrunesRecordsPastTheRetention: recording a run deletes the
// name's records older than WithRunRetention (by the Clock on SQLite),
// after which their run keys run again; younger ones stay.
func TestTryDoOncePrunesRecordsPastTheRetention(t *testing.T) {
	testdb.Slow(t, "about 1.5 s on 2 CPUs")
	ctx := context.Background()
	clock := testdb.NewFakeClock()
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithClock(clock.Now), advisorylock.WithRunRetention(time.Minute))
	once := func(run string) bool {
		t.Helper()
		ran, err := l.TryDoOnce(ctx, run, func(context.Context) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		return ran
	}
	if !once("a") {
		t.Fatal("the first run of a did not run")
	}
	clock.Add(30 * time.Second)
	if !once("b") || once("a") {
		t.Fatal("a record younger than the retention was pruned")
	}
	clock.Add(45 * time.Second) // a is 75s old, b 45s
	if !once("c") {
		t.Fatal("c did not run")
	}
	if once("b") {
		t.Fatal("b (45s old) was pruned")
	}
	if !once("a") {
		t.Fatal("a (75s old, past the 1m retention) was not pruned")
	}
}

// TestTryDoOncePrunesByTheServersClock: on PostgreSQL and MySQL the
// records' age is the server's: a record made old on the server is
// pruned by the next record of its name, another name's is not.
func TestTryDoOncePrunesByTheServersClock(t *testing.T) {
	eachElectionDB(t, true, func(t *testing.T, edb electionDB) {
		ctx := context.Background()
		db := edb.open(t)
		name, other := testdb.UniqueName(t), testdb.UniqueName(t)
		for _, n := range []string{name, other} {
			if ran, err := newLock(t, db, n).TryDoOnce(ctx, "old", func(context.Context) error { return nil }); !ran || err != nil {
				t.Fatalf("TryDoOnce: %v, %v", ran, err)
			}
		}
		age := "UPDATE advisorylock_runs SET done_at = now() - interval '2 minutes'"
		if strings.HasPrefix(edb.name, "mysql") {
			age = "UPDATE advisorylock_runs SET done_at = UTC_TIMESTAMP(6) - INTERVAL 2 MINUTE"
		}
		if _, err := db.ExecContext(ctx, age+" WHERE run = 'old'"); err != nil {
			t.Fatal(err)
		}
		l := newLock(t, db, name, advisorylock.WithRunRetention(time.Minute))
		if ran, err := l.TryDoOnce(ctx, "new", func(context.Context) error { return nil }); !ran || err != nil {
			t.Fatalf("TryDoOnce(new): %v, %v", ran, err)
		}
		if ran, err := l.TryDoOnce(ctx, "old", func(context.Context) error { return nil }); !ran || err != nil {
			t.Fatalf("TryDoOnce(old) after its record was past the retention = %v, %v; want it run again", ran, err)
		}
		if ran, err := newLock(t, db, other, advisorylock.WithRunRetention(time.Minute)).TryDoOnce(ctx, "old", func(context.Context) error { return nil }); ran || err != nil {
			t.Fatalf("another name's old record was pruned: TryDoOnce = %v, %v", ran, err)
		}
	})
}

// TestTryDoOnceRefusesWhatCannotWork: an empty run key, a nil fn and a
// Lock with WithMinHold are refused without running; WithRunRetention
// below a minute, or given to a LeaseLock, is refused at construction.
func TestTryDoOnceRefusesWhatCannotWork(t *testing.T) {
	ctx := context.Background()
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	fn := func(context.Context) error { t.Error("fn ran"); return nil }
	if _, err := newLock(t, db, testdb.UniqueName(t)).TryDoOnce(ctx, "", fn); err == nil || !strings.Contains(err.Error(), "empty run key") {
		t.Errorf("TryDoOnce with an empty run key = %v", err)
	}
	if _, err := newLock(t, db, testdb.UniqueName(t)).TryDoOnce(ctx, "r", nil); err == nil {
		t.Error("TryDoOnce with a nil fn was accepted")
	}
	if _, err := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Second)).TryDoOnce(ctx, "r", fn); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("TryDoOnce on a WithMinHold Lock = %v, want ErrUnsupported", err)
	}
	if _, err := advisorylock.New(db, "x", advisorylock.WithRunRetention(30*time.Second)); err == nil || !strings.Contains(err.Error(), "WithRunRetention(30s)") {
		t.Errorf("WithRunRetention(30s) = %v, want refused naming it", err)
	}
	if _, err := advisorylock.NewLeaseLock(db, "x", advisorylock.WithRunRetention(time.Hour)); err == nil || !strings.Contains(err.Error(), "WithRunRetention") {
		t.Errorf("NewLeaseLock with WithRunRetention = %v, want refused", err)
	}
}

// TestTryDoOncePrunesExactlyTheRecordsPastTheRetention: with a one-hour
// retention, recording a run on PostgreSQL or MySQL deletes the name's
// records 61 and 120 minutes old (by the server's clock) and keeps those
// 30 and 59 minutes old: a sign or a unit slipped in the prune deletes
// the young or keeps the old.
func TestTryDoOncePrunesExactlyTheRecordsPastTheRetention(t *testing.T) {
	eachElectionDB(t, true, func(t *testing.T, edb electionDB) {
		ctx := context.Background()
		db := edb.open(t)
		name := testdb.UniqueName(t)
		l := newLock(t, db, name, advisorylock.WithRunRetention(time.Hour))
		ages := map[string]int{"30m": 30, "59m": 59, "61m": 61, "120m": 120} // minutes
		age := "UPDATE advisorylock_runs SET done_at = now() - $1::bigint * interval '1 minute' WHERE name = $2 AND run = $3"
		if edb.name == "mysql" {
			age = "UPDATE advisorylock_runs SET done_at = UTC_TIMESTAMP(6) - INTERVAL ? MINUTE WHERE name = ? AND run = ?"
		}
		for run, minutes := range ages {
			if ran, err := l.TryDoOnce(ctx, run, func(context.Context) error { return nil }); !ran || err != nil {
				t.Fatalf("TryDoOnce(%q): %v, %v", run, ran, err)
			}
			if _, err := db.ExecContext(ctx, age, minutes, name, run); err != nil {
				t.Fatal(err)
			}
		}
		if ran, err := l.TryDoOnce(ctx, "now", func(context.Context) error { return nil }); !ran || err != nil {
			t.Fatalf("TryDoOnce(now): %v, %v", ran, err)
		}
		if got, want := runsRecorded(t, db, edb.name, name), []string{"30m", "59m", "now"}; !slices.Equal(got, want) {
			t.Fatalf("records left after a run with a 1h retention: %q, want %q (those 61 and 120 minutes old pruned)", got, want)
		}
	})
}

// runsRecorded lists, sorted, the run keys recorded for name, read from
// advisorylock_runs.
func runsRecorded(t *testing.T, db *sql.DB, backend, name string) []string {
	t.Helper()
	q := "SELECT run FROM advisorylock_runs WHERE name = $1"
	if backend == "mysql" {
		q = "SELECT run FROM advisorylock_runs WHERE name = ?"
	}
	rows, err := db.Query(q, name)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var runs []string
	for rows.Next() {
		var run string
		if err := rows.Scan(&run); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(runs)
	return runs
}

// TestTryDoOnceRecordsARunWhoseCallerLeftAsItReturned: the caller's
// context ends as fn returns nil (a shutdown, a deadline met by the last
// statement): the run is done, so it is recorded on a context of its own,
// TryDoOnce reports it ran, and no later call runs it again.
func TestTryDoOnceRecordsARunWhoseCallerLeftAsItReturned(t *testing.T) {
	eachElectionDB(t, false, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		ctx, cancel := context.WithCancel(context.Background())
		ran, err := newLock(t, edb.open(t), name, edb.opts...).TryDoOnce(ctx, "deploy-7", func(context.Context) error {
			cancel() // the caller leaves as the work ends
			return nil
		})
		if !ran || err != nil {
			t.Fatalf("TryDoOnce whose caller left as fn returned nil = %v, %v; want true, nil (the run is done)", ran, err)
		}
		again, err := newLock(t, edb.open(t), name, edb.opts...).TryDoOnce(context.Background(), "deploy-7", func(context.Context) error { return nil })
		if again || err != nil {
			t.Fatalf("a later replica's TryDoOnce = %v, %v; want false, nil (the run was recorded done)", again, err)
		}
	})
}

// TestTryDoOnceBoundsTheRecordByTheReleaseTimeout: the record is written
// on a context of its own, but a bounded one: where its statement waits
// (here on another transaction's uncommitted record of the same run),
// TryDoOnce returns within WithReleaseTimeout an error saying the run
// may run again, instead of holding the lock for as long as the wait.
func TestTryDoOnceBoundsTheRecordByTheReleaseTimeout(t *testing.T) {
	eachElectionDB(t, true, func(t *testing.T, edb electionDB) {
		ctx := context.Background()
		db := edb.open(t)
		name := testdb.UniqueName(t)
		l := newLock(t, db, name, advisorylock.WithReleaseTimeout(300*time.Millisecond))
		if err := l.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if ran, err := l.TryDoOnce(ctx, "warm-up", func(context.Context) error { return nil }); !ran || err != nil {
			t.Fatalf("TryDoOnce(warm-up): %v, %v", ran, err) // creates the table
		}
		blocker, err := edb.open(t).BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer blocker.Rollback()
		insert := "INSERT INTO advisorylock_runs (name, run, done_at) VALUES ($1, 'blocked', now())"
		if edb.name == "mysql" {
			insert = "INSERT INTO advisorylock_runs (name_hash, run_hash, name, run, done_at) VALUES (UNHEX(SHA2(?, 256)), UNHEX(SHA2('blocked', 256)), ?, 'blocked', UTC_TIMESTAMP(6))"
		}
		args := []any{name}
		if edb.name == "mysql" {
			args = append(args, name)
		}
		if _, err := blocker.ExecContext(ctx, insert, args...); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := l.TryDoOnce(ctx, "blocked", func(context.Context) error { return nil })
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "may run again") {
				t.Fatalf("TryDoOnce whose record waited = %v, want an error saying the run may run again", err)
			}
			t.Logf("the record's wait ended after %v", time.Since(start))
		case <-time.After(10 * time.Second):
			_ = blocker.Rollback() // let the stuck call end
			<-done
			t.Fatal("TryDoOnce waited for its record 10s past a 300ms release timeout")
		}
	})
}

// A burst of TryDoOnce calls on a small pool, each holding its lock's
// connection while its run record is read on another, does not hang until
// the callers' contexts end: the record's checkout waits at most
// WithPoolWait, as a try's does, so a call that finds the pool taken by
// the other holders returns ErrPoolUnavailable and lets its lock go.
func TestTryDoOnceBurstOnASmallPoolDoesNotHang(t *testing.T) {
	t.Parallel()
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(2)
			base := testdb.UniqueName(t)
			if _, err := newLock(t, db, base).TryDoOnce(context.Background(), "warm", func(context.Context) error { return nil }); err != nil {
				t.Fatal(err) // the tables exist before the burst
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			const callers = 16
			errs := make(chan error, callers)
			for i := range callers {
				// Pinned: each holds a connection of its own, so the burst
				// takes the whole pool (shared sessions leave it one).
				l := newLock(t, db, base+"/"+strconv.Itoa(i), advisorylock.WithPoolWait(200*time.Millisecond), pinned)
				go func() {
					_, err := l.TryDoOnce(ctx, "run", func(context.Context) error { return nil })
					errs <- err
				}()
			}
			for range callers {
				if err := <-errs; err != nil && !errors.Is(err, advisorylock.ErrPoolUnavailable) {
					t.Fatalf("a TryDoOnce of the burst: %v, want nil or ErrPoolUnavailable (a hang ends with the caller's context)", err)
				}
			}
		})
	}
}
