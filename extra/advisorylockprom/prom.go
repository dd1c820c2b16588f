// Package advisorylockprom reports what advisorylock's locks do as
// Prometheus metrics:
//
//	obs, err := advisorylockprom.NewObserver(prometheus.DefaultRegisterer)
//	if err != nil { return err }
//	lock, err := advisorylock.New(db, "nightly", advisorylock.WithObserver(obs))
//
// Metrics (durations in seconds, in buckets from 100µs to 60s):
//
//	advisorylock_acquire_duration_seconds        histogram backend, kind, outcome
//	advisorylock_hold_duration_seconds           histogram backend, kind
//	advisorylock_held                            gauge     backend, kind
//	advisorylock_lost_total                      counter   backend, kind, cause
//	advisorylock_connections_discarded_total     counter   backend, reason
//	advisorylock_lease_renew_duration_seconds    histogram backend, outcome
//
// They are the metrics of extra/advisorylockotel in Prometheus's spelling:
// its attribute keys without their "advisorylock." prefix are the labels.
// An acquire's outcome is its Event.Outcome; a loss's cause and a
// discard's reason are their Event.Cause; a renewal's outcome is
// "renewed", "lost" (its Event.Err matches advisorylock.ErrLockLost) or
// "error".
// Lock names are not a label unless WithLockNames(true): one series per
// name can be many series. dashboard.json in this folder is a Grafana
// dashboard for them.
package advisorylockprom

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/buckets"
	"github.com/advisorylock/advisorylock/internal/renewal"
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

// Option configures NewObserver.
type Option func(*config)

type config struct {
	lockNames bool
}

// WithLockNames adds the lock's name as the "name" label of every metric
// [false], as advisorylockotel.WithLockNames adds its advisorylock.name
// attribute (a Prometheus label name cannot hold a dot). Each name is a
// series of its own, for every backend, kind and outcome: turn it on only
// for a bounded set of names (one per job), never for names made per
// entity (a user, an order). Every observer on one registry must agree on
// it; see NewObserver.
func WithLockNames(on bool) Option { return func(c *config) { c.lockNames = on } }

// nameLabel is the label WithLockNames adds.
const nameLabel = "name"

// NewObserver registers the package's metrics with reg
// (prometheus.DefaultRegisterer if nil) and returns an Observer that
// records them. Observers made on one registry with the same options
// share its metrics, so one observer per lock is fine. It fails when reg
// already holds a different metric under one of these names, including
// this package's metrics registered by an observer with the other
// WithLockNames (the error says so).
func NewObserver(reg prometheus.Registerer, opts ...Option) (advisorylock.Observer, error) {
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	var c config
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	o := &observer{lockNames: c.lockNames, series: map[seriesKey]*series{}}
	if err := o.register(reg); err != nil {
		return nil, err
	}
	return o, nil
}

// register registers the observer's metrics with reg, or takes the equal
// ones reg has.
func (o *observer) register(reg prometheus.Registerer) error {
	cs := collectors(o.lockNames)
	for i, c := range cs {
		existing, err := registerOrShare(reg, c)
		if err != nil {
			return explain(reg, err, i, o.lockNames)
		}
		if existing != nil {
			cs[i] = existing
		}
	}
	return o.fromCollectors(cs)
}

// collectors returns the package's metrics, in the order fromCollectors
// takes them, with the name label if lockNames.
func collectors(lockNames bool) []prometheus.Collector {
	labels := func(names ...string) []string {
		if lockNames {
			names = append(names, nameLabel)
		}
		return names
	}
	durations := buckets.Durations()
	return []prometheus.Collector{
		prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricAcquireDuration,
			Help:    "How long acquires took, by outcome (including the wait for a held lock).",
			Buckets: durations,
		}, labels("backend", "kind", "outcome")),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricHoldDuration,
			Help:    "How long locks were held, from the grant to the release.",
			Buckets: durations,
		}, labels("backend", "kind")),
		prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: MetricHeld,
			Help: "Locks granted and not yet released.",
		}, labels("backend", "kind")),
		prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricLost,
			Help: "Held locks found lost, by cause.",
		}, labels("backend", "kind", "cause")),
		prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: MetricConnectionsDiscarded,
			Help: "Connections closed instead of pooled, by reason.",
		}, labels("backend", "reason")),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    MetricLeaseRenewDuration,
			Help:    "How long lease renewals took, by outcome.",
			Buckets: durations,
		}, labels("backend", "outcome")),
	}
}

type observer struct {
	lockNames bool

	acquireVec, holdVec, renewVec *prometheus.HistogramVec
	heldVec                       *prometheus.GaugeVec
	lostVec, discardedVec         *prometheus.CounterVec

	mu     sync.RWMutex
	series map[seriesKey]*series
}

// registerOrShare registers c with reg. If reg has an equal collector
// already, it returns that one, so that observers on one registry share
// series.
func registerOrShare(reg prometheus.Registerer, c prometheus.Collector) (existing prometheus.Collector, err error) {
	err = reg.Register(c)
	var dup prometheus.AlreadyRegisteredError
	if errors.As(err, &dup) {
		return dup.ExistingCollector, nil
	}
	if err != nil {
		return nil, fmt.Errorf("advisorylock: prometheus observer: %w", err)
	}
	return nil, nil
}

// explain returns err, the failure to register the i-th of collectors,
// or a clearer error when reg has that metric from an observer with the
// other WithLockNames: the registry's own error says only that the label
// names differ. The probe registers nothing (AlreadyRegisteredError
// means it was not registered; a success is undone).
func explain(reg prometheus.Registerer, err error, i int, lockNames bool) error {
	probe := collectors(!lockNames)[i]
	perr := reg.Register(probe)
	if perr == nil {
		reg.Unregister(probe)
		return err
	}
	if !errors.As(perr, new(prometheus.AlreadyRegisteredError)) {
		return err
	}
	has := "with the name label, by an observer with WithLockNames(true)"
	if lockNames {
		has = "without the name label, by an observer without WithLockNames(true)"
	}
	return fmt.Errorf("advisorylock: prometheus observer: the registry has the advisorylock_ metrics %s: observers on one registry must agree on WithLockNames", has)
}

// fromCollectors types the registered collectors; one that a registry
// had already, of another type, is an error.
func (o *observer) fromCollectors(cs []prometheus.Collector) error {
	var ok [6]bool
	o.acquireVec, ok[0] = cs[0].(*prometheus.HistogramVec)
	o.holdVec, ok[1] = cs[1].(*prometheus.HistogramVec)
	o.heldVec, ok[2] = cs[2].(*prometheus.GaugeVec)
	o.lostVec, ok[3] = cs[3].(*prometheus.CounterVec)
	o.discardedVec, ok[4] = cs[4].(*prometheus.CounterVec)
	o.renewVec, ok[5] = cs[5].(*prometheus.HistogramVec)
	for _, ok := range ok {
		if !ok {
			return errors.New("advisorylock: prometheus observer: the registry holds another kind of metric under an advisorylock_ name")
		}
	}
	return nil
}

// seriesKey names one series: its metric (the held gauge goes with the
// hold histogram) and its label values; unused fields are empty. The
// name is set only with WithLockNames, so that without it the cache holds
// one entry per label set, not one per lock.
type seriesKey struct {
	metric                       string
	backend, kind, outcome, name string
}

// keyName is the name field of the series keys of e's lock.
func (o *observer) keyName(e advisorylock.Event) string {
	if o.lockNames {
		return e.Name
	}
	return ""
}

// labels returns the label values of k's series: values, then the lock's
// name with WithLockNames.
func (o *observer) labels(k seriesKey, values ...string) []string {
	if o.lockNames {
		values = append(values, k.name)
	}
	return values
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

// Observe records e; it returns ctx.
func (o *observer) Observe(ctx context.Context, e advisorylock.Event) context.Context {
	switch e.Type {
	case advisorylock.EventAcquireEnd:
		k := seriesKey{metric: MetricAcquireDuration, backend: e.Backend, kind: e.Kind, outcome: string(e.Outcome), name: o.keyName(e)}
		o.seriesFor(k, func() *series {
			return &series{duration: o.acquireVec.WithLabelValues(o.labels(k, k.backend, k.kind, k.outcome)...)}
		}).duration.Observe(e.Duration.Seconds())
		if e.Outcome == advisorylock.OutcomeAcquired {
			o.holdSeries(e).gauge.Inc()
		}
	case advisorylock.EventRelease:
		s := o.holdSeries(e)
		s.duration.Observe(e.Duration.Seconds())
		s.gauge.Dec()
	case advisorylock.EventLoss:
		k := seriesKey{metric: MetricLost, backend: e.Backend, kind: e.Kind, outcome: string(e.Cause), name: o.keyName(e)}
		o.seriesFor(k, func() *series {
			return &series{counter: o.lostVec.WithLabelValues(o.labels(k, k.backend, k.kind, k.outcome)...)}
		}).counter.Inc()
	case advisorylock.EventDiscard:
		k := seriesKey{metric: MetricConnectionsDiscarded, backend: e.Backend, outcome: string(e.Cause), name: o.keyName(e)}
		o.seriesFor(k, func() *series {
			return &series{counter: o.discardedVec.WithLabelValues(o.labels(k, k.backend, k.outcome)...)}
		}).counter.Inc()
	case advisorylock.EventRenew:
		k := seriesKey{metric: MetricLeaseRenewDuration, backend: e.Backend, outcome: renewal.Outcome(e.Err), name: o.keyName(e)}
		o.seriesFor(k, func() *series {
			return &series{duration: o.renewVec.WithLabelValues(o.labels(k, k.backend, k.outcome)...)}
		}).duration.Observe(e.Duration.Seconds())
	}
	return ctx
}

// holdSeries is the hold histogram and held gauge of the kind of e's lock.
func (o *observer) holdSeries(e advisorylock.Event) *series {
	k := seriesKey{metric: MetricHoldDuration, backend: e.Backend, kind: e.Kind, name: o.keyName(e)}
	return o.seriesFor(k, func() *series {
		return &series{
			duration: o.holdVec.WithLabelValues(o.labels(k, k.backend, k.kind)...),
			gauge:    o.heldVec.WithLabelValues(o.labels(k, k.backend, k.kind)...),
		}
	})
}
