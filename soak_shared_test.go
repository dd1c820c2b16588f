package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

// sharedLoad is the soak's shared row, on one backend: readers (RLock,
// TryRLock) and writers (Do, TryDo) of one name, each on its own pool,
// beside the other rows' faults on the same servers. Every section
// records who is inside; a writer beside a reader or another writer is a
// violation (checked on entry and again before leaving).
type sharedLoad struct {
	backend                    string
	f                          *figures
	readers, writers, together atomic.Int64
	stop                       context.CancelFunc
	wg                         sync.WaitGroup
}

// startSharedLoads starts a shared row on pgx, MariaDB and a SQLite file.
func startSharedLoads(t *testing.T) []*sharedLoad {
	var loads []*sharedLoad
	for _, b := range sharedBackends[1:] {
		loads = append(loads, startSharedLoad(t, b.name, b.open(t)))
	}
	return loads
}

// startSharedLoad starts five workers of one name, each on a pool of its
// own: three readers and two writers, half of each trying, half waiting,
// each Lock with opts too.
func startSharedLoad(t *testing.T, backend string, open func() *sql.DB, opts ...advisorylock.Option) *sharedLoad {
	l := &sharedLoad{backend: backend, f: &figures{}}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { stop(); l.wg.Wait() })
	name := fmt.Sprintf("soak-shared-%s-%d", backend, rand.Uint64())
	for i := range 5 {
		lock := newLock(t, open(), name, append([]advisorylock.Option{quiet, advisorylock.WithPollInterval(5 * time.Millisecond)}, opts...)...)
		l.wg.Go(func() { l.worker(ctx, lock, i < 3, i%2 == 0) })
	}
	return l
}

// worker takes the lock shared or not, waiting or trying, until ctx ends.
func (l *sharedLoad) worker(ctx context.Context, lock *advisorylock.Lock, shared, try bool) {
	for ctx.Err() == nil {
		start := time.Now()
		fn := func(context.Context) error {
			l.f.acquiredAfter(time.Since(start))
			l.section(shared)
			return nil
		}
		var err error
		ran := true
		switch {
		case shared && try:
			ran, err = readSection(ctx, lock.TryRLock, fn)
		case shared:
			_, err = readSection(ctx, lock.RLock, fn)
		case try:
			ran, err = lock.TryDo(ctx, fn)
		default:
			err = lock.Do(ctx, fn)
		}
		l.f.outcome(ctx, err, false)
		if !ran {
			time.Sleep(time.Millisecond) // a try that missed does not spin on a shared server
		}
	}
}

// readSection takes the lock shared with acquire, runs fn and releases:
// (false, nil) when a try finds it held, an error matching ErrLockLost
// when the hold was lost before fn returned.
func readSection(ctx context.Context, acquire func(context.Context) (*advisorylock.Guard, error), fn func(context.Context) error) (bool, error) {
	g, err := acquire(ctx)
	if errors.Is(err, advisorylock.ErrNotAcquired) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	err = fn(ctx)
	select {
	case <-g.Lost():
		err = advisorylock.ErrLockLost
	default:
	}
	if relErr := g.Release(ctx); err == nil {
		err = relErr
	}
	return true, err
}

// section is one holder's stay inside, a few milliseconds long.
func (l *sharedLoad) section(shared bool) {
	in, out := &l.writers, &l.readers
	if shared {
		in, out = &l.readers, &l.writers
	}
	if n := in.Add(1); n > 1 && shared {
		l.together.Add(1)
	} else if n > 1 {
		l.f.violations.Add(1)
	}
	defer in.Add(-1)
	for range 2 {
		if out.Load() > 0 {
			l.f.violations.Add(1)
		}
		time.Sleep(time.Duration(1+rand.IntN(3)) * time.Millisecond) // the work, during which an overlap would show
	}
}

func (l *sharedLoad) String() string {
	return fmt.Sprintf("%s (readers together %d times)", l.f, l.together.Load())
}

// halt stops the workers; check then fails t on a violation, or if the
// row proved nothing (no grant, or readers never together).
func (l *sharedLoad) halt(t *testing.T) {
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, "shared workers on "+l.backend)
}

func (l *sharedLoad) check(t *testing.T) {
	if v := l.f.violations.Load(); v != 0 {
		t.Errorf("shared on %s: %d times a writer overlapped a reader or another writer", l.backend, v)
	}
	if l.f.acquired.Load() == 0 || l.together.Load() == 0 {
		t.Errorf("vacuous: shared on %s: %v", l.backend, l)
	}
}
