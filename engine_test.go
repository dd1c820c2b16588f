package advisorylock_test

// The engine's promises (acquire, wait, keep-alive, loss, release),
// proven in seconds against the fake backend of fakebackend_test.go,
// through the public API only: these tests need no database, run under
// -short, and are how a rewrite of the engine is checked while it is
// written. The real servers prove the dialects (lock_test.go and the rest).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// fakeLock returns a Lock on the fake backend, whose keep-alive checks
// often (so that a loss is seen at once), logging nothing, pinned (a
// session per held lock) unless opts say WithMultiplexing(n).
func fakeLock(t *testing.T, s *fakeServer, db advisorylock.DB, name string, opts ...advisorylock.Option) *advisorylock.Lock {
	t.Helper()
	return newLock(t, db, name, append(append(fakeOptions(s), pinned), opts...)...)
}

// fakeOptions are the options of every lock of the engine tests.
func fakeOptions(s *fakeServer) []advisorylock.Option {
	return []advisorylock.Option{
		advisorylock.WithBackend(fakeBackend{s}),
		advisorylock.WithKeepAlive(time.Millisecond),
		advisorylock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
	}
}

// eventLog is an Observer that keeps each event as a line, "type
// outcome cause" with the fields that are set.
type eventLog struct {
	mu      sync.Mutex
	lines   []string
	events  []advisorylock.Event
	changed chan struct{} // closed and replaced at each event
}

func (o *eventLog) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	line := strings.Join(strings.Fields(fmt.Sprint(e.Type, " ", e.Outcome, " ", e.Cause)), " ")
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lines = append(o.lines, line)
	o.events = append(o.events, e)
	if o.changed != nil {
		close(o.changed)
		o.changed = nil
	}
	return ctx
}

// await waits until line has been seen.
func (o *eventLog) await(t *testing.T, line string) {
	t.Helper()
	deadline := time.After(wait)
	for {
		o.mu.Lock()
		if slices.Contains(o.lines, line) {
			o.mu.Unlock()
			return
		}
		if o.changed == nil {
			o.changed = make(chan struct{})
		}
		ch := o.changed
		o.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the observer never saw %q; it saw %q", line, o.seen())
		}
	}
}

func (o *eventLog) seen() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.lines)
}

// awaitLost waits for g's Lost channel to close.
func awaitLost(t *testing.T, g *advisorylock.Guard) {
	t.Helper()
	select {
	case <-g.Lost():
	case <-time.After(wait):
		t.Fatal("the loss was never told on Lost()")
	}
}

func TestEngineTryLockTakesAFreeLockAndReleaseRecyclesIt(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job")
	g := mustTry(t, l)
	session := s.holder(advisorylock.Key(l.Name()))
	if session == 0 {
		t.Fatal("TryLock returned a guard, but no session holds the key")
	}
	mustRelease(t, g)
	if h := s.holder(advisorylock.Key(l.Name())); h != 0 {
		t.Fatalf("after Release, session %d still holds the key", h)
	}
	if n := s.discards(); n != 0 {
		t.Fatalf("a clean release discarded %d connections; want it recycled", n)
	}
	s.mu.Lock()
	open := s.open[session]
	s.mu.Unlock()
	if st := db.Stats(); !open || st.InUse != 0 || st.Idle == 0 {
		t.Fatalf("after a clean release: session open %v, %d in use, %d idle; want it idle in the pool", open, st.InUse, st.Idle)
	}
}

func TestEngineTryMissReturnsTheConnectionToThePool(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job")
	other := s.take(advisorylock.Key(l.Name()))
	_, err := l.TryLock(context.Background())
	if !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock of a held lock: %v; want ErrNotAcquired", err)
	}
	if !strings.Contains(err.Error(), "job") {
		t.Errorf("the miss %q does not name the lock", err)
	}
	st := db.Stats()
	if st.InUse != 0 || st.Idle == 0 || s.discards() != 0 {
		t.Fatalf("after a definite miss: %d in use, %d idle, %d discarded; want the connection back in the pool", st.InUse, st.Idle, s.discards())
	}
	if n := s.count("wait"); n != 0 {
		t.Fatalf("a try waited (%d wait statements)", n)
	}
	if h := s.holder(advisorylock.Key(l.Name())); h != other {
		t.Fatalf("the key's holder is %d, want the other session %d", h, other)
	}
}

func TestEngineDoHoldsTheLockForItsFunctionAlone(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job")
	ran := false
	err := l.Do(context.Background(), func(ctx context.Context) error {
		ran = s.holder(advisorylock.Key(l.Name())) != 0 && advisorylock.GuardFromContext(ctx) != nil
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do: %v; fn ran holding the lock: %v", err, ran)
	}
	func() {
		defer func() { _ = recover() }()
		_ = l.Do(context.Background(), func(context.Context) error { panic("fn fails") })
	}()
	if h := s.holder(advisorylock.Key(l.Name())); h != 0 {
		t.Fatalf("after Do (and a panicking Do), session %d holds the key", h)
	}
	s.take(advisorylock.Key(l.Name()))
	ran, err = l.TryDo(context.Background(), func(context.Context) error {
		t.Error("TryDo ran fn under a lock held elsewhere")
		return nil
	})
	if ran || err != nil {
		t.Fatalf("TryDo of a held lock: %v, %v; want false, nil", ran, err)
	}
	if st := db.Stats(); st.InUse != 0 || s.discards() != 0 {
		t.Fatalf("after Do and TryDo: %d in use, %d discarded; want every connection recycled", st.InUse, s.discards())
	}
}

func TestEngineCancelledAcquireSendsNothing(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, acquire := range []func(context.Context) (*advisorylock.Guard, error){l.TryLock, l.Lock} {
		if _, err := acquire(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("acquire on a cancelled context: %v; want context.Canceled", err)
		}
	}
	if st := db.Stats(); st.OpenConnections != 0 || s.count("try") != 0 {
		t.Fatalf("a cancelled acquire opened %d connections and sent %d tries", st.OpenConnections, s.count("try"))
	}
}

// A try's checkout ends with the pool wait; a wait's only with its
// context, pinned or multiplexed (a shared session that gets no
// connection within the pool wait leaves the wait to a connection of its
// own).
func TestEngineCheckoutEndsWithItsContextOrThePoolWait(t *testing.T) {
	t.Parallel()
	for _, mode := range sessionModes() {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			opts := append(mode.opts, advisorylock.WithPoolWait(time.Millisecond))
			lines := int64(1) // the pool's lines the Lock joins: a pinned Lock its own
			if mode.opts == nil {
				// One shared session (the default's number depends on the
				// pool's limit): its line first, then its own.
				opts, lines = append(opts, advisorylock.WithMultiplexing(1)), 2
			}
			s, db := openFake(t)
			db.SetMaxOpenConns(1)
			l := fakeLock(t, s, db, "job", opts...)
			g := mustTry(t, fakeLock(t, s, db, "other")) // the pool's one connection
			defer mustRelease(t, g)
			tries := s.count("try")
			if _, err := l.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrPoolUnavailable) {
				t.Fatalf("TryLock on an exhausted pool: %v; want ErrPoolUnavailable after the pool wait", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, err := l.Lock(ctx) // a wait's checkout is bounded by ctx alone
				done <- err
			}()
			want := 1 + lines
			waitForPool := time.Now().Add(wait)
			for db.Stats().WaitCount < want && time.Now().Before(waitForPool) {
				runtime.Gosched() // database/sql tells no event for a checkout in line
			}
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Fatalf("Lock cancelled in the pool's line: %v; want context.Canceled", err)
			}
			if n := s.count("try") - tries; n != 0 {
				t.Fatalf("acquires that never got a connection sent %d tries", n)
			}
		})
	}
}

func TestEngineCancelledWaitLeavesNoHold(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	obs := &eventLog{}
	l := fakeLock(t, s, db, "job", advisorylock.WithObserver(obs))
	other := s.take(advisorylock.Key(l.Name()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.Lock(ctx)
		done <- err
	}()
	s.await(t, "the Lock to wait in the server", func() bool { return s.waiting[advisorylock.Key(l.Name())] == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait returned %v; want context.Canceled", err)
	}
	s.free(advisorylock.Key(l.Name()))
	s.await(t, "the waiter to leave", func() bool { return s.waiting[advisorylock.Key(l.Name())] == 0 })
	if h := s.holder(advisorylock.Key(l.Name())); h != 0 && h != other {
		t.Fatalf("after a cancelled wait, session %d holds the key", h)
	}
	// The wait's statement was cut short: the server may have granted
	// it, so its connection is discarded.
	if got := obs.seen(); !slices.Contains(got, "acquire_end canceled") || !slices.Contains(got, "discard canceled") {
		t.Fatalf("the observer saw %q; want an acquire_end and a discard, canceled", got)
	}
	if n := s.discards(); n != 1 {
		t.Fatalf("%d connections discarded; want the cancelled wait's", n)
	}
}

func TestEngineCancelledAsTheGrantArrivesDiscardsTheGrant(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.onStatement(func(op string, _, _ int64) error {
		if op == "try" {
			cancel() // the caller goes as the server grants
		}
		return nil
	})
	g, err := l.TryLock(ctx)
	if !errors.Is(err, context.Canceled) || g != nil {
		t.Fatalf("TryLock cancelled as it was granted: %v, %v; want context.Canceled and no guard", g, err)
	}
	if h := s.holder(advisorylock.Key(l.Name())); h != 0 {
		t.Fatalf("session %d still holds a grant nobody received", h)
	}
	if n := s.discards(); n != 1 {
		t.Fatalf("%d connections discarded; want the granted one", n)
	}
}

func TestEngineWaitIsGrantedWhenTheHolderReleases(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job")
	s.take(advisorylock.Key(l.Name()))
	got := make(chan *advisorylock.Guard, 1)
	go func() {
		g, err := l.Lock(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	s.await(t, "the Lock to wait in the server", func() bool { return s.waiting[advisorylock.Key(l.Name())] == 1 })
	s.free(advisorylock.Key(l.Name()))
	g := <-got
	if g == nil {
		return
	}
	defer mustRelease(t, g)
	if h := s.holder(advisorylock.Key(l.Name())); h == 0 {
		t.Fatal("Lock returned, but no session holds the key")
	}
}

func TestEngineLockTimeoutReturnsATimeoutError(t *testing.T) {
	t.Parallel()
	for _, budget := range []time.Duration{0, 20 * time.Millisecond} {
		t.Run(budget.String(), func(t *testing.T) {
			t.Parallel()
			s, db := openFake(t)
			l := fakeLock(t, s, db, "job")
			s.take(advisorylock.Key(l.Name()))
			start := time.Now()
			g, err := l.LockTimeout(context.Background(), budget)
			waited := time.Since(start)
			if g != nil || !isTimeout(err, "job") {
				t.Fatalf("LockTimeout(%s) of a held lock: %v, %v; want ErrTimeout naming the lock", budget, g, err)
			}
			if !strings.Contains(err.Error(), budget.String()) || waited > budget+5*time.Second {
				t.Errorf("LockTimeout(%s) = %v after %s; want the budget said and a wait that ended soon after it", budget, err, waited)
			}
			if budget == 0 && s.count("wait") != 0 {
				t.Errorf("LockTimeout(0) waited; want one attempt")
			}
			if st := db.Stats(); st.InUse != 0 || s.discards() != 0 {
				t.Fatalf("after the budget ran out: %d in use, %d discarded; want the connection recycled", st.InUse, s.discards())
			}
		})
	}
}

// TestEngineLossIsToldToLostDoAndTheObserver kills the hold each way the
// keep-alive can find it gone: the session lives on without the lock
// (not_held), or its statements fail (session_ended).
func TestEngineLossIsToldToLostDoAndTheObserver(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cause string
		lose  func(s *fakeServer, key int64)
	}{
		{"not_held", func(s *fakeServer, key int64) { s.free(key) }},
		{"session_ended", func(s *fakeServer, key int64) { s.kill(s.holder(key)) }},
	} {
		t.Run(tc.cause, func(t *testing.T) {
			t.Parallel()
			s, db := openFake(t)
			obs := &eventLog{}
			l := fakeLock(t, s, db, "job", advisorylock.WithObserver(obs))
			var fnCtx context.Context
			err := l.Do(context.Background(), func(ctx context.Context) error {
				fnCtx = ctx
				tc.lose(s, advisorylock.Key(l.Name()))
				awaitLost(t, advisorylock.GuardFromContext(ctx))
				select {
				case <-ctx.Done():
				case <-time.After(wait):
					t.Error("the loss did not end fn's context")
				}
				return ctx.Err()
			})
			if !errors.Is(err, advisorylock.ErrLockLost) {
				t.Fatalf("Do after a loss returned %v; want ErrLockLost", err)
			}
			if cause := context.Cause(fnCtx); !errors.Is(cause, advisorylock.ErrLockLost) {
				t.Fatalf("fn's context ended with %v; want ErrLockLost", cause)
			}
			got := obs.seen()
			want := []string{"acquire_start", "acquire_end acquired", "loss " + tc.cause, "discard " + tc.cause, "release"}
			if !slices.Equal(got, want) {
				t.Fatalf("the observer saw %q; want %q", got, want)
			}
			if n := s.discards(); n != 1 {
				t.Fatalf("%d connections discarded; want the lost lock's", n)
			}
		})
	}
}

func TestEngineReleaseOfALostLockDiscardsItsConnection(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job")
	g := mustTry(t, l)
	lost := g.Lost()                   // asked before the loss: the loss must close it
	s.free(advisorylock.Key(l.Name())) // the session lives on, without the lock
	select {
	case <-lost:
	case <-time.After(wait):
		t.Fatal("the loss did not close Lost()")
	}
	if err := g.Release(context.Background()); err != nil {
		t.Fatalf("Release of a lost lock: %v", err)
	}
	if st := db.Stats(); s.discards() != 1 || st.InUse != 0 {
		t.Fatalf("after releasing a lost lock: %d discarded, %d in use; want its connection discarded", s.discards(), st.InUse)
	}
}

func TestEngineFailedStatementsDiscardTheConnection(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"try", "unlock"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			s, db := openFake(t)
			obs := &eventLog{}
			l := fakeLock(t, s, db, "job", advisorylock.WithKeepAlive(0), advisorylock.WithObserver(obs))
			boom := errors.New("fake: connection reset")
			s.failNext(op, boom)
			g, err := l.TryLock(context.Background())
			if op == "unlock" {
				if err != nil {
					t.Fatal(err)
				}
				err = g.Release(context.Background())
			}
			if !errors.Is(err, boom) {
				t.Fatalf("a failed %s returned %v; want the driver's error", op, err)
			}
			if h := s.holder(advisorylock.Key(l.Name())); h != 0 {
				t.Fatalf("after a failed %s, session %d holds the key", op, h)
			}
			if st := db.Stats(); s.discards() != 1 || st.InUse != 0 {
				t.Fatalf("after a failed %s: %d discarded, %d in use; want the connection discarded", op, s.discards(), st.InUse)
			}
			if !slices.Contains(obs.seen(), "discard error") {
				t.Fatalf("the observer saw %q; want a discard for error", obs.seen())
			}
		})
	}
}

func TestEngineForgottenGuardIsDiscarded(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	obs := &eventLog{}
	l := fakeLock(t, s, db, "job", advisorylock.WithObserver(obs))
	dropGuard(t, func() any { return mustTry(t, l) })
	deadline := time.Now().Add(wait)
	for s.holder(advisorylock.Key(l.Name())) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a forgotten guard kept its lock")
		}
		runtime.GC()
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(10 * time.Millisecond): // another GC cycle
		}
	}
	if n := s.discards(); n != 1 {
		t.Fatalf("%d connections discarded; want the forgotten guard's", n)
	}
	obs.await(t, "release forgotten")
	obs.await(t, "discard forgotten")
}

func TestEngineObserverSeesEachAcquireInOrder(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	obs := &eventLog{}
	l := fakeLock(t, s, db, "job", advisorylock.WithObserver(obs))
	mustRelease(t, mustTry(t, l))
	s.take(advisorylock.Key(l.Name()))
	_, _ = l.TryLock(context.Background())
	want := []string{
		"acquire_start", "acquire_end acquired", "release",
		"acquire_start", "acquire_end not_acquired",
	}
	if got := obs.seen(); !slices.Equal(got, want) {
		t.Fatalf("the observer saw %q; want %q", got, want)
	}
	for _, e := range obs.events {
		if e.Name != "job" || e.Backend != "fake" || fmt.Sprint(e.Kind) != "lock" {
			t.Fatalf("event %+v: want Name job, Backend fake, Kind lock", e)
		}
	}
}

func TestEngineRefusesBadInput(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	fake := advisorylock.WithBackend(fakeBackend{s})
	if _, err := advisorylock.New(nil, "job", fake); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("New(nil): %v; want ErrUnsupported", err)
	}
	for name, opts := range map[string][]advisorylock.Option{
		"empty name":            nil,
		"negative keepalive":    {advisorylock.WithKeepAlive(-time.Second)},
		"negative multiplexing": {advisorylock.WithMultiplexing(-1)},
	} {
		lockName := "job"
		if name == "empty name" {
			lockName = ""
		}
		if _, err := advisorylock.New(db, lockName, append(opts, fake)...); err == nil {
			t.Errorf("New with %s: no error", name)
		}
	}
	l := fakeLock(t, s, db, "job")
	if err := l.Do(context.Background(), nil); err == nil {
		t.Error("Do(nil): no error")
	}
	// What the backend cannot do is refused at the first operation.
	if _, err := l.TryRLock(context.Background()); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("TryRLock on a backend without shared locks: %v; want ErrUnsupported", err)
	}
	w := fakeLock(t, s, db, "window", advisorylock.WithMinHold(time.Minute))
	if _, err := w.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("WithMinHold on a backend without windows: %v; want ErrUnsupported", err)
	}
	if st := db.Stats(); st.InUse != 0 || s.discards() != 0 {
		t.Fatalf("refusals left %d connections in use, %d discarded", st.InUse, s.discards())
	}
}

// TestEngineSetTakesAllOrNone runs on a shared session (the default) and
// on a pinned one: their try, release and keep-alive are separate code.
func TestEngineSetTakesAllOrNone(t *testing.T) {
	t.Parallel()
	for _, mode := range sessionModes() {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			setTakesAllOrNone(t, mode.opts)
		})
	}
}

func setTakesAllOrNone(t *testing.T, opts []advisorylock.Option) {
	s, db := openFake(t)
	names := []string{"a", "b", "c"}
	set, err := advisorylock.NewSet(db, names, append(fakeOptions(s), opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s.take(advisorylock.Key("b"))
	if _, err := set.TryLock(context.Background()); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryLock of a set with one name held: %v; want ErrNotAcquired", err)
	}
	for _, n := range []string{"a", "c"} {
		if h := s.holder(advisorylock.Key(n)); h != 0 {
			t.Fatalf("a missed set left %q held by session %d", n, h)
		}
	}
	s.free(advisorylock.Key("b"))
	g := mustTry(t, set)
	first := s.holder(advisorylock.Key("a"))
	for _, n := range names {
		if h := s.holder(advisorylock.Key(n)); h == 0 || h != first {
			t.Fatalf("%q is held by session %d; want every name on session %d", n, h, first)
		}
	}
	mustRelease(t, g)
	for _, n := range names {
		if h := s.holder(advisorylock.Key(n)); h != 0 {
			t.Fatalf("after the set's release %q is held by session %d", n, h)
		}
	}
	if n := s.discards(); n != 0 {
		t.Fatalf("a clean release of a set discarded %d connections", n)
	}
	g = mustTry(t, set)
	s.free(advisorylock.Key("c")) // one name lost loses the set
	awaitLost(t, g)
	mustRelease(t, g)
	for _, n := range names {
		if h := s.holder(advisorylock.Key(n)); h != 0 {
			t.Fatalf("after a lost set's release %q is held by session %d", n, h)
		}
	}
}

func TestEngineSemaphoreGivesEachSlotOnceAndAWaiterTheFreedOne(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	sem, err := advisorylock.NewSemaphore(db, "pool", 2, append(fakeOptions(s), advisorylock.WithPollInterval(time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g1, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if g1.Slot() == g2.Slot() {
		t.Fatalf("two holders share slot %d", g1.Slot())
	}
	if _, err := sem.TryAcquire(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("a third TryAcquire of two slots: %v; want ErrNotAcquired", err)
	}
	got := make(chan *advisorylock.Guard, 1)
	go func() {
		g, err := sem.Acquire(ctx) // waits, polling, for a slot
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	s.await(t, "the Acquire to try every slot", func() bool { return s.stmts["try any"] >= 4 })
	mustRelease(t, g1)
	g3 := <-got
	if g3 == nil {
		t.FailNow()
	}
	if g3.Slot() != g1.Slot() {
		t.Fatalf("the freed slot was %d, the waiter took %d", g1.Slot(), g3.Slot())
	}
	mustRelease(t, g2)
	mustRelease(t, g3)
	if st := db.Stats(); st.InUse != 0 || s.discards() != 0 {
		t.Fatalf("after every release: %d in use, %d discarded", st.InUse, s.discards())
	}
}

func TestEngineMultiplexedSessionLostLosesOnlyItsLocks(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	var locks []*advisorylock.Lock
	for i := range 6 {
		locks = append(locks, fakeLock(t, s, db, fmt.Sprint("tenant-", i), advisorylock.WithMultiplexing(2)))
	}
	// The first try stalls on its session, so the second opens another.
	first, resume := stalledTry(t, s, locks[0])
	guards := []*advisorylock.Guard{mustTry(t, locks[1])}
	resume()
	g := <-first
	if g == nil {
		t.FailNow()
	}
	guards = append(guards, g)
	keyOf := map[*advisorylock.Guard]int64{guards[0]: advisorylock.Key(locks[1].Name()), g: advisorylock.Key(locks[0].Name())}
	for _, l := range locks[2:] {
		g := mustTry(t, l)
		guards = append(guards, g)
		keyOf[g] = advisorylock.Key(l.Name())
	}
	defer func() {
		for _, g := range guards {
			_ = g.Release(context.Background())
		}
	}()
	sessions := map[int64][]*advisorylock.Guard{}
	for _, g := range guards {
		h := s.holder(keyOf[g])
		sessions[h] = append(sessions[h], g)
	}
	if len(sessions) != 2 {
		t.Fatalf("6 multiplexed locks on %d sessions; want 2", len(sessions))
	}
	busy, victim := s.holder(advisorylock.Key(locks[0].Name())), s.holder(advisorylock.Key(locks[1].Name()))
	if len(sessions[busy]) < len(sessions[victim]) {
		busy, victim = victim, busy
	}
	// A key gone from a session that lives on loses that lock alone.
	gone := sessions[busy][0]
	s.free(keyOf[gone])
	awaitLost(t, gone)
	sessions[busy] = sessions[busy][1:]

	s.kill(victim)
	for _, g := range sessions[victim] {
		awaitLost(t, g)
	}
	for h, gs := range sessions {
		if h == victim {
			continue
		}
		for _, g := range gs {
			select {
			case <-g.Lost():
				t.Fatalf("a lock on the surviving session %d was lost with its neighbour's", h)
			default:
			}
			if s.holder(keyOf[g]) != h {
				t.Fatalf("a lock on session %d is no longer held there", h)
			}
		}
	}
}

func TestEngineElectionLeaderLostHandsTheTermOn(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	type term struct {
		who   string
		token advisorylock.FencingToken
		ctx   context.Context
	}
	terms := make(chan term, 4)
	ctx, cancel := context.WithCancel(context.Background())
	var runs sync.WaitGroup
	for _, who := range []string{"a", "b"} {
		e, err := advisorylock.NewElection(db, "leader", append(fakeOptions(s), advisorylock.WithOwner(who))...)
		if err != nil {
			t.Fatal(err)
		}
		runs.Add(1)
		go func() {
			defer runs.Done()
			_ = e.Run(ctx, func(ctx context.Context, token advisorylock.FencingToken) error {
				terms <- term{who, token, ctx}
				<-ctx.Done()
				return ctx.Err()
			})
		}()
	}
	defer func() {
		cancel()
		runs.Wait()
	}()
	first := <-terms
	leader, err := advisorylock.NewElection(db, "leader", fakeOptions(s)...)
	if err != nil {
		t.Fatal(err)
	}
	h, err := leader.Leader(context.Background())
	if err != nil || h == nil || h.Owner != first.who || h.Token != first.token {
		t.Fatalf("Leader: %+v, %v; want %s with term %d", h, err, first.who, first.token)
	}
	s.kill(int64(h.PID))
	select {
	case <-first.ctx.Done():
	case <-time.After(wait):
		t.Fatal("the killed leader's lead kept running")
	}
	if cause := context.Cause(first.ctx); !errors.Is(cause, advisorylock.ErrLockLost) {
		t.Fatalf("the lost leader's context ended with %v; want ErrLockLost", cause)
	}
	var next term
	select {
	case next = <-terms:
	case <-time.After(wait):
		t.Fatal("no candidate took over from the lost leader")
	}
	if next.token <= first.token {
		t.Fatalf("after %s's term %d, %s leads with term %d; want a larger term", first.who, first.token, next.who, next.token)
	}
	h, err = leader.Leader(context.Background())
	if err != nil || h == nil || h.Owner != next.who || h.Token != next.token {
		t.Fatalf("Leader: %+v, %v; want %s with term %d", h, err, next.who, next.token)
	}
}

func TestEngineWithConnStepsTheKeepAliveAside(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	l := fakeLock(t, s, db, "job") // a keep-alive check every millisecond
	g := mustTry(t, l)
	defer mustRelease(t, g)
	s.await(t, "a keep-alive check", func() bool { return s.stmts["holds"] > 0 })
	var checks int
	err := g.WithConn(context.Background(), func(c advisorylock.Conn) error {
		before := s.count("holds")
		if _, err := c.ExecContext(context.Background(), "SELECT 1"); err != nil {
			return err
		}
		// An absence, so a window, not an event: a hundred keep-alive
		// intervals pass while fn is on the connection, and no check
		// may run on it meanwhile.
		time.Sleep(100 * time.Millisecond)
		checks = s.count("holds") - before
		return nil
	})
	if err != nil {
		t.Fatalf("WithConn: %v", err)
	}
	if checks != 0 {
		t.Fatalf("%d keep-alive checks ran on the connection while WithConn's fn did; want none", checks)
	}
	after := s.count("holds")
	s.await(t, "the keep-alive to check again after fn", func() bool { return s.stmts["holds"] > after })
}

// The tries and releases that come while a statement runs on a shared
// session wait for it, and then go in one statement together.
func TestEngineMultiplexedOpsShareTheNextStatement(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	locks := sharedFakeLocks(t, s, db, "batch-", 6)
	held := mustTry(t, locks[5]) // on the one shared session
	rival := fakeLock(t, s, db, "batch-rival")
	other := mustTry(t, rival) // a pinned session of its own
	defer mustRelease(t, other)
	contender := fakeLock(t, s, db, "batch-rival", oneSharedSession...)

	first, resume := stalledTry(t, s, locks[0])
	type result struct {
		i   int
		g   *advisorylock.Guard
		err error
	}
	results := make(chan result, 6)
	try := func(i int, l *advisorylock.Lock) {
		g, err := l.TryLock(context.Background())
		results <- result{i, g, err}
	}
	for i := 1; i < 5; i++ {
		go try(i, locks[i])
	}
	go try(-1, contender)
	go func() { results <- result{5, nil, held.Release(context.Background())} }()
	testdb.WaitFor(t, 0, func() bool { return advisorylock.MuxQueued(locks[0]) == 6 }, "6 ops queued behind the stalled try; %d are", advisorylock.MuxQueued(locks[0]))
	tries, unlocks := s.count("try"), s.count("unlock")
	resume()
	var guards []*advisorylock.Guard
	names := map[*advisorylock.Guard]string{}
	if g := <-first; g != nil {
		guards = append(guards, g)
		names[g] = locks[0].Name()
	}
	for range 6 {
		r := <-results
		switch {
		case r.i == -1 && !errors.Is(r.err, advisorylock.ErrNotAcquired):
			t.Errorf("a try of a name another session holds: %v, want ErrNotAcquired", r.err)
		case r.i != -1 && r.err != nil:
			t.Errorf("op %d: %v", r.i, r.err)
		case r.g != nil:
			guards = append(guards, r.g)
			names[r.g] = locks[r.i].Name()
		}
	}
	if n := s.count("try unlock"); n != 1 {
		t.Errorf("%d batched statements; want the 6 queued ops in one", n)
	}
	// The stalled try is counted once it runs.
	if n, m := s.count("try")-tries, s.count("unlock")-unlocks; n != 1 || m != 0 {
		t.Errorf("the queued ops ran %d tries and %d unlocks of their own; want them in the batch", n-1, m)
	}
	if h := s.holder(advisorylock.Key(locks[5].Name())); h != 0 {
		t.Errorf("the released lock is still held by session %d", h)
	}
	if h := s.holder(advisorylock.Key(contender.Name())); h != s.holder(advisorylock.Key(rival.Name())) || h == 0 {
		t.Errorf("the contended name moved to session %d", h)
	}
	if len(guards) != 5 {
		t.Fatalf("%d of the 5 free names granted", len(guards))
	}
	shared := s.holder(advisorylock.Key(locks[0].Name()))
	for _, g := range guards {
		if h := s.holder(advisorylock.Key(names[g])); h != shared {
			t.Errorf("%s is held by session %d, not the shared one", names[g], h)
		}
		mustRelease(t, g)
	}
}

// A batched statement that fails ends its shared session, as any failed
// statement there does: each of its ops gets the error, every lock on
// the session is told it is lost, and nothing stays reserved.
func TestEngineMultiplexedBatchThatFailsEndsTheSession(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	locks := sharedFakeLocks(t, s, db, "failed-batch-", 4)
	held := mustTry(t, locks[3])
	first, resume := stalledTry(t, s, locks[0])
	errs := make(chan error, 2)
	for _, l := range locks[1:3] {
		go func() {
			g, err := l.TryLock(context.Background())
			if err == nil {
				_ = g.Release(context.Background())
			}
			errs <- err
		}()
	}
	testdb.WaitFor(t, 0, func() bool { return advisorylock.MuxQueued(locks[0]) == 2 }, "2 tries queued; %d are", advisorylock.MuxQueued(locks[0]))
	cut := errors.New("fake: connection reset")
	s.failNext("try unlock", cut)
	resume()
	for range 2 {
		if err := <-errs; !errors.Is(err, cut) {
			t.Errorf("a try in the failed batch: %v, want the statement's error", err)
		}
	}
	g0 := <-first
	if g0 == nil {
		t.FailNow()
	}
	for i, g := range []*advisorylock.Guard{held, g0} {
		select {
		case <-g.Lost():
		case <-time.After(time.Minute):
			t.Fatalf("%s on the ended session not told it is lost", []string{locks[3].Name(), locks[0].Name()}[i])
		}
		_ = g.Release(context.Background())
	}
	if s.discards() == 0 {
		t.Error("the ended session's connection was not discarded")
	}
	mustRelease(t, mustTry(t, locks[1])) // not left reserved
}

// lockTableFull is the fake's error for a full lock table (SQLSTATE 53200).
type lockTableFull struct{}

func (lockTableFull) Error() string    { return "fake: out of shared memory" }
func (lockTableFull) SQLState() string { return "53200" }

// A batch that the server's full lock table refuses leaves its session
// standing: the library asks which keys the session holds, and runs what
// the batch did not do one statement each.
func TestEngineMultiplexedBatchOnAFullLockTableKeepsTheSession(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	locks := sharedFakeLocks(t, s, db, "full-table-", 4)
	held := mustTry(t, locks[3])
	first, resume := stalledTry(t, s, locks[0])
	errs := make(chan error, 3)
	var granted sync.Map
	for _, l := range locks[1:3] {
		go func() {
			g, err := l.TryLock(context.Background())
			if err == nil {
				granted.Store(l.Name(), g)
			}
			errs <- err
		}()
	}
	go func() { errs <- held.Release(context.Background()) }()
	testdb.WaitFor(t, 0, func() bool { return advisorylock.MuxQueued(locks[0]) == 3 }, "3 ops queued; %d are", advisorylock.MuxQueued(locks[0]))
	s.failNext("try unlock", lockTableFull{})
	resume()
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("an op of the refused batch: %v; want it run alone", err)
		}
	}
	g0 := <-first
	if g0 == nil {
		t.FailNow()
	}
	select {
	case <-g0.Lost():
		t.Fatal("the session was ended: a lock held beside the batch is lost")
	default:
	}
	if s.discards() != 0 || s.holder(advisorylock.Key(locks[3].Name())) != 0 {
		t.Errorf("%d discards, the released name held by session %d; want the session standing and the name free", s.discards(), s.holder(advisorylock.Key(locks[3].Name())))
	}
	granted.Range(func(_, g any) bool { mustRelease(t, g.(*advisorylock.Guard)); return true })
	mustRelease(t, g0)
}

// WithConn on a shared session: a neighbour's lock that fn frees, and then
// the session that fn breaks, are told before WithConn returns.
func TestEngineWithConnOnASharedSessionTellsWhatFnDid(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	a := mustTry(t, fakeLock(t, s, db, "lend-a", oneSharedSession...))
	b := mustTry(t, fakeLock(t, s, db, "lend-b", oneSharedSession...))
	defer mustRelease(t, a)
	defer mustRelease(t, b)
	ctx := context.Background()
	if err := a.WithConn(ctx, func(advisorylock.Conn) error {
		s.free(advisorylock.Key("lend-b"))
		return nil
	}); err != nil {
		t.Fatalf("WithConn: %v", err)
	}
	if !isClosed(b.Lost()) || isClosed(a.Lost()) {
		t.Fatalf("after fn freed lend-b: lost a=%v b=%v, want only b", isClosed(a.Lost()), isClosed(b.Lost()))
	}
	c := mustTry(t, fakeLock(t, s, db, "lend-c", oneSharedSession...))
	defer mustRelease(t, c)
	if err := a.WithConn(ctx, func(advisorylock.Conn) error {
		s.kill(s.holder(advisorylock.Key("lend-a")))
		return nil
	}); err != nil {
		t.Fatalf("WithConn: %v", err)
	}
	if !isClosed(a.Lost()) || !isClosed(c.Lost()) {
		t.Fatalf("after fn ended the session: lost a=%v c=%v, want both", isClosed(a.Lost()), isClosed(c.Lost()))
	}
}

// A try that WithConn's fn makes on the same handle goes to another shared
// session where the pool may open one: the lent session is busy.
func TestEngineWithConnOnASharedSessionLetsFnTakeAnotherLock(t *testing.T) {
	t.Parallel()
	s, db := openFake(t)
	opts := []advisorylock.Option{advisorylock.WithMultiplexing(2), advisorylock.WithKeepAlive(10 * time.Second)}
	a := mustTry(t, fakeLock(t, s, db, "nest-a", opts...))
	defer mustRelease(t, a)
	b := fakeLock(t, s, db, "nest-b", opts...)
	ctx := context.Background()
	var gb *advisorylock.Guard
	err := a.WithConn(ctx, func(advisorylock.Conn) error {
		got := make(chan error, 1)
		go func() {
			var err error
			gb, err = b.TryLock(ctx)
			got <- err
		}()
		select {
		case err := <-got:
			return err
		case <-time.After(wait):
			return errors.New("a TryLock inside fn waited for fn")
		}
	})
	if err != nil {
		t.Fatalf("WithConn: %v", err)
	}
	if s.holder(advisorylock.Key("nest-a")) == s.holder(advisorylock.Key("nest-b")) {
		t.Fatal("fn's lock went to the lent session")
	}
	mustRelease(t, gb)
}

// oneSharedSession puts the fake's Locks on one shared session, whose
// keep-alive does not run during a test.
var oneSharedSession = []advisorylock.Option{advisorylock.WithMultiplexing(1), advisorylock.WithKeepAlive(10 * time.Second)}

// sharedFakeLocks makes n Locks on the fake, named prefix0, prefix1, ...,
// that share one session.
func sharedFakeLocks(t *testing.T, s *fakeServer, db advisorylock.DB, prefix string, n int) []*advisorylock.Lock {
	t.Helper()
	locks := make([]*advisorylock.Lock, n)
	for i := range locks {
		locks[i] = fakeLock(t, s, db, fmt.Sprint(prefix, i), oneSharedSession...)
	}
	return locks
}
