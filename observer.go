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
// Methods are called synchronously on the goroutine doing the work (an
// acquiring caller, a releasing caller, a keep-alive timer, a lease
// keeper), possibly from many goroutines at once: they must be safe for
// concurrent use, must not block, and must not call back into the lock.
// A panic in an Observer is not recovered.
//
// Embed NoopObserver in an implementation so that events added in later
// versions do not break it.
type Observer interface {
	// AcquireStart is called when TryLock, Lock, LockTimeout (and the Do
	// family through them) begins. The context it returns is the one the
	// acquire runs on (its statements see it) and the one AcquireEnd gets:
	// return ctx itself when there is nothing to add, or ctx with values
	// (a span) derived from it. It must not be a context that ends sooner.
	AcquireStart(ctx context.Context, e AcquireStartEvent) context.Context
	// AcquireEnd is called when that acquire returns. When it granted the
	// lock (e.Outcome == OutcomeAcquired), the context returned is kept
	// with the hold and passed to Released and Lost for it (a hold span);
	// otherwise the returned context is not used.
	AcquireEnd(ctx context.Context, e AcquireEndEvent) context.Context
	// Released is called once per granted hold, when it ends: released by
	// its holder, or cleaned up after its Guard was forgotten. ctx is the
	// one AcquireEnd returned for the hold.
	Released(ctx context.Context, e ReleaseEvent)
	// Lost is called when a held lock is found lost (at most once per
	// hold, before its Released). ctx is the one AcquireEnd returned for
	// the hold.
	Lost(ctx context.Context, e LossEvent)
	// Discarded is called when a connection is closed instead of returned
	// to the pool, so that the server frees what it may hold.
	Discarded(e DiscardEvent)
	// Renewed is called after every lease renewal statement, with its
	// latency and outcome.
	Renewed(e RenewEvent)
}

// WithObserver sets an Observer for the lock's events [none]. Without one
// no event is built and no time is read for it.
func WithObserver(o Observer) Option { return func(c *config) { c.observer = o } }

// NoopObserver is an Observer that ignores every event. Embed it to
// implement only the events you need.
type NoopObserver struct{}

// AcquireStart returns ctx.
func (NoopObserver) AcquireStart(ctx context.Context, _ AcquireStartEvent) context.Context {
	return ctx
}

// AcquireEnd returns ctx.
func (NoopObserver) AcquireEnd(ctx context.Context, _ AcquireEndEvent) context.Context {
	return ctx
}

// Released does nothing.
func (NoopObserver) Released(context.Context, ReleaseEvent) {}

// Lost does nothing.
func (NoopObserver) Lost(context.Context, LossEvent) {}

// Discarded does nothing.
func (NoopObserver) Discarded(DiscardEvent) {}

// Renewed does nothing.
func (NoopObserver) Renewed(RenewEvent) {}

// LockKind says which kind of lock an event is about. Its value is the
// "kind" attribute of the metrics.
type LockKind string

// The kinds of lock.
const (
	LockKindLock      LockKind = "lock"      // an exclusive Lock
	LockKindShared    LockKind = "shared"    // a shared hold of a Lock
	LockKindLease     LockKind = "lease"     // a LeaseLock
	LockKindSemaphore LockKind = "semaphore" // a slot of a semaphore
	LockKindElection  LockKind = "election"  // an election's leadership
	// LockKindTransaction is a lock taken in a transaction (Lock.LockTx,
	// Lock.TryLockTx). The transaction's commit or rollback releases it,
	// which the package does not see: its Released event follows its
	// AcquireEnd at once, with Held 0, so that gauges of held locks stay
	// balanced.
	LockKindTransaction LockKind = "transaction"
)

// LockInfo says which lock an event is about.
type LockInfo struct {
	// Backend is the backend's Name(): "postgres", "sqlite", …; "unknown"
	// in the AcquireStart of the first acquire on a wrapped driver, which
	// that acquire identifies by asking the database.
	Backend string
	Kind    LockKind // which kind of lock
	// Name is the lock's name. Names can be many (one per tenant, per
	// job): adapters do not put them on metrics unless asked.
	Name string
}

// Outcome says how an acquire or a lease renewal ended. Its value is the
// "outcome" attribute of the metrics.
type Outcome string

// Acquire outcomes: every AcquireEndEvent has one of these.
const (
	OutcomeAcquired    Outcome = "acquired"     // the lock is held
	OutcomeNotAcquired Outcome = "not_acquired" // one attempt found it held elsewhere
	OutcomeTimeout     Outcome = "timeout"      // LockTimeout's budget or ctx's deadline ran out
	OutcomeCanceled    Outcome = "canceled"     // ctx was cancelled
	OutcomeError       Outcome = "error"        // anything else; see the event's Err
)

// Renewal outcomes: every RenewEvent has one of these.
const (
	OutcomeRenewed Outcome = "renewed" // the lease was extended
	OutcomeLost    Outcome = "lost"    // the lease was no longer this holder's
	// OutcomeError (above): the renewal's outcome is unknown; the keeper
	// tries again sooner, until the local deadline.
)

// LossCause says why a held lock was lost. Its value is the "cause"
// attribute of the metrics.
type LossCause string

// The causes of a loss.
const (
	// LossSessionEnded: the keep-alive check failed on the session's
	// connection (the session was killed, the server restarted).
	LossSessionEnded LossCause = "session_ended"
	// LossNotHeld: the session answered but no longer holds the lock.
	LossNotHeld LossCause = "not_held"
	// LossNoAnswer: the keep-alive check got no answer in time (a dead
	// network or a stalled server).
	LossNoAnswer LossCause = "no_answer"
	// LossExpired: a lease reached its local deadline without a renewal.
	LossExpired LossCause = "expired"
	// LossTakenOver: a renewal found the lease row gone or another's.
	LossTakenOver LossCause = "taken_over"
)

// DiscardReason says why a connection was discarded. Its value is the
// "reason" attribute of the metrics.
type DiscardReason string

// The reasons for a discard.
const (
	// DiscardCanceled: an acquire's context ended while it was talking to
	// the database (a statement may have been cut short mid-grant).
	DiscardCanceled DiscardReason = "canceled"
	// DiscardError: a statement failed, so the session's state is unknown.
	DiscardError DiscardReason = "error"
	// DiscardLost: the connection of a lost lock was closed at release.
	DiscardLost DiscardReason = "lost"
	// DiscardForgotten: a Guard was garbage collected without Release.
	DiscardForgotten DiscardReason = "forgotten"
	// DiscardNoAnswer: a statement got no answer in time and was abandoned
	// (a dead network). On lib/pq the library closes the connection under
	// the statement at once; with a driver it cannot do that for (a
	// wrapped one), the connection closes when the driver lets go.
	DiscardNoAnswer DiscardReason = "no_answer"
)

// AcquireStartEvent is an acquire beginning.
type AcquireStartEvent struct {
	LockInfo
	Wait bool // false for a single attempt (TryLock), true when it may wait
}

// AcquireEndEvent is an acquire ending.
type AcquireEndEvent struct {
	LockInfo
	Outcome Outcome
	Wait    time.Duration // from AcquireStart to now
	Err     error         // the error returned to the caller; nil if acquired
}

// ReleaseEvent is a hold ending.
type ReleaseEvent struct {
	LockInfo
	Held      time.Duration // from the grant to the release
	Forgotten bool          // the Guard was cleaned up, not released
	Err       error         // the release's error, if any
}

// LossEvent is a held lock found lost.
type LossEvent struct {
	LockInfo
	Cause LossCause
	Held  time.Duration // from the grant to the loss being noticed
	Err   error         // what the lock's Lost error wraps
}

// DiscardEvent is a connection closed instead of pooled.
type DiscardEvent struct {
	LockInfo
	Reason DiscardReason
	Err    error // the error that made the session's state unknown, if any
}

// RenewEvent is one lease renewal statement's outcome.
type RenewEvent struct {
	LockInfo
	Outcome Outcome
	Latency time.Duration // from sending the renewal to its answer
	Err     error         // nil when renewed
}

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

// observed is a lock's Observer with the description its events carry.
// Locks without an Observer have none (a nil *observed), so that every
// call site costs one nil check and nothing else.
//
// How a kind of lock reports (Lock and LeaseLock do; shared locks,
// semaphores and elections follow them): its public acquires wrap the
// work in startAcquire and acquiring.end (after wrapErr, so a
// *TimeoutError is seen); a keeper that finds a hold gone calls
// hold.lose with a LossCause; release and cleanup report through the
// hold (doRelease, forgotten); a pinned connection carries the observed,
// and pinned.discard names a DiscardReason; a lease keeper reports each
// renewal with observed.renewed.
type observed struct {
	o    Observer
	info LockInfo
}

// newObserved returns the observed for a lock, or nil without an Observer.
func newObserved(o Observer, backend string, kind LockKind, name string) *observed {
	if o == nil {
		return nil
	}
	return &observed{o: o, info: LockInfo{Backend: backend, Kind: kind, Name: name}}
}

// observable is a lock whose events an Observer may see.
type observable interface {
	observed() *observed // nil without an Observer
}

// acquiring is an acquire in progress, as AcquireStart saw it.
type acquiring struct {
	l     observable
	ob    *observed
	ctx   context.Context
	start time.Time
}

// startAcquire reports the start of an acquire of l and returns the
// context the acquire runs on. With no Observer it returns ctx and a zero
// acquiring, at the cost of one nil check.
func startAcquire(ctx context.Context, l observable, wait bool) (context.Context, acquiring) {
	ob := l.observed()
	if ob == nil {
		return ctx, acquiring{}
	}
	start := time.Now()
	ctx = ob.o.AcquireStart(ctx, AcquireStartEvent{LockInfo: ob.info, Wait: wait})
	return ctx, acquiring{l: l, ob: ob, ctx: ctx, start: start}
}

// end reports the acquire's end; for a grant (h not nil, err nil) it
// keeps the context AcquireEnd returns with the hold, and reports a loss
// that came before it.
func (a acquiring) end(h *hold, err error) {
	if a.ob == nil {
		return
	}
	now := time.Now()
	if a.ob.info.Backend == unknownBackend {
		a.ob = a.l.observed() // the acquire's first use may have learnt it
	}
	outcome := acquireOutcome(err)
	ctx := a.ob.o.AcquireEnd(a.ctx, AcquireEndEvent{LockInfo: a.ob.info, Outcome: outcome, Wait: now.Sub(a.start), Err: err})
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
	w.ob.o.Released(w.ctx, ReleaseEvent{LockInfo: w.ob.info, Held: time.Since(w.granted), Forgotten: forgotten, Err: err})
}

// lost reports a loss of the hold.
func (w holdObserved) lost(cause LossCause, err error) {
	if w.ob == nil {
		return
	}
	w.ob.o.Lost(w.ctx, LossEvent{LockInfo: w.ob.info, Cause: cause, Held: time.Since(w.granted), Err: err})
}

// discarded reports a discarded connection.
func (ob *observed) discarded(reason DiscardReason, err error) {
	if ob == nil {
		return
	}
	ob.o.Discarded(DiscardEvent{LockInfo: ob.info, Reason: reason, Err: err})
}

// renewed reports a lease renewal's outcome.
func (ob *observed) renewed(latency time.Duration, err error) {
	if ob == nil {
		return
	}
	outcome := OutcomeRenewed
	switch {
	case errors.Is(err, ErrLeaseLost):
		outcome = OutcomeLost
	case err != nil:
		outcome = OutcomeError
	}
	ob.o.Renewed(RenewEvent{LockInfo: ob.info, Outcome: outcome, Latency: latency, Err: err})
}

// DurationBuckets returns the bucket boundaries, in seconds, of the
// duration histograms that the adapters export: from 100µs to 60s, for
// waits and holds from a local round trip to a minute. (OpenTelemetry's
// default boundaries are sized for milliseconds.) Each call returns a new
// slice.
func DurationBuckets() []float64 {
	return []float64{
		0.0001, 0.00025, 0.0005,
		0.001, 0.0025, 0.005,
		0.01, 0.025, 0.05,
		0.1, 0.25, 0.5,
		1, 2.5, 5, 10, 30, 60,
	}
}

// unknownBackend is the backend events name before a lock knows its own.
const unknownBackend = "unknown"

// observedOf makes the observed that *p caches for a lock of kind named
// name, and caches it once the backend's name is known: from WithBackend
// or the driver's type (no I/O), else from the lock's first use
// (resolved returns nil until it succeeded). Until then, events say
// backend "unknown": the AcquireStart of a wrapped driver's first acquire,
// whose first use identifies the backend by asking the database (its
// AcquireEnd names the backend when that succeeded).
func observedOf(p *atomic.Pointer[observed], db DB, cfg *config, kind LockKind, name string, resolved func() Backend) *observed {
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
