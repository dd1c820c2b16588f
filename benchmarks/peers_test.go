package benchmarks

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Peer throughput: 32 goroutines over 256 names, as BenchmarkMuxThroughput
// (goroutine g takes names g, g+32, … in turn, so no two goroutines ever
// want the same name, and what is measured is each library's cost under
// 32-way concurrency, not its waits: those are the handoff rows). One
// iteration is a lap of peerLap operations per library; peersHeld is how
// many names the held-names rows hold at once.
const (
	peerGoroutines, peerNames = 32, 256
	peerLap                   = 256
	peersHeld                 = 256
)

// BenchmarkPeers sets advisorylock beside redislock, redsync (on the Redis
// at 127.0.0.1:6379) and etcd's concurrency.Mutex (on an embedded etcd
// server), in one run, interleaved: every iteration runs each library once,
// in an order that turns by one each iteration, so that load that comes
// and goes hits all alike. advisorylock runs pinned (a connection per held
// lock) and multiplexed (WithMultiplexing(4)), on lib/pq, pgx and MariaDB.
// Each sub-benchmark reports, per library L, a figure and its ratio to
// redislock's (L-x-redislock):
//
//   - try_release: one TryLock and its Release of an uncontended name, the
//     median (L-p50-us);
//   - handoff: two contenders take turns on one name, the holder releasing
//     once the other waits (in the server; for the Redis pollers, 5 ms plus
//     a random part of their 20 ms retry after it started), timed from the
//     release call to the waiter's return: L-p50-us, L-p99-us, the ratio of
//     the p50s;
//   - throughput: 32 goroutines over 256 names, each operation a blocking
//     Lock, a counter's increment, and the Release: L-ops/s;
//   - held: 256 names taken one after another and then released, on one
//     client, by the libraries that hold many names without a connection
//     each: L-us/name (take and release).
func BenchmarkPeers(b *testing.B) {
	b.Run("try_release", benchPeersTry)
	b.Run("handoff", benchPeersHandoff)
	b.Run("throughput", benchPeersThroughput)
	b.Run("held", benchPeersHeld)
}

// interleave runs step(p, i) for every peer index p, b.N times, starting
// each iteration one peer further.
func interleave(b *testing.B, n int, step func(p, i int)) {
	b.ResetTimer()
	for i := range b.N {
		for j := range n {
			step((i+j)%n, i)
		}
	}
	b.StopTimer()
}

// reportPeers reports each peer's figure in unit, and its ratio to the
// first peer's (redislock) as x-redislock; per gives each peer's figure.
func reportPeers(b *testing.B, ps []peer, unit string, per func(p int) float64) {
	base := per(0)
	for p := range ps {
		v := per(p)
		b.ReportMetric(v, ps[p].name+"-"+unit)
		if p > 0 {
			b.ReportMetric(v/base, ps[p].name+"-x-redislock")
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func benchPeersTry(b *testing.B) {
	ctx := context.Background()
	ops := make([]peerLock, len(peers))
	for p, pr := range peers {
		ops[p] = pr.open(b)(lockName(b, pr.name))
	}
	for p := range ops { // a session's first statements are not the steady state
		release, err := ops[p].try(ctx)
		must(b, err, peers[p].name+" warm-up")
		must(b, release(ctx), peers[p].name+" warm-up release")
	}
	lat := make([][]time.Duration, len(peers))
	for p := range lat {
		lat[p] = make([]time.Duration, b.N)
	}
	interleave(b, len(peers), func(p, i int) {
		t := time.Now()
		release, err := ops[p].try(ctx)
		if err == nil {
			err = release(ctx)
		}
		lat[p][i] = time.Since(t)
		if err != nil {
			b.Fatalf("%s: %v", peers[p].name, err)
		}
	})
	reportPeers(b, peers, "p50-us", func(p int) float64 { return us(median(lat[p])) })
}

func benchPeersHandoff(b *testing.B) {
	ctx := context.Background()
	pps := make([]*pingPong, len(peers))
	for p, pr := range peers {
		name := lockName(b, pr.name)
		mk := func(int) contender {
			l := pr.open(b)(name)
			var release func(context.Context) error
			return contender{
				acquire: func(ctx context.Context) (err error) {
					release, err = l.lock(ctx)
					return err
				},
				release: func(ctx context.Context) error { return release(ctx) },
			}
		}
		var probe waitProbe
		if pr.probe != nil {
			probe = pr.probe(b, name)
		}
		pps[p] = startPingPong(b, mk, probe)
		for range 2 { // each contender's first wait is not the steady state
			_, err := pps[p].handoff(ctx)
			must(b, err, pr.name+" warm-up handoff")
		}
	}
	lat := make([][]time.Duration, len(peers))
	for p := range lat {
		lat[p] = make([]time.Duration, b.N)
	}
	interleave(b, len(peers), func(p, i int) {
		pp := pps[p]
		if pp.queued == nil {
			// A poller: released at a random point of its retry cycle.
			pp.hold = pollerSettle + rand.N(redisRetry)
		}
		d, err := pp.handoff(ctx)
		if err != nil {
			b.Fatalf("%s: %v", peers[p].name, err)
		}
		lat[p][i] = d
	})
	pct := func(d []time.Duration, q float64) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	reportPeers(b, peers, "p50-us", func(p int) float64 { return us(pct(lat[p], 0.50)) })
	for p, pr := range peers {
		b.ReportMetric(us(pct(lat[p], 0.99)), pr.name+"-p99-us")
	}
}

func benchPeersThroughput(b *testing.B) {
	locks := make([][]peerLock, len(peers))
	for p, pr := range peers {
		open := pr.open(b)
		locks[p] = make([]peerLock, peerNames)
		for i := range locks[p] {
			locks[p][i] = open(lockName(b, pr.name+"/t"+strconv.Itoa(i)))
		}
	}
	for p := range locks { // each name's first Lock is not the steady state
		_, err := lap(locks[p])
		must(b, err, peers[p].name+" warm-up lap")
	}
	elapsed := make([]time.Duration, len(peers))
	interleave(b, len(peers), func(p, _ int) {
		d, err := lap(locks[p])
		if err != nil {
			b.Fatalf("%s: %v", peers[p].name, err)
		}
		elapsed[p] += d
	})
	reportPeers(b, peers, "ops/s", func(p int) float64 { return float64(b.N*peerLap) / elapsed[p].Seconds() })
}

// lap runs peerLap operations over locks with peerGoroutines goroutines
// (goroutine g takes names g, g+32, …), each a Lock, a counter's increment
// under the lock, and the Release, and returns how long they took.
func lap(locks []peerLock) (time.Duration, error) {
	ctx := context.Background()
	var next atomic.Int64
	var counts [peerNames]int
	errs := make([]error, peerGoroutines)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range peerGoroutines {
		wg.Go(func() {
			for i := g; next.Add(1) <= peerLap; i = (i + peerGoroutines) % peerNames {
				release, err := locks[i].lock(ctx)
				if err != nil {
					errs[g] = err
					return
				}
				counts[i]++
				if err := release(ctx); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	total := 0
	for _, c := range counts {
		total += c
	}
	for _, err := range errs {
		if err != nil {
			return d, err
		}
	}
	if total != peerLap {
		return d, fmt.Errorf("%d operations of %d counted", total, peerLap)
	}
	return d, nil
}

func benchPeersHeld(b *testing.B) {
	var ps []peer
	for _, pr := range peers {
		if pr.holdsMany {
			ps = append(ps, pr)
		}
	}
	ctx := context.Background()
	locks := make([][]peerLock, len(ps))
	for p, pr := range ps {
		open := pr.open(b)
		locks[p] = make([]peerLock, peersHeld)
		for i := range locks[p] {
			locks[p][i] = open(lockName(b, pr.name+"/h"+strconv.Itoa(i)))
		}
	}
	elapsed := make([]time.Duration, len(ps))
	interleave(b, len(ps), func(p, _ int) {
		releases := make([]func(context.Context) error, 0, peersHeld)
		t := time.Now()
		for _, l := range locks[p] {
			release, err := l.try(ctx)
			if err != nil {
				b.Fatalf("%s: take %d names: %v", ps[p].name, peersHeld, err)
			}
			releases = append(releases, release)
		}
		for _, release := range releases {
			if err := release(ctx); err != nil {
				b.Fatalf("%s: release: %v", ps[p].name, err)
			}
		}
		elapsed[p] += time.Since(t)
	})
	reportPeers(b, ps, "us/name", func(p int) float64 { return us(elapsed[p]) / float64(b.N*peersHeld) })
}
