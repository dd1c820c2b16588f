package advisorylock

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// A set (NewSet) is one Lock over several names. Its keys are kept in key
// order, and every acquire takes them in that order, so two sets that
// share names never wait for each other in a cycle. On a session backend a
// grant holds every key on one session: a try takes all or none (one
// statement where the backend is a backend.SetLocker, else one per key,
// letting go of what it took on a miss), a wait takes them one after another,
// each waited for server-side. On a row backend (SQLite, or any backend
// with WithLeaseRows) each name is a row of its own, taken in key order;
// the set is held while all its rows are.

// NewSet returns one Lock over names: a grant holds all of them, Release
// frees all, and the loss of any one is the loss of the set (Lost closes,
// Do's context is cancelled). TryLock takes all or none; Lock waits for
// them in key order, so two sets over the same names, passed in any
// order, never deadlock. Name returns the names in key order joined by
// ",", Key the first key, and Holder the holder of the first name, in key
// order, that someone holds.
//
// It refuses, as New does, a nil db, an empty or repeated name, and no
// names at all; it takes New's options but WithMinHold. RLock on a set
// returns ErrUnsupported.
func NewSet(db DB, names []string, opts ...Option) (*Lock, error) {
	label := strings.Join(names, ",")
	if len(names) == 0 {
		return nil, wrapErr(label, "new set", errors.New("advisorylock: a set needs at least one name"))
	}
	type member struct {
		name string
		key  int64
	}
	ms := make([]member, len(names))
	for i, n := range names {
		if n == "" {
			return nil, wrapErr(label, "new set", errEmptyName)
		}
		ms[i] = member{n, Key(n)}
	}
	slices.SortFunc(ms, func(a, b member) int { return cmp.Compare(a.key, b.key) })
	for i := 1; i < len(ms); i++ {
		if ms[i].key == ms[i-1].key {
			return nil, wrapErr(label, "new set", fmt.Errorf("%w: name %q is in the set twice", errInvalidOption, ms[i].name))
		}
	}
	sorted := make([]string, len(ms))
	keys := make([]int64, len(ms))
	for i, m := range ms {
		sorted[i], keys[i] = m.name, m.key
	}
	label = strings.Join(sorted, ",")
	cfg, err := constructed(db, label, "a set", lockOptions&^optMinHold, opts)
	if err != nil {
		return nil, wrapErr(label, "new set", err)
	}
	cfg.multiplexByDefault()
	l := newLock(db, label, cfg, backend.KindLock)
	l.key = keys[0]
	if len(keys) > 1 {
		l.set, l.setNames = keys, sorted
	}
	return l, nil
}

// keysOf is what l locks: its set's keys, or its one key.
func (l *Lock) keysOf() []int64 {
	if l.set != nil {
		return l.set
	}
	return []int64{l.key}
}

// setClaim is a set's claim (see claim): every one of its keys, on one
// session, or none.
type setClaim struct {
	l *Lock
	s backend.SessionLocker
}

func (c setClaim) try(ctx context.Context, p *pinned) (int, backend.SessionResult, error) {
	res, err := c.l.trySet(ctx, c.s, p)
	return 0, res, err
}

func (c setClaim) wait(ctx, budget context.Context, p *pinned) (int, backend.SessionResult, error) {
	res, err := c.l.waitSet(ctx, budget, c.s, p)
	return 0, res, err
}

// leave: waitSet lets go of what it took when it misses.
func (c setClaim) leave(context.Context, *pinned) error { return nil }

func (c setClaim) held(int) *Lock { return c.l }

// trySet makes a set's one attempt on p's session: all or none.
func (l *Lock) trySet(ctx context.Context, locker backend.SessionLocker, p *pinned) (backend.SessionResult, error) {
	if m, ok := locker.(backend.SetLocker); ok {
		res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return m.TryLockAll(ctx, conn, l.set)
		})
		if !errors.Is(err, ErrUnsupported) {
			return res, err
		}
	}
	for i, k := range l.set {
		res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return locker.TryLockSession(ctx, conn, k)
		})
		if err != nil || !res.OK {
			if uerr := unlockKeys(ctx, locker, p, l.set[:i], l.cfg.releaseTimeout); uerr != nil {
				return backend.SessionResult{}, errors.Join(err, uerr)
			}
			return res, err
		}
	}
	return backend.SessionResult{OK: true}, nil
}

// waitSet waits for a set's keys in key order on p's session, each
// server-side, holding those it has; if budget ends first it lets go of
// them (OK false, nil error: a definite miss).
func (l *Lock) waitSet(ctx, budget context.Context, locker backend.SessionLocker, p *pinned) (backend.SessionResult, error) {
	for i, k := range l.set {
		res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return locker.TryLockSession(ctx, conn, k)
		})
		if err == nil && !res.OK {
			res, err = waitSession(ctx, budget, locker, p, k)
		}
		if err != nil {
			return res, err
		}
		if !res.OK {
			err := endWait(ctx, locker, p, k, l.cfg.releaseTimeout)
			return backend.SessionResult{}, errors.Join(err, unlockKeys(ctx, locker, p, l.set[:i], l.cfg.releaseTimeout))
		}
	}
	return backend.SessionResult{OK: true}, nil
}

// unlockKeys releases keys on p's session, within timeout each; an error
// means the session may still hold some and must be discarded.
func unlockKeys(ctx context.Context, locker backend.SessionLocker, p *pinned, keys []int64, timeout time.Duration) error {
	if m, ok := locker.(backend.SetLocker); ok && len(keys) > 1 {
		res, err := askUntil(context.WithoutCancel(ctx), time.Now().Add(timeout), p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return m.UnlockAll(ctx, conn, keys)
		})
		if err == nil && !res.OK {
			err = errors.New("advisorylock: the session did not hold every key of the set")
		}
		if !errors.Is(err, ErrUnsupported) {
			return err
		}
	}
	for _, k := range keys {
		res, err := askUntil(context.WithoutCancel(ctx), time.Now().Add(timeout), p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return locker.UnlockSession(ctx, conn, k)
		})
		if err != nil {
			return err
		}
		if !res.OK {
			return fmt.Errorf("advisorylock: the session did not hold key %d of the set", k)
		}
	}
	return nil
}

// heldOn reports whether p's session still holds every one of keys: one
// statement where the backend is a MultiplexLocker, else one per key.
func heldOn(ctx context.Context, locker backend.SessionLocker, p *pinned, keys []int64) (bool, error) {
	if m, ok := locker.(backend.MultiplexLocker); ok && len(keys) > 1 {
		held, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) ([]bool, error) {
			return m.HeldKeys(ctx, conn, keys)
		})
		return err == nil && len(held) == len(keys) && !slices.Contains(held, false), err
	}
	for _, k := range keys {
		held, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (bool, error) {
			return locker.HoldsSession(ctx, conn, k)
		})
		if err != nil || !held {
			return false, err
		}
	}
	return true, nil
}

// setHolder reports the holder of the first key of l's set that someone
// holds, by holder (which reads one key).
func (l *Lock) setHolder(ctx context.Context, holder func(i int) (*backend.Holder, error)) (*backend.Holder, error) {
	for i, n := range l.setNames {
		h, err := holder(i)
		if err != nil || h != nil {
			if h != nil {
				h.Name, h.Key = n, l.set[i]
			}
			return h, err
		}
	}
	return nil, nil
}

// setOfRows makes one hold of parts, a set's rows, held: it is lost when
// any part is, with that part's cause.
func (l *Lock) setOfRows(parts []*hold) *hold {
	sh := &rowSetHold{parts: parts}
	sh.hold = hold{name: l.name, key: l.key, logger: l.cfg.log(), relTO: l.cfg.releaseTimeout, end: sh}
	for _, p := range parts {
		p.onLost(func(err error) {
			p.lostMu.Lock()
			cause := p.lostCause
			p.lostMu.Unlock()
			sh.lose(cause, err)
		})
	}
	return &sh.hold
}

// rowSetHold is a set held as rows: one lease hold per name.
type rowSetHold struct {
	hold
	parts []*hold
}

// release frees every row; ctx never ends (see doRelease).
func (s *rowSetHold) release(ctx context.Context, _ time.Duration) error {
	var errs []error
	for _, p := range s.parts {
		p.onLost(nil)
		errs = append(errs, p.doRelease(ctx))
	}
	return errors.Join(errs...)
}

// forget frees every row of a forgotten set.
func (s *rowSetHold) forget() {
	for _, p := range s.parts {
		p.mu.Lock()
		if !p.released {
			p.released = true
			p.end.forget()
		}
		p.mu.Unlock()
	}
}
