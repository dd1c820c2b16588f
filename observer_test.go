package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/renewal"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/lib/pq"
)

// TestObserverSeesEveryEventOnPostgres runs the shared scenario (acquire,
// conflict, timeout, cancelled wait, release, killed session, lease
// renewal) and checks each event, its attributes, and that a hold's
// events carry the context its acquire's "acquire_end" returned.
func TestObserverSeesEveryEventOnPostgres(t *testing.T) {
	testdb.Slow(t, "drives every event, per driver")
	t.Parallel() // names and pools of its own; it ends only its own holder's session
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			db := testdb.OpenPostgres(t, driver)
			rec := &observetest.Recorder{}
			observetest.PostgresScenario(t, db, rec, observetest.Hooks{
				WhileHeld: func(t *testing.T) {
					if n, r := len(rec.Events("acquire_end")), len(rec.Events("release")); n != 1 || r != 0 {
						t.Errorf("while A is held: %d acquires ended, %d releases; want 1, 0", n, r)
					}
				},
				Renewed: func() bool { return rec.Count("renew", "renewed") > 0 },
			})

			for _, e := range rec.Events() {
				if e.Backend != "postgres" || e.Name == "" {
					t.Errorf("%s event describes backend %q, name %q; want backend postgres and the lock's name", e.Type, e.Backend, e.Name)
				}
			}
			wantOutcomes := map[string]map[string]int{
				"lock":  {"acquired": 2, "not_acquired": 1, "timeout": 1, "canceled": 1},
				"lease": {"acquired": 1},
			}
			got := map[string]map[string]int{}
			starts := map[int]bool{}
			for _, e := range rec.Events("acquire_start") {
				starts[e.Span] = true
			}
			for _, e := range rec.Events("acquire_end") {
				if got[e.Kind] == nil {
					got[e.Kind] = map[string]int{}
				}
				got[e.Kind][e.Value]++
				if !starts[e.Span] {
					t.Errorf("acquire_end %s did not get its acquire_start's context", e.Value)
				}
				if (e.Err == nil) != (e.Value == "acquired") {
					t.Errorf("acquire_end %s with err %v", e.Value, e.Err)
				}
			}
			for kind, want := range wantOutcomes {
				for outcome, n := range want {
					if got[kind][outcome] != n {
						t.Errorf("acquires of kind %s with outcome %s: %d, want %d (all: %v)", kind, outcome, got[kind][outcome], n, got)
					}
				}
			}

			released := rec.Events("release")
			if len(released) != 3 {
				t.Fatalf("%d Released events, want 3: %+v", len(released), released)
			}
			granted := map[int]bool{}
			for _, e := range rec.Events("acquire_end") {
				if e.Value == "acquired" {
					granted[e.Span] = true
				}
			}
			for _, e := range released {
				if !granted[e.Span] || e.Value != "" || e.Err != nil || e.Duration <= 0 {
					t.Errorf("Released %+v: want a granted acquire's context, not forgotten, no error, a hold time", e)
				}
			}
			if k := released[2].Kind; k != "lease" {
				t.Errorf("last release is of kind %s, want lease", k)
			}

			lost := rec.Events("loss")
			if len(lost) != 1 || lost[0].Value != "session_ended" || !errors.Is(lost[0].Err, advisorylock.ErrLockLost) {
				t.Fatalf("Lost events %+v, want one session_ended with ErrLockLost", lost)
			}
			if lost[0].Span != released[1].Span {
				t.Errorf("Lost came with acquire %d's context, the lost lock's release with %d", lost[0].Span, released[1].Span)
			}

			c, l, n := rec.Count("discard", "canceled"), rec.Count("discard", "session_ended"), len(rec.Events("discard"))
			if driver == "postgres" {
				// lib/pq's cancel request may miss answerGrace on a loaded
				// machine: the statement is then abandoned, not answered.
				c += rec.Count("discard", "no_answer")
			}
			if c != 1 || l != 1 || n != 2 {
				t.Errorf("discards: %d canceled, %d session_ended (the lost lock's), %d in all; want 1, 1, 2: %+v", c, l, n, rec.Events("discard"))
			}
			for _, e := range rec.Events("renew") {
				if e.Kind != "lease" || e.Value != "renewed" || e.Duration <= 0 || e.Err != nil {
					t.Errorf("Renewed %+v: want a lease renewed, with its latency", e)
				}
			}
		})
	}
}

// TestObserverSeesLockRowsOnSQLite checks the events of a Lock kept as a
// lease row (SQLite): acquire, conflict, renewal, release; no connection
// is pinned, so none is discarded.
func TestObserverSeesLockRowsOnSQLite(t *testing.T) {
	testdb.Slow(t, "waits for renewals a second apart")
	t.Parallel() // a file of its own
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
	rec := &observetest.Recorder{}
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithObserver(rec), advisorylock.WithLeaseTTL(3*time.Second)) // a renewal within a second; a stall of one loses no lease
	ctx := context.Background()
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second TryLock: %v, want ErrNotAcquired", err)
	}
	testdb.WaitFor(t, 0, func() bool { return rec.Count("renew", "renewed") > 0 }, "no renewal of the lock row observed")
	mustRelease(t, g)

	if a, n := rec.Count("acquire_end", "acquired"), rec.Count("acquire_end", "not_acquired"); a != 1 || n != 1 {
		t.Errorf("acquires: %d acquired, %d not_acquired; want 1, 1", a, n)
	}
	if r := rec.Events("release"); len(r) != 1 || r[0].Duration <= 0 {
		t.Errorf("Released events %+v, want one with a hold time", r)
	}
	if d := rec.Events("discard"); len(d) != 0 {
		t.Errorf("discards on SQLite: %+v, want none", d)
	}
	for _, e := range rec.Events() {
		if e.Backend != "sqlite" || e.Kind != "lock" {
			t.Errorf("%s event describes backend %q, kind %q; want backend sqlite, kind lock", e.Type, e.Backend, e.Kind)
		}
	}
}

// TestObserverSeesAForgottenGuard checks that a Guard collected without
// Release ends its hold for the Observer ("release", forgotten) and
// discards its connection.
func TestObserverSeesAForgottenGuard(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	rec := &observetest.Recorder{}
	l := newLock(t, db, testdb.UniqueName(t), pinned, advisorylock.WithObserver(rec))
	func() {
		if _, err := l.TryLock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}()
	testdb.WaitFor(t, 0, func() bool {
		runtime.GC()
		return rec.Count("release", "forgotten") == 1
	}, "forgotten guard's hold never ended for the observer")
	// The discard follows, from the goroutine the cleanup starts (it must
	// not wait on I/O in the runtime's cleanup goroutine): soon, not at once.
	testdb.WaitFor(t, 0, func() bool { return rec.Count("discard", "forgotten") > 0 },
		"no discard for a forgotten guard")
	if n := rec.Count("discard", "forgotten"); n != 1 {
		t.Errorf("%d discards for a forgotten guard, want 1", n)
	}
}

// TestObserverAddsNoAllocation checks that an Observer that keeps nothing
// costs TryLock+Release no allocation: events are passed by value.
func TestObserverAddsNoAllocation(t *testing.T) {
	testdb.Slow(t, "counts allocations over many acquires")
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
	ctx := context.Background()
	allocs := func(opts ...advisorylock.Option) float64 {
		l := newLock(t, db, testdb.UniqueName(t), opts...)
		return testing.AllocsPerRun(200, func() {
			g, err := l.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			mustRelease(t, g)
		})
	}
	allocs() // warm the pool and the schema
	bare, observed := allocs(), allocs(advisorylock.WithObserver(nopObserver{}))
	if observed > bare {
		t.Errorf("TryLock+Release: %.0f allocations with a no-op Observer, %.0f without", observed, bare)
	}
}

// nopObserver is an Observer that keeps nothing.
type nopObserver struct{}

func (nopObserver) Observe(ctx context.Context, _ advisorylock.Event) context.Context { return ctx }

// TestObserverSeesALeaseLoss expires a lease by its clock and lets another
// holder take it over: the first holder's keeper reports the loss, with
// the lease's kind and a lease cause (which of the two it notices first,
// the local deadline or the renewal's refusal, is a race of timers).
func TestObserverSeesALeaseLoss(t *testing.T) {
	const ttl = time.Second
	path := testdb.SQLitePath(t)
	open := func() *sql.DB {
		return testdb.OpenSQLite(t, path, sqliteWAL)
	}
	clock := testdb.NewFakeClock()
	rec := &observetest.Recorder{}
	name := testdb.UniqueName(t)
	opts := []advisorylock.Option{advisorylock.WithLeaseTTL(ttl), advisorylock.WithClock(clock.Now), advisorylock.WithObserver(rec)}
	first := newLeaseLock(t, open(), name, opts...)
	second := newLeaseLock(t, open(), name, opts...)
	g := tryLease(t, first)
	clock.Add(ttl)
	h := tryLease(t, second)
	defer releaseLease(t, h)
	select {
	case <-g.Lease().Lost():
	case <-time.After(leaseWait):
		t.Fatal("the expired holder's Lost() never closed")
	}
	releaseLease(t, g)

	lost := rec.Events("loss")
	if len(lost) != 1 || lost[0].Kind != "lease" || lost[0].Backend != "sqlite" ||
		(lost[0].Value != "expired" && lost[0].Value != "taken_over") ||
		!errors.Is(lost[0].Err, advisorylock.ErrLockLost) || !strings.Contains(lost[0].Err.Error(), "lease") {
		t.Fatalf("Lost events %+v, want one for the lease, expired or taken_over, with ErrLockLost naming the lease", lost)
	}
	if lost[0].Value == "taken_over" && rec.Count("renew", "lost") != 1 {
		t.Errorf("taken over, but renewals say %+v", rec.Events("renew"))
	}
	if a := rec.Count("acquire_end", "acquired"); a != 2 {
		t.Errorf("%d grants observed, want 2", a)
	}
	if r := rec.Events("release"); len(r) != 1 || r[0].Span != lost[0].Span {
		t.Errorf("Released %+v: want the lost lease's release, with its acquire's context", r)
	}
}

// TestObserverTellsARenewalThatFoundTheLeaseLost hands a held lease's
// row to another owner: the next renewal's EventRenew carries an Err that
// matches ErrLockLost (the adapters' "lost"), and the EventLoss that
// follows says taken_over. (SQLite: renewals a third of a second apart,
// each before the local deadline.)
func TestObserverTellsARenewalThatFoundTheLeaseLost(t *testing.T) {
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
	rec := &observetest.Recorder{}
	name := testdb.UniqueName(t)
	g := tryLease(t, newLeaseLock(t, db, name, quiet, advisorylock.WithLeaseTTL(time.Second), advisorylock.WithObserver(rec)))
	defer releaseLease(t, g)
	testdb.WaitFor(t, 0, func() bool { return rec.Count("renew", "renewed") > 0 }, "no renewal observed")
	if _, err := db.Exec("UPDATE advisorylock_leases SET owner = 'someone-else' WHERE name = ?", name); err != nil {
		t.Fatal(err)
	}
	testdb.WaitFor(t, 0, func() bool { return len(rec.Events("loss")) > 0 }, "the lease handed to another owner was not lost")
	lost := rec.Events("loss")
	renewals := rec.Events("renew")
	last := renewals[len(renewals)-1]
	if len(lost) != 1 || lost[0].Value != "taken_over" {
		t.Fatalf("loss events %+v, want one taken_over", lost)
	}
	if !errors.Is(last.Err, advisorylock.ErrLockLost) || last.Value != "lost" || last.Outcome != "" || last.Duration <= 0 {
		t.Fatalf("the last renewal %+v: want an Err matching ErrLockLost, no Outcome, its latency", last)
	}
	for _, e := range renewals[:len(renewals)-1] {
		if e.Err != nil {
			t.Errorf("renewal %+v before the takeover: want Err nil", e)
		}
	}
}

// TestObserverLearnsTheBackendOfAWrappedDriver checks the one case where
// a lock does not know its backend before its first use (a driver wrapped
// by instrumentation): the first "acquire_start" says "unknown", and every
// later event names the backend the first use found.
func TestObserverLearnsTheBackendOfAWrappedDriver(t *testing.T) {
	registerWrapped.Do(func() { sql.Register("wrapped-pq", wrappedDriver{&pq.Driver{}}) })
	db, err := sql.Open("wrapped-pq", testdb.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rec := &observetest.Recorder{}
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithObserver(rec))
	for range 2 {
		g, err := l.TryLock(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		mustRelease(t, g)
	}
	var backends []string
	for _, e := range rec.Events() {
		backends = append(backends, string(e.Type)+":"+e.Backend)
	}
	want := []string{"acquire_start:unknown", "acquire_end:postgres", "release:postgres",
		"acquire_start:postgres", "acquire_end:postgres", "release:postgres"}
	if !slices.Equal(backends, want) {
		t.Errorf("events %v, want %v", backends, want)
	}
}

// TestObserverSeesANetworkCut cuts the network under a held lock: the
// keep-alive gets no answer (cause no_answer). Where the driver does not
// end a statement with its context (lib/pq), the check is abandoned and
// its connection discarded for no_answer; pgx ends it, and the release of
// the lost lock discards the connection for the loss's cause, no_answer
// too: one discard either way.
func TestObserverSeesANetworkCut(t *testing.T) {
	testdb.Slow(t, "fault: network cut")
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			db, proxy := testdb.OpenPostgresProxied(t, driver)
			rec := &observetest.Recorder{}
			l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithObserver(rec),
				advisorylock.WithKeepAlive(50*time.Millisecond), advisorylock.WithReleaseTimeout(300*time.Millisecond))
			g, err := l.TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			proxy.Cut()
			defer proxy.Heal()
			select {
			case <-g.Lost():
			case <-time.After(testdb.DefaultWait):
				t.Fatal("the cut was not reported as a loss")
			}
			_ = g.Release(context.Background())
			if lost := rec.Events("loss"); len(lost) != 1 || lost[0].Value != "no_answer" {
				t.Fatalf("Lost events %+v, want one no_answer", lost)
			}
			if d := rec.Events("discard"); len(d) != 1 || d[0].Value != "no_answer" {
				t.Errorf("discards %+v, want one no_answer", d)
			}
			if r := rec.Events("release"); len(r) != 1 {
				t.Errorf("Released events %+v, want one", r)
			}
		})
	}
}

// TestSeveralObserversAreEachToldInOrder gives a lock two Observers (two
// WithObserver, a nil one between them): each is told of every event, the
// first before the second, and each gets back the contexts it returned
// itself, as if it were alone. The second has seen an acquire of another
// lock first, so that the two number the same acquire differently.
func TestSeveralObserversAreEachToldInOrder(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	ctx := context.Background()
	turns := &turns{}
	first, second := &turnTaker{name: "first", turns: turns}, &turnTaker{name: "second", turns: turns}
	mustRelease(t, mustTry(t, newLock(t, db, testdb.UniqueName(t), advisorylock.WithObserver(second))))
	turns.reset()

	name := testdb.UniqueName(t)
	l := newLock(t, db, name, advisorylock.WithObserver(first), advisorylock.WithObserver(nil),
		advisorylock.WithObserver(second), advisorylock.WithKeepAlive(50*time.Millisecond))
	g := mustTry(t, l)
	if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second TryLock: %v, want ErrNotAcquired", err)
	}
	observetest.TerminateHolder(t, db, l)
	select {
	case <-g.Lost():
	case <-time.After(testdb.DefaultWait):
		t.Fatal("the lock was not reported lost after its session was terminated")
	}
	_ = g.Release(ctx)

	told := turns.list()
	for i := 0; i < len(told); i += 2 {
		if i+1 == len(told) || told[i] != "first:"+told[i+1][len("second:"):] {
			t.Fatalf("observers told %v; want each event told to first, then second", told)
		}
	}
	var seen []string
	for _, o := range []*turnTaker{first, second} {
		var events []string
		var start, granted int
		for _, e := range o.Events() {
			if e.Name != name {
				continue
			}
			events = append(events, string(e.Type)+":"+e.Value)
			switch e.Type {
			case advisorylock.EventAcquireStart:
				start = e.Span
			case advisorylock.EventAcquireEnd:
				if e.Span != start {
					t.Errorf("%s: acquire_end got acquire %d's context, want %d's (its own start's)", o.name, e.Span, start)
				}
				if e.Outcome == advisorylock.OutcomeAcquired {
					granted = start
				}
			case advisorylock.EventLoss, advisorylock.EventRelease:
				if e.Span != granted {
					t.Errorf("%s: %s got acquire %d's context, want %d's (the grant's)", o.name, e.Type, e.Span, granted)
				}
			}
		}
		if seen == nil {
			seen = events
		} else if !slices.Equal(events, seen) {
			t.Errorf("second observer told %v, the first %v", events, seen)
		}
	}
	for _, want := range []string{"acquire_end:acquired", "acquire_end:not_acquired", "loss:session_ended", "release:"} {
		if !slices.Contains(seen, want) {
			t.Errorf("observers told %v, want %s among them", seen, want)
		}
	}
}

// turnTaker is a Recorder that first notes, in turns, that it was told.
type turnTaker struct {
	observetest.Recorder
	name  string
	turns *turns
}

func (o *turnTaker) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	o.turns.add(o.name + ":" + string(e.Type))
	return o.Recorder.Observe(ctx, e)
}

// turns is the order in which observers were told of events.
type turns struct {
	mu   sync.Mutex
	told []string
}

func (t *turns) add(s string) { t.mu.Lock(); t.told = append(t.told, s); t.mu.Unlock() }
func (t *turns) reset()       { t.mu.Lock(); t.told = nil; t.mu.Unlock() }
func (t *turns) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.told)
}

// TestObserverVocabularyKeepsItsStrings pins the strings of the event
// types, outcomes and causes, and the outcomes the metric adapters give a
// renewal: they are the values of metric labels that dashboards and
// alerts already match.
func TestObserverVocabularyKeepsItsStrings(t *testing.T) {
	got := []string{
		string(advisorylock.EventAcquireStart), string(advisorylock.EventAcquireEnd), string(advisorylock.EventRelease),
		string(advisorylock.EventLoss), string(advisorylock.EventDiscard), string(advisorylock.EventRenew),
		string(advisorylock.OutcomeAcquired), string(advisorylock.OutcomeNotAcquired), string(advisorylock.OutcomeTimeout),
		string(advisorylock.OutcomeCanceled), string(advisorylock.OutcomeError),
		string(advisorylock.CauseSessionEnded), string(advisorylock.CauseNotHeld), string(advisorylock.CauseNoAnswer),
		string(advisorylock.CauseExpired), string(advisorylock.CauseTakenOver),
		string(advisorylock.CauseCanceled), string(advisorylock.CauseError), string(advisorylock.CauseForgotten),
		renewal.Renewed, renewal.Lost, renewal.Error,
	}
	want := []string{
		"acquire_start", "acquire_end", "release", "loss", "discard", "renew",
		"acquired", "not_acquired", "timeout", "canceled", "error",
		"session_ended", "not_held", "no_answer", "expired", "taken_over",
		"canceled", "error", "forgotten",
		"renewed", "lost", "error",
	}
	if !slices.Equal(got, want) {
		t.Errorf("observer vocabulary %q, want %q", got, want)
	}
}
