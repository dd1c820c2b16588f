package advisorylockgocron

import (
	"context"
	"fmt"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockcron"
	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"
)

// TickFunc is a job that runs for one tick of its schedule (see
// OncePerTick). ctx is gocron's job context, which ends at the scheduler's
// Shutdown and also if the lock is lost while the job runs; tick is the
// scheduled time it runs for. A job that returns an error leaves its tick
// not done.
type TickFunc func(ctx context.Context, tick time.Time) error

// OncePerTick returns a gocron.Task that runs fn once per tick of schedule
// across every replica whose scheduler fires it, for gocron.NewJob with
// the same schedule and no Locker (gocron.WithDisabledDistributedJobLocker(true)
// where the scheduler has one): the run key of advisorylock.Lock.TryDoOnce
// is the tick (see Tick), so the first replica to fire runs fn and records
// the tick done once fn returns nil, and every other replica finds it done
// (or running) and returns at once. Replicas whose clocks or schedulers
// are apart by less than half the schedule's interval agree on the tick;
// no window needs choosing.
//
// schedule is the job's own: cron.ParseStandard of the crontab given to
// gocron.CronJob, or cron.Every(d) for gocron.DurationJob(d), started at a
// multiple of d (gocron.WithStartAt) so that it fires on its ticks. The
// task returns fn's error, or TryDoOnce's (the lock's first-use checks,
// the run record), wrapped; gocron reports it to its AfterJobRunsWithError
// listeners. A tick that another replica ran, or runs, is a success here.
//
// name is the Lock's, shared by every replica's task for this job; give
// each job its own. opts are passed to advisorylock.New (not
// advisorylock.WithMinHold); advisorylock.WithRunRetention must exceed the
// interval. The firing time is read from the system clock. OncePerTick
// fails only for a nil db, fn or schedule, or options advisorylock.New
// refuses.
func OncePerTick(db advisorylock.DB, name string, schedule cron.Schedule, fn TickFunc, opts ...advisorylock.Option) (gocron.Task, error) {
	return oncePerTick(time.Now, db, name, schedule, fn, opts...)
}

// oncePerTick is OncePerTick reading the firing time from now.
func oncePerTick(now func() time.Time, db advisorylock.DB, name string, schedule cron.Schedule, fn TickFunc, opts ...advisorylock.Option) (gocron.Task, error) {
	if fn == nil || schedule == nil {
		return nil, fmt.Errorf("advisorylockgocron: lock %q: once per tick needs a job and its schedule", name)
	}
	lock, err := advisorylock.New(db, name, opts...)
	if err != nil {
		return nil, fmt.Errorf("advisorylockgocron: %w", err)
	}
	return gocron.NewTask(func(ctx context.Context) error {
		tick := Tick(schedule, now())
		_, err := lock.TryDoOnce(ctx, tick.UTC().Format(time.RFC3339Nano), func(ctx context.Context) error {
			return fn(ctx, tick)
		})
		if err != nil {
			return fmt.Errorf("advisorylockgocron: tick %s: %w", tick.Format(time.RFC3339Nano), err)
		}
		return nil
	}), nil
}

// Tick returns the tick of schedule that a job fired at fired belongs to:
// replicas that fire one tick up to half an interval apart get the same
// time. It is advisorylockcron.Tick, which says how ticks are found.
func Tick(schedule cron.Schedule, fired time.Time) time.Time {
	return advisorylockcron.Tick(schedule, fired)
}
