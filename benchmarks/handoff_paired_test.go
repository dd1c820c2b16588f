package benchmarks

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

// handoffRawLiteral is the protocol floor of a handoff: pg_advisory_lock
// waiting server-side on a pinned connection, then pg_advisory_unlock,
// with the key as a literal (one round trip each on every driver).
func handoffRawLiteral(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	key := advisorylock.Key(lockName(b, "handoff_raw"))
	lit := strconv.FormatInt(key, 10)
	lock, unlock := "SELECT pg_advisory_lock("+lit+")", "SELECT pg_advisory_unlock("+lit+")"
	return func(int) contender {
		conn := pin(b, openPG(b, drv, postgresDSN(), 2))
		return contender{
			acquire: func(ctx context.Context) error {
				_, err := conn.ExecContext(ctx, lock)
				return err
			},
			release: func(ctx context.Context) error {
				_, err := conn.ExecContext(ctx, unlock)
				return err
			},
		}
	}, queuedOn(b, key)
}

// pingPong is a handoff between two contenders of one library that take
// turns: the holder releases once the other waits in the server.
type pingPong struct {
	cs     [2]contender
	holder int
	queued waitProbe     // nil: hold instead
	hold   time.Duration // if set, the holder releases this long after the waiter started, instead of once it is queued
}

// newPingPong builds two contenders with setup and lets the first take
// the lock.
func newPingPong(b *testing.B, drv string, setup func(b *testing.B, drv string) (func(i int) contender, waitProbe)) *pingPong {
	mk, waiting := setup(b, drv)
	return startPingPong(b, mk, waiting)
}

// startPingPong builds two contenders of mk, whose waits queued sees,
// and lets the first take the lock.
func startPingPong(b *testing.B, mk func(i int) contender, queued waitProbe) *pingPong {
	p := &pingPong{cs: [2]contender{mk(0), mk(1)}, queued: queued}
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	must(b, p.cs[0].acquire(ctx), "first acquire")
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		_ = p.cs[p.holder].release(ctx)
	})
	return p
}

// handoff makes the waiting contender wait, releases once it is queued in
// the server, and returns the time from the release call to the waiter's
// return from its acquire. The roles then swap.
func (p *pingPong) handoff(ctx context.Context) (time.Duration, error) {
	type grant struct {
		at  time.Time
		err error
	}
	got := make(chan grant, 1)
	waiter := p.cs[1-p.holder]
	go func() {
		err := waiter.acquire(ctx)
		got <- grant{time.Now(), err}
	}()
	if p.hold > 0 || p.queued == nil {
		time.Sleep(p.hold) // the same idle time on both sides of a pair, not a synchronization: a late waiter is still woken
	} else if err := p.awaitQueued(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := p.cs[p.holder].release(ctx); err != nil {
		return 0, fmt.Errorf("release: %w", err)
	}
	g := <-got
	if g.err != nil {
		return 0, fmt.Errorf("acquire: %w", g.err)
	}
	p.holder = 1 - p.holder
	return g.at.Sub(start), nil
}

// awaitQueued polls the probe until the waiter waits in the server.
func (p *pingPong) awaitQueued(ctx context.Context) error {
	deadline := time.Now().Add(setupTimeout)
	for {
		in, err := p.queued(ctx, 1)
		if err != nil {
			return err
		}
		if in {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the waiter did not queue within %v", setupTimeout)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// handoffPairs are measured side by side by BenchmarkHandoffPaired.
var handoffPairs = []struct {
	op, base         string
	opSetup, baseSet func(b *testing.B, drv string) (func(i int) contender, waitProbe)
}{
	{"advisorylock", "raw_literal", handoffAdvisoryLock, handoffRawLiteral},
}

// BenchmarkHandoffPaired alternates, handoff by handoff (in alternating
// order), a handoff of op and one of base between two contenders each
// (every contender with its own connection), and reports the median
// handoff of each (base-p50-us, op-p50-us) and their ratio (x-base): a
// burst of load hits both alike. A handoff is timed from the holder's
// release call to the waiter's return from its acquire.
func BenchmarkHandoffPaired(b *testing.B) {
	for _, pair := range handoffPairs {
		for _, drv := range pgDrivers {
			b.Run(pair.op+"_vs_"+pair.base+"/"+drv, func(b *testing.B) {
				runHandoffPair(b, newPingPong(b, drv, pair.opSetup), newPingPong(b, drv, pair.baseSet))
			})
		}
	}
}

// runHandoffPair alternates b.N handoffs of op and of base and reports
// their medians and ratio (see BenchmarkHandoffPaired).
func runHandoffPair(b *testing.B, op, base *pingPong) {
	ctx := context.Background()
	opLat, baseLat := make([]time.Duration, b.N), make([]time.Duration, b.N)
	timed := func(p *pingPong, into *time.Duration) {
		d, err := p.handoff(ctx)
		if err != nil {
			b.Fatal(err)
		}
		*into = d
	}
	b.ResetTimer()
	for i := range b.N {
		if i%2 == 0 {
			timed(base, &baseLat[i])
			timed(op, &opLat[i])
		} else {
			timed(op, &opLat[i])
			timed(base, &baseLat[i])
		}
	}
	b.StopTimer()
	bm, om := median(baseLat), median(opLat)
	b.ReportMetric(float64(bm)/float64(time.Microsecond), "base-p50-us")
	b.ReportMetric(float64(om)/float64(time.Microsecond), "op-p50-us")
	b.ReportMetric(float64(om)/float64(bm), "x-base")
}
