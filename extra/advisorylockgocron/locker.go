// Package advisorylockgocron runs the jobs of several
// github.com/go-co-op/gocron/v2 schedulers (one per replica) once across
// the replicas, in one of three ways:
//
//   - OncePerTick, a gocron.Task: every replica's scheduler fires the job,
//     and the first to fire each scheduled tick runs it and records the
//     tick done (advisorylock.Lock.TryDoOnce, the tick as the run key);
//     the others find it done. Replicas apart by less than half the
//     interval agree on the tick: no window to choose.
//   - Locker, a gocron.Locker: every replica's scheduler fires each job, and
//     the one that takes the job's lock runs it. A min-hold keeps the lock
//     taken for a window after each grant, so schedulers a little apart
//     (clock skew, a late timer) run a short job once per tick.
//   - Elector, a gocron.Elector built on an advisorylock.Election: one
//     replica leads and runs every job; the others skip them until it
//     stops leading.
//
// Wiring any of them is a line or two:
//
//	task, err := advisorylockgocron.OncePerTick(db, "report", cron.Every(time.Minute), report)
//	_, err = s.NewJob(gocron.DurationJob(time.Minute), task,
//		gocron.WithStartAt(gocron.WithStartDateTime(time.Now().Truncate(time.Minute).Add(time.Minute))))
//
//	locker, err := advisorylockgocron.NewLocker(db)
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
//
//	election, err := advisorylock.NewElection(db, "scheduler-leader")
//	elector, err := advisorylockgocron.NewElector(ctx, election)
//	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
package advisorylockgocron

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/go-co-op/gocron/v2"
)

// DefaultMinHold is the window a Locker keeps a job's lock taken after
// each grant when NewLocker is given no advisorylock.WithMinHold: schedulers
// up to a second apart run a job once per tick, and any job whose interval
// is longer than a second plus that skew runs every tick.
//
// The window must be longer than the skew between the schedulers and
// shorter than the job's interval minus that skew: about half the shortest
// interval among the scheduler's jobs tolerates the most skew. Jobs that
// run more often than every two seconds need a shorter window (or they
// skip ticks); schedulers further apart need a longer one (or a job runs
// more than once per tick). Jobs whose intervals differ widely can each
// have a Locker of their own, with gocron.WithDistributedJobLocker.
const DefaultMinHold = time.Second

// Locker is a gocron.Locker that takes one advisorylock.Lock per job, named
// LockName(job name), with a min-hold window. It is safe for concurrent
// use by any number of schedulers and jobs.
type Locker struct {
	db   advisorylock.DB
	opts []advisorylock.Option

	mu    sync.Mutex
	locks map[string]*advisorylock.Lock // by job name; one per job, never removed
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker for gocron.WithDistributedLocker (or
// gocron.WithDistributedJobLocker). opts are passed to advisorylock.New for
// every job's lock, after advisorylock.WithMinHold(DefaultMinHold), so an
// advisorylock.WithMinHold among them sets the window (see DefaultMinHold
// for how to choose it). Every replica must pass the same window.
//
// Like advisorylock.New it does no I/O: it fails only for a nil db or
// options advisorylock.New refuses. The first job's Lock runs the
// first-use checks (and on PostgreSQL and MySQL creates the
// advisorylock_windows table that keeps the windows).
func NewLocker(db advisorylock.DB, opts ...advisorylock.Option) (*Locker, error) {
	opts = append([]advisorylock.Option{advisorylock.WithMinHold(DefaultMinHold)}, opts...)
	if _, err := advisorylock.New(db, LockName(""), opts...); err != nil {
		return nil, fmt.Errorf("advisorylockgocron: %w", err)
	}
	return &Locker{db: db, opts: opts, locks: map[string]*advisorylock.Lock{}}, nil
}

// LockName returns the name of the advisorylock.Lock that a Locker takes
// for the job named key: "gocron:" and the job's name, so that a job's
// lock does not collide with the application's own locks. Look its holder
// up with advisorylock.New(db, LockName(job)) and Holder, or `lockrun
// status`.
func LockName(key string) string { return "gocron:" + key }

// Lock makes one attempt to take the lock of the job named key, as gocron
// asks before each run. It returns an error matching
// advisorylock.ErrNotAcquired when another scheduler runs the job or its
// window since the last grant is still open (gocron then skips this run
// and reports the error to gocron.AfterLockError listeners), or the
// advisorylock error that made the attempt fail.
//
// The returned lock holds a database connection until Unlock (on
// PostgreSQL and MySQL; on SQLite a renewed row), which gocron calls when
// the job returns. If the lock is lost while the job runs (its session
// killed), the job is not told: gocron gives jobs no way to be. Use an
// Elector with advisorylock.Fence, or advisorylock's Do in the job, where
// that matters.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	lock, err := l.lockFor(key)
	if err != nil {
		return nil, err
	}
	g, err := lock.TryLock(ctx)
	if err != nil {
		return nil, err
	}
	return unlocker{g}, nil
}

// lockFor returns the job's lock, made at its first run.
func (l *Locker) lockFor(key string) (*advisorylock.Lock, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if lock, ok := l.locks[key]; ok {
		return lock, nil
	}
	lock, err := advisorylock.New(l.db, LockName(key), l.opts...)
	if err != nil {
		return nil, fmt.Errorf("advisorylockgocron: job %q: %w", key, err)
	}
	l.locks[key] = lock
	return lock, nil
}

// unlocker is the gocron.Lock of one run: a held advisorylock.Guard.
type unlocker struct{ g *advisorylock.Guard }

// Unlock releases the lock (see advisorylock.Guard.Release): the job's
// window still keeps it taken until its end.
func (u unlocker) Unlock(ctx context.Context) error { return u.g.Release(ctx) }
