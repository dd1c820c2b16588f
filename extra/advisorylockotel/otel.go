// Package advisorylockotel reports what advisorylock's locks do as
// OpenTelemetry metrics and spans:
//
//	obs := advisorylockotel.NewObserver()
//	lock, err := advisorylock.New(db, "nightly", advisorylock.WithObserver(obs))
//
// Metrics (all durations in seconds, in buckets from 100µs to 60s) and
// their attributes, each key written
// here without its "advisorylock." prefix (backend is
// "advisorylock.backend", the constant AttrBackend):
//
//	advisorylock.acquire.duration       histogram       backend, kind, outcome
//	advisorylock.hold.duration          histogram       backend, kind
//	advisorylock.held                   up-down counter backend, kind
//	advisorylock.lost                   counter         backend, kind, cause
//	advisorylock.connections.discarded  counter         backend, reason
//	advisorylock.lease.renew.duration   histogram       backend, outcome
//
// Spans: "advisorylock.acquire" covers an acquire's wait (its statements
// run under it; attributes backend, kind, wait and, at its end, outcome),
// and "advisorylock.hold" a granted hold, from the grant to the release
// (backend, kind, and forgotten for a Guard cleaned up without Release),
// with an "advisorylock.lost" event (cause) when the lock is lost.
// Both are children of the span in the acquire's context. An acquire whose
// context carries no span (it is part of no trace) gets no spans unless
// WithRootSpans(true): most locks are taken outside any request, and a
// trace per acquire would be noise (and 3 to 4 µs more per TryLock+Release).
//
// The global providers are used unless options give others. Lock names
// are not an attribute (AttrName) unless WithLockNames(true): one series
// per name can be many series.
package advisorylockotel

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/buckets"
	"github.com/advisorylock/advisorylock/internal/renewal"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/advisorylock/advisorylock/extra/advisorylockotel"

// The metric names (the contract that dashboards depend on).
const (
	MetricAcquireDuration      = "advisorylock.acquire.duration"
	MetricHoldDuration         = "advisorylock.hold.duration"
	MetricHeld                 = "advisorylock.held"
	MetricLost                 = "advisorylock.lost"
	MetricConnectionsDiscarded = "advisorylock.connections.discarded"
	MetricLeaseRenewDuration   = "advisorylock.lease.renew.duration"
)

// The attribute keys of the metrics and spans (a contract, as the metric
// names are). Each is in the advisorylock. namespace, so that it cannot
// collide with another instrumentation's keys on the same span or series.
const (
	// AttrBackend is the backend's name ("postgres", "sqlite", ...).
	AttrBackend attribute.Key = "advisorylock.backend"
	// AttrKind is the kind of lock (advisorylock.Event.Kind).
	AttrKind attribute.Key = "advisorylock.kind"
	// AttrName is the lock's name; only with WithLockNames(true).
	AttrName attribute.Key = "advisorylock.name"
	// AttrOutcome is how an acquire ended (advisorylock.Event.Outcome),
	// or a lease renewal: "renewed", "lost" (its Err matches
	// advisorylock.ErrLockLost) or "error" (another Err).
	AttrOutcome attribute.Key = "advisorylock.outcome"
	// AttrCause is why a lock was lost (advisorylock.Event.Cause of an
	// EventLoss).
	AttrCause attribute.Key = "advisorylock.cause"
	// AttrReason is why a connection was discarded
	// (advisorylock.Event.Cause of an EventDiscard).
	AttrReason attribute.Key = "advisorylock.reason"
	// AttrWait is on acquire spans: false for a single attempt (TryLock),
	// true for an acquire that may wait.
	AttrWait attribute.Key = "advisorylock.wait"
	// AttrForgotten is true on the hold span of a Guard cleaned up without
	// Release, and absent otherwise.
	AttrForgotten attribute.Key = "advisorylock.forgotten"
)

// Option configures NewObserver.
type Option func(*config)

type config struct {
	meters    metric.MeterProvider
	tracers   trace.TracerProvider
	lockNames bool
	rootSpans bool
}

// WithMeterProvider sets the meter provider [otel.GetMeterProvider()].
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meters = mp }
}

// WithTracerProvider sets the tracer provider [otel.GetTracerProvider()].
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracers = tp }
}

// WithLockNames adds the lock's name as the AttrName attribute
// ("advisorylock.name") of every metric and span [false]. Each name is a
// series of its own: turn it on only for a bounded set of names.
func WithLockNames(on bool) Option { return func(c *config) { c.lockNames = on } }

// WithRootSpans makes spans also for acquires whose context carries no
// span, each the root of a trace of its own [false].
func WithRootSpans(on bool) Option { return func(c *config) { c.rootSpans = on } }

// NewObserver returns an advisorylock.Observer that records the package's
// metrics and spans. An instrument the meter cannot create is reported to
// otel.Handle and then records nothing.
func NewObserver(opts ...Option) advisorylock.Observer {
	c := config{}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.meters == nil {
		c.meters = otel.GetMeterProvider()
	}
	if c.tracers == nil {
		c.tracers = otel.GetTracerProvider()
	}
	m := c.meters.Meter(ScopeName)
	buckets := metric.WithExplicitBucketBoundaries(buckets.Durations()...)
	o := &observer{
		tracer:    c.tracers.Tracer(ScopeName),
		lockNames: c.lockNames,
		rootSpans: c.rootSpans,
		sets:      map[setKey]*attrs{},
	}
	var err error
	o.acquire, err = m.Float64Histogram(MetricAcquireDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("How long acquires took, by outcome (including the wait for a held lock)."))
	handle(err)
	o.hold, err = m.Float64Histogram(MetricHoldDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("How long locks were held, from the grant to the release."))
	handle(err)
	// held is counted here and read at collection: an observable counter
	// spares every grant and release a trip through the SDK.
	_, err = m.Int64ObservableUpDownCounter(MetricHeld, metric.WithUnit("{lock}"),
		metric.WithDescription("Locks granted and not yet released."),
		metric.WithInt64Callback(o.observeHeld))
	handle(err)
	o.lost, err = m.Int64Counter(MetricLost, metric.WithUnit("{lock}"),
		metric.WithDescription("Held locks found lost, by cause."))
	handle(err)
	o.discarded, err = m.Int64Counter(MetricConnectionsDiscarded, metric.WithUnit("{connection}"),
		metric.WithDescription("Connections closed instead of pooled, by reason."))
	handle(err)
	o.renew, err = m.Float64Histogram(MetricLeaseRenewDuration, metric.WithUnit("s"), buckets,
		metric.WithDescription("How long lease renewals took, by outcome."))
	handle(err)
	return o
}

// handle reports an instrument that could not be created; the meter still
// returns a usable (no-op) instrument in that case.
func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}

type observer struct {
	tracer    trace.Tracer
	lockNames bool
	rootSpans bool
	acquire   metric.Float64Histogram
	hold      metric.Float64Histogram
	lost      metric.Int64Counter
	discarded metric.Int64Counter
	renew     metric.Float64Histogram

	mu   sync.RWMutex
	sets map[setKey]*attrs
}

// setKey identifies one attribute set; unused fields are empty.
type setKey struct {
	backend, kind, name string
	label               attribute.Key
	value               string
}

// attrs is one attribute set, as the options each instrument call takes.
// They are built once per set, so that recording allocates nothing of
// ours.
type attrs struct {
	set  attribute.Set
	rec  []metric.RecordOption
	add  []metric.AddOption
	span []trace.SpanStartOption // a hold span's
	try  []trace.SpanStartOption // an acquire span's, one attempt (wait=false)
	wait []trace.SpanStartOption // an acquire span's that may wait (wait=true)
	held atomic.Int64            // grants minus releases, for the held counter
}

// attrsFor returns the attribute set of e's lock plus label=value (if label
// is not empty).
func (o *observer) attrsFor(e advisorylock.Event, withKind bool, label attribute.Key, value string) *attrs {
	k := setKey{backend: e.Backend, label: label, value: value}
	if withKind {
		k.kind = e.Kind
	}
	if o.lockNames {
		k.name = e.Name
	}
	o.mu.RLock()
	a := o.sets[k]
	o.mu.RUnlock()
	if a != nil {
		return a
	}
	list := []attribute.KeyValue{AttrBackend.String(k.backend)}
	if withKind {
		list = append(list, AttrKind.String(k.kind))
	}
	if label != "" {
		list = append(list, label.String(value))
	}
	if o.lockNames {
		list = append(list, AttrName.String(k.name))
	}
	set := attribute.NewSet(list...)
	a = &attrs{
		set:  set,
		rec:  []metric.RecordOption{metric.WithAttributeSet(set)},
		add:  []metric.AddOption{metric.WithAttributeSet(set)},
		span: []trace.SpanStartOption{trace.WithAttributes(list...), trace.WithSpanKind(trace.SpanKindInternal)},
		try:  []trace.SpanStartOption{trace.WithAttributes(slices.Concat(list, []attribute.KeyValue{AttrWait.Bool(false)})...), trace.WithSpanKind(trace.SpanKindInternal)},
		wait: []trace.SpanStartOption{trace.WithAttributes(slices.Concat(list, []attribute.KeyValue{AttrWait.Bool(true)})...), trace.WithSpanKind(trace.SpanKindInternal)},
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev := o.sets[k]; prev != nil {
		return prev
	}
	o.sets[k] = a
	return a
}

// observeHeld reports the held count of every backend and kind seen.
func (o *observer) observeHeld(_ context.Context, obs metric.Int64Observer) error {
	o.mu.RLock()
	defer o.mu.RUnlock()
	for k, a := range o.sets {
		if k.kind != "" && k.label == "" {
			obs.Observe(a.held.Load(), metric.WithAttributeSet(a.set))
		}
	}
	return nil
}

// spans are the spans of one acquire and its hold, carried in the
// acquire's context (under spansKey) when there are any: the observer
// ends only spans it started, never the caller's.
type spans struct {
	parent  trace.Span // current before the acquire: the parent of both
	acquire trace.Span
	hold    trace.Span // set at the acquire's end, for a grant
}

type spansKey struct{}

// spanContext is an acquire's context with its spans: one allocation
// where context.WithValue and the spans would take two.
type spanContext struct {
	context.Context
	spans
}

// Value returns the spans for spansKey, else what the context holds.
func (c *spanContext) Value(key any) any {
	if key == (spansKey{}) {
		return &c.spans
	}
	return c.Context.Value(key)
}

// Observe records e, and returns ctx with the acquire's spans (if any)
// for an EventAcquireStart; ctx otherwise.
func (o *observer) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	switch e.Type {
	case advisorylock.EventAcquireStart:
		return o.acquireStart(ctx, e)
	case advisorylock.EventAcquireEnd:
		o.acquireEnd(ctx, e)
	case advisorylock.EventRelease:
		o.released(ctx, e)
	case advisorylock.EventLoss:
		o.lose(ctx, e)
	case advisorylock.EventDiscard:
		a := o.attrsFor(e, false, AttrReason, string(e.Cause))
		o.discarded.Add(ctx, 1, a.add...)
	case advisorylock.EventRenew:
		a := o.attrsFor(e, false, AttrOutcome, renewal.Outcome(e.Err))
		o.renew.Record(ctx, e.Duration.Seconds(), a.rec...)
	}
	return ctx
}

func (o *observer) acquireStart(ctx context.Context, e advisorylock.Event) context.Context {
	parent := trace.SpanFromContext(ctx)
	if !o.rootSpans && !parent.SpanContext().IsValid() {
		return ctx
	}
	a := o.attrsFor(e, true, "", "")
	opts := a.try
	if e.MayWait {
		opts = a.wait
	}
	ctx, span := o.tracer.Start(ctx, "advisorylock.acquire", opts...)
	if !span.IsRecording() {
		return ctx
	}
	return &spanContext{Context: ctx, spans: spans{parent: parent, acquire: span}}
}

func (o *observer) acquireEnd(ctx context.Context, e advisorylock.Event) {
	a := o.attrsFor(e, true, AttrOutcome, string(e.Outcome))
	o.acquire.Record(ctx, e.Duration.Seconds(), a.rec...)
	s, traced := ctx.Value(spansKey{}).(*spans)
	if traced {
		s.acquire.SetAttributes(AttrOutcome.String(string(e.Outcome)))
		if e.Outcome == advisorylock.OutcomeError {
			s.acquire.SetStatus(codes.Error, e.Err.Error())
		}
		s.acquire.End()
	}
	if e.Outcome != advisorylock.OutcomeAcquired {
		return
	}
	h := o.attrsFor(e, true, "", "")
	h.held.Add(1)
	if traced {
		_, s.hold = o.tracer.Start(trace.ContextWithSpan(ctx, s.parent), "advisorylock.hold", h.span...)
	}
}

// holdSpan returns the hold span that ctx carries, or nil.
func holdSpan(ctx context.Context) trace.Span {
	if s, ok := ctx.Value(spansKey{}).(*spans); ok {
		return s.hold
	}
	return nil
}

func (o *observer) released(ctx context.Context, e advisorylock.Event) {
	a := o.attrsFor(e, true, "", "")
	o.hold.Record(ctx, e.Duration.Seconds(), a.rec...)
	a.held.Add(-1)
	if span := holdSpan(ctx); span != nil {
		if e.Cause == advisorylock.CauseForgotten {
			span.SetAttributes(AttrForgotten.Bool(true))
		}
		if e.Err != nil {
			span.SetStatus(codes.Error, e.Err.Error())
		}
		span.End()
	}
}

func (o *observer) lose(ctx context.Context, e advisorylock.Event) {
	a := o.attrsFor(e, true, AttrCause, string(e.Cause))
	o.lost.Add(ctx, 1, a.add...)
	if span := holdSpan(ctx); span != nil {
		span.AddEvent("advisorylock.lost", trace.WithAttributes(AttrCause.String(string(e.Cause))))
		msg := string(e.Cause)
		if e.Err != nil {
			msg = e.Err.Error()
		}
		span.SetStatus(codes.Error, msg)
	}
}
