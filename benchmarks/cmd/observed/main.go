// Command observed runs a small contended workload on PostgreSQL with the
// Prometheus observer (extra/advisorylockprom) and draws what it recorded:
// acquire latency by outcome, from the histogram's own buckets, as the
// dashboard's first panel would show it. The README's Observability
// section shows its output (observed.svg), real data rather than a
// mock-up.
//
//	cd benchmarks && go run ./cmd/observed [-dsn DSN] [-for 5s] [-o observed.svg]
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"html"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockprom"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func main() {
	dsn := flag.String("dsn", envOr("ADVISORYLOCK_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL DSN")
	run := flag.Duration("for", 5*time.Second, "how long the workload runs")
	out := flag.String("o", "observed.svg", "where to write the chart")
	flag.Parse()

	db, err := sql.Open("pgx", *dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	if err := warm(db, 8); err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	obs, err := advisorylockprom.NewObserver(reg)
	if err != nil {
		log.Fatal(err)
	}
	n, err := workload(db, obs, *run)
	if err != nil {
		log.Fatal(err)
	}
	series, err := acquireBuckets(reg)
	if err != nil {
		log.Fatal(err)
	}
	title := fmt.Sprintf("advisorylock_acquire_duration_seconds by outcome — %d acquires, 6 workers, 2 locks, %s, PostgreSQL (pgx)", n, *run)
	if err := os.WriteFile(*out, []byte(chart(title, series)), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s from %d acquires\n", *out, n)
}

// warm opens n connections at once and returns them to the pool, so that
// the workload's 5 ms budgets time acquires, not dials.
func warm(db *sql.DB, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// workload runs 6 workers for d on two locks: two wait with Lock, two
// bound their wait with LockTimeout(5ms), two only TryLock. Each holds a
// grant for 0.2–3 ms. It returns the number of acquires.
func workload(db *sql.DB, obs advisorylock.Observer, d time.Duration) (int, error) {
	// The run ends by cancellation: acquires it cuts short are "canceled",
	// not "timeout" (a deadline), which the chart keeps for LockTimeout.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := time.AfterFunc(d, cancel)
	defer stop.Stop()
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	var locks [2]*advisorylock.Lock
	for i := range locks {
		l, err := advisorylock.New(db, fmt.Sprintf("observed-%d-%s", i, suffix), advisorylock.WithObserver(obs))
		if err != nil {
			return 0, err
		}
		locks[i] = l
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		total int
		fail  error
	)
	modes := []string{"lock", "lock", "timeout", "timeout", "try", "try"}
	for w, mode := range modes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := worker(ctx, locks[w%2], mode)
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil && fail == nil {
				fail = err
			}
		}()
	}
	wg.Wait()
	return total, fail
}

// worker acquires l in mode until ctx ends; an error other than the
// expected misses (held, timed out, ctx over) stops it.
func worker(ctx context.Context, l *advisorylock.Lock, mode string) (int, error) {
	n := 0
	for ctx.Err() == nil {
		var g *advisorylock.Guard
		var err error
		switch mode {
		case "lock":
			g, err = l.Lock(ctx)
		case "timeout":
			g, err = l.LockTimeout(ctx, 5*time.Millisecond)
		default:
			g, err = l.TryLock(ctx)
		}
		n++
		switch {
		case err == nil:
			time.Sleep(time.Duration(200+rand.IntN(2800)) * time.Microsecond) // the critical section
			if err := g.Release(context.Background()); err != nil {
				return n, err
			}
		case errors.Is(err, advisorylock.ErrNotAcquired):
			time.Sleep(time.Millisecond) // a cron that tries again later
		case errors.Is(err, advisorylock.ErrTimeout), ctx.Err() != nil && errors.Is(err, context.Canceled):
		default:
			return n, err
		}
	}
	return n, nil
}

// buckets is one outcome's histogram: counts per bucket (not cumulative),
// the last one for everything above the highest bound.
type buckets struct {
	outcome string
	bounds  []float64
	counts  []uint64
	total   uint64
}

// acquireBuckets reads the acquire histogram of kind lock from reg.
func acquireBuckets(reg *prometheus.Registry) ([]buckets, error) {
	families, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	var out []buckets
	for _, f := range families {
		if f.GetName() != advisorylockprom.MetricAcquireDuration {
			continue
		}
		for _, m := range f.GetMetric() {
			out = append(out, bucketsOf(label(m, "outcome"), m.GetHistogram()))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no acquire was observed")
	}
	order := map[string]int{"acquired": 0, "not_acquired": 1, "timeout": 2, "canceled": 3, "error": 4}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if order[out[j].outcome] < order[out[i].outcome] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func bucketsOf(outcome string, h *dto.Histogram) buckets {
	b := buckets{outcome: outcome, total: h.GetSampleCount()}
	var prev uint64
	for _, bk := range h.GetBucket() {
		b.bounds = append(b.bounds, bk.GetUpperBound())
		b.counts = append(b.counts, bk.GetCumulativeCount()-prev)
		prev = bk.GetCumulativeCount()
	}
	b.counts = append(b.counts, h.GetSampleCount()-prev)
	return b
}

// chart draws each outcome's share of acquires per bucket as grouped bars.
func chart(title string, series []buckets) string {
	bounds := series[0].bounds
	nb := 0 // buckets shown: up to the last one with a count, and one more
	for _, sr := range series {
		for b, c := range sr.counts {
			if c > 0 {
				nb = max(nb, b+2)
			}
		}
	}
	nb = min(nb, len(bounds)+1)
	const width, left, right, top, bottom, height = 960, 60, 20, 70, 70, 380
	plotW, plotH := float64(width-left-right), float64(height-top-bottom)
	groupW := plotW / float64(nb)
	barW := groupW * 0.8 / float64(len(series))
	var peak float64
	for _, s := range series {
		for _, c := range s.counts {
			peak = max(peak, float64(c)/float64(max(s.total, 1)))
		}
	}
	peak = math.Ceil(peak*10) / 10
	colors := map[string]string{"acquired": "#2b6cb0", "not_acquired": "#dd6b20", "timeout": "#c53030", "canceled": "#718096", "error": "#000000"}

	var s strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&s, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%d" y="22" font-size="13" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	for i, sr := range series {
		x := left + i*190
		w(`<rect x="%d" y="36" width="12" height="12" fill="%s"/><text x="%d" y="46">%s (%d)</text>`+"\n", x, colors[sr.outcome], x+16, sr.outcome, sr.total)
	}
	for t := 0.0; t <= peak+1e-9; t += peak / 5 {
		y := float64(top) + plotH*(1-t/peak)
		w(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e2e8f0"/><text x="%d" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n", left, width-right, y, y, left-6, y+4, t*100)
	}
	for i, sr := range series {
		for b, c := range sr.counts[:nb] {
			frac := float64(c) / float64(max(sr.total, 1))
			h := plotH * frac / peak
			x := float64(left) + groupW*float64(b) + groupW*0.1 + barW*float64(i)
			w(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", x, float64(top)+plotH-h, barW, h, colors[sr.outcome])
		}
	}
	for b := range nb {
		x := float64(left) + groupW*(float64(b)+0.5)
		name := "> " + seconds(bounds[len(bounds)-1])
		if b < len(bounds) {
			name = "≤ " + seconds(bounds[b])
		}
		w(`<text x="%.1f" y="%d" text-anchor="middle" font-size="10">%s</text>`+"\n", x, height-bottom+16, html.EscapeString(name))
	}
	w(`<text x="%d" y="%d" text-anchor="middle">acquire duration (bucket upper bounds, as the adapters export them); bars: share of that outcome's acquires</text>`+"\n", left+int(plotW/2), height-bottom+44)
	w("</svg>\n")
	return s.String()
}

// seconds formats a bucket bound.
func seconds(v float64) string {
	d := time.Duration(v * float64(time.Second))
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)), ".0") + "ms"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", d.Seconds()), ".0") + "s"
}
