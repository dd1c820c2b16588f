package advisorylock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// Observer sees what locks do, for metrics and traces: every acquire
// (start; end with outcome and wait), release (hold time), loss (cause),
// discarded connection (cause) and lease renewal (latency, error), for
// every kind of lock. WithObserver installs one; the adapters in
// extra/advisorylockotel and extra/advisorylockprom turn its events into
// the metrics listed in docs/observability.md.
//
// Observe is called synchronously on the goroutine doing the work (an
// acquiring caller, a releasing caller, a keep-alive timer, a lease
// keeper), possibly from many goroutines at once: it must be safe for
// concurrent use, must not block, and must not call back into the lock.
// A panic in an Observer is not recovered.
type Observer interface {
	// Observe is told of one event; e.Type says which, and which of e's
	// fields it sets. Later versions may add event types, outcomes and
	// causes: ignore the ones you do not know, returning ctx.
	//
	// The context returned matters for two types. For EventAcquireStart,
	// ctx is the acquire's and the one returned is the one the acquire
	// runs on (its statements see it) and the one its EventAcquireEnd
	// gets: return ctx itself when there is nothing to add, or ctx with
	// values (a span) derived from it, never a context that ends sooner.
	// For an EventAcquireEnd that granted the lock (OutcomeAcquired), the
	// one returned is kept with the hold and is the ctx of its
	// EventRelease and EventLoss. For every other event the returned
	// context is not used; EventDiscard and EventRenew get
	// context.Background().
	Observe(ctx context.Context, e Event) context.Context
}

// WithObserver adds o to the Observers of the lock's events [none]; a nil
// o adds nothing. Given more than once, it adds each: every event goes to
// each Observer in the order given, and each gets the contexts it
// returned itself, as if it were alone (an acquire's EventAcquireStart
// goes to each in turn with the context the one before returned, and the
// acquire runs on the last one's). Without an Observer no event is built
// and no time is read for it. A Fence refuses it: a Fence has no holds
// to report.
func WithObserver(o Observer) Option {
	return func(c *config) { c.observer = addObserver(c.observer, o); c.set(optObserver) }
}

// addObserver returns the Observer that tells to, then o.
func addObserver(to, o Observer) Observer {
	if o == nil {
		return to
	}
	if to == nil {
		return o
	}
	if list, ok := to.(observers); ok {
		return append(slices.Clip(list), o) // a copy: another config may share list
	}
	return observers{to, o}
}

// observers are a lock's Observers when WithObserver was given twice.
type observers []Observer

// observersContext is the last Observer's context, carrying each one's.
type observersContext struct {
	context.Context // the last Observer's
	each            []context.Context
}

// Observe tells each Observer of e, in order. An acquire's start goes to
// each with the context the one before returned; its end goes to each
// with the context that one returned for the start, and a release or a
// loss with the one it returned for the grant; an event with no such
// context (a discard, a renewal) goes to each with ctx.
func (list observers) Observe(ctx context.Context, e Event) context.Context {
	own, _ := ctx.(*observersContext)
	var each []context.Context // what each returns, kept for an acquire's start and end
	if e.Type == EventAcquireStart || e.Type == EventAcquireEnd {
		each = make([]context.Context, len(list))
	}
	for i, o := range list {
		c := ctx
		switch {
		case e.Type == EventAcquireStart && i > 0:
			c = each[i-1]
		case e.Type != EventAcquireStart && own != nil:
			c = own.each[i]
		}
		c = o.Observe(c, e)
		if each != nil {
			each[i] = c
		}
	}
	if each == nil {
		return ctx // not used
	}
	return &observersContext{Context: each[len(each)-1], each: each}
}

// Event is one thing a lock did, as an Observer sees it. Fields that its
// Type does not set are zero. Events are passed by value, so that an
// Observer that keeps nothing costs no allocation.
type Event struct {
	// Type says what happened, and which of the fields below it sets (see
	// each EventType); Backend, Kind and Name are always set.
	Type EventType
	// Backend is the backend's Name(): "postgres", "mysql", "sqlite", …;
	// "unknown" in the EventAcquireStart of the first acquire on a
	// wrapped driver, which that acquire identifies by asking the
	// database. It is the "backend" attribute of the metrics.
	Backend string
	// Kind is which kind of lock, the "kind" attribute of the metrics:
	// "lock" (an exclusive Lock), "shared" (a shared hold of a Lock),
	// "lease" (a LeaseLock), "semaphore" (a slot of a semaphore),
	// "election" (an election's leadership) or "transaction" (a lock
	// taken in a transaction by Lock.LockTx or Lock.TryLockTx). A
	// transaction's commit or rollback releases its lock, which the
	// package does not see: its EventRelease follows its EventAcquireEnd
	// at once, with Duration 0, so that gauges of held locks stay
	// balanced.
	Kind string
	// Name is the lock's name. Names can be many (one per tenant, per
	// job): adapters do not put them on metrics unless asked.
	Name string

	// MayWait is false for a single attempt (TryLock), true for an
	// acquire that may wait.
	MayWait bool
	// Outcome says how an acquire ended, the "outcome" attribute of the
	// acquire metrics.
	Outcome Outcome
	// Cause says why: why a held lock was lost (EventLoss, the "cause"
	// attribute of the metrics), why a connection was discarded
	// (EventDiscard, their "reason" attribute), and CauseForgotten for
	// the end of a hold whose Guard was cleaned up, not released
	// (EventRelease).
	Cause Cause
	// Duration is how long, as each EventType says: an acquire's wait, a
	// hold, or a renewal's round trip.
	Duration time.Duration
	// Err is the error of the event, as each EventType says.
	Err error
}

// EventType says what an Event reports, and which of its fields are set.
type EventType string

// The types of Event, with the fields each sets besides Backend, Kind and
// Name.
const (
	// EventAcquireStart: TryLock, Lock or LockTimeout (and the Do family
	// through them) begins. Sets MayWait.
	EventAcquireStart EventType = "acquire_start"
	// EventAcquireEnd: that acquire returns. Sets MayWait, Outcome,
	// Duration (the wait: from the acquire's start to its end) and Err
	// (the error returned to the caller; nil when acquired).
	EventAcquireEnd EventType = "acquire_end"
	// EventRelease: a granted hold ends, once per hold: released by its
	// holder, or cleaned up after its Guard was forgotten (then Cause is
	// CauseForgotten; otherwise it is empty). Sets Duration (the hold:
	// from the grant to the release) and Err (the release's error, if
	// any).
	EventRelease EventType = "release"
	// EventLoss: a held lock is found lost, at most once per hold and
	// before its EventRelease. Sets Cause (a loss's: CauseSessionEnded,
	// CauseNotHeld, CauseNoAnswer, CauseExpired, CauseTakenOver), Duration
	// (the hold: from the grant to the loss being noticed) and Err (what
	// the lock's Lost error wraps).
	EventLoss EventType = "loss"
	// EventDiscard: a connection is closed instead of returned to the
	// pool, so that the server frees what it may hold. Sets Cause
	// (CauseCanceled, CauseError, CauseForgotten, CauseNoAnswer, or, for
	// the connection of a lock found lost, the cause of that loss) and
	// Err (the error that made the session's state unknown, if any).
	EventDiscard EventType = "discard"
	// EventRenew: a lease renewal statement answered, or failed. Sets
	// Duration (from sending the renewal to its answer) and Err: nil when
	// the renewal extended the lease; an error matching ErrLockLost when
	// it found the lease no longer this holder's (an EventLoss with
	// CauseTakenOver follows); any other error when its outcome is
	// unknown (the keeper tries again sooner, until the local deadline).
	// It sets no Outcome.
	EventRenew EventType = "renew"
)

// Outcome says how an acquire ended (EventAcquireEnd).
type Outcome string

// The outcomes of an acquire.
const (
	// OutcomeAcquired: the acquire got the lock, which is now held.
	OutcomeAcquired Outcome = "acquired"
	// OutcomeNotAcquired: a single attempt (TryLock) found the lock held
	// elsewhere (ErrNotAcquired).
	OutcomeNotAcquired Outcome = "not_acquired"
	// OutcomeTimeout: LockTimeout's budget or ctx's deadline ran out
	// before a grant (ErrTimeout, context.DeadlineExceeded).
	OutcomeTimeout Outcome = "timeout"
	// OutcomeCanceled: ctx was cancelled before a grant.
	OutcomeCanceled Outcome = "canceled"
	// OutcomeError: an acquire failed otherwise (see Err).
	OutcomeError Outcome = "error"
)

// Cause says why a held lock was lost (EventLoss), why a connection was
// discarded (EventDiscard), or that a hold ended because its Guard was
// forgotten (EventRelease).
type Cause string

// The causes of a loss (the first five) and of a discard: a lost lock's
// connection is discarded with the cause of its loss.
const (
	// CauseSessionEnded: the keep-alive check failed on the session's
	// connection (the session was killed, the server restarted).
	CauseSessionEnded Cause = "session_ended"
	// CauseNotHeld: the session answered but no longer holds the lock.
	CauseNotHeld Cause = "not_held"
	// CauseNoAnswer: the keep-alive check got no answer in time (a dead
	// network or a stalled server); for a discard, a statement got no
	// answer in time and was abandoned. On lib/pq the library closes the
	// connection under the statement at once; with a driver it cannot do
	// that for (a wrapped one), the connection closes when the driver
	// lets go.
	CauseNoAnswer Cause = "no_answer"
	// CauseExpired: a lease reached its local deadline without a renewal.
	CauseExpired Cause = "expired"
	// CauseTakenOver: a renewal found the lease row gone or another's.
	CauseTakenOver Cause = "taken_over"
	// CauseCanceled: a discard because an acquire's context ended while
	// it was talking to the database (a statement may have been cut
	// short mid-grant), or a release gave up waiting for WithConn's fn.
	CauseCanceled Cause = "canceled"
	// CauseError: a discard because a statement failed, so the session's
	// state is unknown.
	CauseError Cause = "error"
	// CauseForgotten: a Guard was garbage collected without Release; its
	// hold's EventRelease and its connection's EventDiscard say so.
	CauseForgotten Cause = "forgotten"
)

// The kinds of lock, as Event.Kind names them, beside backend.KindLock,
// KindShared and KindLease (the kinds of backend.LeaseRequest).
const (
	kindSemaphore   = "semaphore"
	kindElection    = "election"
	kindTransaction = "transaction"
)

// acquireOutcome classifies an acquire's error.
func acquireOutcome(err error) Outcome {
	switch {
	case err == nil:
		return OutcomeAcquired
	case errors.Is(err, ErrNotAcquired):
		return OutcomeNotAcquired
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, errBudget):
		return OutcomeTimeout
	case errors.Is(err, context.Canceled):
		return OutcomeCanceled
	}
	return OutcomeError
}

// observed is a lock's Observer with the description its events carry;
// nil without an Observer, so that every call site costs one nil check
// and no Event is built. Who reports what: DESIGN.md ("Observation").
type observed struct {
	o                   Observer
	backend, kind, name string
}

// newObserved returns the observed for a lock, or nil without an Observer.
func newObserved(o Observer, backend, kind, name string) *observed {
	if o == nil {
		return nil
	}
	return &observed{o: o, backend: backend, kind: kind, name: name}
}

// emit hands e to the Observer: the one place events leave the package.
func (ob *observed) emit(ctx context.Context, e Event) context.Context {
	e.Backend, e.Kind, e.Name = ob.backend, ob.kind, ob.name
	return ob.o.Observe(ctx, e)
}

// observable is a lock whose events an Observer may see.
type observable interface {
	observed() *observed // nil without an Observer
}

// acquiring is an acquire in progress, as its "acquire_start" saw it.
type acquiring struct {
	l       observable
	ob      *observed
	ctx     context.Context
	start   time.Time
	mayWait bool
}

// startAcquire reports an acquire's start; it runs on the ctx returned.
func startAcquire(ctx context.Context, l observable, mayWait bool) (context.Context, acquiring) {
	ob := l.observed()
	if ob == nil {
		return ctx, acquiring{}
	}
	start := time.Now()
	ctx = ob.emit(ctx, Event{Type: EventAcquireStart, MayWait: mayWait})
	return ctx, acquiring{l: l, ob: ob, ctx: ctx, start: start, mayWait: mayWait}
}

// end reports the acquire's end; for a grant (h not nil, err nil) it
// keeps the context the Observer returns with the hold, and reports a
// loss that came before it.
func (a acquiring) end(h *hold, err error) {
	if a.ob == nil {
		return
	}
	now := time.Now()
	if a.ob.backend == unknownBackend {
		a.ob = a.l.observed() // the acquire's first use may have learnt it
	}
	outcome := acquireOutcome(err)
	ctx := a.ob.emit(a.ctx, Event{Type: EventAcquireEnd, MayWait: a.mayWait, Outcome: outcome, Duration: now.Sub(a.start), Err: err})
	if h == nil || outcome != OutcomeAcquired {
		return
	}
	w := holdObserved{ob: a.ob, ctx: ctx, granted: now}
	h.lostMu.Lock()
	h.obs = w
	gone, cause, why := h.isGone, h.lostCause, h.lostErr
	h.lostMu.Unlock()
	if gone && cause != "" {
		w.lost(cause, why)
	}
}

// holdObserved is what a hold keeps for its events (zero: no Observer).
type holdObserved struct {
	ob      *observed
	ctx     context.Context
	granted time.Time
}

// released reports the end of a hold: cause is CauseForgotten for a
// forgotten Guard's, "" for a release.
func (w holdObserved) released(cause Cause, err error) {
	if w.ob == nil {
		return
	}
	w.ob.emit(w.ctx, Event{Type: EventRelease, Cause: cause, Duration: time.Since(w.granted), Err: err})
}

// lost reports a loss of the hold.
func (w holdObserved) lost(cause Cause, err error) {
	if w.ob == nil {
		return
	}
	w.ob.emit(w.ctx, Event{Type: EventLoss, Cause: cause, Duration: time.Since(w.granted), Err: err})
}

// discarded reports a discarded connection.
func (ob *observed) discarded(cause Cause, err error) {
	if ob == nil {
		return
	}
	ob.emit(context.Background(), Event{Type: EventDiscard, Cause: cause, Err: err})
}

// renewed reports a lease renewal's answer, err as RenewLease returned
// it: a lease found lost (backend.ErrLeaseLost) is told as ErrLockLost.
func (ob *observed) renewed(latency time.Duration, err error) {
	if ob == nil {
		return
	}
	if errors.Is(err, backend.ErrLeaseLost) && !errors.Is(err, ErrLockLost) {
		err = fmt.Errorf("%w: %w", ErrLockLost, err)
	}
	ob.emit(context.Background(), Event{Type: EventRenew, Duration: latency, Err: err})
}

// unknownBackend is the backend events name before a lock knows its own.
const unknownBackend = "unknown"

// observedOf returns what the events of a lock of kind named name need,
// nil without an Observer, cached in *p (p nil: not cached) once the
// backend's name is known: from WithBackend or the driver's type (no
// I/O), else from the lock's first use (resolved returns nil until it
// succeeded). Until then events say backend "unknown": the
// "acquire_start" of a wrapped driver's first acquire, whose first use
// asks the database (its "acquire_end" names the backend).
func observedOf(p *atomic.Pointer[observed], db DB, cfg *config, kind, name string, resolved func() backend.Backend) *observed {
	if cfg.observer == nil {
		return nil
	}
	if p == nil {
		p = new(atomic.Pointer[observed])
	}
	if ob := p.Load(); ob != nil {
		return ob
	}
	b := localBackend(db, cfg)
	if b == nil {
		b = resolved()
	}
	if b == nil {
		return newObserved(cfg.observer, unknownBackend, kind, name)
	}
	p.CompareAndSwap(nil, newObserved(cfg.observer, b.Name(), kind, name))
	return p.Load()
}
