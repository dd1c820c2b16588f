package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// Shared holds, as sync.RWMutex spells them: RLock and TryRLock take the
// lock shared. Shared holders of a name coexist; an exclusive holder
// (Lock, TryLock) excludes them all and is excluded by any, on every
// backend. A shared hold is a *Guard like any other: the same Release,
// Lost, keep-alive and Observer events (kind "shared").
//
// Waiting writers are not starved: on every backend a writer that waits
// keeps new shared holders out until it has had its turn (PostgreSQL
// queues them behind it in the server's lock queue; MySQL by the
// writer's GET_LOCK; lease rows, on SQLite or with WithLeaseRows, by the
// writer's claim on the row, see backend.SharedRowStore). So
// TryRLock reports ErrNotAcquired while a writer waits, as
// sync.RWMutex.TryRLock does, and readers can wait behind a stream of
// writers.

// TryRLock makes one attempt to take the lock shared and returns a Guard,
// or an error matching ErrNotAcquired when an exclusive holder has it (or,
// on MySQL and on lease rows, a writer waits for it). Contexts, the pool and
// cancellation behave as in TryLock. A Lock with WithMinHold, or on a
// backend without shared locks, returns ErrUnsupported.
func (l *Lock) TryRLock(ctx context.Context) (*Guard, error) {
	return acquire(ctx, sharedSide{l}, "try rlock", false)
}

// RLock waits until it holds the lock shared or ctx ends, as Lock waits:
// server-side in slices on PostgreSQL and MySQL, polling on lease rows
// (SQLite, WithLeaseRows). It
// returns ctx's error when ctx ends first (a cancelled acquire leaves
// nothing held), ErrUnsupported as TryRLock does, and the first-use
// errors of Lock. To bound the wait, give ctx a deadline
// (context.WithTimeout): running out of it returns an error matching
// context.DeadlineExceeded.
func (l *Lock) RLock(ctx context.Context) (*Guard, error) {
	return acquire(ctx, sharedSide{l}, "rlock", true)
}

// Holders lists every holder of the lock now, shared (Holder.Shared) and
// exclusive, or none when it is free. On PostgreSQL it reads pg_locks and
// pg_stat_activity (details of other roles' sessions need
// pg_read_all_stats), on MySQL the holders' rows, IS_USED_LOCK and the
// process list (PROCESS for other users' details), on SQLite the rows.
// With WithMinHold, a name kept taken by a window lists that grant alone.
// A set (NewSet) lists the holders of each of its names, in key order,
// each Holder naming its own.
func (l *Lock) Holders(ctx context.Context) ([]*Holder, error) {
	b, err := l.backend(ctx)
	if err != nil {
		return nil, wrapErr(l.name, "holders", err)
	}
	var all []*Holder
	for _, one := range l.members() {
		hs, err := one.holdersOn(ctx, b)
		if err != nil {
			return nil, wrapErr(l.name, "holders", err)
		}
		all = append(all, hs...)
	}
	return all, nil
}

// holdersOn lists the holders of l's one name on b.
func (l *Lock) holdersOn(ctx context.Context, b *lockBackend) ([]*Holder, error) {
	var hs []*Holder
	var err error
	switch {
	case b.rows != nil:
		hs, err = rowHolders(ctx, l.db, b.rows, l.rowRequest(""))
	default:
		var h *backend.Holder
		if h, err = l.windowHolder(ctx, b); h != nil || err != nil {
			hs = []*Holder{holderOf(h)}
		} else {
			hs, err = sessionHolders(ctx, l.db, b.session, l.key)
		}
	}
	for _, h := range hs {
		if h != nil {
			h.Name = l.name
		}
	}
	return hs, err
}

// sharedView returns how l takes shared holds on b, nil where it cannot.
// A Lock with WithMinHold has none: a window is an exclusive grant's.
func (l *Lock) sharedView(b *lockBackend) *lockBackend {
	if l.cfg.minHold > 0 {
		return nil
	}
	if s, ok := b.session.(backend.SharedSessionLocker); ok {
		sb := &lockBackend{session: s.Shared(), bounded: b.bounded, isShared: true}
		sb.claim = keyClaim{l, sb.session}
		return sb
	}
	if _, ok := b.rows.(backend.SharedRowStore); ok {
		return &lockBackend{rows: b.rows, isShared: true}
	}
	return nil
}

// sharedOf returns b's shared view, or why there is none.
func (l *Lock) sharedOf(b *lockBackend) (*lockBackend, error) {
	if b.shared != nil {
		return b.shared, nil
	}
	if l.cfg.minHold > 0 {
		return nil, fmt.Errorf("%w: a Lock with WithMinHold cannot be taken shared", ErrUnsupported)
	}
	return nil, fmt.Errorf("%w: backend %q has no shared locks", ErrUnsupported, b.backend().Name())
}

// endWait lets go of what a wait that ended without the lock may have
// left on the session (see backend.SharedSessionLocker.EndWait), within the
// release timeout; an error means the connection must be discarded.
func endWait(ctx context.Context, s backend.SessionLocker, p *pinned, key int64, timeout time.Duration) error {
	w, ok := s.(backend.SharedSessionLocker)
	if !ok {
		return nil
	}
	_, err := askUntil(context.WithoutCancel(ctx), time.Now().Add(timeout), p, func(ctx context.Context, conn *sql.Conn) (struct{}, error) {
		return struct{}{}, w.EndWait(ctx, conn, key)
	})
	return err
}

// sessionHolders lists the holders of key on a session backend: all of
// them where it can, else the one SessionHolder reports.
func sessionHolders(ctx context.Context, db DB, s backend.SessionLocker, key int64) ([]*Holder, error) {
	if l, ok := s.(backend.SharedSessionLocker); ok {
		return holdersOf(l.SessionHolders(ctx, db, key))
	}
	return oneHolder(s.SessionHolder(ctx, db, key))
}

// rowHolders lists the holders of a Lock kept as rows.
func rowHolders(ctx context.Context, db DB, s backend.LeaseStore, r backend.LeaseRequest) ([]*Holder, error) {
	if s, ok := s.(backend.SharedRowStore); ok {
		return holdersOf(s.LeaseHolders(ctx, db, r))
	}
	return oneHolder(s.LeaseHolder(ctx, db, r))
}

// oneHolder lists h, a backend's one holder: none when h is nil.
func oneHolder(h *backend.Holder, err error) ([]*Holder, error) {
	if h == nil || err != nil {
		return nil, err
	}
	return []*Holder{holderOf(h)}, nil
}

// sharedSide is a Lock seen by the Observer as its shared holds.
type sharedSide struct{ l *Lock }

func (s sharedSide) observed() *observed { return s.l.observedAs(true) }

func (s sharedSide) settings() (string, *config) { return s.l.settings() }

// take takes the lock shared (see frontEnd), as Lock.take does.
func (s sharedSide) take(ctx, budget context.Context, wait bool) (*Guard, error) {
	l := s.l
	b, err := l.backend(budget)
	switch {
	case err != nil:
		return nil, err
	case l.set != nil:
		return nil, fmt.Errorf("%w: a set (NewSet) cannot be taken shared", ErrUnsupported)
	case b.muxed && l.cfg.given&optMultiplexing != 0: // by default they are pinned
		return nil, fmt.Errorf("%w: shared locks (RLock) are not multiplexed (WithMultiplexing): use a Lock without it, which takes them pinned", ErrUnsupported)
	}
	if b, err = l.sharedOf(b); err != nil {
		return nil, err
	}
	if b.rows != nil {
		return l.acquireRows(ctx, budget, b, wait)
	}
	return acquireSession(ctx, budget, l, b, l.observedAs(true), b.claim, wait)
}
