package advisorylockotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockotel"
	"github.com/advisorylock/advisorylock/internal/buckets"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// providers are an SDK meter provider with a manual reader and a tracer
// provider with a span recorder, shut down at the test's end.
type providers struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newProviders(t *testing.T) *providers {
	p := &providers{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(p.reader))
	p.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(p.spans))
	t.Cleanup(func() {
		_ = p.mp.Shutdown(context.Background())
		_ = p.tp.Shutdown(context.Background())
	})
	return p
}

func (p *providers) observer(opts ...advisorylockotel.Option) advisorylock.Observer {
	opts = append([]advisorylockotel.Option{advisorylockotel.WithMeterProvider(p.mp), advisorylockotel.WithTracerProvider(p.tp)}, opts...)
	return advisorylockotel.NewObserver(opts...)
}

// metrics collects the metrics, by name.
func (p *providers) metrics(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// attrs renders an attribute set as "k=v,k=v" in key order.
func attrs(s attribute.Set) string {
	var out string
	for i, kv := range s.ToSlice() {
		if i > 0 {
			out += ","
		}
		out += string(kv.Key) + "=" + kv.Value.String()
	}
	return out
}

// counts maps each data point's attributes to its count (histograms) or
// value (sums); a metric not yet recorded (nil) has none.
func counts(t *testing.T, data metricdata.Aggregation) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	switch d := data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out[attrs(dp.Attributes)] = int64(dp.Count)
			if !slices.Equal(dp.Bounds, buckets.Durations()) {
				t.Errorf("histogram %s has bounds %v, want buckets.Durations()", attrs(dp.Attributes), dp.Bounds)
			}
		}
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out[attrs(dp.Attributes)] = dp.Value
		}
	case nil:
	default:
		t.Fatalf("unexpected aggregation %T", data)
	}
	return out
}

func TestObserverRecordsEveryMetricAndSpan(t *testing.T) {
	p := newProviders(t)
	db := testdb.OpenPostgres(t, "pgx")
	observetest.PostgresScenario(t, db, p.observer(advisorylockotel.WithRootSpans(true)), observetest.Hooks{
		WhileHeld: func(t *testing.T) {
			held := counts(t, p.metrics(t)[advisorylockotel.MetricHeld])
			if n := held["advisorylock.backend=postgres,advisorylock.kind=lock"]; n != 1 {
				t.Errorf("held while one lock is held: %d, want 1", n)
			}
		},
		Renewed: func() bool {
			return counts(t, p.metrics(t)[advisorylockotel.MetricLeaseRenewDuration])["advisorylock.backend=postgres,advisorylock.outcome=renewed"] > 0
		},
	})

	m := p.metrics(t)
	want := map[string]map[string]int64{
		advisorylockotel.MetricAcquireDuration: {
			"advisorylock.backend=postgres,advisorylock.kind=lock,advisorylock.outcome=acquired":     2,
			"advisorylock.backend=postgres,advisorylock.kind=lock,advisorylock.outcome=not_acquired": 1,
			"advisorylock.backend=postgres,advisorylock.kind=lock,advisorylock.outcome=timeout":      1,
			"advisorylock.backend=postgres,advisorylock.kind=lock,advisorylock.outcome=canceled":     1,
			"advisorylock.backend=postgres,advisorylock.kind=lease,advisorylock.outcome=acquired":    1,
		},
		advisorylockotel.MetricHoldDuration: {
			"advisorylock.backend=postgres,advisorylock.kind=lock":  2,
			"advisorylock.backend=postgres,advisorylock.kind=lease": 1,
		},
		advisorylockotel.MetricHeld: {
			"advisorylock.backend=postgres,advisorylock.kind=lock":  0,
			"advisorylock.backend=postgres,advisorylock.kind=lease": 0,
		},
		advisorylockotel.MetricLost: {
			"advisorylock.backend=postgres,advisorylock.cause=session_ended,advisorylock.kind=lock": 1,
		},
		advisorylockotel.MetricConnectionsDiscarded: {
			"advisorylock.backend=postgres,advisorylock.reason=canceled":      1,
			"advisorylock.backend=postgres,advisorylock.reason=session_ended": 1,
		},
	}
	for name, series := range want {
		got := counts(t, m[name])
		if !maps.Equal(got, series) {
			t.Errorf("%s: %v, want %v", name, got, series)
		}
	}
	renew := counts(t, m[advisorylockotel.MetricLeaseRenewDuration])
	if len(renew) != 1 || renew["advisorylock.backend=postgres,advisorylock.outcome=renewed"] < 1 {
		t.Errorf("%s: %v, want renewals with outcome renewed only", advisorylockotel.MetricLeaseRenewDuration, renew)
	}

	if started, ended := len(p.spans.Started()), len(p.spans.Ended()); started != ended {
		t.Errorf("%d spans started, %d ended", started, ended)
	}
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range p.spans.Ended() {
		byName[s.Name()] = append(byName[s.Name()], s)
	}
	if a, h := len(byName["advisorylock.acquire"]), len(byName["advisorylock.hold"]); a != 6 || h != 3 {
		t.Errorf("%d acquire spans and %d hold spans, want 6 and 3", a, h)
	}
	waits := map[bool]int{}
	for _, s := range byName["advisorylock.acquire"] {
		for _, kv := range s.Attributes() {
			if kv.Key == "advisorylock.wait" {
				waits[kv.Value.AsBool()]++
			}
		}
	}
	if waits[false] != 4 || waits[true] != 2 {
		t.Errorf("acquire spans by their wait attribute: %v, want 4 single attempts (TryLock) and 2 that may wait", waits)
	}
	var lostEvents int
	for _, s := range byName["advisorylock.hold"] {
		if s.Parent().IsValid() {
			t.Errorf("hold span has parent %v, want the acquire's parent (none here), not the acquire span", s.Parent().SpanID())
		}
		for _, e := range s.Events() {
			if e.Name == "advisorylock.lost" {
				lostEvents++
			}
		}
	}
	if lostEvents != 1 {
		t.Errorf("%d advisorylock.lost span events, want 1", lostEvents)
	}
}

// with returns e describing the lock that lock describes, as the
// library's events do.
func with(lock, e advisorylock.Event) advisorylock.Event {
	e.Backend, e.Kind, e.Name = lock.Backend, lock.Kind, lock.Name
	return e
}

// TestAttributeKeysAreNamespacedAndNamesOptIn feeds one event of each
// kind to an observer with and without WithLockNames(true), and checks
// the exact attributes of every metric, span and span event: every key is
// advisorylock.-prefixed, and the name is there only when asked.
func TestAttributeKeysAreNamespacedAndNamesOptIn(t *testing.T) {
	for _, named := range []bool{false, true} {
		p := newProviders(t)
		o := p.observer(advisorylockotel.WithLockNames(named), advisorylockotel.WithRootSpans(true))
		nightly := advisorylock.Event{Backend: "postgres", Kind: "lock", Name: "nightly"}
		ctx := o.Observe(context.Background(), with(nightly, advisorylock.Event{Type: advisorylock.EventAcquireStart}))
		ctx = o.Observe(ctx, with(nightly, advisorylock.Event{Type: advisorylock.EventAcquireEnd, Outcome: advisorylock.OutcomeAcquired, Duration: time.Millisecond}))
		o.Observe(ctx, with(nightly, advisorylock.Event{Type: advisorylock.EventLoss, Cause: advisorylock.CauseNotHeld}))
		o.Observe(ctx, with(nightly, advisorylock.Event{Type: advisorylock.EventRelease, Duration: time.Second, Cause: advisorylock.CauseForgotten}))
		o.Observe(context.Background(), with(nightly, advisorylock.Event{Type: advisorylock.EventDiscard, Cause: advisorylock.CauseForgotten}))
		// A renewal's outcome label comes from its Err.
		o.Observe(context.Background(), with(nightly, advisorylock.Event{Type: advisorylock.EventRenew}))
		o.Observe(context.Background(), with(nightly, advisorylock.Event{Type: advisorylock.EventRenew, Err: fmt.Errorf("%w: taken over", advisorylock.ErrLockLost)}))
		o.Observe(context.Background(), with(nightly, advisorylock.Event{Type: advisorylock.EventRenew, Err: errors.New("connection refused")}))

		name := ""
		if named {
			name = ",advisorylock.name=nightly"
		}
		const lock = "advisorylock.backend=postgres,advisorylock.kind=lock"
		want := map[string]map[string]int64{
			advisorylockotel.MetricAcquireDuration:      {lock + name + ",advisorylock.outcome=acquired": 1},
			advisorylockotel.MetricHoldDuration:         {lock + name: 1},
			advisorylockotel.MetricHeld:                 {lock + name: 0},
			advisorylockotel.MetricLost:                 {"advisorylock.backend=postgres,advisorylock.cause=not_held,advisorylock.kind=lock" + name: 1},
			advisorylockotel.MetricConnectionsDiscarded: {"advisorylock.backend=postgres" + name + ",advisorylock.reason=forgotten": 1},
			advisorylockotel.MetricLeaseRenewDuration: {
				"advisorylock.backend=postgres" + name + ",advisorylock.outcome=renewed": 1,
				"advisorylock.backend=postgres" + name + ",advisorylock.outcome=lost":    1,
				"advisorylock.backend=postgres" + name + ",advisorylock.outcome=error":   1,
			},
		}
		m := p.metrics(t)
		for metric, series := range want {
			if got := counts(t, m[metric]); !maps.Equal(got, series) {
				t.Errorf("WithLockNames(%v): %s: %v, want %v", named, metric, got, series)
			}
		}

		wantSpans := map[string]string{
			"advisorylock.acquire": lock + name + ",advisorylock.outcome=acquired,advisorylock.wait=false",
			"advisorylock.hold":    "advisorylock.backend=postgres,advisorylock.forgotten=true,advisorylock.kind=lock" + name,
		}
		ended := p.spans.Ended()
		if len(ended) != len(wantSpans) {
			t.Fatalf("WithLockNames(%v): %d spans, want %d", named, len(ended), len(wantSpans))
		}
		for _, s := range ended {
			if got := attrs(attribute.NewSet(s.Attributes()...)); got != wantSpans[s.Name()] {
				t.Errorf("WithLockNames(%v): span %s has attributes %s, want %s", named, s.Name(), got, wantSpans[s.Name()])
			}
			for _, e := range s.Events() {
				if got, want := attrs(attribute.NewSet(e.Attributes...)), "advisorylock.cause=not_held"; got != want {
					t.Errorf("WithLockNames(%v): event %s has attributes %s, want %s", named, e.Name, got, want)
				}
			}
		}
	}
}

// TestAttributeKeys pins the exported keys: they are the contract that
// queries depend on.
func TestAttributeKeys(t *testing.T) {
	for key, want := range map[attribute.Key]string{
		advisorylockotel.AttrBackend:   "advisorylock.backend",
		advisorylockotel.AttrKind:      "advisorylock.kind",
		advisorylockotel.AttrName:      "advisorylock.name",
		advisorylockotel.AttrOutcome:   "advisorylock.outcome",
		advisorylockotel.AttrCause:     "advisorylock.cause",
		advisorylockotel.AttrReason:    "advisorylock.reason",
		advisorylockotel.AttrWait:      "advisorylock.wait",
		advisorylockotel.AttrForgotten: "advisorylock.forgotten",
	} {
		if string(key) != want {
			t.Errorf("attribute key %q, want %q", key, want)
		}
	}
}

// TestObserverParentsSpansOnTheCallersSpan checks that the acquire span is
// a child of the caller's span, and the hold span its sibling.
func TestObserverParentsSpansOnTheCallersSpan(t *testing.T) {
	p := newProviders(t)
	o := p.observer()
	ctx, root := p.tp.Tracer("test").Start(context.Background(), "job")
	lease := advisorylock.Event{Backend: "sqlite", Kind: "lease", Name: "x"}
	ctx = o.Observe(ctx, with(lease, advisorylock.Event{Type: advisorylock.EventAcquireStart, MayWait: true}))
	ctx = o.Observe(ctx, with(lease, advisorylock.Event{Type: advisorylock.EventAcquireEnd, Outcome: advisorylock.OutcomeAcquired}))
	o.Observe(ctx, with(lease, advisorylock.Event{Type: advisorylock.EventRelease}))
	if !root.IsRecording() {
		t.Fatal("the observer ended the caller's span")
	}
	root.End()
	for _, s := range p.spans.Ended() {
		if s.Name() == "advisorylock.acquire" && !slices.Contains(s.Attributes(), advisorylockotel.AttrWait.Bool(true)) {
			t.Errorf("acquire span of a waiting acquire has attributes %v, want wait=true", s.Attributes())
		}
		if s.Name() != "job" && s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("span %s has parent %v, want the caller's span %v", s.Name(), s.Parent().SpanID(), root.SpanContext().SpanID())
		}
	}
	if n := len(p.spans.Ended()); n != 3 {
		t.Errorf("%d spans ended, want 3 (job, acquire, hold)", n)
	}
}

// TestNoSpansOutsideATraceUnlessAsked checks that an acquire whose context
// carries no span records metrics but starts no span, and never ends a
// span it did not start.
func TestNoSpansOutsideATraceUnlessAsked(t *testing.T) {
	for _, root := range []bool{false, true} {
		p := newProviders(t)
		o := p.observer(advisorylockotel.WithRootSpans(root))
		lock := advisorylock.Event{Backend: "postgres", Kind: "lock", Name: "x"}
		ctx := o.Observe(context.Background(), with(lock, advisorylock.Event{Type: advisorylock.EventAcquireStart}))
		ctx = o.Observe(ctx, with(lock, advisorylock.Event{Type: advisorylock.EventAcquireEnd, Outcome: advisorylock.OutcomeAcquired}))
		o.Observe(ctx, with(lock, advisorylock.Event{Type: advisorylock.EventLoss, Cause: advisorylock.CauseNotHeld}))
		o.Observe(ctx, with(lock, advisorylock.Event{Type: advisorylock.EventRelease}))
		want := 0
		if root {
			want = 2
		}
		if n := len(p.spans.Ended()); n != want {
			t.Errorf("WithRootSpans(%v): %d spans, want %d", root, n, want)
		}
		if n := counts(t, p.metrics(t)[advisorylockotel.MetricLost])["advisorylock.backend=postgres,advisorylock.cause=not_held,advisorylock.kind=lock"]; n != 1 {
			t.Errorf("WithRootSpans(%v): lost = %d, want 1", root, n)
		}
	}
}
