package benchmarks

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

// Once per window (WithMinHold) costs its locks a write at every grant:
// trydo_minhold and leaselock_minhold measure it beside trydo and
// leaselock. A name stays taken for its window after each iteration, so
// the iterations take turns over minHoldNames names, each reused long
// after its 1ms window has ended.
const (
	minHoldWindow = time.Millisecond
	minHoldNames  = 64
)

func setupTryDoMinHold(b *testing.B, e pgEnv) func(ctx context.Context) error {
	locks := make([]*advisorylock.Lock, minHoldNames)
	for i := range locks {
		locks[i] = newLock(b, e.db, lockName(b, fmt.Sprintf("lock-%d", i)), advisorylock.WithMinHold(minHoldWindow))
		must(b, locks[i].Check(context.Background()), "Check")
	}
	noop := func(context.Context) error { return nil }
	i := 0
	return func(ctx context.Context) error {
		i++
		ran, err := locks[i%minHoldNames].TryDo(ctx, noop)
		if err == nil && !ran {
			err = errNotGranted
		}
		return err
	}
}

func setupLeaseLockMinHold(b *testing.B, e pgEnv) func(ctx context.Context) error {
	locks := make([]*advisorylock.LeaseLock, minHoldNames)
	for i := range locks {
		name := lockName(b, fmt.Sprintf("lease-%d", i))
		forgetLease(b, name)
		locks[i] = newLeaseLock(b, e.db, name, advisorylock.WithMinHold(minHoldWindow))
	}
	i := 0
	return func(ctx context.Context) error {
		i++
		g, err := locks[i%minHoldNames].TryLock(ctx)
		if err != nil {
			return err
		}
		return g.Release(ctx)
	}
}
