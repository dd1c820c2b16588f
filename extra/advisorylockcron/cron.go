// Package advisorylockcron runs a github.com/robfig/cron/v3 job on one
// replica per tick when every replica's cron fires it. OncePerTick is a
// cron.JobWrapper that runs each scheduled tick once across the replicas
// (advisorylock.Lock.TryDoOnce, the tick as the run key): no window to
// choose. OnOneReplica does it with a min-hold window instead.
//
//	spec := "@hourly"
//	schedule, _ := cron.ParseStandard(spec)
//	c := cron.New()
//	c.AddJob(spec, cron.NewChain(
//		advisorylockcron.OncePerTick(cron.DefaultLogger, db, "hourly-report", schedule),
//	).Then(advisorylockcron.TickFunc(report)))
package advisorylockcron

import (
	"context"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/robfig/cron/v3"
)

// DefaultMinHold is the window OnOneReplica keeps a job's lock taken after
// each grant when it is given no advisorylock.WithMinHold: crons up to a
// second apart run the job once per tick, and a job scheduled less often
// than every second plus that skew runs every tick.
//
// The window must be longer than the skew between the replicas and
// shorter than the job's period minus that skew: about half the period
// tolerates the most skew. A job that runs more often than every two
// seconds needs a shorter window (or it skips ticks); replicas further
// apart need a longer one (or a tick runs more than once).
const DefaultMinHold = time.Second

// OnOneReplica returns a cron.JobWrapper that runs the job it wraps only on
// the replica that takes the lock named name for this tick: each run makes
// one attempt (advisorylock.Lock.TryDo) and runs the job if it was granted;
// otherwise it skips the run, logging at Info level ("skip") when another
// replica runs it or its window is still open, at Error level when the
// attempt failed. An error after a run (the lock was lost while the job
// ran, or its release failed) is logged at Error level ("run"). The name stays taken until the window after the grant
// ends (see DefaultMinHold), also when the job returns sooner.
//
// Give each job its own name: a wrapper shares its lock among every job
// it wraps, so jobs under one name exclude each other. opts are passed to
// advisorylock.New after advisorylock.WithMinHold(DefaultMinHold), so an
// advisorylock.WithMinHold among them sets the window; every replica must
// pass the same window. The lock's first use runs its first-use checks
// (and on PostgreSQL and MySQL creates the advisorylock_windows table).
//
// A cron.Job is not told if the lock is lost while it runs (it has no
// context); a TickJob is, through its ctx, and can return an error.
// OnOneReplica panics if db is nil or advisorylock.New refuses opts, as a
// wiring mistake.
func OnOneReplica(logger cron.Logger, db advisorylock.DB, name string, opts ...advisorylock.Option) cron.JobWrapper {
	opts = append([]advisorylock.Option{advisorylock.WithMinHold(DefaultMinHold)}, opts...)
	lock, err := advisorylock.New(db, name, opts...)
	if err != nil {
		panic("advisorylockcron: " + err.Error())
	}
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			ran, err := lock.TryDo(context.Background(), func(ctx context.Context) error {
				return run(ctx, j, time.Time{})
			})
			switch {
			case err != nil && ran: // lost while the job ran, or the release failed
				logger.Error(err, "run", "lock", name)
			case err != nil:
				logger.Error(err, "skip", "lock", name)
			case !ran:
				logger.Info("skip", "lock", name, "reason", "another replica runs this tick")
			}
		})
	}
}

// OncePerTick returns a cron.JobWrapper that runs the job it wraps once
// per tick of schedule across every replica whose cron fires it: the run
// key of advisorylock.Lock.TryDoOnce is the tick (see Tick), so the first
// replica to fire runs the job, records the tick done once the job
// returns, and every other replica skips it, logging at Info level
// ("skip"). Replicas whose clocks or schedulers are apart by less than
// half the schedule's interval agree on the tick; no window needs
// choosing. A TickJob that returns an error leaves its tick not done (a
// replica firing it later runs it), and the error is logged at Error
// level ("run"); a job that panics leaves it not done too, and the panic
// goes on up the chain.
//
// schedule must be the job's own (cron.ParseStandard of its spec, or
// cron.Every). The job reads its tick if it is a TickFunc or a TickJob:
// put OncePerTick last in the chain, next to the job, so that no other
// wrapper hides it.
// opts are passed to advisorylock.New (not advisorylock.WithMinHold);
// advisorylock.WithRunRetention must exceed the interval. The firing time
// is read from the system clock. OncePerTick panics if db is nil or
// advisorylock.New refuses opts, as a wiring mistake.
func OncePerTick(logger cron.Logger, db advisorylock.DB, name string, schedule cron.Schedule, opts ...advisorylock.Option) cron.JobWrapper {
	return oncePerTick(time.Now, logger, db, name, schedule, opts...)
}

// oncePerTick is OncePerTick reading the firing time from now.
func oncePerTick(now func() time.Time, logger cron.Logger, db advisorylock.DB, name string, schedule cron.Schedule, opts ...advisorylock.Option) cron.JobWrapper {
	lock, err := advisorylock.New(db, name, opts...)
	if err != nil {
		panic("advisorylockcron: " + err.Error())
	}
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			tick := Tick(schedule, now())
			ran, err := lock.TryDoOnce(context.Background(), tick.UTC().Format(time.RFC3339Nano), func(ctx context.Context) error {
				return run(ctx, j, tick)
			})
			switch {
			case err != nil && ran:
				logger.Error(err, "run", "lock", name, "tick", tick)
			case err != nil:
				logger.Error(err, "skip", "lock", name, "tick", tick)
			case !ran:
				logger.Info("skip", "lock", name, "tick", tick, "reason", "another replica ran this tick, or runs it")
			}
		})
	}
}

// Tick returns the tick of schedule that a job fired at fired belongs to,
// a wall time without a monotonic reading; replicas that fire one tick up
// to half an interval apart (early or late) get the same time. A
// cron.Every(d) schedule's ticks are the multiples of d (fired.Round(d):
// for a d that divides a day, the clock's whole minutes, hours, ...),
// which every replica shares wherever its cron started counting. A
// crontab schedule's tick is its scheduled time nearest to fired, taking
// the interval after the next tick as the schedule's.
func Tick(schedule cron.Schedule, fired time.Time) time.Time {
	if every, ok := schedule.(cron.ConstantDelaySchedule); ok {
		return fired.Round(every.Delay)
	}
	next := schedule.Next(fired)
	interval := schedule.Next(next).Sub(next)
	return schedule.Next(fired.Add(-interval / 2)).Round(0)
}

// TickFunc is a job that reads its tick (see OncePerTick). Run, outside
// OncePerTick, passes the zero time.
type TickFunc func(tick time.Time)

// Run runs f with the zero time: f is not under OncePerTick.
func (f TickFunc) Run() { f(time.Time{}) }

// TickJob is a job that can fail without a panic: its error leaves the
// tick not done under OncePerTick (a replica firing the tick later runs it
// again) and is logged at Error level ("run") by either wrapper. ctx ends
// if the lock is lost while the job runs; tick is the tick it runs for
// under OncePerTick, the zero time under OnOneReplica. Like TickFunc it
// must be next to the wrapper in the chain, or the wrapper sees only Run.
type TickJob func(ctx context.Context, tick time.Time) error

// Run runs f with a background context and the zero time, outside the
// wrappers, and logs its error to cron.DefaultLogger.
func (f TickJob) Run() {
	if err := f(context.Background(), time.Time{}); err != nil {
		cron.DefaultLogger.Error(err, "run")
	}
}

// run runs j for tick under the lock's ctx: a TickJob's error is the run's.
func run(ctx context.Context, j cron.Job, tick time.Time) error {
	switch j := j.(type) {
	case TickJob:
		return j(ctx, tick)
	case TickFunc:
		j(tick)
	default:
		j.Run()
	}
	return nil
}
