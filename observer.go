package advisorylock

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// Observer sees what locks do, for metrics and traces: every acquire
// (start; end with outcome and wait), release (hold time), loss (cause),
// discarded connection (reason) and lease renewal (latency, outcome), for
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
	// fields it sets. Later versions may add event types and outcomes:
	// ignore the ones you do not know, returning ctx.
	//
	// The context returned matters for two types. For "acquire_start",
	// ctx is the acquire's and the one returned is the one the acquire
	// runs on (its statements see it) and the one its "acquire_end" gets:
	// return ctx itself when there is nothing to add, or ctx with values
	// (a span) derived from it, never a context that ends sooner. For an
	// "acquire_end" that granted the lock (e.Outcome == "acquired"), the
	// one returned is kept with the hold and is the ctx of its "release"
	// and "loss". For every other event the returned context is not used;
	// "discard" and "renew" get context.Background().
	Observe(ctx context.Context, e Event) context.Context
}

// WithObserver sets an Observer for the lock's events [none]. Without one
// no event is built and no time is read for it.
func WithObserver(o Observer) Option { return func(c *config) { c.observer = o } }

// Event is one thing a lock did, as an Observer sees it. Fields that
// its Type does not set are zero. Events are passed by value, so that an
// Observer that keeps nothing costs no allocation.
type Event struct {
	// Type says what happened, and which of the fields below it sets;
	// Backend, Kind and Name are always set. One of:
	//   - "acquire_start": TryLock, Lock, LockTimeout (and the Do family
	//     through them) begins. Sets MayWait.
	//   - "acquire_end": that acquire returns. Sets MayWait, Outcome (an
	//     acquire's), Wait and Err (the error returned to the caller; nil
	//     if acquired).
	//   - "release": a granted hold ends, once per hold: released by its
	//     holder, or cleaned up after its Guard was forgotten. Sets Held,
	//     Forgotten and Err (the release's error, if any).
	//   - "loss": a held lock is found lost, at most once per hold and
	//     before its "release". Sets Cause, Held and Err (what the lock's
	//     Lost error wraps).
	//   - "discard": a connection is closed instead of returned to the
	//     pool, so that the server frees what it may hold. Sets Reason
	//     and Err (the error that made the session's state unknown, if
	//     any).
	//   - "renew": a lease renewal statement answered, or failed. Sets
	//     Outcome (a renewal's), Latency and Err (nil when renewed).
	Type string
	// Backend is the backend's Name(): "postgres", "mysql", "sqlite", …;
	// "unknown" in the "acquire_start" of the first acquire on a
	// wrapped driver, which that acquire identifies by asking the
	// database. It is the "backend" attribute of the metrics.
	Backend string
	// Kind is which kind of lock, the "kind" attribute of the metrics:
	// "lock" (an exclusive Lock), "shared" (a shared hold of a Lock),
	// "lease" (a LeaseLock), "semaphore" (a slot of a semaphore),
	// "election" (an election's leadership) or "transaction" (a lock
	// taken in a transaction by Lock.LockTx or Lock.TryLockTx). A
	// transaction's commit or rollback releases its lock, which the
	// package does not see: its "release" follows its "acquire_end" at
	// once, with Held 0, so that gauges of held locks stay balanced.
	Kind string
	// Name is the lock's name. Names can be many (one per tenant, per
	// job): adapters do not put them on metrics unless asked.
	Name string

	// MayWait is false for a single attempt (TryLock), true for an
	// acquire that may wait.
	MayWait bool
	// Outcome says how an acquire or a renewal ended, the "outcome"
	// attribute of the metrics. An "acquire_end" has one of:
	//   - "acquired": the lock is held;
	//   - "not_acquired": one attempt found it held elsewhere;
	//   - "timeout": LockTimeout's budget or ctx's deadline ran out;
	//   - "canceled": ctx was cancelled;
	//   - "error": anything else; see Err.
	// A "renew" has one of:
	//   - "renewed": the lease was extended;
	//   - "lost": the lease was no longer this holder's;
	//   - "error": the renewal's outcome is unknown; the keeper tries
	//     again sooner, until the local deadline.
	Outcome string
	// Cause says why a held lock was lost, the "cause" attribute of the
	// metrics:
	//   - "session_ended": the keep-alive check failed on the session's
	//     connection (the session was killed, the server restarted);
	//   - "not_held": the session answered but no longer holds the lock;
	//   - "no_answer": the keep-alive check got no answer in time (a dead
	//     network or a stalled server);
	//   - "expired": a lease reached its local deadline without a renewal;
	//   - "taken_over": a renewal found the lease row gone or another's.
	Cause string
	// Reason says why a connection was discarded, the "reason" attribute
	// of the metrics:
	//   - "canceled": an acquire's context ended while it was talking to
	//     the database (a statement may have been cut short mid-grant);
	//   - "error": a statement failed, so the session's state is unknown;
	//   - "lost": the connection of a lost lock was closed at release;
	//   - "forgotten": a Guard was garbage collected without Release;
	//   - "no_answer": a statement got no answer in time and was abandoned
	//     (a dead network). On lib/pq the library closes the connection
	//     under the statement at once; with a driver it cannot do that
	//     for (a wrapped one), the connection closes when the driver lets
	//     go.
	Reason string

	Wait      time.Duration // "acquire_end": from the acquire's start to its end
	Held      time.Duration // "release", "loss": from the grant to the release, or to the loss being noticed
	Latency   time.Duration // "renew": from sending the renewal to its answer
	Forgotten bool          // "release": the Guard was cleaned up, not released
	Err       error         // see Type
}

// The types of event, as Event.Type names them.
const (
	eventAcquireStart = "acquire_start"
	eventAcquireEnd   = "acquire_end"
	eventRelease      = "release"
	eventLoss         = "loss"
	eventDiscard      = "discard"
	eventRenew        = "renew"
)

// The outcomes of an acquire or a renewal, as Event.Outcome names them.
const (
	outcomeAcquired    = "acquired"
	outcomeNotAcquired = "not_acquired"
	outcomeTimeout     = "timeout"
	outcomeCanceled    = "canceled"
	outcomeError       = "error"
	outcomeRenewed     = "renewed"
	outcomeLost        = "lost"
)

// The kinds of lock, as Event.Kind names them; the first three are also
// the kinds of LeaseRequest.
const (
	kindLock        = "lock"
	kindShared      = "shared"
	kindLease       = "lease"
	kindSemaphore   = "semaphore"
	kindElection    = "election"
	kindTransaction = "transaction"
)

// lossCause is an Event.Cause: why a held lock was lost.
type lossCause string

// The causes of a loss; Event.Cause says what each means.
const (
	lossSessionEnded lossCause = "session_ended"
	lossNotHeld      lossCause = "not_held"
	lossNoAnswer     lossCause = "no_answer"
	lossExpired      lossCause = "expired"
	lossTakenOver    lossCause = "taken_over"
)

// discardReason is an Event.Reason: why a connection was discarded.
type discardReason string

// The reasons for a discard; Event.Reason says what each means.
const (
	discardCanceled  discardReason = "canceled"
	discardError     discardReason = "error"
	discardLost      discardReason = "lost"
	discardForgotten discardReason = "forgotten"
	discardNoAnswer  discardReason = "no_answer"
)

// acquireOutcome classifies an acquire's error.
func acquireOutcome(err error) string {
	switch {
	case err == nil:
		return outcomeAcquired
	case errors.Is(err, ErrNotAcquired):
		return outcomeNotAcquired
	case errors.Is(err, ErrTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, errBudget):
		return outcomeTimeout
	case errors.Is(err, context.Canceled):
		return outcomeCanceled
	}
	return outcomeError
}

// observed is a lock's Observer with the description its events carry.
// Locks without an Observer have none (a nil *observed), so that every
// call site costs one nil check and nothing else: no Event is built and
// no time is read.
//
// How a kind of lock reports (Lock and LeaseLock do; shared locks,
// semaphores and elections follow them): its public acquires wrap the
// work in startAcquire and acquiring.end (after wrapErr, so a
// *TimeoutError is seen); a keeper that finds a hold gone calls
// hold.lose with a lossCause; release and cleanup report through the
// hold (doRelease, forgotten); a pinned connection carries the observed,
// and pinned.discard names a discardReason; a lease keeper reports each
// renewal with observed.renewed. Every one of them hands its Event to
// emit.
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

// emit names ob's lock in e and hands e to the Observer: the one place
// events leave the package. Event is passed by value, so an Observer
// that keeps nothing costs no allocation.
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

// startAcquire reports the start of an acquire of l and returns the
// context the acquire runs on. With no Observer it returns ctx and a zero
// acquiring, at the cost of one nil check.
func startAcquire(ctx context.Context, l observable, mayWait bool) (context.Context, acquiring) {
	ob := l.observed()
	if ob == nil {
		return ctx, acquiring{}
	}
	start := time.Now()
	ctx = ob.emit(ctx, Event{Type: eventAcquireStart, MayWait: mayWait})
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
	ctx := a.ob.emit(a.ctx, Event{Type: eventAcquireEnd, MayWait: a.mayWait, Outcome: outcome, Wait: now.Sub(a.start), Err: err})
	if h == nil || outcome != outcomeAcquired {
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

// holdObserved is what a hold keeps for its events; zero without an
// Observer.
type holdObserved struct {
	ob      *observed
	ctx     context.Context
	granted time.Time
}

// released reports the end of a hold.
func (w holdObserved) released(forgotten bool, err error) {
	if w.ob == nil {
		return
	}
	w.ob.emit(w.ctx, Event{Type: eventRelease, Held: time.Since(w.granted), Forgotten: forgotten, Err: err})
}

// lost reports a loss of the hold.
func (w holdObserved) lost(cause lossCause, err error) {
	if w.ob == nil {
		return
	}
	w.ob.emit(w.ctx, Event{Type: eventLoss, Cause: string(cause), Held: time.Since(w.granted), Err: err})
}

// discarded reports a discarded connection.
func (ob *observed) discarded(reason discardReason, err error) {
	if ob == nil {
		return
	}
	ob.emit(context.Background(), Event{Type: eventDiscard, Reason: string(reason), Err: err})
}

// renewed reports a lease renewal's outcome.
func (ob *observed) renewed(latency time.Duration, err error) {
	if ob == nil {
		return
	}
	outcome := outcomeRenewed
	switch {
	case errors.Is(err, ErrLeaseLost):
		outcome = outcomeLost
	case err != nil:
		outcome = outcomeError
	}
	ob.emit(context.Background(), Event{Type: eventRenew, Outcome: outcome, Latency: latency, Err: err})
}

// unknownBackend is the backend events name before a lock knows its own.
const unknownBackend = "unknown"

// observedOf makes the observed that *p caches for a lock of kind named
// name, and caches it once the backend's name is known: from WithBackend
// or the driver's type (no I/O), else from the lock's first use
// (resolved returns nil until it succeeded). Until then, events say
// backend "unknown": the "acquire_start" of a wrapped driver's first
// acquire, whose first use identifies the backend by asking the database
// (its "acquire_end" names the backend when that succeeded).
func observedOf(p *atomic.Pointer[observed], db DB, cfg *config, kind, name string, resolved func() Backend) *observed {
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
