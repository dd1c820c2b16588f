// Package advisorylockcron runs a github.com/robfig/cron/v3 job on one
// replica per tick when every replica's cron fires it: OnOneReplica is a
// cron.JobWrapper that takes an advisorylock.Lock, with a min-hold window,
// around each run, and skips the run when another replica has it.
//
//	c := cron.New()
//	c.AddJob("@hourly", cron.NewChain(
//		advisorylockcron.OnOneReplica(cron.DefaultLogger, db, "hourly-report"),
//	).Then(cron.FuncJob(report)))
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
// The job is not told if the lock is lost while it runs (a robfig/cron
// job has no context); call the Lock's TryDo in the job yourself where
// that matters. OnOneReplica panics if db is nil or advisorylock.New
// refuses opts, as a wiring mistake.
func OnOneReplica(logger cron.Logger, db advisorylock.DB, name string, opts ...advisorylock.Option) cron.JobWrapper {
	opts = append([]advisorylock.Option{advisorylock.WithMinHold(DefaultMinHold)}, opts...)
	lock, err := advisorylock.New(db, name, opts...)
	if err != nil {
		panic("advisorylockcron: " + err.Error())
	}
	return func(j cron.Job) cron.Job {
		return cron.FuncJob(func() {
			ran, err := lock.TryDo(context.Background(), func(context.Context) error {
				j.Run()
				return nil
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
