package advisorylock_test

// The tests in this file put the library through what production does to
// it: load from several processes, killed sessions, a server restart and
// network cuts. Each ends with the leak checks of checkLeaks: no lock of
// its own left held, no connection left checked out, no lease row left
// held, no goroutine left running.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// faultJobEnv carries a helper process's faultJob, as JSON.
const faultJobEnv = "ADVISORYLOCK_FAULT_JOB"

// faultJob tells a helper process what load to run.
type faultJob struct {
	Kind       string // "lock" (Lock.Do) or "lease" (LeaseLock.Do with fenced writes)
	Driver     string // "postgres", "pgx" or "sqlite"
	SQLite     string // the SQLite file and its DSN options
	MySQL      string // the MySQL DSN, for Driver "mysql"
	Counter    testdb.Counter
	Name       string // the lock's name, also the fenced resource
	Goroutines int
	Iters      int
}

// sqliteLoadOptions makes SQLite wait for its writer lock instead of
// failing, and begins transactions IMMEDIATE (as Fence.Admit advises).
const sqliteLoadOptions = "_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_txlock=immediate"

// open opens the job's database.
func (j faultJob) open(t testing.TB) *sql.DB {
	switch j.Driver {
	case "sqlite":
		return testdb.OpenSQLite(t, j.SQLite, sqliteLoadOptions)
	case "mysql":
		return testdb.OpenMySQLDSN(t, j.MySQL)
	}
	return testdb.OpenPostgres(t, j.Driver)
}

// TestFaultHelperProcess is the body of the helper processes of
// TestMutualExclusionUnderLoad; it skips in a normal run.
func TestFaultHelperProcess(t *testing.T) {
	if testdb.HelperRole() == "" {
		t.Skip("helper process only")
	}
	var job faultJob
	if err := json.Unmarshal([]byte(os.Getenv(faultJobEnv)), &job); err != nil {
		t.Fatalf("helper process: bad %s: %v", faultJobEnv, err)
	}
	db := job.open(t)
	db.SetMaxOpenConns(job.Goroutines + 2) // every waiter pins one; the holder needs one more for its work
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	section, err := job.section(db)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range job.Goroutines {
		wg.Go(func() {
			for i := range job.Iters {
				if err := section(ctx); err != nil {
					t.Errorf("section %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// section returns one run of the job's critical section under its lock.
func (j faultJob) section(db *sql.DB) (func(ctx context.Context) error, error) {
	c := &j.Counter
	poll := advisorylock.WithPollInterval(5 * time.Millisecond)
	if j.Kind == "lock" {
		l, err := advisorylock.New(db, j.Name, poll)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			return l.Do(ctx, func(ctx context.Context) error {
				return counted(ctx, c, db, func() error { return c.Bump(ctx, db) })
			})
		}, nil
	}
	l, err := advisorylock.NewLeaseLock(db, j.Name, poll)
	if err != nil {
		return nil, err
	}
	f, err := advisorylock.NewFence(db, j.Name)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return l.Do(ctx, func(ctx context.Context, lease advisorylock.Lease) error {
			return counted(ctx, c, db, func() error {
				return fencedWrite(ctx, db, f, c, lease.Token())
			})
		})
	}, nil
}

// counted runs work between the counter's entry and exit marks, and fails
// if another holder was inside at the same time.
func counted(ctx context.Context, c *testdb.Counter, db *sql.DB, work func() error) error {
	marks := context.WithoutCancel(ctx) // the marks must land (or fail) whole, even as the load stops
	inside, err := c.Enter(marks, db)
	if err != nil {
		return err
	}
	werr := work()
	if err := c.Exit(marks, db); err != nil {
		return err
	}
	if inside != 1 {
		return fmt.Errorf("%d holders inside the critical section at once", inside)
	}
	return werr
}

// fencedWrite bumps the counter and logs the write in one transaction
// that Fence.Admit opens with the token: a stale token rolls it back.
// With a nil counter the transaction only passes token through f.
func fencedWrite(ctx context.Context, db *sql.DB, f *advisorylock.Fence, c *testdb.Counter, token advisorylock.FencingToken) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := f.Admit(ctx, tx, token); err != nil {
		return err
	}
	if c == nil {
		return tx.Commit()
	}
	if err := c.Bump(ctx, tx); err != nil {
		return err
	}
	if err := c.Record(ctx, tx, int64(token)); err != nil {
		return err
	}
	return tx.Commit()
}

// TestMutualExclusionUnderLoad runs a non-atomic read-modify-write of one
// counter row from several processes, each with several goroutines, under
// Lock.Do and under LeaseLock.Do with fenced writes, on PostgreSQL (lib/pq
// and pgx processes mixed) and on one SQLite file. The count must be exact,
// no two holders may ever be inside at once, every grant of the lease gets
// its own token, and the fence log never goes back in token order.
func TestMutualExclusionUnderLoad(t *testing.T) {
	testdb.Slow(t, "fault: several processes under load")
	t.Parallel()
	const procs, goroutines = 3, 4
	for _, tc := range []struct {
		name, kind string
		sqlite     bool
		iters      int
	}{
		{"postgres/Lock", "lock", false, 15},
		{"postgres/LeaseLock", "lease", false, 6},
		{"sqlite/Lock", "lock", true, 8},
		{"sqlite/LeaseLock", "lease", true, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testdb.CheckGoroutines(t)
			job := faultJob{Kind: tc.kind, Name: testdb.UniqueName(t), Goroutines: goroutines, Iters: tc.iters}
			var admin *sql.DB
			if tc.sqlite {
				job.SQLite = testdb.SQLitePath(t)
				admin = testdb.OpenSQLite(t, job.SQLite, sqliteLoadOptions)
			} else {
				admin = testdb.OpenPostgres(t, "postgres")
			}
			job.Counter = *testdb.NewCounter(t, admin, tc.sqlite)
			cmds := make([]*exec.Cmd, procs)
			for i := range cmds {
				job.Driver = "sqlite"
				if !tc.sqlite {
					job.Driver = testdb.Drivers[i%len(testdb.Drivers)]
				}
				env, err := json.Marshal(job)
				if err != nil {
					t.Fatal(err)
				}
				cmds[i] = testdb.HelperCommand(t, "TestFaultHelperProcess", fmt.Sprintf("%s-%d", job.Driver, i), faultJobEnv+"="+string(env))
				if err := cmds[i].Start(); err != nil {
					t.Fatalf("start helper: %v", err)
				}
			}
			for i, c := range cmds {
				if err := c.Wait(); err != nil {
					t.Errorf("helper %d: %v (its output is above)", i, err)
				}
			}
			ctx := context.Background()
			s, err := job.Counter.State(ctx, admin)
			if err != nil {
				t.Fatal(err)
			}
			want := int64(procs * goroutines * tc.iters)
			if s.N != want || s.Violations != 0 || s.Holders != 0 {
				t.Fatalf("counter %d (want %d), %d overlapping holders seen, %d inside at the end", s.N, want, s.Violations, s.Holders)
			}
			if tc.kind == "lease" {
				var distinct int64
				q := "SELECT count(DISTINCT token) FROM " + job.Counter.Table + "_writes"
				if err := admin.QueryRowContext(ctx, q).Scan(&distinct); err != nil {
					t.Fatal(err)
				}
				if s.Writes != want || distinct != want || s.Regressions != 0 {
					t.Fatalf("fence log: %d writes, %d distinct tokens (want %d each), %d stale writes admitted", s.Writes, distinct, want, s.Regressions)
				}
				if top := fenceToken(t, admin, tc.sqlite, job.Name); top != s.MaxToken {
					t.Fatalf("fence keeps token %d, the highest write was %d", top, s.MaxToken)
				}
			}
			checkLeaks(t, leakCheck{db: admin, sqlite: tc.sqlite, locks: lockNames(tc.kind, job.Name), leases: leaseNames(tc.kind, job.Name)})
		})
	}
}

func lockNames(kind, name string) []string {
	if kind == "lock" {
		return []string{name}
	}
	return nil
}

func leaseNames(kind, name string) []string {
	if kind == "lease" {
		return []string{name}
	}
	return nil
}

// placeholder is the first bind parameter in the dialect.
func placeholder(sqlite bool) string {
	if sqlite {
		return "?"
	}
	return "$1"
}

// fenceToken reads the highest token a fence admitted.
func fenceToken(t testing.TB, db *sql.DB, sqlite bool, resource string) int64 {
	t.Helper()
	var top int64
	q := "SELECT token FROM advisorylock_fences WHERE resource = " + placeholder(sqlite)
	if err := db.QueryRow(q, resource).Scan(&top); err != nil {
		t.Fatalf("reading fence %q: %v", resource, err)
	}
	return top
}

// leakCheck names what a scenario may have left behind.
type leakCheck struct {
	db     *sql.DB // a handle that saw none of the faults
	sqlite bool
	locks  []string  // Lock names
	leases []string  // LeaseLock names
	pools  []*sql.DB // handles whose connections must all be back
	within time.Duration
}

// checkLeaks waits (within c.within, default 30s) until no Lock of c.locks
// is held (a PostgreSQL advisory lock, a SQLite lock row), no LeaseLock of
// c.leases is held unexpired, and no connection of c.pools (and c.db) is
// checked out; it fails t if that does not happen.
func checkLeaks(t *testing.T, c leakCheck) {
	t.Helper()
	within := c.within
	if within <= 0 {
		within = wait
	}
	ph := placeholder(c.sqlite)
	for _, name := range c.locks {
		if c.sqlite {
			testdb.WaitFor(t, within, func() bool {
				return countRows(t, c.db, "SELECT count(*) FROM advisorylock_locks WHERE key = "+ph, advisorylock.Key(name)) == 0
			}, "SQLite lock %q left held", name)
			continue
		}
		testdb.WaitFor(t, within, func() bool { return locksHeld(t, c.db, name) == 0 }, "advisory lock %q left held", name)
	}
	for _, name := range c.leases {
		held := func() int {
			if c.sqlite { // lease times are Unix milliseconds of the host's clock
				return countRows(t, c.db, "SELECT count(*) FROM advisorylock_leases WHERE name = ? AND owner IS NOT NULL AND expires_at > ?", name, time.Now().UnixMilli())
			}
			return countRows(t, c.db, "SELECT count(*) FROM advisorylock_leases WHERE name = $1 AND owner IS NOT NULL AND expires_at > now()", name)
		}
		testdb.WaitFor(t, within, func() bool { return held() == 0 }, "lease %q left held", name)
	}
	for i, p := range append(slices.Clone(c.pools), c.db) {
		testdb.WaitFor(t, within, func() bool { return p.Stats().InUse == 0 }, "pool %d: %d connections left checked out", i, p.Stats().InUse)
	}
}

func countRows(t testing.TB, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// figures counts what a load did; the soak prints them.
type figures struct {
	ops          atomic.Int64 // Do calls made
	acquired     atomic.Int64 // Do calls that got the lock and ran fn
	losses       atomic.Int64 // Do calls that reported the lock or lease lost
	errs         atomic.Int64 // Do calls that failed otherwise (a killed waiter, a dead connection)
	faults       atomic.Int64 // faults injected
	violations   atomic.Int64 // safety violations: must stay 0
	writes       atomic.Int64 // fenced writes committed
	staleRefused atomic.Int64 // fenced writes refused with a stale token
	lateAdmitted atomic.Int64 // writes after a lost lease that no newer token had yet overtaken

	mu      sync.Mutex
	latency []time.Duration // from each Do call to its fn starting
	errLog  map[string]int  // the first words of unexpected errors, for the report
}

// outcome counts how a Do call ended, and reports whether it ended in a
// loss; lost says the lock was lost (fn may have returned an error of its
// own for it).
func (f *figures) outcome(ctx context.Context, err error, lost bool) bool {
	f.ops.Add(1)
	switch {
	case err == nil:
	case lost || errors.Is(err, advisorylock.ErrLockLost): // a lease's loss too
		f.losses.Add(1)
		return true
	case ctx.Err() != nil: // the load is stopping
	default:
		f.errs.Add(1)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.errLog == nil {
			f.errLog = map[string]int{}
		}
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 && len(msg)-i < 80 {
			msg = msg[i+2:]
		}
		f.errLog[msg]++
	}
	return false
}

func (f *figures) acquiredAfter(d time.Duration) {
	f.acquired.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latency = append(f.latency, d)
}

// percentile returns the p-th percentile (0 < p <= 1) of acquire latency.
func (f *figures) percentile(p float64) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.latency) == 0 {
		return 0
	}
	l := slices.Clone(f.latency)
	slices.Sort(l)
	return l[min(len(l)-1, int(p*float64(len(l))))]
}

func (f *figures) String() string {
	f.mu.Lock()
	errLog := fmt.Sprint(f.errLog)
	f.mu.Unlock()
	return fmt.Sprintf("operations %d, locks acquired %d, losses detected %d, other errors %d, faults injected %d, violations %d, "+
		"fenced writes %d (stale refused %d, late admitted %d), acquire latency p50 %v p99 %v; errors seen: %s",
		f.ops.Load(), f.acquired.Load(), f.losses.Load(), f.errs.Load(), f.faults.Load(), f.violations.Load(),
		f.writes.Load(), f.staleRefused.Load(), f.lateAdmitted.Load(),
		f.percentile(0.5).Round(10*time.Microsecond), f.percentile(0.99).Round(10*time.Microsecond), errLog)
}

// sections records the critical sections run under one lock name in
// this process and catches two running at once. An overlap is a violation
// unless the older holder had been told of its loss before the newer one
// was granted, by timestamps: told is when Do's context was cancelled for
// a loss, (a lease) when its Lost first read closed, or (a Lock) when its
// Do returned an error; granted is the lease row's acquired_at where
// grantedAt can read it, else when fn started. A session lock is the one
// exception the server makes unavoidable: when a fault ends the holder's
// server session (a terminated backend, a reset connection) the server
// frees the lock at once and the holder learns of it only at its next
// keep-alive, or when its Do ends. Such an overlap is excused if a
// session-ending fault came before the newer grant and the older holder
// was told within noticeWithin of it. Which of two session locks' grants
// is older is not known from their sections (a grant's fn may start late:
// a statement batched after it, a busy machine), so such an overlap is
// also excused the other way round: the section entered second was
// granted first, lost with its session before the other's grant, and told
// within noticeWithin (the history check, which knows no entry order,
// agrees).
type sections struct {
	name         string
	figs         *figures
	log          func(format string, args ...any)
	noticeWithin time.Duration                              // 0: no session-ending faults are injected
	grantedAt    func(advisorylock.Lease) (time.Time, bool) // the database's grant time, if it has one
	mu           sync.Mutex
	inside       map[*section]struct{}
	pairs        [][2]*section // (entered first, entered second)
	ended        []time.Time   // session-ending faults, when injected
	excusedPairs int           // overlaps settle excused: the older holder was told in time
	hist         history       // history hook: every Do call and fenced write (history_test.go)
}

// section is one run of fn.
type section struct {
	lease   *advisorylock.Lease       // nil for a session lock
	term    advisorylock.FencingToken // an election's term (enterTerm); 0 otherwise
	granted time.Time
	told    atomic.Int64 // unix nanoseconds when the holder was told of a loss; 0 if never
	done    chan struct{}
	// history hook (history_test.go): when fn started and returned.
	entered, exited time.Time
	who             string // the holder, for a violation's report (set by the caller after enter)
	unknown         bool   // a lease whose grant the row did not show as it entered (see grantedAt)
}

func newSections(name string, figs *figures, log func(string, ...any)) *sections {
	return &sections{name: name, figs: figs, log: log, inside: map[*section]struct{}{}}
}

// sessionFaults excuses overlaps after faults that end a holder's server
// session (see sections), if the holder is told within d of the fault.
func (s *sections) sessionFaults(d time.Duration) *sections {
	s.noticeWithin = d
	return s
}

// fault records a session-ending fault injected now.
func (s *sections) fault() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended = append(s.ended, time.Now())
}

// tellOnLoss calls tell when fctx ends for the loss of its lock (cause
// ErrLockLost, a lease's loss too): at once if it already has (lost
// before the section began: told now, not when AfterFunc's goroutine
// runs), else from AfterFunc, whose stop it returns.
func tellOnLoss(fctx context.Context, tell func()) (stop func() bool) {
	told := func() {
		if errors.Is(context.Cause(fctx), advisorylock.ErrLockLost) {
			tell()
		}
	}
	if fctx.Err() != nil {
		told()
	}
	return context.AfterFunc(fctx, told)
}

// enter records a section starting now in fn, whose context is fctx;
// call exit when fn returns.
func (s *sections) enter(fctx context.Context, lease *advisorylock.Lease) *section {
	now := time.Now()
	sec := &section{lease: lease, granted: now, entered: now, done: make(chan struct{})}
	tellOnLoss(fctx, sec.tell)
	if lease != nil {
		go sec.watchLease()
	}
	s.mu.Lock()
	overlap := len(s.inside) > 0
	for o := range s.inside {
		s.pairs = append(s.pairs, [2]*section{o, sec})
	}
	s.inside[sec] = struct{}{}
	s.mu.Unlock()
	if overlap && lease != nil && s.grantedAt != nil {
		at, ok := s.grantedAt(*lease)
		s.mu.Lock()
		if ok && at.Before(sec.granted) {
			sec.granted = at
		}
		sec.unknown = !ok
		s.mu.Unlock()
	}
	return sec
}

// enterTerm records a leader's term starting now in lead, whose context
// is lctx; call exit when lead returns. A term is a grant whose token is
// the term, as a lease's is its token.
func (s *sections) enterTerm(lctx context.Context, term advisorylock.FencingToken) *section {
	sec := s.enter(lctx, nil)
	s.mu.Lock()
	sec.term = term
	s.mu.Unlock()
	return sec
}

// token returns the grant's token: the lease's, the term, or 0 for a
// session lock.
func (sec *section) token() int64 {
	if sec.lease != nil {
		return int64(sec.lease.Token())
	}
	return int64(sec.term)
}

// tell records the first time the holder was told of its loss.
func (sec *section) tell() { sec.told.CompareAndSwap(0, time.Now().UnixNano()) }

// watchLease notes when the lease first reads lost (its Lost channel
// reads closed from the local deadline on, even before a goroutine of
// the library notices), until the section ends.
func (sec *section) watchLease() {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if isLost(*sec.lease) {
			sec.tell()
			return
		}
		select {
		case <-sec.done:
			return
		case <-tick.C:
		}
	}
}

func (s *sections) exit(sec *section) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inside, sec)
	close(sec.done)
	sec.exited = time.Now() // history hook
}

// settle counts the violations; call it once every Do has returned.
func (s *sections) settle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pairs {
		older, newer := p[0], p[1]
		if newer.token() < older.token() {
			older, newer = newer, older
		}
		// A session lock's grants are not ordered by their sections:
		// the one entered second may have been granted first, lost with
		// its session, and started fn only after the other's grant.
		if s.excused(older, newer) || older.token() == 0 && s.excused(newer, older) {
			s.excusedPairs++
			continue
		}
		s.figs.violations.Add(1)
		told := "never told"
		if n := older.told.Load(); n != 0 {
			told = fmt.Sprintf("told %v after", time.Unix(0, n).Sub(newer.granted))
		}
		if older.token() != 0 {
			s.log("VIOLATION: %q: grant %d while grant %d was held and its holder did not know it lost it (%s)",
				s.name, newer.token(), older.token(), told)
		} else {
			s.log("VIOLATION: %q: a section entered while another held the lock and its holder did not know it lost it (%s)", s.name, told)
		}
		s.log("  older: %s, in %v, out %v after the newer's grant; newer: %s, in %v, %s; session-ending faults %v before the newer's grant",
			older.holder(), older.entered.Format("15:04:05.000"), older.exited.Sub(newer.granted), newer.holder(),
			newer.entered.Format("15:04:05.000"), newer.toldAfter(), s.faultsBefore(newer.granted))
	}
	s.pairs = nil
}

// checkCounter checks, once the sections have settled, the counter that
// lockDoWorker's sections marked and bumped through db: nobody left
// inside, and no overlap or lost bump the sections did not excuse. A
// lease-row Lock's holder told of its loss (a renewal starved past the
// local deadline) may still be inside when its successor enters; the
// sections excuse that by timestamps, so the counter may show as many
// overlaps as they excused, and lose at most one bump to each.
func (s *sections) checkCounter(t *testing.T, what string, c *testdb.Counter, db *sql.DB, bumps int64) {
	t.Helper()
	st, err := c.State(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	excused := int64(s.excusedPairs)
	s.mu.Unlock()
	if st.Holders != 0 || st.Violations > excused || st.N > bumps || st.N < bumps-st.Violations {
		s.figs.violations.Add(1)
		t.Logf("VIOLATION: %s counter %d after %d bumps; %d overlapping holders seen (%d excused), %d inside at the end",
			what, st.N, bumps, st.Violations, excused, st.Holders)
	} else if st.Violations != 0 {
		t.Logf("%s counter: %d overlaps, each after the older holder was told of its loss", what, st.Violations)
	}
}

// holder names the section's holder where its caller said (who).
func (sec *section) holder() string {
	if sec.who == "" {
		return "a holder"
	}
	return sec.who
}

// toldAfter says when the holder was told of a loss, from its grant, and
// whether the row showed that grant as the holder entered.
func (sec *section) toldAfter() string {
	told := "never told"
	if n := sec.told.Load(); n != 0 {
		told = fmt.Sprintf("told %v after its grant", time.Unix(0, n).Sub(sec.granted))
	}
	if sec.unknown {
		told += " (the row did not show its grant as it entered)"
	}
	return told
}

// faultsBefore lists how long before t each session-ending fault came.
// s.mu is held.
func (s *sections) faultsBefore(t time.Time) []time.Duration {
	var d []time.Duration
	for _, f := range s.ended {
		if !f.After(t) {
			d = append(d, t.Sub(f).Round(time.Millisecond))
		}
	}
	return d
}

// excused reports whether the older holder was told before the newer
// grant, or (a session lock) soon enough after a fault that ended its
// session.
func (s *sections) excused(older, newer *section) bool {
	n := older.told.Load()
	if n == 0 {
		return false
	}
	told := time.Unix(0, n)
	if !told.After(newer.granted) {
		return true
	}
	if older.token() != 0 {
		return false
	}
	for _, f := range s.ended {
		if !f.After(newer.granted) && !told.After(f.Add(s.noticeWithin)) {
			return true
		}
	}
	return false
}

// sessionWorker runs Lock.Do on l until ctx ends, holding the lock for
// hold() in each section (or until the lock is lost).
func sessionWorker(ctx context.Context, l *advisorylock.Lock, secs *sections, figs *figures, hold func() time.Duration, w *pgWorker) {
	for ctx.Err() == nil {
		w.waitResumed(ctx)
		start := time.Now()
		var sec *section
		err := l.Do(ctx, func(fctx context.Context) error {
			figs.acquiredAfter(time.Since(start))
			sec = secs.enter(fctx, nil)
			defer secs.exit(sec)
			w.entered()
			defer w.exited()
			t := time.NewTimer(hold())
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-fctx.Done():
				return context.Cause(fctx)
			}
		})
		if sec != nil && err != nil {
			// A section shorter than a keep-alive interval ends before the
			// check could tell it; Do's error (its release found the
			// session gone) is the first word it gets.
			sec.tell()
		}
		secs.record(start, sec) // history hook
		w.outcome(figs.outcome(ctx, err, false))
	}
}

// leaseWorker runs LeaseLock.Do on l until ctx ends; each section makes
// a few fenced writes through db, and holds the lease for hold() (or
// until lost). After a lost lease it writes once more with the lost
// token, as a holder that never looked would: the fence must refuse that
// write once a newer token has written.
func leaseWorker(ctx context.Context, l *advisorylock.LeaseLock, f *advisorylock.Fence, db *sql.DB, c *testdb.Counter, secs *sections, figs *figures, hold func() time.Duration, w *pgWorker) {
	for ctx.Err() == nil {
		w.waitResumed(ctx)
		start := time.Now()
		var held *advisorylock.Lease
		var sec *section
		section := func(fctx context.Context, lease advisorylock.Lease) error {
			figs.acquiredAfter(time.Since(start))
			held = &lease
			sec = secs.enter(fctx, &lease)
			defer secs.exit(sec)
			w.entered()
			defer w.exited()
			for range 3 {
				began := time.Now()
				err := figs.fenced(fctx, db, f, c, lease.Token())
				secs.wrote(lease.Token(), began, err) // history hook
				if err != nil {
					return err
				}
				time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
			}
			t := time.NewTimer(hold())
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-fctx.Done():
				return context.Cause(fctx)
			}
		}
		var err error
		if w.tries() {
			// A job that skips a run when the lease is held (cron-like)
			// tries again and again, so it also tries while a holder's
			// lease is close to its expiry.
			var ran bool
			if ran, err = l.TryDo(ctx, section); !ran && err == nil {
				secs.record(start, nil) // history hook
				time.Sleep(rand.N(30 * time.Millisecond))
				continue
			}
		} else {
			err = l.Do(ctx, section)
		}
		secs.record(start, sec) // history hook
		lost := held != nil && isLost(*held) && err != nil
		w.outcome(figs.outcome(ctx, err, lost))
		if lost {
			late, cancel := context.WithTimeout(context.Background(), wait)
			began := time.Now()
			err := figs.fenced(late, db, f, c, held.Token())
			secs.wrote(held.Token(), began, err) // history hook
			if err == nil {
				figs.lateAdmitted.Add(1)
				figs.writes.Add(-1)
			}
			cancel()
		}
	}
}

// fenced makes one fenced write and counts its outcome.
func (f *figures) fenced(ctx context.Context, db *sql.DB, fence *advisorylock.Fence, c *testdb.Counter, token advisorylock.FencingToken) error {
	err := fencedWrite(ctx, db, fence, c, token)
	switch {
	case err == nil:
		f.writes.Add(1)
	case errors.Is(err, advisorylock.ErrStaleToken):
		f.staleRefused.Add(1)
	}
	return err
}

// holdBriefly holds a lock for up to 20ms, and one time in four for
// 300-600ms, long enough for a keep-alive of 200ms to notice a fault.
func holdBriefly() time.Duration {
	if rand.IntN(4) == 0 {
		return 300*time.Millisecond + rand.N(300*time.Millisecond)
	}
	return rand.N(20 * time.Millisecond)
}

// appName returns an application_name unique to this run, by which a
// test finds its own sessions and no one else's.
func appName() string {
	return fmt.Sprintf("advisorylock-fault-%08x", rand.Uint32())
}

// killOne terminates one random session named app that holds or waits
// for one of the named locks, and reports whether it was a holder.
func killOne(ctx context.Context, admin *sql.DB, app string, names []string) (killed, holder bool, err error) {
	var match []string
	for _, n := range names {
		k := uint64(advisorylock.Key(n))
		match = append(match, fmt.Sprintf("(l.classid = %d AND l.objid = %d)", k>>32, k&0xFFFFFFFF))
	}
	q := fmt.Sprintf(`SELECT pg_terminate_backend(l.pid), l.granted FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND a.application_name = '%s' AND (%s)
ORDER BY random() LIMIT 1`, app, strings.Join(match, " OR "))
	err = admin.QueryRowContext(ctx, q).Scan(&killed, &holder)
	if errors.Is(err, sql.ErrNoRows) {
		return false, false, nil
	}
	return killed, holder, err
}

// waitGroupWithin waits for wg, failing t if that takes longer than d:
// something hung.
func waitGroupWithin(t *testing.T, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s still running after %v: something hangs", what, d)
	}
}

// TestKilledSessionsUnderLoad terminates random holders and waiters (only
// sessions of this test, found by their application_name and lock keys)
// while workers on lib/pq and pgx take two locks with Lock.Do. Nothing may
// hang, no two sections may hold one lock at once unless the first was
// told of its loss, and afterwards no lock is held and no connection is
// checked out.
func TestKilledSessionsUnderLoad(t *testing.T) {
	testdb.Slow(t, "fault: sessions killed under load")
	t.Parallel()
	testdb.CheckGoroutines(t)
	app := appName()
	admin := testdb.OpenPostgres(t, "postgres")
	names := []string{testdb.UniqueName(t), testdb.UniqueName(t)}
	figs := &figures{}
	secs := map[string]*sections{}
	for _, n := range names {
		secs[n] = newSections(n, figs, t.Logf).sessionFaults(3 * time.Second)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	var pools []*sql.DB
	for _, drv := range testdb.Drivers {
		db := testdb.OpenPostgresDSN(t, drv, testdb.WithParam(testdb.PostgresDSN(t), "application_name", app))
		pools = append(pools, db)
		for i := range 3 {
			name := names[i%len(names)]
			l := newLock(t, db, name, advisorylock.WithKeepAlive(200*time.Millisecond), advisorylock.WithReleaseTimeout(2*time.Second))
			wg.Go(func() { sessionWorker(ctx, l, secs[name], figs, holdBriefly, nil) })
		}
	}
	var holders, waiters int
	deadline := time.Now().Add(60 * time.Second)
	for holders < 5 || waiters < 5 || figs.losses.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("not enough happened in time: %d holders and %d waiters killed; %s", holders, waiters, figs)
		}
		time.Sleep(20*time.Millisecond + rand.N(40*time.Millisecond))
		for _, s := range secs {
			s.fault() // a little early if nobody is killed: an excuse no longer than the real one
		}
		killed, holder, err := killOne(ctx, admin, app, names)
		if err != nil {
			t.Fatal(err)
		}
		if killed {
			figs.faults.Add(1)
			if holder {
				holders++
			} else {
				waiters++
			}
		}
	}
	stop()
	waitGroupWithin(t, &wg, wait, "workers")
	for _, s := range secs {
		s.settle()
	}
	checkHistory(t, secs[names[0]], secs[names[1]]) // history hook
	t.Logf("%d holders and %d waiters killed; %s", holders, waiters, figs)
	if v := figs.violations.Load(); v != 0 {
		t.Fatalf("%d violations of mutual exclusion", v)
	}
	if figs.acquired.Load() == 0 {
		t.Fatal("no section ran")
	}
	checkLeaks(t, leakCheck{db: admin, locks: names, pools: pools})
}

// quiet discards the library's warnings (lock lost, release failed),
// which the fault tests provoke by the hundred.
var quiet = advisorylock.WithLogger(slog.New(slog.DiscardHandler))

// TestServerRestart restarts a private PostgreSQL while Lock guards and
// leases are held and waiters wait, on lib/pq and pgx. Every session guard
// reports the loss, every waiter returns (with an error, or holding the
// lock after the restart), nothing hangs, the pools recover and new
// acquisitions work. Then an outage longer than the lease TTL: every held
// lease is lost while the server is down, a successor gets a larger token
// after the restart, and the fence refuses the lost holder's writes.
func TestServerRestart(t *testing.T) {
	testdb.Slow(t, "server kill: restarts a private PostgreSQL")
	t.Parallel()
	testdb.CheckGoroutines(t)
	c := testdb.OwnCluster(t)
	admin := testdb.OpenPostgresDSN(t, "postgres", c.DSN)
	admin.SetMaxIdleConns(-1) // a fresh session per query: none dies in the restart
	opts := []advisorylock.Option{quiet, advisorylock.WithReleaseTimeout(2 * time.Second), advisorylock.WithLeaseTTL(3 * time.Second)}
	lockOpts := append(slices.Clip(opts), advisorylock.WithKeepAlive(200*time.Millisecond))
	ctx := context.Background()

	type waiter struct {
		name   string
		result chan error
		lease  *advisorylock.LeaseGuard // the held lease it waits for; nil for a Lock
	}
	var (
		pools    []*sql.DB
		guards   []*advisorylock.Guard
		leases   []*advisorylock.LeaseGuard
		waiters  []waiter
		locks    []string
		leaseFor = map[*advisorylock.LeaseGuard]*advisorylock.LeaseLock{}
		wg       sync.WaitGroup
	)
	wctx, stopWaiters := context.WithTimeout(ctx, 2*wait)
	t.Cleanup(func() { stopWaiters(); wg.Wait() })
	for _, drv := range testdb.Drivers {
		holderDB := testdb.OpenPostgresDSN(t, drv, c.DSN)
		waiterDB := testdb.OpenPostgresDSN(t, drv, c.DSN)
		pools = append(pools, holderDB, waiterDB)

		name := testdb.UniqueName(t)
		locks = append(locks, name)
		g, err := newLock(t, holderDB, name, lockOpts...).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		guards = append(guards, g)
		ll, err := advisorylock.NewLeaseLock(holderDB, testdb.UniqueName(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		lg, err := ll.TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lg)
		leaseFor[lg] = ll
		t.Cleanup(func() { _ = lg.Release(ctx) })

		wl := newLock(t, waiterDB, name, opts...)
		wll, err := advisorylock.NewLeaseLock(waiterDB, ll.Name(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []struct {
			name    string
			lease   *advisorylock.LeaseGuard
			acquire func() (interface{ Release(context.Context) error }, error)
		}{
			{name, nil, func() (interface{ Release(context.Context) error }, error) { return wl.Lock(wctx) }},
			{ll.Name(), lg, func() (interface{ Release(context.Context) error }, error) { return wll.Lock(wctx) }},
		} {
			res := make(chan error, 1)
			waiters = append(waiters, waiter{w.name, res, w.lease})
			wg.Go(func() {
				g, err := w.acquire()
				if err == nil {
					err = g.Release(ctx)
				}
				res <- err
			})
		}
	}
	for _, name := range locks {
		testdb.WaitFor(t, wait, func() bool { return waitingOn(t, admin, name) == 1 }, "waiter on %q never queued", name)
	}

	c.Restart(t)

	for i, g := range guards {
		select {
		case <-g.Lost():
		case <-time.After(wait):
			t.Fatalf("guard of %q did not report the restart as a loss", locks[i])
		}
		if err := g.Release(ctx); err != nil {
			t.Errorf("Release of a lost guard: %v", err)
		}
	}
	waitedOut := map[*advisorylock.LeaseGuard]bool{} // judged below: right if the lease survived
	for _, w := range waiters {
		select {
		case err := <-w.result:
			switch {
			case errors.Is(err, context.DeadlineExceeded) && w.lease != nil:
				waitedOut[w.lease] = true
			case errors.Is(err, context.DeadlineExceeded):
				t.Errorf("waiter on %q waited out its whole deadline", w.name)
			}
			t.Logf("waiter on %q returned: %v", w.name, err)
		case <-time.After(2 * wait):
			t.Fatalf("waiter on %q still waiting long after the restart", w.name)
		}
	}
	for _, lg := range leases {
		// A restart shorter than the lease's local deadline may keep it;
		// otherwise it must know it lost it.
		var h *advisorylock.Holder
		var err error
		testdb.WaitFor(t, wait, func() bool { h, err = leaseFor[lg].Holder(ctx); return err == nil }, "Holder after the restart: %v", err)
		kept := h != nil && h.Token == lg.Lease().Token()
		name := leaseFor[lg].Name()
		t.Logf("lease %q (token %d) after the restart: lost %v, still held in the database %v", name, lg.Lease().Token(), isLost(lg.Lease()), kept)
		if !kept && !isLost(lg.Lease()) {
			testdb.WaitFor(t, wait, func() bool { return isLost(lg.Lease()) }, "lease %q is no longer held but its guard does not know", name)
		}
		if waitedOut[lg] && !kept {
			t.Errorf("the waiter on lease %q waited out its whole deadline though the lease did not survive the restart", name)
		}
		_ = lg.Release(ctx)
	}

	// The pools recover: new acquisitions work on every pool (a pool may
	// first hand out a few connections that died in the restart).
	for i, db := range pools {
		l := newLock(t, db, testdb.UniqueName(t), opts...)
		ll, err := advisorylock.NewLeaseLock(db, testdb.UniqueName(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		locks = append(locks, l.Name())
		var lastErr error
		testdb.WaitFor(t, wait, func() bool {
			g, err := l.TryLock(ctx)
			if lastErr = err; err != nil {
				return false
			}
			lg, err := ll.TryLock(ctx)
			if lastErr = err; err != nil {
				_ = g.Release(ctx)
				return false
			}
			return g.Release(ctx) == nil && lg.Release(ctx) == nil
		}, "pool %d never recovered from the restart: %v", i, lastErr)
	}
	var leaseNames []string
	for _, lg := range leases {
		leaseNames = append(leaseNames, leaseFor[lg].Name())
	}
	checkLeaks(t, leakCheck{db: admin, locks: locks, leases: leaseNames, pools: pools})

	t.Run("outage longer than the lease TTL", func(t *testing.T) {
		var held []*advisorylock.LeaseGuard
		var names []string // held[i]'s
		for i, db := range pools[:2] {
			ll, err := advisorylock.NewLeaseLock(db, testdb.UniqueName(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			lg, err := ll.TryLock(ctx)
			if err != nil {
				t.Fatalf("pool %d: %v", i, err)
			}
			held, names = append(held, lg), append(names, ll.Name())
			t.Cleanup(func() { _ = lg.Release(ctx) })
		}
		c.Stop(t)
		for i, lg := range held {
			select {
			case <-lg.Lease().Lost():
			case <-time.After(wait):
				t.Fatalf("lease %q kept while the server is down", names[i])
			}
		}
		c.Restart(t)
		successor := testdb.OpenPostgresDSN(t, "pgx", c.DSN)
		for i, lg := range held {
			name := names[i]
			next, err := advisorylock.NewLeaseLock(successor, name, quiet)
			if err != nil {
				t.Fatal(err)
			}
			ng, err := next.LockTimeout(ctx, wait)
			if err != nil {
				t.Fatalf("successor on %q: %v", name, err)
			}
			if ng.Lease().Token() <= lg.Lease().Token() {
				t.Fatalf("successor's token %d is not above the lost %d", ng.Lease().Token(), lg.Lease().Token())
			}
			f, err := advisorylock.NewFence(successor, name)
			if err != nil {
				t.Fatal(err)
			}
			if err := fencedWrite(ctx, successor, f, nil, ng.Lease().Token()); err != nil {
				t.Fatalf("successor's write: %v", err)
			}
			if err := fencedWrite(ctx, successor, f, nil, lg.Lease().Token()); !isStale(err, name, lg.Lease().Token(), ng.Lease().Token()) {
				t.Fatalf("the lost holder's write = %v, want ErrStaleToken with highest %d", err, ng.Lease().Token())
			}
			if err := lg.Release(ctx); err != nil {
				t.Logf("release of the lost lease: %v", err)
			}
			if h, err := next.Holder(ctx); err != nil || h == nil || h.Token != ng.Lease().Token() {
				t.Fatalf("after the lost holder's release the successor does not hold %q: %+v, %v", name, h, err)
			}
			mustRelease(t, ng)
			leaseNames = append(leaseNames, name)
		}
		checkLeaks(t, leakCheck{db: admin, leases: leaseNames, pools: append(pools, successor)})
	})
}

// TestNetworkCutLosesLocksBeforeExpiry cuts the network (a proxy that
// stops forwarding, sockets left open) under a held Lock guard and a held
// lease, on lib/pq and pgx. The guard reports the loss through its
// keep-alive; the lease is lost while its row is still unexpired in the
// database, so before anyone else can be granted it; a successor then
// gets a larger token, the fence refuses the cut-off holder's write once
// the network heals, and the stale release does not free the successor.
func TestNetworkCutLosesLocksBeforeExpiry(t *testing.T) {
	testdb.Slow(t, "fault: network cuts, waits out lease expiry")
	t.Parallel()
	// The drivers' subtests run side by side, each on a proxy and names of
	// its own; the goroutine check covers them together, on the whole
	// test.
	testdb.CheckGoroutines(t)
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			admin := testdb.OpenPostgres(t, drv)
			opts := []advisorylock.Option{quiet, advisorylock.WithReleaseTimeout(time.Second), advisorylock.WithLeaseTTL(3 * time.Second)}

			l := newLock(t, db, testdb.UniqueName(t), append(slices.Clip(opts), advisorylock.WithKeepAlive(200*time.Millisecond))...)
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ll, err := advisorylock.NewLeaseLock(db, testdb.UniqueName(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			lg, err := ll.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Heal(); _ = lg.Release(ctx); _ = g.Release(ctx) })
			f, err := advisorylock.NewFence(db, ll.Name())
			if err != nil {
				t.Fatal(err)
			}
			if err := fencedWrite(ctx, db, f, nil, lg.Lease().Token()); err != nil {
				t.Fatalf("write before the cut: %v", err)
			}

			// A guard without keep-alive does not know of the cut; its
			// Release must still come back within its timeout, cut or not.
			unwatched, err := newLock(t, db, testdb.UniqueName(t), quiet, advisorylock.WithKeepAlive(0), advisorylock.WithReleaseTimeout(time.Second)).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}

			proxy.Cut()
			returnsDuringCut(t, "Release of a Lock guard", func() error { _ = unwatched.Release(ctx); return nil })
			select {
			case <-lg.Lease().Lost():
			case <-time.After(wait):
				t.Fatal("lease not lost during the cut")
			}
			var owned, unexpired bool
			err = admin.QueryRow("SELECT owner IS NOT NULL AND generation = $2, expires_at > now() FROM advisorylock_leases WHERE name = $1",
				ll.Name(), int64(lg.Lease().Token())).Scan(&owned, &unexpired)
			if err != nil {
				t.Fatal(err)
			}
			if !owned || !unexpired {
				t.Fatalf("the lease was lost only after its database expiry (row still ours %v, unexpired %v)", owned, unexpired)
			}
			select {
			case <-g.Lost():
			case <-time.After(wait):
				t.Fatal("Lock guard did not report the cut as a loss")
			}
			// Acquires are bounded by their context or budget, cut or not.
			other := newLock(t, db, testdb.UniqueName(t), opts...)
			returnsDuringCut(t, "TryLock with a 1s context", func() error {
				tctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				_, err := other.TryLock(tctx)
				return expectFailure(err)
			})
			returnsDuringCut(t, "LockTimeout(1s)", func() error { _, err := other.LockTimeout(ctx, time.Second); return expectFailure(err) })
			otherLease, err := advisorylock.NewLeaseLock(db, testdb.UniqueName(t), opts...)
			if err != nil {
				t.Fatal(err)
			}
			returnsDuringCut(t, "LeaseLock.LockTimeout(1s)", func() error { _, err := otherLease.LockTimeout(ctx, time.Second); return expectFailure(err) })
			// So are the questions.
			for what, holder := range map[string]func(context.Context) (*advisorylock.Holder, error){
				"Lock.Holder": other.Holder, "LeaseLock.Holder": otherLease.Holder,
			} {
				returnsDuringCut(t, what+" with a 1s context", func() error {
					tctx, cancel := context.WithTimeout(ctx, time.Second)
					defer cancel()
					switch h, err := holder(tctx); {
					case err == nil:
						return errors.New("answered with the network cut")
					case h != nil:
						return fmt.Errorf("returned a holder (%+v) with its error %w", h, err)
					}
					return nil
				})
			}

			returnsDuringCut(t, "Release of the lost lease", func() error { _ = lg.Release(ctx); return nil })

			next, err := advisorylock.NewLeaseLock(admin, ll.Name(), quiet)
			if err != nil {
				t.Fatal(err)
			}
			ng, err := next.LockTimeout(ctx, wait)
			if err != nil {
				t.Fatalf("successor: %v", err)
			}
			t.Cleanup(func() { _ = ng.Release(ctx) })
			if ng.Lease().Token() <= lg.Lease().Token() {
				t.Fatalf("successor's token %d is not above the lost %d", ng.Lease().Token(), lg.Lease().Token())
			}
			nf, err := advisorylock.NewFence(admin, ll.Name())
			if err != nil {
				t.Fatal(err)
			}
			if err := fencedWrite(ctx, admin, nf, nil, ng.Lease().Token()); err != nil {
				t.Fatalf("successor's write: %v", err)
			}

			proxy.Heal()
			testdb.WaitFor(t, wait, func() bool {
				err = fencedWrite(ctx, db, f, nil, lg.Lease().Token())
				return err == nil || errors.Is(err, advisorylock.ErrStaleToken) // else a connection that died in the cut: try again
			}, "the fenced write never got an answer after the heal: %v", err)
			if highest, stale := staleHighest(err); !stale || highest != ng.Lease().Token() {
				t.Fatalf("cut-off holder's write after the heal = %v, want ErrStaleToken (highest %d)", err, ng.Lease().Token())
			}
			if h, err := next.Holder(ctx); err != nil || h == nil || h.Token != ng.Lease().Token() {
				t.Fatalf("the stale release freed the successor: %+v, %v", h, err)
			}
			mustRelease(t, ng)
			_ = g.Release(ctx)
			checkLeaks(t, leakCheck{db: admin, locks: []string{l.Name()}, leases: []string{ll.Name()}, pools: []*sql.DB{db}})
		})
	}
}

// returnsDuringCut fails t unless f returns while the network is still
// cut, within cutBound: every call it is given has a budget, timeout or
// context of 1s, and a release is bounded by its WithReleaseTimeout and an
// acquire by its context or budget (plus about a second), not by the
// partition. An error from f fails t.
// TestReleaseDuringACutGivesBackItsPoolSlot: a release that gets no
// answer on a dead network ends its statement, and its connection leaves
// the pool before Release returns. Were the statement left reading in a
// goroutine of its own (lib/pq does not end a read when its context ends),
// the connection would keep its pool slot until the network heals or TCP
// gives up, minutes later: a partition would exhaust a small pool.
func TestReleaseDuringACutGivesBackItsPoolSlot(t *testing.T) {
	testdb.Slow(t, "fault: network cut, waits out release timeouts")
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db, proxy := testdb.OpenPostgresProxied(t, drv)
			db.SetMaxOpenConns(1)
			rec := &observetest.Recorder{}
			l := newLock(t, db, testdb.UniqueName(t), quiet, pinned, advisorylock.WithObserver(rec),
				advisorylock.WithKeepAlive(0), advisorylock.WithReleaseTimeout(500*time.Millisecond))
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			proxy.Cut()
			defer proxy.Heal()
			returnsDuringCut(t, "Release", func() error { _ = g.Release(ctx); return nil })
			if s := db.Stats(); s.InUse != 0 || s.OpenConnections != 0 {
				t.Fatalf("after the release, during the cut: %d connections open, %d in use; want the unanswered one gone", s.OpenConnections, s.InUse)
			}
			want := "no_answer" // cut short by the library (lib/pq)
			if drv == "pgx" {
				want = "error" // pgx ends it, with an error
			}
			if d := rec.Events("discard"); len(d) != 1 || d[0].Value != want {
				t.Errorf("discards %+v, want one %s", d, want)
			}
		})
	}
}

func returnsDuringCut(t *testing.T, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s during the cut: %v", what, err)
		}
	case <-time.After(cutBound):
		t.Fatalf("%s still blocked %v into the cut, for 1s budgets", what, cutBound)
	}
	t.Logf("%s returned %v into the cut", what, time.Since(start).Round(time.Millisecond))
}

// cutBound bounds a call with a 1s budget during a partition: LockTimeout
// returns within about a second of its budget, so 2s, and 2x that.
const cutBound = 4 * time.Second

// expectFailure turns the error an acquire during a cut must return into
// nil, and its absence into an error.
func expectFailure(err error) error {
	if err == nil {
		return errors.New("acquired a lock with the network cut")
	}
	return nil
}

// pgLoad is a load on PostgreSQL: Lock.Do workers on one name and fenced
// LeaseLock.Do workers on another, on lib/pq and pgx. Each worker has a
// pool of its own behind a proxy of its own, and its sessions carry an
// application_name of their own, so that a fault hits one worker and no
// one else: a partition isolates one holder from the database while its
// successors still reach it.
type pgLoad struct {
	admin     *sql.DB // direct to the server: sees no fault
	workers   []*pgWorker
	lockName  string
	leaseName string
	counter   *testdb.Counter
	session   *figures // Lock.Do workers
	lease     *figures // LeaseLock.Do workers
	secs      []*sections
	stop      context.CancelFunc
	wg        sync.WaitGroup
}

// pgWorker is one worker of a pgLoad, with its own pool and proxy.
type pgWorker struct {
	lease  bool   // a LeaseLock worker, else a Lock worker
	try    bool   // a LeaseLock worker that uses TryDo
	app    string // its sessions' application_name
	proxy  *testdb.Proxy
	db     *sql.DB
	inside atomic.Bool                   // in a section now
	aimed  atomic.Pointer[faultClass]    // the fault last aimed at it, until a loss reports it
	gate   atomic.Pointer[chan struct{}] // while set, the worker waits for it to close before its next Do
}

// pause stops w from starting another Do until resume is called; resume
// may be called more than once.
func (w *pgWorker) pause() (resume func()) {
	gate := make(chan struct{})
	w.gate.Store(&gate)
	return sync.OnceFunc(func() {
		w.gate.Store(nil)
		close(gate)
	})
}

// waitResumed blocks while w is paused, or until ctx ends. It accepts a
// nil worker.
func (w *pgWorker) waitResumed(ctx context.Context) {
	if w == nil {
		return
	}
	if gate := w.gate.Load(); gate != nil {
		select {
		case <-*gate:
		case <-ctx.Done():
		}
	}
}

// tries reports whether w takes its lease with TryDo instead of Do.
func (w *pgWorker) tries() bool { return w != nil && w.try }

// entered and exited mark the worker inside a section; outcome credits a
// loss to the fault aimed at the worker. All accept a nil worker.
func (w *pgWorker) entered() {
	if w != nil {
		w.inside.Store(true)
	}
}

func (w *pgWorker) exited() {
	if w != nil {
		w.inside.Store(false)
	}
}

func (w *pgWorker) outcome(lost bool) {
	if w == nil || !lost {
		return
	}
	if c := w.aimed.Swap(nil); c != nil {
		c.reached.Add(1)
	}
}

// leaseTTL is the lease of a pgLoad's workers: the local deadline is a
// second after each acquire or renew was sent, and a cut of more than
// 1.5s lets a successor in.
const leaseTTL = 1500 * time.Millisecond

// deadHolder is the dead-holder timeout of a pgLoad's workers: a holder
// blackholed from the server loses its session (and lock) within about
// that, after it noticed the loss (200ms keep-alive + 1s release timeout).
const deadHolder = 3 * time.Second

// pgLoadOptions are the options of every lock of a pgLoad; its Locks
// add a keep-alive and WithDeadHolderTimeout(deadHolder).
var pgLoadOptions = []advisorylock.Option{quiet, advisorylock.WithReleaseTimeout(time.Second),
	advisorylock.WithLeaseTTL(leaseTTL), advisorylock.WithPollInterval(50 * time.Millisecond)}

// newPGLoadLock returns a Lock on name with a pgLoad's options.
func newPGLoadLock(t testing.TB, db *sql.DB, name string) *advisorylock.Lock {
	t.Helper()
	return newLock(t, db, name, append(slices.Clip(pgLoadOptions), advisorylock.WithKeepAlive(200*time.Millisecond), advisorylock.WithDeadHolderTimeout(deadHolder))...)
}

// startPGLoad starts sessionWorkers Lock workers and leaseWorkers lease
// workers per driver, each holding its lock for hold() (or until lost).
// Session guards check their session every 200ms. Lease workers on lib/pq
// wait with Do (polling: plain lib/pq hears no releases); on pgx the first
// tries with TryDo, again and again, as a job that skips a run while
// another holds the lease, and the others wait with Do, in line for the
// lease (a release hands it to them; see waitInLine).
func startPGLoad(t *testing.T, sessionWorkers, leaseWorkers int, hold func() time.Duration) *pgLoad {
	t.Helper()
	return startPGLoadOn(t, testdb.PostgresDSN(t), sessionWorkers, leaseWorkers, hold)
}

// startPGLoadOn is startPGLoad on the server of dsn.
func startPGLoadOn(t *testing.T, dsn string, sessionWorkers, leaseWorkers int, hold func() time.Duration) *pgLoad {
	t.Helper()
	l := &pgLoad{
		admin:     testdb.OpenPostgresDSN(t, "pgx", dsn),
		lockName:  testdb.UniqueName(t),
		leaseName: testdb.UniqueName(t),
		session:   &figures{},
		lease:     &figures{},
	}
	l.counter = testdb.NewCounter(t, l.admin, false)
	sessionSecs := newSections(l.lockName, l.session, t.Logf).sessionFaults(3 * time.Second)
	leaseSecs := newSections(l.leaseName, l.lease, t.Logf)
	leaseSecs.grantedAt = l.grantedAt
	l.secs = []*sections{sessionSecs, leaseSecs}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { l.heal(); stop(); l.wg.Wait() })
	app := appName()
	for _, drv := range testdb.Drivers {
		for i := range sessionWorkers + leaseWorkers {
			w := &pgWorker{lease: i >= sessionWorkers, try: i == sessionWorkers && drv == "pgx", app: fmt.Sprintf("%s-%s-%d", app, drv, i), proxy: testdb.NewProxy(t, testdb.HostPort(t, dsn))}
			w.db = testdb.OpenPostgresDSN(t, drv, testdb.WithParam(w.proxy.DSN(dsn), "application_name", w.app))
			l.workers = append(l.workers, w)
			if !w.lease {
				lock := newPGLoadLock(t, w.db, l.lockName)
				l.wg.Go(func() { sessionWorker(ctx, lock, sessionSecs, l.session, hold, w) })
				continue
			}
			ll, f := fencedLease(t, w.db, l.leaseName, pgLoadOptions...)
			l.wg.Go(func() { leaseWorker(ctx, ll, f, w.db, l.counter, leaseSecs, l.lease, hold, w) })
		}
	}
	return l
}

// grantedAt reads when the database granted lease (of l.leaseName), if
// its row still shows that grant.
func (l *pgLoad) grantedAt(lease advisorylock.Lease) (time.Time, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var at time.Time
	err := l.admin.QueryRowContext(ctx, "SELECT acquired_at FROM advisorylock_leases WHERE name = $1 AND generation = $2",
		l.leaseName, int64(lease.Token())).Scan(&at)
	return at, err == nil
}

// pools returns every worker's pool.
func (l *pgLoad) pools() []*sql.DB {
	var dbs []*sql.DB
	for _, w := range l.workers {
		dbs = append(dbs, w.db)
	}
	return dbs
}

// heal ends every cut and delay.
func (l *pgLoad) heal() {
	for _, w := range l.workers {
		w.proxy.SetDelay(0)
		w.proxy.Heal()
	}
}

// holder waits up to d for a worker of the kind to be inside a section,
// and returns it (nil if none was).
func (l *pgLoad) holder(lease bool, d time.Duration) *pgWorker {
	var found *pgWorker
	testdb.Poll(d, func() bool {
		for _, i := range rand.Perm(len(l.workers)) {
			if w := l.workers[i]; w.lease == lease && w.inside.Load() {
				found = w
				return true
			}
		}
		return false
	})
	return found
}

// cut partitions one holder (a Lock holder, or a lease holder) from the
// server for d, then heals, and reports whether it found a holder.
func (l *pgLoad) cut(lease bool, d time.Duration) bool {
	w := l.holder(lease, 3*time.Second)
	if w == nil {
		return false
	}
	w.proxy.Cut()
	time.Sleep(d)
	w.proxy.Heal()
	l.session.faults.Add(1)
	return true
}

// progresses fails t unless both kinds of workers acquire their lock
// again after the faults ended.
func (l *pgLoad) progresses(t *testing.T) {
	t.Helper()
	s, ls := l.session.acquired.Load(), l.lease.acquired.Load()
	testdb.WaitFor(t, 2*wait, func() bool { return l.session.acquired.Load() > s+1 && l.lease.acquired.Load() > ls+1 },
		"no progress after the faults: %d Lock and %d lease acquisitions since", l.session.acquired.Load()-s, l.lease.acquired.Load()-ls)
}

// halt heals the network, stops the workers (failing t if they hang) and
// counts the violations, also those only the database shows: a stale
// write admitted, a fenced count that is not exact.
func (l *pgLoad) halt(t *testing.T) {
	t.Helper()
	l.heal()
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, "workers")
	for _, s := range l.secs {
		s.settle()
	}
	checkFenced(t, l.admin, false, l.counter, l.leaseName, l.lease)
}

// fenceViolations counts what a fenced load's log shows into f.
// checkFenced reads counter c, whose writes the Fence of resource
// guarded, and counts its violations into f.
func checkFenced(t *testing.T, admin *sql.DB, sqlite bool, c *testdb.Counter, resource string, f *figures) {
	t.Helper()
	st, err := c.State(context.Background(), admin)
	if err != nil {
		t.Fatal(err)
	}
	top := int64(0)
	if st.Writes > 0 {
		top = fenceToken(t, admin, sqlite, resource)
	}
	fenceViolations(t, f, st, top)
}

func fenceViolations(t *testing.T, f *figures, st testdb.CounterState, top int64) {
	t.Helper()
	if st.Regressions != 0 {
		f.violations.Add(st.Regressions)
		t.Logf("VIOLATION: %d stale writes admitted by the fence", st.Regressions)
	}
	if st.N != st.Writes {
		f.violations.Add(1)
		t.Logf("VIOLATION: fenced count %d, but %d fenced writes committed", st.N, st.Writes)
	}
	if top != st.MaxToken {
		f.violations.Add(1)
		t.Logf("VIOLATION: fence keeps token %d, the highest write committed was %d", top, st.MaxToken)
	}
}

// check checks a halted load: no violation, nothing left held or checked
// out.
func (l *pgLoad) check(t *testing.T) {
	t.Helper()
	if v := l.session.violations.Load() + l.lease.violations.Load(); v != 0 {
		t.Errorf("%d violations (see the log)", v)
	}
	checkLeaks(t, leakCheck{db: l.admin, locks: []string{l.lockName}, leases: []string{l.leaseName}, pools: l.pools()})
}

// TestNetworkCutsUnderLoad partitions one holder at a time from the
// database (each worker has a proxy of its own, so its successors still
// reach the server) under Lock and fenced LeaseLock workers on lib/pq and
// pgx: session guards report their loss, leases are lost before anyone
// else is granted them (checked against the grant's database timestamp),
// the fence refuses the cut-off holder's late write, the load recovers
// after each heal, and nothing is left behind.
func TestNetworkCutsUnderLoad(t *testing.T) {
	testdb.Slow(t, "fault: network cuts under load")
	t.Parallel()
	testdb.CheckGoroutines(t)
	// One section in three holds its lock long enough (or until lost) for
	// a cut to find a holder: 200ms between keep-alive checks, 1s per check.
	l := startPGLoad(t, 2, 1, func() time.Duration {
		if rand.IntN(3) == 0 {
			return 3 * time.Second
		}
		return rand.N(20 * time.Millisecond)
	})
	for cycle := 0; cycle < 2 || l.session.losses.Load() == 0 || l.lease.losses.Load() == 0 || l.lease.staleRefused.Load() == 0; cycle++ {
		if cycle == 10 {
			t.Fatalf("after %d cycles of cuts: Lock workers %v; lease workers %v", cycle, l.session, l.lease)
		}
		l.cut(false, 1200*time.Millisecond+rand.N(800*time.Millisecond))
		l.cut(true, leaseTTL+time.Second)
	}
	l.progresses(t)
	l.halt(t)
	l.check(t)
	checkHistory(t, l.secs...) // history hook
	t.Logf("Lock workers: %v", l.session)
	t.Logf("lease workers: %v", l.lease)
}

// fencedLease returns a LeaseLock on name and the Fence that guards its
// writes, both on db.
func fencedLease(t testing.TB, db *sql.DB, name string, opts ...advisorylock.Option) (*advisorylock.LeaseLock, *advisorylock.Fence) {
	t.Helper()
	ll, err := advisorylock.NewLeaseLock(db, name, opts...)
	if err != nil {
		t.Fatal(err)
	}
	f, err := advisorylock.NewFence(db, name)
	if err != nil {
		t.Fatal(err)
	}
	return ll, f
}
