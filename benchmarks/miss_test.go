package benchmarks

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

// missHeldFew and missHeldMany are the numbers of advisory locks the
// server holds while BenchmarkMissCost measures misses: a miss must cost
// the same whatever the server holds (SPEC 11.3: within 1.5x).
const missHeldFew, missHeldMany = 100, 10_000

// BenchmarkMissCost times TryLock misses on a name another handle holds,
// while the server holds missHeldFew advisory locks and while it holds
// missHeldMany, alternating the two in rounds on the same handles, and
// reports the medians (few-p50-ns, many-p50-ns) and their ratio (x-few).
// A miss that reads pg_locks (built from every lock on the server) grows
// with the second; the gate is x-few <= 1.5.
func BenchmarkMissCost(b *testing.B) {
	for _, drv := range pgDrivers {
		b.Run(drv, func(b *testing.B) {
			ctx := context.Background()
			dsn := postgresDSN()
			holderDB := openPG(b, drv, dsn, 3)
			name := lockName(b, "held")
			held, err := newLock(b, holderDB, name).TryLock(ctx)
			must(b, err, "the holder's TryLock")
			b.Cleanup(func() { _ = held.Release(context.Background()) })
			// The other locks are held on sessions of their own: one for
			// the few, one for the rest of the many (taken and let go
			// between rounds).
			few, rest := pin(b, holderDB), pin(b, holderDB)
			if _, err := few.ExecContext(ctx, "SELECT count(pg_advisory_lock(-k)) FROM generate_series(1, $1::int) k", missHeldFew-1); err != nil {
				b.Fatalf("holding %d locks: %v", missHeldFew, err)
			}
			db := openPG(b, drv, dsn, 1)
			l := newLock(b, db, name)
			miss := func() time.Duration {
				t := time.Now()
				if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
					b.Fatalf("TryLock beside a holder: %v, want ErrNotAcquired", err)
				}
				return time.Since(t)
			}
			miss() // the session's first miss configures it
			const rounds = 4
			per := max(b.N/rounds, 1)
			var fewLat, manyLat []time.Duration
			b.ResetTimer()
			for range rounds {
				for range per {
					fewLat = append(fewLat, miss())
				}
				b.StopTimer()
				if _, err := rest.ExecContext(ctx, "SELECT count(pg_advisory_lock(-k)) FROM generate_series($1::int, $2::int) k", missHeldFew, missHeldMany-1); err != nil {
					b.Fatalf("holding %d locks: %v", missHeldMany, err)
				}
				b.StartTimer()
				for range per {
					manyLat = append(manyLat, miss())
				}
				b.StopTimer()
				if _, err := rest.ExecContext(ctx, "SELECT pg_advisory_unlock_all()"); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.StopTimer()
			fm, mm := median(fewLat), median(manyLat)
			b.ReportMetric(float64(fm), "few-p50-ns")
			b.ReportMetric(float64(mm), "many-p50-ns")
			b.ReportMetric(float64(mm)/float64(fm), "x-few")
		})
	}
}
