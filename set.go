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

// A set (NewSet) is one Lock over several names, always taken in key
// order, so two sets never wait for each other in a cycle: every key on
// one session (setClaim), or a row per name, held while all its rows are.

// NewSet returns one Lock over names: a grant holds all of them, Release
// frees all, and the loss of any one is the loss of the set (Lost closes,
// Do's context is cancelled). TryLock takes all or none; Lock waits for
// them in key order, so two sets over the same names, passed in any
// order, never deadlock. Name returns the names in key order joined by
// ",", and Holder the holder of the first name, in key order, that
// someone holds; each name's key is Key(name), and the key order is the
// order of those int64s.
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

// members returns what l locks as Locks of one name each: l itself, or
// one for each name of its set, in key order.
func (l *Lock) members() []*Lock {
	if l.set == nil {
		return []*Lock{l}
	}
	ms := make([]*Lock, len(l.set))
	for i, k := range l.set {
		ms[i] = &Lock{db: l.db, name: l.setNames[i], key: k, cfg: l.cfg}
	}
	return ms
}

// keysOf is what l locks: its set's keys, or its one key.
func (l *Lock) keysOf() []int64 {
	if l.set != nil {
		return l.set
	}
	return []int64{l.key}
}

// setClaim is a set's claim: all of its keys on one session, or none.
type setClaim struct {
	l *Lock
	s backend.SessionLocker
}

// try makes a set's one attempt: all or none.
func (c setClaim) try(ctx context.Context, p *pinned) (int, backend.SessionResult, error) {
	l, locker := c.l, c.s
	if m, ok := locker.(backend.SetLocker); ok {
		res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return m.TryLockAll(ctx, conn, l.set)
		})
		if !errors.Is(err, ErrUnsupported) {
			return 0, res, err
		}
	}
	for i, k := range l.set {
		res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return locker.TryLockSession(ctx, conn, k)
		})
		if err != nil || !res.OK {
			if uerr := unlockKeys(ctx, locker, p, l.set[:i], l.cfg.releaseTimeout); uerr != nil {
				return 0, backend.SessionResult{}, errors.Join(err, uerr)
			}
			return 0, res, err
		}
	}
	return 0, backend.SessionResult{OK: true}, nil
}

// wait waits for the keys in key order, each server-side, holding those
// it has; if budget ends first it lets go of them (a definite miss).
func (c setClaim) wait(ctx, budget context.Context, p *pinned) (int, backend.SessionResult, error) {
	l, locker := c.l, c.s
	for i, k := range l.set {
		res, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (backend.SessionResult, error) {
			return locker.TryLockSession(ctx, conn, k)
		})
		if err == nil && !res.OK {
			res, err = waitSession(ctx, budget, locker, p, k)
		}
		if err != nil {
			return 0, res, err
		}
		if !res.OK {
			err := endWait(ctx, locker, p, k, l.cfg.releaseTimeout)
			return 0, backend.SessionResult{}, errors.Join(err, unlockKeys(ctx, locker, p, l.set[:i], l.cfg.releaseTimeout))
		}
	}
	return 0, backend.SessionResult{OK: true}, nil
}

// leave: wait lets go of what it took when it misses.
func (c setClaim) leave(context.Context, *pinned) error { return nil }

func (c setClaim) held(int) *Lock { return c.l }

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

// heldOn reports whether p's session still holds every one of keys.
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

// setOfRows makes one hold of a set's rows, lost with any one of them.
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

// expireIfPast marks the set lost once a row's local deadline has passed
// (see deadlineEnd): the row's loss ends the set.
func (s *rowSetHold) expireIfPast() {
	for _, p := range s.parts {
		p.checkDeadline()
	}
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
