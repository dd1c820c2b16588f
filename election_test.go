package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// Generous bounds on the election's takeover promises (measured values
// are logged; see docs/election.md): after a resign or a
// killed session within a few round trips; on SQLite after a dead leader
// within the lease TTL and the poll cap.
const (
	takeoverWithin   = 3 * time.Second
	electionSQLTTL   = 2 * time.Second
	sqliteTakeoverIn = electionSQLTTL + 2*time.Second
)

// electionDB is a backend the election tests run on: open returns a new
// *sql.DB on the same database at each call, and a helper process given
// dsn opens one there too (see openElectionDB).
type electionDB struct {
	name    string
	session bool // a session backend (PostgreSQL, MySQL): sessions can be killed
	dsn     string
	opts    []advisorylock.Option
}

func (edb electionDB) open(t *testing.T) *sql.DB { return openElectionDB(t, edb.name, edb.dsn) }

// openElectionDB opens a *sql.DB on backend name's database at dsn.
func openElectionDB(t *testing.T, name, dsn string) *sql.DB {
	switch name {
	case "mysql":
		return testdb.OpenMySQLDSN(t, dsn)
	case "sqlite":
		return testdb.OpenSQLite(t, dsn, "")
	}
	if driver, ok := strings.CutPrefix(name, "pgbouncer/"); ok { // dsn is the pool's
		return testdb.OpenPostgresDSN(t, driver, dsn)
	}
	return testdb.OpenPostgres(t, strings.TrimPrefix(name, "postgres/"))
}

// eachElectionDB runs f in a subtest per backend: PostgreSQL with each
// driver, MariaDB, and a SQLite file (only the session backends when
// sessionOnly), with the goroutine check on.
func eachElectionDB(t *testing.T, sessionOnly bool, f func(t *testing.T, edb electionDB)) {
	forElectionDBs(t, sessionOnly, false, f)
}

// eachElectionDBInParallel is eachElectionDB with the test run beside
// other tests and its subtests beside each other, for a test whose
// subtests mostly wait (on names of their own; none touches process-wide
// state). The goroutine check, on the whole test, covers them together.
func eachElectionDBInParallel(t *testing.T, sessionOnly bool, f func(t *testing.T, edb electionDB)) {
	t.Parallel()
	testdb.CheckGoroutines(t)
	forElectionDBs(t, sessionOnly, true, f)
}

func forElectionDBs(t *testing.T, sessionOnly, parallel bool, f func(t *testing.T, edb electionDB)) {
	var dbs []electionDB
	for _, drv := range testdb.Drivers {
		dbs = append(dbs, electionDB{name: "postgres/" + drv, session: true})
	}
	dbs = append(dbs, electionDB{name: "mysql", session: true})
	if !sessionOnly {
		dbs = append(dbs, electionDB{name: "sqlite", opts: []advisorylock.Option{advisorylock.WithLeaseTTL(electionSQLTTL)}})
	}
	for _, edb := range dbs {
		t.Run(edb.name, func(t *testing.T) {
			if parallel {
				t.Parallel()
			} else {
				testdb.CheckGoroutines(t)
			}
			switch edb.name {
			case "mysql":
				edb.dsn = testdb.MySQLDSN(t)
			case "sqlite":
				edb.dsn = testdb.SQLitePath(t)
			}
			f(t, edb)
		})
	}
}

func newElection(t testing.TB, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.Election {
	t.Helper()
	e, err := advisorylock.NewElection(db, name, opts...)
	if err != nil {
		t.Fatalf("NewElection(%q): %v", name, err)
	}
	return e
}

// loss is the end of a lead's context, as the lead saw it.
type loss struct {
	cause error
	at    time.Time
}

// term is one leadership as a lead function saw it.
type term struct {
	who   int
	token advisorylock.FencingToken
	at    time.Time // when lead started
}

// candidates runs n candidates of one election, each on its own *sql.DB,
// whose lead reports its term on terms and then leads until told to
// resign (resign[i]) or its context ends; cause[i] gets the context's
// cause then. overlap counts leads that started while another ran.
type candidates struct {
	name      string // the election's
	elections []*advisorylock.Election
	dbs       []*sql.DB
	terms     chan term
	resign    []chan struct{}
	causes    []chan loss
	leading   atomic.Int32
	overlap   atomic.Int32
	cancel    context.CancelFunc
	done      chan error // one Run result per candidate
}

func startCandidates(t *testing.T, edb electionDB, name string, n int, opts ...advisorylock.Option) *candidates {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidates{name: name, terms: make(chan term, 100), cancel: cancel, done: make(chan error, n)}
	for i := range n {
		db := edb.open(t)
		o := append(slices.Clone(edb.opts), advisorylock.WithOwner(fmt.Sprintf("candidate-%d", i)))
		c.elections = append(c.elections, newElection(t, db, name, append(o, opts...)...))
		c.dbs = append(c.dbs, db)
		c.resign = append(c.resign, make(chan struct{}, 1))
		c.causes = append(c.causes, make(chan loss, 100))
	}
	for i, e := range c.elections {
		go func() { c.done <- e.Run(ctx, c.lead(i)) }()
	}
	t.Cleanup(func() { c.stop(t) })
	return c
}

func (c *candidates) lead(i int) func(ctx context.Context, token advisorylock.FencingToken) error {
	return func(ctx context.Context, token advisorylock.FencingToken) error {
		if c.leading.Add(1) > 1 {
			c.overlap.Add(1)
		}
		c.terms <- term{who: i, token: token, at: time.Now()}
		select {
		case <-c.resign[i]:
		case <-ctx.Done():
			c.causes[i] <- loss{context.Cause(ctx), time.Now()}
		}
		c.leading.Add(-1)
		return nil
	}
}

// next waits for the next term.
func (c *candidates) next(t *testing.T, within time.Duration) term {
	t.Helper()
	select {
	case tm := <-c.terms:
		return tm
	case <-time.After(within):
		t.Fatalf("no leader within %v", within)
		return term{}
	}
}

// stop cancels every Run and checks that each returned ctx's error.
func (c *candidates) stop(t *testing.T) {
	if c.cancel == nil {
		return
	}
	c.cancel()
	c.cancel = nil
	for range c.elections {
		select {
		case err := <-c.done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Run after cancel: %v, want context.Canceled", err)
			}
		case <-time.After(wait):
			t.Fatal("Run did not return after its context was cancelled")
		}
	}
}

// checkLeader checks that Leader, asked of e (the election name),
// reports tm's candidate.
func checkLeader(t *testing.T, e *advisorylock.Election, name string, tm term) *advisorylock.Holder {
	t.Helper()
	h, err := e.Leader(context.Background())
	if err != nil || h == nil {
		t.Fatalf("Leader while candidate %d leads term %v: %+v, %v", tm.who, tm.token, h, err)
	}
	if want := fmt.Sprintf("candidate-%d", tm.who); h.Owner != want || h.Token != tm.token || h.Name != name || h.Since.IsZero() {
		t.Fatalf("Leader = %+v, want owner %s, term %v, name %q", h, want, tm.token, name)
	}
	return h
}

// medianOf returns the median of ds.
func medianOf(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestElectionThreeCandidatesTakeTurnsOnResign runs three candidates on
// separate *sql.DBs: one leads at a time, Leader (asked from a fourth
// handle) names it with its term, and never an earlier term once a later
// one was reported (polled throughout), resigns hand leadership to another
// candidate, within a few round trips (measured; on SQLite within the
// waiters' poll), and terms strictly increase.
func TestElectionThreeCandidatesTakeTurnsOnResign(t *testing.T) {
	testdb.Slow(t, "three candidates taking turns, per backend")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		c := startCandidates(t, edb, name, 3)
		watcher := newElection(t, edb.open(t), name, append(slices.Clone(edb.opts), advisorylock.WithPollInterval(10*time.Millisecond))...)
		octx, ocancel := context.WithCancel(context.Background())
		seen := make(chan []*advisorylock.Holder)
		firstSeen := make(chan struct{}) // closed when Observe reported a leader
		go func() {                      // every leader Observe reports, polled throughout
			var leaders []*advisorylock.Holder
			for h := range watcher.Observe(octx) {
				if h != nil {
					if leaders = append(leaders, h); len(leaders) == 1 {
						close(firstSeen)
					}
				}
			}
			seen <- leaders
		}()
		var took, toOther []time.Duration // to any candidate; to another than the resigner
		var last advisorylock.FencingToken
		resigned, prev := time.Time{}, -1
		for round := range 9 {
			tm := c.next(t, wait)
			if !resigned.IsZero() {
				took = append(took, tm.at.Sub(resigned))
				if tm.who != prev {
					toOther = append(toOther, tm.at.Sub(resigned))
				}
			}
			prev = tm.who
			if tm.token <= last {
				t.Fatalf("round %d: term %v after term %v", round, tm.token, last)
			}
			last = tm.token
			checkLeader(t, watcher, name, tm)
			if round == 0 { // handovers can outrun Observe's polls: let it see one leader
				select {
				case <-firstSeen:
				case <-time.After(wait):
					t.Fatal("Observe reported no leader while one led")
				}
			}
			if !edb.session {
				// A lead that ran past the quick-lead pause (1s): Run does
				// not rest after it, so what hands over on SQLite is the
				// resigner standing aside for the pollers.
				time.Sleep(time.Until(tm.at.Add(1200 * time.Millisecond)))
			}
			resigned = time.Now()
			c.resign[tm.who] <- struct{}{}
		}
		c.stop(t)
		ocancel()
		leaders := <-seen
		var terms []advisorylock.FencingToken
		for _, h := range leaders {
			terms = append(terms, h.Token)
		}
		if len(terms) == 0 || !slices.IsSorted(terms) || len(slices.Compact(slices.Clone(terms))) != len(terms) {
			for _, h := range leaders {
				t.Logf("Observe reported %+v", *h)
			}
			t.Fatalf("Observe reported terms %v during the handovers: want each once, in increasing order", terms)
		}
		if n := c.overlap.Load(); n != 0 {
			t.Fatalf("%d leads started while another ran", n)
		}
		if h, err := watcher.Leader(context.Background()); h != nil || err != nil {
			t.Fatalf("Leader after every Run returned: %+v, %v", h, err)
		}
		t.Logf("resign takeover on %s: median %v, max %v (%d handovers); by another candidate: %v", edb.name, medianOf(took), slices.Max(took), len(took), toOther)
		if m := medianOf(took); m > takeoverWithin {
			t.Fatalf("resign takeover median %v, want within %v", m, takeoverWithin)
		}
		// On SQLite the resigner stands aside for the pollers. (Where the
		// server queues waiters it hands the lock to one of them, but only
		// to those already queued: in the first rounds, candidates still
		// starting up are not, and the resigner may win again.)
		if !edb.session && len(toOther) < len(took)/2 {
			t.Fatalf("%d of %d resigns handed leadership to another candidate, want most", len(toOther), len(took))
		}
	})
}

// killSession ends the server session of the leader h (PostgreSQL:
// pg_terminate_backend; MySQL: KILL).
func killSession(t *testing.T, edb electionDB, admin *sql.DB, h *advisorylock.Holder) {
	t.Helper()
	q := "SELECT pg_terminate_backend($1)"
	if edb.name == "mysql" {
		q = "KILL ?"
	}
	if _, err := admin.Exec(q, h.PID); err != nil {
		t.Fatalf("killing session %d: %v", h.PID, err)
	}
}

// TestElectionKilledSessionIsTakenOver kills the leader's session: another
// candidate leads within a few round trips (measured), the old leader's
// lead context is cancelled with ErrLockLost at its next keep-alive
// check, and it campaigns again (its Run does not return). The two
// leaders overlap for at most about one keep-alive interval (measured).
func TestElectionKilledSessionIsTakenOver(t *testing.T) {
	testdb.Slow(t, "kills leader sessions, waits for keep-alives")
	const keepAlive = 200 * time.Millisecond
	eachElectionDBInParallel(t, true, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		c := startCandidates(t, edb, name, 3, advisorylock.WithKeepAlive(keepAlive))
		admin := edb.open(t)
		var took, overlap []time.Duration
		var last advisorylock.FencingToken
		for range 3 {
			tm := c.next(t, wait)
			if tm.token <= last {
				t.Fatalf("term %v after term %v", tm.token, last)
			}
			last = tm.token
			h := checkLeader(t, c.elections[(tm.who+1)%3], name, tm)
			if h.PID == 0 {
				t.Fatalf("Leader names no session: %+v", h)
			}
			killed := time.Now()
			killSession(t, edb, admin, h)
			next := c.next(t, wait)
			took = append(took, next.at.Sub(killed))
			select {
			case l := <-c.causes[tm.who]:
				if !errors.Is(l.cause, advisorylock.ErrLockLost) {
					t.Fatalf("the killed leader's lead context ended with %v, want ErrLockLost", l.cause)
				}
				overlap = append(overlap, l.at.Sub(next.at))
			case <-time.After(wait):
				t.Fatal("the killed leader's lead context was never cancelled")
			}
			c.terms <- next // let the loop check it as the next leader
		}
		t.Logf("killed-session takeover on %s: median %v, max %v; two leaders for at most %v (keep-alive %v)", edb.name, medianOf(took), slices.Max(took), slices.Max(overlap), keepAlive)
		if m := medianOf(took); m > takeoverWithin {
			t.Fatalf("killed-session takeover median %v, want within %v", m, takeoverWithin)
		}
		if m := slices.Max(overlap); m > keepAlive+takeoverWithin {
			t.Fatalf("two leaders for %v, want about one keep-alive interval (%v) at most", m, keepAlive)
		}
	})
}

// TestElectionVanishedLeaderIsTakenOverWithinTheDeadHolderTimeout
// blackholes the leader's connection (a host powered off): its keep-alive
// fails first, so it stops leading before the server ends its session and
// frees the lock, within about the dead-holder timeout, for another
// candidate to lead.
func TestElectionVanishedLeaderIsTakenOverWithinTheDeadHolderTimeout(t *testing.T) {
	testdb.Slow(t, "iptables: blackholes the leader, waits out the dead-holder timeout")
	testdb.RequireIptables(t)
	const d = 3 * time.Second
	opts := []advisorylock.Option{advisorylock.WithDeadHolderTimeout(d), advisorylock.WithKeepAlive(time.Second), advisorylock.WithReleaseTimeout(time.Second)}
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		t.Parallel() // side by side: a name and a blackholed client port of its own
		// No goroutine check: the drivers' reads of the blackholed socket
		// end only when the kernel gives up on it (as for a Lock, see
		// TestVanishedHolderIsFreedWithinTheDeadHolderTimeout).
		c := startCandidates(t, electionDB{name: "postgres/" + drv, session: true}, testdb.UniqueName(t), 2, opts...)
		old := c.next(t, wait)
		h := checkLeader(t, c.elections[1-old.who], c.name, old)
		vanished := time.Now()
		testdb.Blackhole(t, testdb.Port(t, testdb.PostgresDSN(t)), testdb.ClientPort(t, testdb.OpenPostgres(t, "postgres"), h.PID))
		cur := c.next(t, 3*d)
		var l loss
		select {
		case l = <-c.causes[old.who]:
		case <-time.After(wait):
			t.Fatal("the vanished leader's lead context was never cancelled")
		}
		t.Logf("vanished leader on %s: stopped leading after %v, taken over after %v (dead-holder timeout %v)", drv, l.at.Sub(vanished), cur.at.Sub(vanished), d)
		if !errors.Is(l.cause, advisorylock.ErrLockLost) || !l.at.Before(cur.at) || cur.token <= old.token {
			t.Fatalf("the vanished leader stopped at %v (%v), its successor led at %v with term %v after %v: want the loss first and a larger term", l.at, l.cause, cur.at, cur.token, old.token)
		}
	})
}

// TestElectionStaleLeadersFencedWriteIsRefused kills the session of a
// leader that has no keep-alive, so it cannot know: it goes on leading
// while a new leader is elected (two leaders at once, the documented
// window). The new leader's term is larger; once it has written through
// the Fence, the old leader's write is refused with ErrStaleToken.
func TestElectionStaleLeadersFencedWriteIsRefused(t *testing.T) {
	eachElectionDBInParallel(t, true, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		c := startCandidates(t, edb, name, 2, advisorylock.WithKeepAlive(0))
		admin := edb.open(t)
		fence, err := advisorylock.NewFence(admin, name)
		if err != nil {
			t.Fatal(err)
		}
		old := c.next(t, wait)
		mustAdmit(t, admin, fence, old.token)
		killSession(t, edb, admin, checkLeader(t, c.elections[1-old.who], name, old))
		cur := c.next(t, wait)
		if cur.who == old.who || cur.token <= old.token {
			t.Fatalf("after the kill: candidate %d with term %v; the old leader was %d with term %v", cur.who, cur.token, old.who, old.token)
		}
		if n := c.leading.Load(); n != 2 {
			t.Fatalf("%d leads running, want 2 (the old leader cannot know without a keep-alive)", n)
		}
		mustAdmit(t, admin, fence, cur.token)
		tx, err := admin.Begin()
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if err := fence.Admit(context.Background(), tx, old.token); !isStale(err, name, old.token, cur.token) {
			t.Fatalf("the old leader's Admit(%v) after term %v: %v, want ErrStaleToken naming both", old.token, cur.token, err)
		}
		c.resign[old.who] <- struct{}{}
	})
}

// mustAdmit admits token at fence in a transaction of its own.
func mustAdmit(t *testing.T, db *sql.DB, fence *advisorylock.Fence, token advisorylock.FencingToken) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := fence.Admit(context.Background(), tx, token); err != nil {
		t.Fatalf("Admit(%v): %v", token, err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestElectionRunReturnsLeadsError: a lead that returns nil resigns and
// Run campaigns again (a larger term); one that returns an error resigns
// and Run returns that error; after it nobody leads, and no goroutine is
// left. The election's name looks like SQL.
func TestElectionRunReturnsLeadsError(t *testing.T) {
	testdb.Slow(t, "campaigns several terms, per backend")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		// A name that looks like SQL is data: it reaches the term row as a
		// value.
		e := newElection(t, edb.open(t), testdb.UniqueName(t)+`'); DROP TABLE advisorylock_elections; --\`, edb.opts...)
		boom := errors.New("boom")
		var terms []advisorylock.FencingToken
		err := e.Run(context.Background(), func(ctx context.Context, term advisorylock.FencingToken) error {
			terms = append(terms, term)
			if len(terms) < 3 {
				return nil
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Run: %v, want lead's error", err)
		}
		if len(terms) != 3 || terms[0] >= terms[1] || terms[1] >= terms[2] {
			t.Fatalf("terms %v, want three, strictly increasing", terms)
		}
		if h, err := e.Leader(context.Background()); h != nil || err != nil {
			t.Fatalf("Leader after Run returned: %+v, %v", h, err)
		}
	})
}

// TestElectionRunReturnsContextError: cancelling Run's context while it
// leads cancels lead's context, resigns, and Run returns ctx.Err(); while
// it campaigns behind another leader, Run returns ctx.Err() too.
func TestElectionRunReturnsContextError(t *testing.T) {
	testdb.Slow(t, "campaigns behind a leader, per backend")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		leader := newElection(t, edb.open(t), name, edb.opts...)
		ctx, cancel := context.WithCancel(context.Background())
		leading := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- leader.Run(ctx, func(ctx context.Context, _ advisorylock.FencingToken) error {
				close(leading)
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-leading
		follower := newElection(t, edb.open(t), name, edb.opts...)
		fctx, fcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer fcancel()
		err := follower.Run(fctx, func(context.Context, advisorylock.FencingToken) error {
			return errors.New("the follower led while the leader ran")
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("follower's Run: %v, want its context's error", err)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("leader's Run: %v, want context.Canceled", err)
		}
		if h, err := follower.Leader(context.Background()); h != nil || err != nil {
			t.Fatalf("Leader after the leader's Run returned: %+v, %v", h, err)
		}
	})
}

// TestElectionLeaderIgnoresTheResignersSessionRetakingTheLock: a leader
// that resigned may get the same pooled session for its next campaign
// (here certainly: a pool of one connection), and the session's grant of
// the election's lock must not pass for its old term before it records a
// new one. The test takes the lock on that session with a plain Lock,
// which never records a term: Leader must say nobody leads.
func TestElectionLeaderIgnoresTheResignersSessionRetakingTheLock(t *testing.T) {
	eachElectionDBInParallel(t, true, func(t *testing.T, edb electionDB) {
		ctx := context.Background()
		db := edb.open(t)
		db.SetMaxOpenConns(1) // every statement on one server session
		name := testdb.UniqueName(t)
		e := newElection(t, db, name, edb.opts...)
		rctx, cancel := context.WithCancel(ctx)
		var led advisorylock.FencingToken
		err := e.Run(rctx, func(ctx context.Context, term advisorylock.FencingToken) error {
			led = term
			cancel() // one term: Run resigns and returns
			return nil
		})
		if !errors.Is(err, context.Canceled) || led == 0 {
			t.Fatalf("Run = %v after term %d, want context.Canceled after one term", err, led)
		}
		g, err := newLock(t, db, name).TryLock(ctx) // the election's key, on the resigner's session
		if err != nil {
			t.Fatalf("TryLock of the election's lock after the resign: %v", err)
		}
		defer mustRelease(t, g)
		watcher := newElection(t, edb.open(t), name, edb.opts...)
		if h, err := watcher.Leader(ctx); h != nil || err != nil {
			t.Fatalf("Leader while the resigner's session holds the lock but leads no term = %+v, %v; want nil (term %d ended)", h, err, led)
		}
	})
}

// TestElectionLeaderForgetsAKilledLeadersTerm: the leader's session is
// killed and the leader, without a keep-alive, cannot know (its term was
// never ended): its term's row still names its session. Leader must trust
// the row only while that session holds the lock: nobody leads once the
// server has freed it, nor while another session holds the lock without
// having recorded a term (a plain Lock on the name).
func TestElectionLeaderForgetsAKilledLeadersTerm(t *testing.T) {
	eachElectionDBInParallel(t, true, func(t *testing.T, edb electionDB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		c := startCandidates(t, edb, name, 1, advisorylock.WithKeepAlive(0))
		admin := edb.open(t)
		watcher := newElection(t, admin, name, edb.opts...)
		old := c.next(t, wait)
		killSession(t, edb, admin, checkLeader(t, watcher, name, old))
		var h *advisorylock.Holder
		testdb.WaitFor(t, wait, func() bool {
			var err error
			if h, err = watcher.Leader(ctx); err != nil {
				t.Fatal(err)
			}
			return h == nil
		}, "Leader still reported the killed leader's term")
		g := mustTry(t, newLock(t, edb.open(t), name)) // the election's key, recording no term
		defer mustRelease(t, g)
		if h, err := watcher.Leader(ctx); h != nil || err != nil {
			t.Fatalf("Leader while a plain Lock holds the killed leader's lock = %+v, %v; want nil (term %v ended with its session)", h, err, old.token)
		}
	})
}

// TestElectionObserveFollowsTheLeader: Observe delivers the current
// leader (nobody at first), then each new term, and closes when its
// context ends.
func TestElectionObserveFollowsTheLeader(t *testing.T) {
	testdb.Slow(t, "follows several terms, per backend")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		watcher := newElection(t, edb.open(t), name, append(slices.Clone(edb.opts), advisorylock.WithPollInterval(10*time.Millisecond))...)
		ctx, cancel := context.WithCancel(context.Background())
		seen := watcher.Observe(ctx)
		if h := receive(t, seen); h != nil {
			t.Fatalf("first leader observed: %+v, want nil", h)
		}
		c := startCandidates(t, edb, name, 2)
		for range 3 {
			tm := c.next(t, wait)
			testdb.WaitFor(t, wait, func() bool {
				h := receive(t, seen)
				return h != nil && h.Token == tm.token && h.Owner == fmt.Sprintf("candidate-%d", tm.who)
			}, "Observe never delivered term %v", tm.token)
			c.resign[tm.who] <- struct{}{}
		}
		c.stop(t)
		testdb.WaitFor(t, wait, func() bool { return receive(t, seen) == nil }, "Observe never delivered nobody leading")
		cancel()
		for range seen {
		}
	})
}

// receive waits for a value from ch.
func receive(t *testing.T, ch <-chan *advisorylock.Holder) *advisorylock.Holder {
	t.Helper()
	select {
	case h, ok := <-ch:
		if !ok {
			t.Fatal("Observe's channel closed")
		}
		return h
	case <-time.After(wait):
		t.Fatal("Observe delivered nothing")
		return nil
	}
}

// TestElectionEventsHaveKindElection: an Observer sees a term as an
// acquire and a release of kind "election".
func TestElectionEventsHaveKindElection(t *testing.T) {
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		rec := &observetest.Recorder{}
		name := testdb.UniqueName(t)
		e := newElection(t, edb.open(t), name, append(slices.Clone(edb.opts), advisorylock.WithObserver(rec))...)
		stop := errors.New("stop")
		if err := e.Run(context.Background(), func(context.Context, advisorylock.FencingToken) error { return stop }); !errors.Is(err, stop) {
			t.Fatal(err)
		}
		for _, ev := range rec.Events() {
			if ev.Kind != "election" || ev.Name != name {
				t.Errorf("event %+v, want kind election", ev)
			}
		}
		if rec.Count("acquire_end", "acquired") != 1 || len(rec.Events("release")) != 1 {
			t.Fatalf("events %+v, want one acquire and one release", rec.Events())
		}
	})
}

// TestNewElectionRefusesUnstorableNames: the term row stores the name.
func TestNewElectionRefusesUnstorableNames(t *testing.T) {
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	for _, name := range []string{"a\x00b", "\xff"} {
		if _, err := advisorylock.NewElection(db, name); err == nil {
			t.Errorf("NewElection(%q): no error", name)
		}
	}
	if _, err := advisorylock.NewElection(nil, "x"); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("NewElection(nil): %v", err)
	}
}

// TestElectionLeadPanicResigns: a panic in lead resigns before it goes
// on, so another candidate can lead.
func TestElectionLeadPanicResigns(t *testing.T) {
	testdb.Slow(t, "about two seconds on 2 CPUs")
	eachElectionDB(t, false, func(t *testing.T, edb electionDB) {
		e := newElection(t, edb.open(t), testdb.UniqueName(t), edb.opts...)
		recovered := func() (v any) {
			defer func() { v = recover() }()
			_ = e.Run(context.Background(), func(context.Context, advisorylock.FencingToken) error { panic("lead failed") })
			return nil
		}()
		if recovered != "lead failed" {
			t.Fatalf("Run let through %v, want lead's panic", recovered)
		}
		if h, err := e.Leader(context.Background()); h != nil || err != nil {
			t.Fatalf("Leader after lead panicked: %+v, %v", h, err)
		}
	})
}

// TestElectionRefusesTransactionPooler: behind a transaction-mode pooler
// a session lock cannot hold leadership, so Run (and Check) refuse with
// ErrTransactionPooler at once rather than campaigning forever, and lead
// never runs.
func TestElectionRefusesTransactionPooler(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			_, _, tx := poolerDBs(t, drv)
			testdb.CheckGoroutines(t) // after PgBouncer started: it runs on for the package's tests
			e := newElection(t, tx, testdb.UniqueName(t))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			err := e.Run(ctx, func(context.Context, advisorylock.FencingToken) error {
				return errors.New("led through a transaction pooler")
			})
			if !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("Run through a transaction pool = %v, want ErrTransactionPooler", err)
			}
			if err := e.Check(ctx); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("Check through a transaction pool = %v, want ErrTransactionPooler", err)
			}
		})
	}
}

// runRefused runs an election on name that must not lead, and returns
// Run's error; it fails the test if Run tries for longer than a generous
// bound (an error it keeps retrying; a refusal takes a few round trips).
func runRefused(t *testing.T, db *sql.DB, name string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := newElection(t, db, name).Run(ctx, func(context.Context, advisorylock.FencingToken) error {
		return errors.New("led without the privilege")
	})
	if ctx.Err() != nil {
		t.Errorf("Run was still campaigning after 10s: %v", err)
	}
	return err
}

// TestElectionRunReturnsAMissingPrivilege: an ordinary role without a
// grant on advisorylock_elections, or without the right to create the
// missing tables, gets from Run at once an error naming the election and
// keeping SQLSTATE 42501, instead of a campaign retried forever.
func TestElectionRunReturnsAMissingPrivilege(t *testing.T) {
	testdb.Slow(t, "creates fresh databases and roles")
	admin := testdb.OpenPostgres(t, "postgres")
	ctx := context.Background()
	role := ordinaryRole(t, admin)
	base := testdb.PostgresDSN(t)
	withTables := testdb.WithDatabase(base, freshDatabase(t, admin))
	owner := testdb.OpenPostgresDSN(t, "postgres", withTables)
	for _, s := range []string{advisorylock.Schema(advisorylock.Postgres()),
		"GRANT SELECT, INSERT, UPDATE ON advisorylock_leases, advisorylock_fences TO " + role, // not advisorylock_elections
		"GRANT USAGE ON SEQUENCE advisorylock_token_seq TO " + role,
		"GRANT SELECT ON advisorylock_schema TO " + role} {
		if _, err := owner.ExecContext(ctx, s); err != nil {
			t.Fatalf("%.60s: %v", s, err)
		}
	}
	bare := testdb.WithDatabase(base, freshDatabase(t, admin))
	for _, drv := range testdb.Drivers {
		for what, dsn := range map[string]string{"no grant on advisorylock_elections": withTables, "no tables, no CREATE": bare} {
			name := testdb.UniqueName(t)
			db := testdb.OpenPostgresDSN(t, drv, withUser(t, dsn, role))
			var coded interface{ SQLState() string }
			if err := newElection(t, db, name).Check(ctx); !errors.As(err, &coded) || coded.SQLState() != "42501" {
				t.Errorf("%s, %s: Check = %v; want the 42501 that Run gets", drv, what, err)
			}
			err := runRefused(t, db, name)
			if !errors.As(err, &coded) || coded.SQLState() != "42501" || !strings.Contains(err.Error(), "election "+strconv.Quote(name)) {
				t.Errorf("%s, %s: Run = %v; want at once an error naming the election, wrapping SQLSTATE 42501", drv, what, err)
			}
			t.Logf("%s, %s: %v", drv, what, err)
		}
	}
}

// TestElectionLeadReturningAtOnceDoesNotHammer: a lead that returns nil
// at once (a buggy one, or one with nothing to do) makes Run pause
// before it campaigns again, longer each time up to about a second: over
// three seconds it begins at most 30 terms (about 9 expected, 3 on
// SQLite, whose resigner stands aside; a tight loop begins one per round
// trip, hundreds), and at least two.
func TestElectionLeadReturningAtOnceDoesNotHammer(t *testing.T) {
	testdb.Slow(t, "counts terms over 3 s, per backend")
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		e := newElection(t, edb.open(t), testdb.UniqueName(t), edb.opts...)
		if err := e.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var terms atomic.Int32
		err := e.Run(ctx, func(context.Context, advisorylock.FencingToken) error {
			terms.Add(1)
			return nil
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run: %v, want its context's error", err)
		}
		if n := terms.Load(); n < 2 || n > 30 {
			t.Fatalf("a lead returning nil at once ran %d times in 3s, want 2 to 30", n)
		}
		t.Logf("%d terms in 3s", terms.Load())
	})
}

// TestElectionResignHandsOverAndRunGoesOn: Resign cancels the leader's
// lead, frees the term for another candidate, returns once it is freed,
// and leaves Run campaigning; a Resign from a replica that does not lead
// returns nil at once.
func TestElectionResignHandsOverAndRunGoesOn(t *testing.T) {
	eachElectionDBInParallel(t, false, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		c := startCandidates(t, edb, name, 2)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		first := c.next(t, wait)
		other := 1 - first.who
		if err := c.elections[other].Resign(ctx); err != nil {
			t.Fatalf("Resign of a candidate that does not lead: %v", err)
		}
		select {
		case l := <-c.causes[other]:
			t.Fatalf("Resign of a non-leader ended a lead (cause %v)", l.cause)
		default:
		}
		// The other candidate has done its first-use work: it campaigns.
		if err := c.elections[other].Check(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.elections[first.who].Resign(ctx); err != nil {
			t.Fatalf("Resign of the leader: %v", err)
		}
		select {
		case <-c.causes[first.who]:
		default:
			t.Fatal("Resign returned before the leader's lead saw its context end")
		}
		next := c.next(t, wait)
		if next.who != other || next.token <= first.token {
			t.Fatalf("after the leader (%d, term %v) resigned, candidate %d led with term %v; want candidate %d with a larger term", first.who, first.token, next.who, next.token, other)
		}
		select {
		case err := <-c.done:
			t.Fatalf("a Run returned after Resign: %v, want it to go on campaigning", err)
		default:
		}
		if n := c.overlap.Load(); n != 0 {
			t.Fatalf("%d leads overlapped", n)
		}
	})
}
