package advisorylock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/lib/pq"
)

// Elections and semaphores on lease rows (WithLeaseRows) across
// processes behind PgBouncer, in its transaction pool (lib/pq, and pgx in
// exec mode) and in its session pool, where the result must not differ.
// The helper processes are TestElectionHelperProcess's; each records what
// it holds in a holdRecord, which this process reads directly from the
// server.

// rowsProcTTL is the lease TTL of the helper processes.
const rowsProcTTL = 2 * time.Second

// rowsProcTakeoverIn bounds a takeover after the leader's process is
// killed (or stopped). The dead leader's row expires at most rowsProcTTL
// after its last renewal, which it sent before the kill; a waiter reads
// that expiry and looks again then, or at most LeaseWaitCap later. What
// is left is a few round trips through the pooler (the waiter's acquire,
// the new leader's record and fenced write, this test's read of them
// every 50 ms at most) and a loaded 2-CPU machine's scheduling delays:
// 2 s of slack covers them many times over.
const rowsProcTakeoverIn = rowsProcTTL + advisorylock.LeaseWaitCap + 2*time.Second

// rowsSlotWork is how long a semaphore helper holds its slot each turn.
const rowsSlotWork = 300 * time.Millisecond

// TestLeaseRowsElectionAcrossProcesses: three candidate processes on rows
// behind PgBouncer elect one leader at a time. SIGKILL of the leader's
// process hands over within rowsProcTakeoverIn, and so does SIGSTOP of
// the next leader's; terms strictly increase; the Fence refuses the
// killed leader's term once the new leader has written with its own, and
// refuses the stopped leader's own write after it resumes, deposed.
func TestLeaseRowsElectionAcrossProcesses(t *testing.T) {
	testdb.Slow(t, "three candidate processes per pool; two takeovers each wait out a lease")
	t.Parallel() // names, record tables and processes of its own
	for _, p := range pooledEndpoints {
		t.Run(p.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			admin := testdb.OpenPostgres(t, "postgres")
			rec := newHoldRecord(t, admin)
			name := testdb.UniqueName(t)
			job := electionJob{Backend: p.backend(), DSN: p.dsn(t), Name: name, TTL: rowsProcTTL, Rows: true,
				Record: rec, Counter: testdb.NewCounter(t, admin, false)}
			procs := map[string]*exec.Cmd{}
			for i := range 3 {
				job.Owner = fmt.Sprintf("candidate-%d", i)
				procs[job.Owner] = startRowsHelper(t, job)
			}
			db := p.open(t)
			watcher := newElection(t, db, name, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsProcTTL))

			first := rec.nextLead(t, admin, job.Counter, 0, wait)
			if h, err := watcher.Leader(ctx); err != nil || h == nil || h.Owner != first.who || h.Token != first.term {
				t.Fatalf("Leader = %+v, %v; want %s with term %d", h, err, first.who, first.term)
			}

			// The leader's process is killed: another candidate leads
			// once its row expires.
			killed := signal(t, procs[first.who], syscall.SIGKILL)
			_ = procs[first.who].Wait()
			rec.leaveFor(t, admin, first.who)
			second := rec.nextLead(t, admin, job.Counter, first.term, rowsProcTakeoverIn)
			tookKill := second.seen.Sub(killed)

			fence := checkedFence(t, db, name)
			if err := admitOnce(ctx, db, fence, second.term); err != nil {
				t.Fatalf("Admit of the leader's term %d: %v", second.term, err)
			}
			if err := admitOnce(ctx, db, fence, first.term); !errors.Is(err, advisorylock.ErrStaleToken) {
				t.Fatalf("Admit of the killed leader's term %d after term %d wrote = %v, want ErrStaleToken", first.term, second.term, err)
			}

			// The next leader's process is stopped: the last candidate
			// leads once its row expires, and the stopped one, resumed,
			// finds its lead lost and its write with its term refused.
			stopped := signal(t, procs[second.who], syscall.SIGSTOP)
			rec.leaveFor(t, admin, second.who)
			third := rec.nextLead(t, admin, job.Counter, second.term, rowsProcTakeoverIn)
			tookStop := third.seen.Sub(stopped)
			signal(t, procs[second.who], syscall.SIGCONT)
			if got := rec.afterLoss(t, admin, second.who, second.term, wait); got != "refused" {
				t.Fatalf("the deposed leader's write with its term %d after term %d wrote: %s, want refused", second.term, third.term, got)
			}

			t.Logf("takeover after SIGKILL %v, after SIGSTOP %v (TTL %v, bound %v)", tookKill, tookStop, rowsProcTTL, rowsProcTakeoverIn)
			// Sooner than TTL/3 would be before the dead leader's row could
			// expire: it renewed at most TTL/3 before the signal, so its row
			// lived on for 2/3 TTL at least (TTL/3 more allows for a late
			// renewal).
			for _, to := range []struct {
				signal string
				took   time.Duration
			}{{"SIGKILL", tookKill}, {"SIGSTOP", tookStop}} {
				if to.took < rowsProcTTL/3 || to.took > rowsProcTakeoverIn {
					t.Errorf("takeover after %s of the leader took %v, want between %v and %v", to.signal, to.took, rowsProcTTL/3, rowsProcTakeoverIn)
				}
			}
			if third.who == first.who || third.who == second.who || second.who == first.who {
				t.Errorf("leaders %s, %s, %s: want each candidate once", first.who, second.who, third.who)
			}
			leads, most := rec.entries(t, admin)
			if most != 1 {
				t.Errorf("%d leaders at once in the record", most)
			}
			for i := 1; i < len(leads); i++ {
				if leads[i].term <= leads[i-1].term {
					t.Errorf("term %d (%s) after term %d (%s): terms must strictly increase", leads[i].term, leads[i].who, leads[i-1].term, leads[i-1].who)
				}
			}
			s, err := job.Counter.State(ctx, admin)
			if err != nil {
				t.Fatal(err)
			}
			if s.Regressions != 0 || s.MaxToken != int64(third.term) {
				t.Errorf("fence log: %d stale writes admitted, highest term written %d (want 0 and %d)", s.Regressions, s.MaxToken, third.term)
			}
		})
	}
}

// TestLeaseRowsSemaphoreAcrossProcesses: a Semaphore of 3 slots on rows
// behind PgBouncer, held by 8 processes in turn: the record never shows
// more than 3 holders at once (and shows 3, so it would have seen a
// fourth), and every process gets each of its turns.
func TestLeaseRowsSemaphoreAcrossProcesses(t *testing.T) {
	testdb.Slow(t, "eight holder processes per pool, a few seconds each")
	t.Parallel() // names, record tables and processes of its own
	const slots, procs, turns = 3, 8, 2
	for _, p := range pooledEndpoints {
		t.Run(p.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			admin := testdb.OpenPostgres(t, "postgres")
			rec := newHoldRecord(t, admin)
			name := testdb.UniqueName(t)

			// This test holds every slot until every process waits, so
			// that all of them contend from the start.
			gate, err := advisorylock.NewSemaphore(p.open(t), name, slots, advisorylock.WithLeaseRows(), advisorylock.WithLeaseTTL(rowsProcTTL))
			if err != nil {
				t.Fatalf("NewSemaphore: %v", err)
			}
			var held []*advisorylock.Guard
			for range slots {
				g, err := gate.TryAcquire(ctx)
				if err != nil {
					t.Fatalf("TryAcquire: %v", err)
				}
				held = append(held, g)
			}

			job := electionJob{Backend: p.backend(), DSN: p.dsn(t), Name: name, TTL: rowsProcTTL, Rows: true,
				Record: rec, Slots: slots, Turns: turns}
			exited := make(chan error, procs)
			for i := range procs {
				job.Owner = fmt.Sprintf("holder-%d", i)
				cmd := startRowsHelper(t, job)
				go func() { exited <- cmd.Wait() }()
			}
			testdb.WaitFor(t, wait, func() bool { return rec.count(t, admin, "ready") == procs }, "not every holder process got ready")
			for _, g := range held {
				if err := g.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
			}
			for range procs {
				select {
				case err := <-exited:
					if err != nil {
						t.Fatalf("a holder process failed: %v (its output is above)", err)
					}
				case <-ctx.Done():
					t.Fatalf("not every holder process had its %d turns", turns)
				}
			}

			entries, most := rec.entries(t, admin)
			t.Logf("%d turns, at most %d holders at once", len(entries), most)
			if most != slots {
				t.Errorf("at most %d holders at once in the record, want %d on a semaphore of %d", most, slots, slots)
			}
			perHolder := map[string]int{}
			for _, e := range entries {
				perHolder[e.who]++
			}
			if len(perHolder) != procs || len(entries) != procs*turns {
				t.Errorf("turns per holder %v, want %d holders with %d each", perHolder, procs, turns)
			}
		})
	}
}

// startRowsHelper starts a helper process on job, its role job.Owner.
func startRowsHelper(t *testing.T, job electionJob) *exec.Cmd {
	t.Helper()
	env, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	cmd := testdb.HelperCommand(t, "TestElectionHelperProcess", job.Owner, electionHelperEnv+"="+string(env))
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	return cmd
}

// signal sends sig to a helper process and returns when it did.
func signal(t *testing.T, cmd *exec.Cmd, sig syscall.Signal) time.Time {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v to helper process %d: %v", sig, cmd.Process.Pid, err)
	}
	return time.Now()
}

// recordedLead is a helper's lead that a test can check: it marks itself
// in job.Record, writes once through a Fence with its term, and leads
// until its context ends. Then, as a leader that has not noticed its loss
// would, it writes with its term once more, and records what the Fence
// said ("refused", "admitted", or the error).
func recordedLead(t *testing.T, db *sql.DB, job electionJob, owner string) func(context.Context, advisorylock.FencingToken) error {
	fence := checkedFence(t, db, job.Name)
	return func(ctx context.Context, term advisorylock.FencingToken) error {
		if err := job.Record.enter(ctx, db, owner, int64(term)); err != nil {
			return err
		}
		if err := fencedWrite(ctx, db, fence, job.Counter, term); err != nil {
			return err
		}
		<-ctx.Done()
		after, cancel := context.WithTimeout(context.WithoutCancel(ctx), testdb.DefaultWait)
		defer cancel()
		if err := job.Record.leave(after, db, owner); err != nil {
			return err
		}
		outcome := "admitted"
		if err := fencedWrite(after, db, fence, job.Counter, term); errors.Is(err, advisorylock.ErrStaleToken) {
			outcome = "refused"
		} else if err != nil {
			outcome = err.Error()
		}
		if err := job.Record.note(after, db, owner, outcome, int64(term)); err != nil {
			return err
		}
		return ctx.Err()
	}
}

// holdSlots is a semaphore helper's work: it notes that it is ready, then
// holds a slot job.Turns times, each time marked in job.Record for
// rowsSlotWork.
func holdSlots(ctx context.Context, t *testing.T, db *sql.DB, job electionJob, owner string, opts []advisorylock.Option) {
	s, err := advisorylock.NewSemaphore(db, job.Name, job.Slots, opts...)
	if err != nil {
		t.Fatalf("NewSemaphore: %v", err)
	}
	if err := s.Check(ctx); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if err := job.Record.note(ctx, db, owner, "ready", 0); err != nil {
		t.Fatal(err)
	}
	for turn := range job.Turns {
		err := s.Do(ctx, func(ctx context.Context) error {
			if err := job.Record.enter(ctx, db, owner, int64(turn+1)); err != nil {
				return err
			}
			time.Sleep(rowsSlotWork) // the work done while holding a slot
			return job.Record.leave(ctx, db, owner)
		})
		if err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
	}
}

// holdRecord is a record of who holds, kept apart from the library's
// tables: a holder marks itself in (enter) as its hold begins and out
// (leave) before it ends, and each entry logs how many were in at once,
// itself included, so that a holder too many is seen whichever of them
// entered last. Marks are a row per holder, so marking out is idempotent:
// a test marks out the holder whose process it killed or stopped, and the
// holder's own leave, once resumed, finds nothing left to do.
type holdRecord struct {
	Table string // the marks; the log is Table+"_log"
}

// newHoldRecord creates a record (its tables, under a name unique to this
// run) in db, and drops it at t.Cleanup.
func newHoldRecord(t *testing.T, db *sql.DB) *holdRecord {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := &holdRecord{Table: "hold_record_" + hex.EncodeToString(b[:])}
	for _, ddl := range []string{
		"CREATE TABLE " + r.Table + " (who text PRIMARY KEY)",
		"CREATE TABLE " + r.log() + " (seq bigserial PRIMARY KEY, who text NOT NULL, what text NOT NULL, term bigint NOT NULL, inside bigint NOT NULL)",
	} {
		if _, err := db.Exec(ddl); err != nil {
			t.Fatalf("hold record: %v", err)
		}
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS " + r.Table)
		_, _ = db.Exec("DROP TABLE IF EXISTS " + r.log())
	})
	return r
}

func (r *holdRecord) log() string { return r.Table + "_log" }

// The record's statements carry their values in their text, not as
// parameters: lib/pq sends a statement with parameters in two round trips,
// which a transaction pool may give to two server sessions.

// enter marks who in, and logs the entry with term and the holders in
// once it was: each a statement of its own, so that of two holders in at
// once the later count sees both.
func (r *holdRecord) enter(ctx context.Context, db *sql.DB, who string, term int64) error {
	if _, err := db.ExecContext(ctx, "INSERT INTO "+r.Table+" (who) VALUES ("+pq.QuoteLiteral(who)+")"); err != nil {
		return fmt.Errorf("hold record: enter: %w", err)
	}
	var inside int64
	if err := db.QueryRowContext(ctx, "SELECT count(*) FROM "+r.Table).Scan(&inside); err != nil {
		return fmt.Errorf("hold record: count: %w", err)
	}
	return r.logged(ctx, db, who, "in", term, inside)
}

// leave marks who out, if it is in.
func (r *holdRecord) leave(ctx context.Context, db *sql.DB, who string) error {
	if _, err := db.ExecContext(ctx, "DELETE FROM "+r.Table+" WHERE who = "+pq.QuoteLiteral(who)); err != nil {
		return fmt.Errorf("hold record: leave: %w", err)
	}
	return nil
}

// note logs an event other than an entry.
func (r *holdRecord) note(ctx context.Context, db *sql.DB, who, what string, term int64) error {
	return r.logged(ctx, db, who, what, term, 0)
}

func (r *holdRecord) logged(ctx context.Context, db *sql.DB, who, what string, term, inside int64) error {
	q := fmt.Sprintf("INSERT INTO %s (who, what, term, inside) VALUES (%s, %s, %d, %d)", r.log(), pq.QuoteLiteral(who), pq.QuoteLiteral(what), term, inside)
	if _, err := db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("hold record: log: %w", err)
	}
	return nil
}

// holdEntry is one entry of the record: who held, with which term
// (an Election's; a semaphore holder's turn), first seen by this test at
// seen.
type holdEntry struct {
	who  string
	term advisorylock.FencingToken
	seen time.Time
}

// nextLead waits up to within for the first lead with a term above after
// that has written through the fence into c's log, and returns it. It
// fails as soon as the record shows two leaders at once.
func (r *holdRecord) nextLead(t *testing.T, admin *sql.DB, c *testdb.Counter, after advisorylock.FencingToken, within time.Duration) holdEntry {
	t.Helper()
	var l holdEntry
	q := "SELECT who, term FROM " + r.log() + " AS l WHERE what = 'in' AND term > $1 AND EXISTS (SELECT FROM " +
		c.Table + "_writes AS w WHERE w.token = l.term) ORDER BY seq LIMIT 1"
	testdb.WaitFor(t, within, func() bool {
		if _, most := r.entries(t, admin); most > 1 {
			t.Fatalf("%d leaders at once in the record", most)
		}
		err := admin.QueryRow(q, int64(after)).Scan(&l.who, &l.term)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("hold record: %v", err)
		}
		return err == nil
	}, "no leader wrote with a term above %d", after)
	l.seen = time.Now()
	return l
}

// afterLoss waits up to within for what who's Fence said to its write
// with term after its lead ended.
func (r *holdRecord) afterLoss(t *testing.T, admin *sql.DB, who string, term advisorylock.FencingToken, within time.Duration) string {
	t.Helper()
	var what string
	testdb.WaitFor(t, within, func() bool {
		err := admin.QueryRow("SELECT what FROM "+r.log()+" WHERE who = $1 AND term = $2 AND what <> 'in'", who, int64(term)).Scan(&what)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			t.Fatalf("hold record: %v", err)
		}
		return err == nil
	}, "%s's lead of term %d did not end (or it did not write after)", who, term)
	return what
}

// leaveFor marks who out for its process, which this test killed or stopped.
func (r *holdRecord) leaveFor(t *testing.T, admin *sql.DB, who string) {
	t.Helper()
	if err := r.leave(context.Background(), admin, who); err != nil {
		t.Fatal(err)
	}
}

// count counts the log's events what.
func (r *holdRecord) count(t *testing.T, admin *sql.DB, what string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow("SELECT count(*) FROM "+r.log()+" WHERE what = $1", what).Scan(&n); err != nil {
		t.Fatalf("hold record: %v", err)
	}
	return n
}

// entries returns the record's entries in order, and the most holders in
// at once that any of them saw.
func (r *holdRecord) entries(t *testing.T, admin *sql.DB) (entries []holdEntry, most int64) {
	t.Helper()
	rows, err := admin.Query("SELECT who, term, inside FROM " + r.log() + " WHERE what = 'in' ORDER BY seq")
	if err != nil {
		t.Fatalf("hold record: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e holdEntry
		var inside int64
		if err := rows.Scan(&e.who, &e.term, &inside); err != nil {
			t.Fatalf("hold record: %v", err)
		}
		entries, most = append(entries, e), max(most, inside)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("hold record: %v", err)
	}
	return entries, most
}
