package advisorylock

import (
	"context"
	"errors"
	"fmt"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// TryDoOnce runs fn at most once for the pair (the Lock's name, run),
// across every replica and over time: the first caller to find the lock
// free and the run not yet done runs fn under the lock, and once fn
// returns nil records the run done in the database before it releases
// the lock. Every later call with the same run key, on any replica, at
// any later time, returns (false, nil) without running fn; so does a call
// while another holder has the lock. The run key is the caller's: the
// scheduled tick of a cron job ("2026-12-03T02:00"), a deploy's id.
//
// A run is done only when recorded: if fn returns an error (returned to
// the caller), or its holder dies or loses the lock before the record is
// written, the next caller runs it again. If fn succeeds but the record
// cannot be written, TryDoOnce returns that error, and the run may run
// again: make fn's effect idempotent where a second run would harm, or
// write it in the same database. Records older than WithRunRetention (7
// days by default) are deleted as the Lock records others.
//
// It costs TryDo's round trips and two more: a read of the record under
// the lock, and its write. The records live in advisorylock_runs (see
// Schema), on the connection pool beside the held one: the pool needs one
// more connection than the lock holds, and a call that finds none free
// within WithPoolWait returns ErrPoolUnavailable. An empty run key, a nil fn or a
// Lock with WithMinHold (whose windows already make one run per window)
// are refused.
func (l *Lock) TryDoOnce(ctx context.Context, run string, fn func(ctx context.Context) error) (ran bool, err error) {
	switch {
	case run == "":
		return false, wrapErr(l.name, "try do once", errors.New("advisorylock: empty run key"))
	case isNilFunc(fn):
		return false, wrapErr(l.name, "try do once", errNilFunc)
	case l.cfg.minHold > 0:
		return false, wrapErr(l.name, "try do once", fmt.Errorf("%w: TryDoOnce does not take WithMinHold (the run key makes each run once)", ErrUnsupported))
	}
	lb, err := l.backend(ctx)
	if err != nil {
		return false, wrapErr(l.name, "try do once", err)
	}
	rec, ok := lb.backend().(backend.RunRecorder)
	if !ok {
		return false, wrapErr(l.name, "try do once", fmt.Errorf("%w: backend %q records no runs (TryDoOnce needs a LeaseStore)", ErrUnsupported, lb.backend().Name()))
	}
	done, unsupported := false, false
	ran, err = tryDo(ctx, l.name, l.TryLock, func(ctx context.Context) error {
		// The record's statements take a second connection while the lock
		// holds one: their checkout waits at most WithPoolWait, as a try's,
		// so that holders that have taken the whole pool do not wait for
		// each other until their callers give up.
		var err error
		if done, err = rec.RunDone(dbutil.WithPoolWait(ctx, l.cfg.poolWait), l.db, l.name, run); err != nil {
			unsupported = errors.Is(err, ErrUnsupported) // the store keeps no runs: nothing ran
			return wrapErr(l.name, "try do once", err)
		}
		if done {
			return nil
		}
		if err := fn(ctx); err != nil {
			return err
		}
		// Recorded before the release, also if the lock was lost as fn
		// returned (fn's work is done either way), bounded as a release.
		rctx, cancel := context.WithTimeout(dbutil.WithPoolWait(context.WithoutCancel(ctx), l.cfg.poolWait), l.cfg.releaseTimeout)
		defer cancel()
		if err := rec.RecordRun(rctx, l.db, l.name, run, l.cfg.clock.Now(), l.cfg.runRetention); err != nil {
			return wrapErr(l.name, "try do once", fmt.Errorf("advisorylock: run %q ran but was not recorded done, so it may run again: %w", run, err))
		}
		return nil
	})
	return ran && !done && !unsupported, err
}
