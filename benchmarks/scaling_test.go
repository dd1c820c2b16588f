package benchmarks

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

// scalingCells are the (goroutines, pool size) pairs measured: goroutine
// counts at a pool of 8, and pool sizes at 64 goroutines. The server is
// shared, so the largest pool stays well below max_connections.
var scalingCells = []struct{ g, pool int }{
	{1, 8}, {8, 8}, {64, 8},
	{64, 2}, {64, 32},
}

// scalingModes: "select1" is the unit through the pool (the ceiling),
// "distinct" is TryLock+Release with each goroutine on its own name,
// "one" is Lock+Release with every goroutine on the same name (the
// critical sections run one at a time; throughput is the handoff rate).
var scalingModes = []string{"select1", "distinct", "one"}

// BenchmarkScaling runs b.N operations spread over g goroutines that share
// one *sql.DB with a pool of the given size, and reports throughput as
// ops/s (ns/op is its inverse).
func BenchmarkScaling(b *testing.B) {
	for _, drv := range pgDrivers {
		for _, mode := range scalingModes {
			for _, cell := range scalingCells {
				b.Run(fmt.Sprintf("%s/%s/g=%d/pool=%d", drv, mode, cell.g, cell.pool), func(b *testing.B) {
					db := openPG(b, drv, postgresDSN(), cell.pool)
					warm(b, db, cell.pool)
					steps := make([]func(ctx context.Context) error, cell.g)
					one := newLock(b, db, lockName(b, "one"))
					for i := range steps {
						steps[i] = scalingStep(b, mode, db, one, i)
					}
					runParallel(b, steps)
				})
			}
		}
	}
}

func scalingStep(b *testing.B, mode string, db *sql.DB, one *advisorylock.Lock, i int) func(ctx context.Context) error {
	switch mode {
	case "select1":
		return func(ctx context.Context) error {
			var n int
			return db.QueryRowContext(ctx, "SELECT 1").Scan(&n)
		}
	case "distinct":
		l := newLock(b, db, lockName(b, "g"+strconv.Itoa(i)))
		return func(ctx context.Context) error {
			g, err := l.TryLock(ctx)
			if err != nil {
				return err
			}
			return g.Release(ctx)
		}
	default:
		return func(ctx context.Context) error {
			g, err := one.Lock(ctx)
			if err != nil {
				return err
			}
			return g.Release(ctx)
		}
	}
}

// runParallel runs b.N steps, each goroutine i running steps[i] until the
// shared count is spent.
func runParallel(b *testing.B, steps []func(ctx context.Context) error) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for _, step := range steps {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				if err := step(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
}
