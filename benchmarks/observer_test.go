package benchmarks

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockotel"
	"github.com/advisorylock/advisorylock/extra/advisorylockprom"
	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// observers are the Observers the benchmarks compare, by name: a no-op
// (the cost of the calls alone), the OpenTelemetry adapter on the SDK
// (a manual reader, so every measurement is aggregated as in production;
// every span sampled, with no exporter) and the Prometheus adapter on a
// registry of its own.
func observers(tb testing.TB) map[string]advisorylock.Observer {
	tb.Helper()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	tb.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	prom, err := advisorylockprom.NewObserver(prometheus.NewRegistry())
	if err != nil {
		tb.Fatal(err)
	}
	return map[string]advisorylock.Observer{
		"noop": noopObserver{},
		"otel": advisorylockotel.NewObserver(advisorylockotel.WithMeterProvider(mp), advisorylockotel.WithTracerProvider(tp)),
		"prom": prom,
	}
}

// noopObserver is an Observer that ignores every event: the cost of the
// library's calls alone.
type noopObserver struct{}

func (noopObserver) Observe(ctx context.Context, _ advisorylock.Event) context.Context { return ctx }

// setupObservedTryLock is TryLock+Release with the named observer.
func setupObservedTryLock(name string) func(b *testing.B, e pgEnv) func(ctx context.Context) error {
	return func(b *testing.B, e pgEnv) func(ctx context.Context) error {
		return setupTryLock([]advisorylock.Option{advisorylock.WithObserver(observers(b)[name])})(b, e)
	}
}

// setupTracedTryLock is TryLock+Release with the OpenTelemetry observer,
// called in a trace (a recording span in ctx), so that it records an
// acquire span and a hold span besides the metrics.
func setupTracedTryLock(b *testing.B, e pgEnv) func(ctx context.Context) error {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs := advisorylockotel.NewObserver(advisorylockotel.WithTracerProvider(tp),
		advisorylockotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))))
	step := setupTryLock([]advisorylock.Option{advisorylock.WithObserver(obs)})(b, e)
	_, request := tp.Tracer("benchmark").Start(context.Background(), "request")
	return func(ctx context.Context) error {
		return step(trace.ContextWithSpan(ctx, request))
	}
}

// observerEvents are the event sequences BenchmarkObserverEvents times,
// each as the library calls it: "trylock_release" is every event of an
// uncontended TryLock+Release (acquire start and end, release).
var observerEvents = []struct {
	name string
	run  func(ctx context.Context, o advisorylock.Observer)
}{
	{"trylock_release", func(ctx context.Context, o advisorylock.Observer) {
		ctx = o.Observe(ctx, benchEvent(advisorylock.Event{Type: advisorylock.EventAcquireStart}))
		ctx = o.Observe(ctx, benchEvent(advisorylock.Event{Type: advisorylock.EventAcquireEnd, Outcome: advisorylock.OutcomeAcquired, Duration: 50 * time.Microsecond}))
		o.Observe(ctx, benchEvent(advisorylock.Event{Type: advisorylock.EventRelease, Duration: time.Millisecond}))
	}},
	{"not_acquired", func(ctx context.Context, o advisorylock.Observer) {
		ctx = o.Observe(ctx, benchEvent(advisorylock.Event{Type: advisorylock.EventAcquireStart}))
		o.Observe(ctx, benchEvent(advisorylock.Event{Type: advisorylock.EventAcquireEnd, Outcome: advisorylock.OutcomeNotAcquired, Duration: 50 * time.Microsecond, Err: advisorylock.ErrNotAcquired}))
	}},
	{"lost", func(ctx context.Context, o advisorylock.Observer) {
		o.Observe(ctx, benchEvent(advisorylock.Event{Type: advisorylock.EventLoss, Cause: advisorylock.CauseSessionEnded, Duration: time.Second, Err: errBenchLoss}))
	}},
	{"discarded", func(_ context.Context, o advisorylock.Observer) {
		o.Observe(context.Background(), benchEvent(advisorylock.Event{Type: advisorylock.EventDiscard, Cause: advisorylock.CauseCanceled}))
	}},
	{"renewed", func(_ context.Context, o advisorylock.Observer) {
		o.Observe(context.Background(), benchEvent(advisorylock.Event{Type: advisorylock.EventRenew, Duration: time.Millisecond}))
	}},
}

// benchEvent is e about the benchmarked lock, as the library names it in
// every event.
func benchEvent(e advisorylock.Event) advisorylock.Event {
	e.Backend, e.Kind, e.Name = "postgres", "lock", "bench"
	return e
}

// BenchmarkObserverEvents measures what an Observer costs per event, with
// no database: ns/op and allocs/op of each event sequence, per observer
// ("otel_traced": the OpenTelemetry observer called in a trace, so that it
// also records spans).
// Pin "trylock_release" against BenchmarkPG/trylock_release (the library
// adds no cost of its own without an Observer: one nil check).
func BenchmarkObserverEvents(b *testing.B) {
	for _, ev := range observerEvents {
		for _, name := range []string{"noop", "otel", "otel_traced", "prom"} {
			name, traced := strings.CutSuffix(name, "_traced")
			label := ev.name + "/" + name
			if traced {
				label += "_traced"
			}
			b.Run(label, func(b *testing.B) {
				o := observers(b)[name]
				ctx := context.Background()
				if traced {
					tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
					b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
					var request trace.Span
					ctx, request = tp.Tracer("benchmark").Start(ctx, "request")
					defer request.End()
				}
				ev.run(ctx, o) // first use builds the attribute sets
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					ev.run(ctx, o)
				}
			})
		}
	}
}

// errBenchLoss is the error of the benchmarked loss events.
var errBenchLoss = errors.New("benchmark: session ended")
