package advisorylockprom_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockprom"
	"github.com/advisorylock/advisorylock/internal/buckets"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// series gathers reg and maps "metric{k=v,...}" to each series' sample
// count (histograms) or value (gauges, counters).
func series(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := f.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				out[key] = float64(m.GetHistogram().GetSampleCount())
				if !bucketsAre(m.GetHistogram(), buckets.Durations()) {
					t.Errorf("%s: buckets are not buckets.Durations()", key)
				}
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func bucketsAre(h *dto.Histogram, bounds []float64) bool {
	var got []float64
	for _, b := range h.GetBucket() {
		got = append(got, b.GetUpperBound())
	}
	return slices.Equal(got, bounds)
}

func TestObserverRecordsEveryMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := advisorylockprom.NewObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	db := testdb.OpenPostgres(t, "pgx")
	const renewed = "advisorylock_lease_renew_duration_seconds{backend=postgres,outcome=renewed}"
	observetest.PostgresScenario(t, db, obs, observetest.Hooks{
		WhileHeld: func(t *testing.T) {
			if n := series(t, reg)["advisorylock_held{backend=postgres,kind=lock}"]; n != 1 {
				t.Errorf("advisorylock_held while one lock is held: %v, want 1", n)
			}
		},
		Renewed: func() bool { return series(t, reg)[renewed] > 0 },
	})

	got := series(t, reg)
	want := map[string]float64{
		"advisorylock_acquire_duration_seconds{backend=postgres,kind=lock,outcome=acquired}":     2,
		"advisorylock_acquire_duration_seconds{backend=postgres,kind=lock,outcome=not_acquired}": 1,
		"advisorylock_acquire_duration_seconds{backend=postgres,kind=lock,outcome=timeout}":      1,
		"advisorylock_acquire_duration_seconds{backend=postgres,kind=lock,outcome=canceled}":     1,
		"advisorylock_acquire_duration_seconds{backend=postgres,kind=lease,outcome=acquired}":    1,
		"advisorylock_hold_duration_seconds{backend=postgres,kind=lock}":                         2,
		"advisorylock_hold_duration_seconds{backend=postgres,kind=lease}":                        1,
		"advisorylock_held{backend=postgres,kind=lock}":                                          0,
		"advisorylock_held{backend=postgres,kind=lease}":                                         0,
		"advisorylock_lost_total{backend=postgres,cause=session_ended,kind=lock}":                1,
		"advisorylock_connections_discarded_total{backend=postgres,reason=canceled}":             1,
		"advisorylock_connections_discarded_total{backend=postgres,reason=session_ended}":        1,
	}
	if got[renewed] < 1 {
		t.Errorf("%s = %v, want at least 1", renewed, got[renewed])
	}
	delete(got, renewed)
	if !maps.Equal(got, want) {
		t.Errorf("series:\n%s\nwant:\n%s", render(got), render(want))
	}
}

func render(m map[string]float64) string {
	var lines []string
	for k, v := range m {
		lines = append(lines, k+" "+strconv.FormatFloat(v, 'g', -1, 64))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestObserversShareARegistry checks that a second observer on one
// registry, with the same options, records into the same series instead
// of failing.
func TestObserversShareARegistry(t *testing.T) {
	for _, named := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		for range 2 {
			o, err := advisorylockprom.NewObserver(reg, advisorylockprom.WithLockNames(named))
			if err != nil {
				t.Fatalf("WithLockNames(%v): %v", named, err)
			}
			o.Observe(context.Background(), advisorylock.Event{Type: advisorylock.EventDiscard, Backend: "sqlite", Kind: "lock", Name: "x", Cause: advisorylock.CauseError})
		}
		key := "advisorylock_connections_discarded_total{backend=sqlite,reason=error}"
		if named {
			key = "advisorylock_connections_discarded_total{backend=sqlite,name=x,reason=error}"
		}
		if got := series(t, reg); got[key] != 2 || len(got) != 1 {
			t.Errorf("WithLockNames(%v): discards through two observers on one registry: %v, want %s 2", named, got, key)
		}
	}
}

// TestLockNamesAreALabelOnlyWhenAsked feeds one event of each kind to an
// observer with and without WithLockNames(true) and checks every series'
// exact labels.
func TestLockNamesAreALabelOnlyWhenAsked(t *testing.T) {
	for named, want := range map[bool]map[string]float64{
		false: {
			"advisorylock_acquire_duration_seconds{backend=postgres,kind=lock,outcome=acquired}": 1,
			"advisorylock_hold_duration_seconds{backend=postgres,kind=lock}":                     1,
			"advisorylock_held{backend=postgres,kind=lock}":                                      0,
			"advisorylock_lost_total{backend=postgres,cause=not_held,kind=lock}":                 1,
			"advisorylock_connections_discarded_total{backend=postgres,reason=not_held}":         1,
			"advisorylock_lease_renew_duration_seconds{backend=postgres,outcome=renewed}":        1,
			"advisorylock_lease_renew_duration_seconds{backend=postgres,outcome=lost}":           1,
			"advisorylock_lease_renew_duration_seconds{backend=postgres,outcome=error}":          1,
		},
		true: {
			"advisorylock_acquire_duration_seconds{backend=postgres,kind=lock,name=nightly,outcome=acquired}": 1,
			"advisorylock_hold_duration_seconds{backend=postgres,kind=lock,name=nightly}":                     1,
			"advisorylock_held{backend=postgres,kind=lock,name=nightly}":                                      0,
			"advisorylock_lost_total{backend=postgres,cause=not_held,kind=lock,name=nightly}":                 1,
			"advisorylock_connections_discarded_total{backend=postgres,name=nightly,reason=not_held}":         1,
			"advisorylock_lease_renew_duration_seconds{backend=postgres,name=nightly,outcome=renewed}":        1,
			"advisorylock_lease_renew_duration_seconds{backend=postgres,name=nightly,outcome=lost}":           1,
			"advisorylock_lease_renew_duration_seconds{backend=postgres,name=nightly,outcome=error}":          1,
		},
	} {
		reg := prometheus.NewRegistry()
		o, err := advisorylockprom.NewObserver(reg, advisorylockprom.WithLockNames(named))
		if err != nil {
			t.Fatal(err)
		}
		feedOneOfEach(o, advisorylock.Event{Backend: "postgres", Kind: "lock", Name: "nightly"})
		if got := series(t, reg); !maps.Equal(got, want) {
			t.Errorf("WithLockNames(%v): series:\n%s\nwant:\n%s", named, render(got), render(want))
		}
	}
}

// TestObserversDisagreeingOnLockNamesFail checks that a second observer on
// one registry with the other WithLockNames is an error that names the
// option, not a panic, and leaves the first observer's series as they were.
func TestObserversDisagreeingOnLockNamesFail(t *testing.T) {
	for _, firstNamed := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		first, err := advisorylockprom.NewObserver(reg, advisorylockprom.WithLockNames(firstNamed))
		if err != nil {
			t.Fatal(err)
		}
		_, err = advisorylockprom.NewObserver(reg, advisorylockprom.WithLockNames(!firstNamed))
		if err == nil || !strings.Contains(err.Error(), "WithLockNames") {
			t.Fatalf("WithLockNames(%v) after WithLockNames(%v) on one registry: error %v, want one naming WithLockNames", !firstNamed, firstNamed, err)
		}
		first.Observe(context.Background(), advisorylock.Event{Type: advisorylock.EventDiscard, Backend: "sqlite", Name: "x", Cause: advisorylock.CauseError})
		key := "advisorylock_connections_discarded_total{backend=sqlite,reason=error}"
		if firstNamed {
			key = "advisorylock_connections_discarded_total{backend=sqlite,name=x,reason=error}"
		}
		if got := series(t, reg); got[key] != 1 || len(got) != 1 {
			t.Errorf("after the refused observer, the first one's series: %v, want only %s 1", got, key)
		}
	}
}

// TestObserverRefusesAClashingMetric checks that a registry holding
// another metric under one of the names is an error, not a panic.
func TestObserverRefusesAClashingMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: advisorylockprom.MetricHeld, Help: "not ours"}))
	if _, err := advisorylockprom.NewObserver(reg); err == nil {
		t.Fatal("NewObserver on a registry with a clashing advisorylock_held: no error")
	}
}

// feedOneOfEach gives o one event of each type for the lock that lock
// describes (its Backend, Kind and Name): an acquire that is granted, a
// loss, the release, the discard of the lost lock's connection, and
// renewals that renewed, found the lease lost, and failed.
func feedOneOfEach(o advisorylock.Observer, lock advisorylock.Event) {
	with := func(e advisorylock.Event) advisorylock.Event {
		e.Backend, e.Kind, e.Name = lock.Backend, lock.Kind, lock.Name
		return e
	}
	ctx := o.Observe(context.Background(), with(advisorylock.Event{Type: advisorylock.EventAcquireStart}))
	ctx = o.Observe(ctx, with(advisorylock.Event{Type: advisorylock.EventAcquireEnd, Outcome: advisorylock.OutcomeAcquired}))
	o.Observe(ctx, with(advisorylock.Event{Type: advisorylock.EventLoss, Cause: advisorylock.CauseNotHeld}))
	o.Observe(ctx, with(advisorylock.Event{Type: advisorylock.EventRelease}))
	o.Observe(context.Background(), with(advisorylock.Event{Type: advisorylock.EventDiscard, Cause: advisorylock.CauseNotHeld}))
	o.Observe(context.Background(), with(advisorylock.Event{Type: advisorylock.EventRenew}))
	o.Observe(context.Background(), with(advisorylock.Event{Type: advisorylock.EventRenew, Err: fmt.Errorf("%w: taken over", advisorylock.ErrLockLost)}))
	o.Observe(context.Background(), with(advisorylock.Event{Type: advisorylock.EventRenew, Err: errors.New("connection refused")}))
}

// exported feeds one event of each kind to a fresh observer and returns
// the labels of every metric it exports, by name.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	o, err := advisorylockprom.NewObserver(reg)
	if err != nil {
		t.Fatal(err)
	}
	feedOneOfEach(o, advisorylock.Event{Backend: "postgres", Kind: "lock", Name: "x"})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range families {
		for _, l := range f.GetMetric()[0].GetLabel() {
			out[f.GetName()] = append(out[f.GetName()], l.GetName())
		}
	}
	if len(out) != 6 {
		t.Fatalf("one event of each kind exported %d metrics, want 6: %v", len(out), out)
	}
	return out
}

var (
	metricRef = regexp.MustCompile(`\badvisorylock_[a-z_]+`)
	byClause  = regexp.MustCompile(`\bby \(([^)]*)\)`)
	matcher   = regexp.MustCompile(`[{,]\s*([a-z_]+)\s*(?:=~|!~|!=|=)\s*"`)
)

// TestDashboardQueriesNameExportedMetrics checks every query of
// dashboard.json: it names at least one metric, every metric it names
// (histograms by their _bucket, _count or _sum series) is exported by the
// observer, and it groups only by labels those metrics have. Every
// exported metric is on the dashboard.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	metrics := exported(t)
	raw, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	queries := collectQueries(doc)
	if len(queries) < 8 {
		t.Fatalf("dashboard.json has %d queries, want one or more per panel", len(queries))
	}
	used := map[string]bool{}
	for _, q := range queries {
		checkQuery(t, q, metrics, used)
	}
	for name := range metrics {
		if !used[name] {
			t.Errorf("metric %s is on no panel of dashboard.json", name)
		}
	}
}

// TestAlertingRulesNameExportedMetrics checks alerts.yml: it parses as a
// Prometheus rules file (groups of rules, each an alert with an expr), every
// expression names metrics the observer exports and groups and matches by
// labels they have, and the alerts cover losses, lease renewals, discarded
// connections and acquires. Where promtool is installed (Debian's
// prometheus package), `promtool check rules` must accept the file too.
func TestAlertingRulesNameExportedMetrics(t *testing.T) {
	metrics := exported(t)
	raw, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Name  string
			Rules []struct {
				Alert, Expr, For string
				Labels           map[string]string
				Annotations      map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	used := map[string]bool{}
	alerts := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			alerts++
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("group %s: rule %+v needs alert, expr, a severity label and a summary", g.Name, r)
			}
			checkQuery(t, r.Expr, metrics, used)
		}
	}
	for _, name := range []string{
		advisorylockprom.MetricLost, advisorylockprom.MetricLeaseRenewDuration,
		advisorylockprom.MetricConnectionsDiscarded, advisorylockprom.MetricAcquireDuration,
	} {
		if !used[name] {
			t.Errorf("no alert in alerts.yml reads %s", name)
		}
	}
	if alerts == 0 {
		t.Fatal("alerts.yml has no rules")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Logf("promtool is not installed: alerts.yml was checked by this test alone")
		return
	}
	if out, err := exec.Command(promtool, "check", "rules", "alerts.yml").CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules alerts.yml: %v\n%s", err, out)
	}
}

// checkQuery checks one PromQL query q: it names at least one metric,
// every metric it names (histograms by their _bucket, _count or _sum
// series) is in metrics, and every label it groups by or matches on is
// one of theirs. It marks the metrics it names in used.
func checkQuery(t *testing.T, q string, metrics map[string][]string, used map[string]bool) {
	t.Helper()
	refs := metricRef.FindAllString(q, -1)
	if len(refs) == 0 {
		t.Errorf("query names no advisorylock metric: %s", q)
	}
	labels := map[string]bool{"le": true}
	for _, ref := range refs {
		name := exportedName(ref, metrics)
		if name == "" {
			t.Errorf("query names %s, which the observer does not export: %s", ref, q)
			continue
		}
		used[name] = true
		for _, l := range metrics[name] {
			labels[l] = true
		}
	}
	for _, m := range byClause.FindAllStringSubmatch(q, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); !labels[l] {
				t.Errorf("query groups by %q, a label none of its metrics has: %s", l, q)
			}
		}
	}
	for _, m := range matcher.FindAllStringSubmatch(q, -1) {
		if !labels[m[1]] {
			t.Errorf("query matches on %q, a label none of its metrics has: %s", m[1], q)
		}
	}
}

// exportedName maps a series name in a query to the exported metric.
func exportedName(ref string, metrics map[string][]string) string {
	if _, ok := metrics[ref]; ok {
		return ref
	}
	for _, suffix := range []string{"_bucket", "_count", "_sum"} {
		if base, ok := strings.CutSuffix(ref, suffix); ok {
			if _, ok := metrics[base]; ok {
				return base
			}
		}
	}
	return ""
}

// collectQueries returns every "expr" of the dashboard's panels and every
// template variable's "definition".
func collectQueries(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
				out = append(out, s)
				continue
			}
			out = append(out, collectQueries(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, collectQueries(x)...)
		}
	}
	return out
}
