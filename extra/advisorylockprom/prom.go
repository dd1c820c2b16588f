// Package advisorylockprom reports what advisorylock's locks do as
// Prometheus metrics:
//
//	obs, err := advisorylockprom.NewObserver(prometheus.DefaultRegisterer)
//	if err != nil { return err }
//	lock, err := advisorylock.New(db, "nightly", advisorylock.WithObserver(obs))
//
// Metrics (durations in seconds, buckets from advisorylock.DurationBuckets):
//
//	advisorylock_acquire_duration_seconds        histogram backend, kind, outcome
//	advisorylock_hold_duration_seconds           histogram backend, kind
//	advisorylock_held                            gauge     backend, kind
//	advisorylock_lost_total                      counter   backend, kind, cause
//	advisorylock_connections_discarded_total     counter   backend, reason
//	advisorylock_lease_renew_duration_seconds    histogram backend, outcome
//
// They are the metrics of extra/advisorylockotel in Prometheus's spelling.
// Lock names are not a label (one series per name can be many series).
// dashboard.json in this folder is a Grafana dashboard for them.
package advisorylockprom

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/advisorylock/advisorylock"
	"github.com/prometheus/client_golang/prometheus"
)

// The metric names (the contract that dashboards depend on).
const (
	MetricAcquireDuration      = "advisorylock_acquire_duration_seconds"
	MetricHoldDuration         = "advisorylock_hold_duration_seconds"
	MetricHeld                 = "advisorylock_held"
	MetricLost                 = "advisorylock_lost_total"
	MetricConnectionsDiscarded = "advisorylock_connections_discarded_total"
	MetricLeaseRenewDuration   = "advisorylock_lease_renew_duration_seconds"
)

// NewObserver registers the package's metrics with reg
// (prometheus.DefaultRegisterer if nil) and returns an Observer that
// records them. Observers made on one registry share its metrics, so one
// observer per lock is fine. It fails when reg already holds a different
// metric under one of these names.
func NewObserver(reg prometheus.Registerer) (advisorylock.Observer, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	buckets := advisorylock.DurationBuckets()
	o := &observer{
		acquire: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricAcquireDuration,
			Help:    "How long acquires took, by outcome (including the wait for a held lock).",
			Buckets: buckets,
		}, []string{"backend", "kind", "outcome"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricHoldDuration,
			Help:    "How long locks were held, from the grant to the release.",
			Buckets: buckets,
		}, []string{"backend", "kind"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricHeld,
			Help: "Locks granted and not yet released.",
		}, []string{"backend", "kind"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricLost,
			Help: "Held locks found lost, by cause.",
		}, []string{"backend", "kind", "cause"}),
		discarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricConnectionsDiscarded,
			Help: "Connections closed instead of pooled, by reason.",
		}, []string{"backend", "reason"}),
		renew: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricLeaseRenewDuration,
			Help:    "How long lease renewals took, by outcome.",
			Buckets: buckets,
		}, []string{"backend", "outcome"}),
		series: map[seriesKey]*series{},
	}
	for _, c := range []*prometheus.Collector{&o.acquire, &o.hold, &o.held, &o.lost, &o.discarded, &o.renew} {
		if err := register(reg, c); err != nil {
			return nil, err
		}
	}
	if err := o.fromCollectors(); err != nil {
		return nil, err
	}
	return o, nil
}

// collectors are kept as prometheus.Collector while registering, so that
// register can swap in a registry's existing one.
type observer struct {
	advisorylock.NoopObserver // events added later are ignored until handled here

	acquire, hold, held, lost, discarded, renew prometheus.Collector

	acquireVec, holdVec, renewVec *prometheus.HistogramVec
	heldVec                       *prometheus.GaugeVec
	lostVec, discardedVec         *prometheus.CounterVec

	mu     sync.RWMutex
	series map[seriesKey]*series
}

// register registers *c with reg; if reg has an equal collector already,
// *c becomes that one, so that observers on one registry share series.
func register(reg prometheus.Registerer, c *prometheus.Collector) error {
	err := reg.Register(*c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		*c = dup.ExistingCollector
		return nil
	}
	if err != nil {
		return fmt.Errorf("advisorylock: prometheus observer: %w", err)
	}
	return nil
}

// fromCollectors types the registered collectors; one that a registry
// had already, of another type, is an error.
func (o *observer) fromCollectors() error {
	var ok [6]bool
	o.acquireVec, ok[0] = o.acquire.(*prometheus.HistogramVec)
	o.holdVec, ok[1] = o.hold.(*prometheus.HistogramVec)
	o.heldVec, ok[2] = o.held.(*prometheus.GaugeVec)
	o.lostVec, ok[3] = o.lost.(*prometheus.CounterVec)
	o.discardedVec, ok[4] = o.discarded.(*prometheus.CounterVec)
	o.renewVec, ok[5] = o.renew.(*prometheus.HistogramVec)
	for _, ok := range ok {
		if !ok {
			return errors.New("advisorylock: prometheus observer: the registry holds another kind of metric under an advisorylock_ name")
		}
	}
	return nil
}

// seriesKey names the series of one event; unused fields are empty.
type seriesKey struct {
	event                  string
	backend, kind, outcome string
}

// series is the children an event records into, looked up once per label
// set so that recording allocates nothing.
type series struct {
	duration prometheus.Observer
	gauge    prometheus.Gauge
	counter  prometheus.Counter
}

// seriesFor returns the cached series of k, made by mk on first use.
func (o *observer) seriesFor(k seriesKey, mk func() *series) *series {
	o.mu.RLock()
	s := o.series[k]
	o.mu.RUnlock()
	if s != nil {
		return s
	}
	s = mk()
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev := o.series[k]; prev != nil {
		return prev
	}
	o.series[k] = s
	return s
}

func (o *observer) AcquireEnd(ctx context.Context, e advisorylock.AcquireEndEvent) context.Context {
	k := seriesKey{event: "acquire", backend: e.Backend, kind: string(e.Kind), outcome: string(e.Outcome)}
	o.seriesFor(k, func() *series {
		return &series{duration: o.acquireVec.WithLabelValues(k.backend, k.kind, k.outcome)}
	}).duration.Observe(e.Wait.Seconds())
	if e.Outcome == advisorylock.OutcomeAcquired {
		o.holdSeries(e.LockInfo).gauge.Inc()
	}
	return ctx
}

// holdSeries is the hold histogram and held gauge of a kind of lock.
func (o *observer) holdSeries(info advisorylock.LockInfo) *series {
	k := seriesKey{event: "hold", backend: info.Backend, kind: string(info.Kind)}
	return o.seriesFor(k, func() *series {
		return &series{
			duration: o.holdVec.WithLabelValues(k.backend, k.kind),
			gauge:    o.heldVec.WithLabelValues(k.backend, k.kind),
		}
	})
}

func (o *observer) Released(_ context.Context, e advisorylock.ReleaseEvent) {
	s := o.holdSeries(e.LockInfo)
	s.duration.Observe(e.Held.Seconds())
	s.gauge.Dec()
}

func (o *observer) Lost(_ context.Context, e advisorylock.LossEvent) {
	k := seriesKey{event: "lost", backend: e.Backend, kind: string(e.Kind), outcome: string(e.Cause)}
	o.seriesFor(k, func() *series {
		return &series{counter: o.lostVec.WithLabelValues(k.backend, k.kind, k.outcome)}
	}).counter.Inc()
}

func (o *observer) Discarded(e advisorylock.DiscardEvent) {
	k := seriesKey{event: "discarded", backend: e.Backend, outcome: string(e.Reason)}
	o.seriesFor(k, func() *series {
		return &series{counter: o.discardedVec.WithLabelValues(k.backend, k.outcome)}
	}).counter.Inc()
}

func (o *observer) Renewed(e advisorylock.RenewEvent) {
	k := seriesKey{event: "renew", backend: e.Backend, outcome: string(e.Outcome)}
	o.seriesFor(k, func() *series {
		return &series{duration: o.renewVec.WithLabelValues(k.backend, k.outcome)}
	}).duration.Observe(e.Latency.Seconds())
}
