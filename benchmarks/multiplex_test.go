package benchmarks

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
)

// muxEngines are the servers the multiplexing benchmarks run on: both
// PostgreSQL drivers and MySQL/MariaDB.
var muxEngines = []string{"pq", "pgx", "mysql"}

// openEngine opens a handle on engine with a pool of maxOpen connections
// (0: unlimited), kept idle.
func openEngine(b *testing.B, engine string, maxOpen int) *sql.DB {
	var db *sql.DB
	if engine == "mysql" {
		db = openMySQL(b, maxOpen)
	} else {
		db = openPG(b, engine, postgresDSN(), maxOpen)
	}
	if maxOpen == 0 {
		db.SetMaxIdleConns(64)
	}
	return db
}

// muxAnchor holds one lock on db's shared sessions for the benchmark, so
// that the session the benchmarked lock shares stays open between its
// iterations (a shared session that holds nothing goes back to the pool).
// Each call anchors a name of its own (one benchmark may open several
// handles).
func muxAnchor(b *testing.B, db *sql.DB, opts ...advisorylock.Option) {
	l := newLock(b, db, lockName(b, "anchor-"+strconv.FormatInt(muxAnchors.Add(1), 10)), opts...)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	g, err := l.TryLock(ctx)
	must(b, err, "anchor TryLock")
	b.Cleanup(func() { _ = g.Release(context.Background()) })
}

// muxAnchors numbers muxAnchor's names.
var muxAnchors atomic.Int64

// tryRelease is one TryLock+Release of l.
func tryRelease(l *advisorylock.Lock) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		g, err := l.TryLock(ctx)
		if err != nil {
			return err
		}
		return g.Release(ctx)
	}
}

// BenchmarkMuxPaired alternates, iteration by iteration, TryLock+Release
// of a multiplexed lock (WithMultiplexing(4), one other lock held on the
// same shared session) with the bare statements on a pinned connection:
// PostgreSQL's pg_try_advisory_lock and pg_advisory_unlock with the key as
// a literal (raw_literal); MySQL's GET_LOCK(name, 0) and RELEASE_LOCK
// (raw_literal), and the same with the read of shared holders the
// library's grab makes (raw_shared_read, MySQL's gate base). It reports
// both medians and their ratio (x-base).
func BenchmarkMuxPaired(b *testing.B) {
	mux := advisorylock.WithMultiplexing(4)
	for _, drv := range pgDrivers {
		b.Run("trylock_release_vs_raw_literal/"+drv, func(b *testing.B) {
			dsn := postgresDSN()
			db := openPG(b, drv, dsn, 4)
			warm(b, db, 3)
			muxAnchor(b, db, mux)
			base := setupRawLiteral(b, pgEnv{drv: drv, dsn: dsn, db: db})
			runPaired(b, base, tryRelease(newLock(b, db, lockName(b, "lock"), mux)))
		})
	}
	for _, base := range []string{"raw_literal", "raw_shared_read"} {
		b.Run("trylock_release_vs_"+base+"/mysql", func(b *testing.B) {
			db := mysqlReady(b)
			warm(b, db, 3)
			muxAnchor(b, db, mux)
			runPaired(b, mysqlOps[base](b, db), tryRelease(newLock(b, db, lockName(b, "lock"), mux)))
		})
	}
}

// envHeldNames sets how many names BenchmarkMuxHeld holds on PostgreSQL.
// Advisory locks live in the server's shared lock table, sized by
// max_locks_per_transaction × max_connections and shared by every
// session, so the default stays far below what a shared server has
// room for; MySQL has no such table and always holds 10,000.
const envHeldNames = "ADVISORYLOCK_BENCH_HELD_NAMES"

// heldNames is the count BenchmarkMuxHeld holds on engine.
func heldNames(b *testing.B, engine string) int {
	if engine == "mysql" {
		return 10000
	}
	if s := os.Getenv(envHeldNames); s != "" {
		n, err := strconv.Atoi(s)
		must(b, err, envHeldNames)
		return n
	}
	return 1000
}

// BenchmarkMuxHeld measures the cost of holding many names. Client
// memory, per name, from the heap after GC: making n Locks (lock-B/name),
// what a Lock keeps after its first acquire and release (used-lock-B/name),
// and holding them all on WithMultiplexing(4)'s shared sessions against
// the same Locks released (held-B/name). Keep-alive: a pinned connection takes the same n names
// with bare statements, and each iteration times one HeldKeys over them
// (the statement a shared session's keep-alive runs once per interval;
// on MySQL, one per 1,000 names) as keepalive-ms.
func BenchmarkMuxHeld(b *testing.B) {
	for _, engine := range muxEngines {
		b.Run(engine, func(b *testing.B) {
			n := heldNames(b, engine)
			db := openEngine(b, engine, 8)
			if engine == "mysql" {
				mysqlReady(b)
			}
			names := make([]string, n)
			keys := make([]int64, n)
			for i := range names {
				names[i] = lockName(b, "h"+strconv.Itoa(i))
				keys[i] = advisorylock.Key(names[i])
			}
			perName := func(before, after uint64) float64 { return (float64(after) - float64(before)) / float64(n) }
			start := heapAfterGC()
			locks := make([]*advisorylock.Lock, n)
			for i, name := range names {
				locks[i] = newLock(b, db, name, advisorylock.WithMultiplexing(4))
			}
			made := heapAfterGC()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			guards := make([]*advisorylock.Guard, n)
			for i, l := range locks {
				g, err := l.TryLock(ctx)
				must(b, err, "TryLock "+names[i])
				guards[i] = g
			}
			held := heapAfterGC()
			for _, g := range guards {
				must(b, g.Release(ctx), "Release")
			}
			released := heapAfterGC()
			runtime.KeepAlive(locks)
			lockB, heldB, usedB := perName(start, made), perName(released, held), perName(made, released)

			conn := pin(b, db)
			var locker backend.MultiplexLocker
			if engine == "mysql" {
				locker = advisorylock.MySQL().(backend.MultiplexLocker)
				takeMySQL(b, conn, keys)
			} else {
				locker = advisorylock.Postgres().(backend.MultiplexLocker)
				takePG(b, conn, keys)
			}
			lat := make([]time.Duration, b.N)
			b.ResetTimer()
			for i := range b.N {
				t := time.Now()
				h, err := locker.HeldKeys(ctx, conn, keys)
				lat[i] = time.Since(t)
				must(b, err, "HeldKeys")
				if slices.Contains(h, false) {
					b.Fatal("HeldKeys: the session lost a name")
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(median(lat))/float64(time.Millisecond), "keepalive-ms")
			b.ReportMetric(float64(n), "names")
			b.ReportMetric(lockB, "lock-B/name")
			b.ReportMetric(heldB, "held-B/name")
			b.ReportMetric(usedB, "used-lock-B/name")
		})
	}
}

// heapAfterGC is the live heap after a collection.
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// takePG takes keys on conn's session in statements of 1,000, and lets
// them go at cleanup (the connection is closed then too).
func takePG(b *testing.B, conn *sql.Conn, keys []int64) {
	ctx := context.Background()
	for chunk := range slices.Chunk(keys, 1000) {
		list := make([]string, len(chunk))
		for i, k := range chunk {
			list[i] = strconv.FormatInt(k, 10)
		}
		var got int
		err := conn.QueryRowContext(ctx, "SELECT count(*) FILTER (WHERE pg_try_advisory_lock(k)) FROM unnest(ARRAY["+strings.Join(list, ",")+"]::int8[]) AS k").Scan(&got)
		must(b, err, "take the names")
		if got != len(chunk) {
			b.Fatalf("took %d of %d names", got, len(chunk))
		}
	}
	b.Cleanup(func() { _, _ = conn.ExecContext(ctx, "SELECT pg_advisory_unlock_all()") })
}

// takeMySQL takes keys on conn's session, as advisorylock names them, in
// statements of 100 (a longer expression overruns the server's thread
// stack), and lets them go at cleanup.
func takeMySQL(b *testing.B, conn *sql.Conn, keys []int64) {
	ctx := context.Background()
	for chunk := range slices.Chunk(keys, 100) {
		terms := make([]string, len(chunk))
		for i, k := range chunk {
			terms[i] = fmt.Sprintf("GET_LOCK('advisorylock:v1:%016x', 0)", uint64(k))
		}
		var got int
		must(b, conn.QueryRowContext(ctx, "SELECT "+strings.Join(terms, "+")).Scan(&got), "take the names")
		if got != len(chunk) {
			b.Fatalf("took %d of %d names", got, len(chunk))
		}
	}
	b.Cleanup(func() { _, _ = conn.ExecContext(ctx, "SELECT RELEASE_ALL_LOCKS()") })
}

// muxModes are the ways BenchmarkMuxThroughput's 32 goroutines lock:
// multiplexed on 4 or 8 shared sessions (a pool of 16), a connection per
// held lock from an unlimited pool, and a connection per held lock from a
// pool of 8.
var muxModes = []struct {
	name string
	pool int // 0: unlimited
	opts []advisorylock.Option
}{
	{"mux4", 16, []advisorylock.Option{advisorylock.WithMultiplexing(4)}},
	{"mux8", 16, []advisorylock.Option{advisorylock.WithMultiplexing(8)}},
	{"conn_per_lock", 0, []advisorylock.Option{advisorylock.WithMultiplexing(0)}},
	{"conn_per_lock_pool8", 8, []advisorylock.Option{advisorylock.WithMultiplexing(0)}},
}

// BenchmarkMuxThroughput runs b.N operations spread over 32 goroutines
// on 256 names: goroutine g takes, in turn, names g, g+32, … (8 of its
// own, so no two goroutines ever want the same name), each operation a
// Lock and a Release with nothing between them. It reports ops/s, the
// median and 99th percentile operation (p50-us, p99-us), and the failed
// operations (errors, of them pool-unavailable: ErrPoolUnavailable).
func BenchmarkMuxThroughput(b *testing.B) {
	const goroutines, nameCount = 32, 256
	for _, engine := range muxEngines {
		for _, mode := range muxModes {
			b.Run(engine+"/"+mode.name, func(b *testing.B) {
				db := openEngine(b, engine, mode.pool)
				if engine == "mysql" {
					mysqlReady(b)
				}
				locks := make([]*advisorylock.Lock, nameCount)
				for i := range locks {
					locks[i] = newLock(b, db, lockName(b, "t"+strconv.Itoa(i)), mode.opts...)
				}
				var next, failed, noPool atomic.Int64
				lats := make([][]time.Duration, goroutines)
				ctx := context.Background()
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for g := range goroutines {
					wg.Go(func() {
						for i := g; next.Add(1) <= int64(b.N); i = (i + goroutines) % nameCount {
							t := time.Now()
							guard, err := locks[i].Lock(ctx)
							if err == nil {
								err = guard.Release(ctx)
							}
							lats[g] = append(lats[g], time.Since(t))
							if err != nil {
								failed.Add(1)
								if errors.Is(err, advisorylock.ErrPoolUnavailable) {
									noPool.Add(1)
								}
							}
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				all := slices.Concat(lats...)
				slices.Sort(all)
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
				b.ReportMetric(float64(all[len(all)/2])/float64(time.Microsecond), "p50-us")
				b.ReportMetric(float64(all[len(all)*99/100])/float64(time.Microsecond), "p99-us")
				b.ReportMetric(float64(failed.Load()), "errors")
				b.ReportMetric(float64(noPool.Load()), "pool-unavailable")
			})
		}
	}
}

// BenchmarkMuxSet alternates a NewSet TryLock+Release over 4 names with
// 4 single TryLocks and their 4 Releases, on a pinned lock (a connection
// of its own) and multiplexed, and reports both medians and their ratio
// (x-base). On PostgreSQL it also runs through the counting proxy and
// reports the round trips of each (set-rt/op, singles-rt/op).
func BenchmarkMuxSet(b *testing.B) {
	for _, engine := range muxEngines {
		for _, mode := range []string{"pinned", "mux4"} {
			b.Run(engine+"/"+mode, func(b *testing.B) {
				opts := []advisorylock.Option{advisorylock.WithMultiplexing(0)} // pinned
				var db *sql.DB
				var proxy *countingProxy
				if engine == "mysql" {
					mysqlReady(b)
					db = openMySQL(b, 8)
				} else {
					proxy = startProxy(b, targetAddr(postgresDSN()))
					db = openPG(b, engine, withHostPort(postgresDSN(), proxy.addr()), 8)
					warm(b, db, 4)
				}
				if mode == "mux4" {
					opts = []advisorylock.Option{advisorylock.WithMultiplexing(4)}
					muxAnchor(b, db, opts...)
				}
				names := make([]string, 4)
				singles := make([]*advisorylock.Lock, 4)
				for i := range names {
					names[i] = lockName(b, "s"+strconv.Itoa(i))
					singles[i] = newLock(b, db, lockName(b, "one"+strconv.Itoa(i)), opts...)
				}
				set, err := advisorylock.NewSet(db, names, opts...)
				must(b, err, "NewSet")
				setOp := tryRelease(set)
				singlesOp := func(ctx context.Context) error {
					gs := make([]*advisorylock.Guard, 0, len(singles))
					for _, l := range singles {
						g, err := l.TryLock(ctx)
						if err != nil {
							return err
						}
						gs = append(gs, g)
					}
					for _, g := range gs {
						if err := g.Release(ctx); err != nil {
							return err
						}
					}
					return nil
				}
				var setRT, singlesRT atomic.Int64
				counted := func(op func(context.Context) error, into *atomic.Int64) func(context.Context) error {
					if proxy == nil {
						return op
					}
					return func(ctx context.Context) error {
						before := proxy.roundTrips()
						err := op(ctx)
						into.Add(proxy.roundTrips() - before)
						return err
					}
				}
				ctx := context.Background()
				for range 3 { // the sessions' first statements (checks, settings) are not the steady state
					must(b, setOp(ctx), "set warm-up")
					must(b, singlesOp(ctx), "singles warm-up")
				}
				runPaired(b, counted(singlesOp, &singlesRT), counted(setOp, &setRT))
				if proxy != nil {
					b.ReportMetric(float64(setRT.Load())/float64(b.N), "set-rt/op")
					b.ReportMetric(float64(singlesRT.Load())/float64(b.N), "singles-rt/op")
				}
			})
		}
	}
}
