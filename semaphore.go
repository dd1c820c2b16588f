package advisorylock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// Semaphore is a named counting semaphore: at most Slots holders at once,
// across every process that uses the name with the same slot count. Each
// holder has a slot, a number from 0 to slots-1 that no other holder
// has at the same time, and slot i is an exclusive lock of its own, on
// a key of its own: the first 8 bytes, read as a big-endian
// two's-complement integer, of SHA-256 over "advisorylock:v1:slot", one
// zero byte, the name's bytes, one zero byte and i in decimal. No slot
// key is the Key of a Lock but by a 64-bit hash collision (Key's input
// has a zero byte where this one has a colon). On MySQL the slot's lock
// name is derived from its key as a Lock's is from Key. A slot is held:
//
//   - on PostgreSQL a session advisory lock, on MySQL and MariaDB a
//     GET_LOCK named lock, each on a connection pinned for the hold, as a
//     Lock is (a held slot uses a connection of the pool; a holder whose
//     session ends frees its slot, at once for a closed socket and within
//     WithDeadHolderTimeout for a vanished host);
//   - on SQLite, and on any backend with WithLeaseRows (behind a
//     transaction-mode pooler, say), a lease row in advisorylock_locks,
//     renewed in the background (a holder that dies frees its slot when
//     its lease expires, within WithLeaseTTL).
//
// A try takes one free slot, chosen from a random start so that
// concurrent tries spread over the slots: on PostgreSQL and MySQL in one
// statement that stops at the first slot it gets. On PostgreSQL, where
// the handle's notifications can be heard (pgx, or a handle wrapped by
// extra/advisorylockpq; while waiters wait, one listener per handle keeps
// a connection of the pool, or the wrapper's own, and none listens on a
// pool limited to fewer than four), a slot's release notifies, and a
// waiter tries
// every slot when it hears one, else at each poll (WithPollInterval,
// backing off to half a second: a slot freed by a holder whose session
// died sends nothing). Elsewhere (lib/pq unwrapped, MySQL) a wait waits
// server-side on one slot at a time, in slices of a quarter second, and
// tries every slot between slices: a slot freed elsewhere is seen within
// about a slice. On SQLite a wait polls (WithPollInterval).
//
// Every user of a name must give it the same slot count: two semaphores
// on one name with different counts allow the larger count (their slots
// overlap). A semaphore's slots never exclude a Lock of the same name.
// WithMinHold does not apply to semaphores: NewSemaphore refuses it. A
// Semaphore is safe for concurrent use.
type Semaphore struct {
	db   DB
	name string
	keys []int64 // slotKey(name, i)
	lock *Lock   // the configuration, the first-use work, the Observer's view; never locked itself
}

// maxSlots is the most slots a Semaphore may have: a try names every
// slot in one statement.
const maxSlots = 1000

// semaphoreSlice bounds the server-side wait on one slot, after which a
// waiter tries every slot again.
const semaphoreSlice = 250 * time.Millisecond

// slotKey returns the key of a semaphore's slot (see Semaphore).
func slotKey(name string, slot int) int64 {
	h := sha256.New()
	h.Write([]byte(keyDomain + ":slot"))
	h.Write([]byte{0})
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write(strconv.AppendInt(nil, int64(slot), 10))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}

// NewSemaphore returns a Semaphore on name with slots slots. Any string
// but "" is a valid name. It does no I/O (see New): it fails only for a
// nil db, slots below 1 or above 1000 (a try names every slot in one
// statement), or an invalid option set. The first operation picks the
// backend and runs the first-use checks (on PostgreSQL the pooler probe:
// a transaction-mode pooler is refused with ErrTransactionPooler, as for
// a Lock).
func NewSemaphore(db DB, name string, slots int, opts ...Option) (*Semaphore, error) {
	if slots < 1 || slots > maxSlots {
		return nil, wrapErr(name, "new semaphore", fmt.Errorf("advisorylock: a semaphore has from 1 to %d slots, not %d", maxSlots, slots))
	}
	cfg, err := constructed(db, name, "a Semaphore", lockOptions&^(optMinHold|optRunRetention|optMultiplexing), opts)
	if err != nil {
		return nil, wrapErr(name, "new semaphore", err)
	}
	l := newLock(db, name, cfg, kindSemaphore)
	keys := make([]int64, slots)
	for i := range keys {
		keys[i] = slotKey(name, i)
	}
	return &Semaphore{db: db, name: name, keys: keys, lock: l}, nil
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.name }

// Check runs the first-use work now (see NewSemaphore), for a service
// that wants to fail at start-up; later operations skip it.
func (s *Semaphore) Check(ctx context.Context) error { return s.lock.Check(ctx) }

// TryAcquire makes one attempt and returns a Guard on a free slot (its
// Slot says which, and on PostgreSQL and MySQL its WithConn lends the slot's pinned connection), or an error
// matching ErrNotAcquired when every slot is held. As Lock's TryLock, a
// done ctx returns its error without touching the pool, the
// pool checkout waits at most WithPoolWait (then ErrPoolUnavailable), and
// an acquire cancelled even as it is granted closes its connection, which
// frees the slot.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Guard, error) {
	return acquire(ctx, s, "try acquire", false)
}

// Acquire waits until it holds a slot or ctx ends (see Semaphore for how
// it waits); it returns ctx's error when ctx ends first, and a cancelled
// acquire leaves no slot held. To bound the wait, give ctx a deadline
// (context.WithTimeout): running out of it returns an error matching
// context.DeadlineExceeded.
func (s *Semaphore) Acquire(ctx context.Context) (*Guard, error) {
	return acquire(ctx, s, "acquire", true)
}

// Do waits for a slot (as Acquire does), runs fn, and releases the slot
// when fn returns, fails or panics: at most slots calls of fn run at
// once across the fleet. fn learns its slot from its guard:
// GuardFromContext(ctx).Slot(). fn's context is cancelled, with cause
// ErrLockLost, if the slot is lost while fn runs; Do then returns an
// error matching ErrLockLost unless fn returned an error of its own.
// Otherwise Do returns fn's error, or the release's.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	return do(ctx, s.name, s.Acquire, fn)
}

// TryDo runs fn only if a slot is free now. It returns (false, nil) when
// every slot is held, (false, an error matching ErrLockLost) when the slot
// was lost as it was granted (see Lock.Do), and otherwise (true, the error
// Do would return).
func (s *Semaphore) TryDo(ctx context.Context, fn func(ctx context.Context) error) (ran bool, err error) {
	return tryDo(ctx, s.name, s.TryAcquire, fn)
}

// Holders lists the holders of the semaphore's slots, in slot order (each
// with its Slot), and an empty list when none is held. On
// PostgreSQL it reads every slot in one statement, one snapshot (one
// round trip); on MySQL in one statement that asks the slots one after
// another, microseconds apart, so a slot that changes hands within them
// may read with its old holder or its new one (a session that moved from
// one slot to another then reads on both); elsewhere (SQLite) one
// statement per slot, so a slot taken or freed meanwhile may be missing
// or extra. A holder reads as Lock's Holder does.
func (s *Semaphore) Holders(ctx context.Context) ([]*Holder, error) {
	b, err := s.lock.backend(ctx)
	if err != nil {
		return nil, wrapErr(s.name, "holders", err)
	}
	bySlot, err := s.slotHolders(ctx, b)
	if err != nil {
		return nil, wrapErr(s.name, "holders", err)
	}
	holders := []*Holder{}
	for i, h := range bySlot {
		if h != nil {
			h.Name, h.Slot = s.name, i
			holders = append(holders, h)
		}
	}
	return holders, nil
}

// slotHolders reads each slot's holder: in one statement where it can.
func (s *Semaphore) slotHolders(ctx context.Context, b *lockBackend) ([]*Holder, error) {
	if l, ok := b.session.(backend.SlotLocker); ok {
		hs, err := l.KeyHolders(ctx, s.db, s.keys)
		if !errors.Is(err, ErrUnsupported) {
			return holdersOf(hs, err)
		}
	}
	holders := make([]*Holder, len(s.keys))
	for i := range s.keys {
		var err error
		if holders[i], err = s.slot(i).holderOn(ctx, b); err != nil {
			return nil, err
		}
	}
	return holders, nil
}

// observed returns its Lock's (kind "semaphore").
func (s *Semaphore) observed() *observed { return s.lock.observed() }

// settings returns the semaphore's name and configuration (see frontEnd).
func (s *Semaphore) settings() (string, *config) { return s.name, &s.lock.cfg }

// take takes a slot (see frontEnd).
func (s *Semaphore) take(ctx, budget context.Context, wait bool) (*Guard, error) {
	b, err := s.lock.backend(budget)
	if err != nil {
		return nil, err
	}
	if b.rows != nil {
		parts, slot, err := acquireRows(ctx, budget, b.rows, s.db, &s.lock.cfg, rowClaim{reqs: s.rowRequests(), anyOne: true}, wait)
		if err != nil {
			return nil, err
		}
		g := newGuard(parts[0])
		g.slot = slot
		return g, nil
	}
	return acquireSession(ctx, budget, s.lock, b, s.observed(), slotClaim{s, b.session}, wait)
}

// slot returns the Lock that stands for slot i in a hold.
func (s *Semaphore) slot(i int) *Lock {
	return &Lock{db: s.db, name: s.name, key: s.keys[i], cfg: s.lock.cfg, kind: kindSemaphore}
}

// unlockHeld releases l's key on conn; a Semaphore's slot signals its
// waiters where the backend can (see backend.ReleaseSignaler).
func unlockHeld(ctx context.Context, locker backend.SessionLocker, conn *sql.Conn, l *Lock) (backend.SessionResult, error) {
	if m, ok := locker.(backend.ReleaseSignaler); ok && l.kind == kindSemaphore {
		res, err := m.UnlockAndSignal(ctx, conn, l.key, Key(l.name))
		if !errors.Is(err, ErrUnsupported) {
			return res, err
		}
	}
	return locker.UnlockSession(ctx, conn, l.key)
}

// slotClaim is a Semaphore's claim: any one of its slots.
type slotClaim struct {
	s      *Semaphore
	locker backend.SessionLocker
}

// try takes at most one slot, from a random start.
func (c slotClaim) try(ctx context.Context, p *pinned) (int, backend.SessionResult, error) {
	s, locker := c.s, c.locker
	start := rand.N(len(s.keys))
	keys := append(append(make([]int64, 0, len(s.keys)), s.keys[start:]...), s.keys[:start]...)
	type answer struct {
		i   int
		res backend.SessionResult
	}
	a, err := ask(ctx, p, func(ctx context.Context, conn *sql.Conn) (answer, error) {
		i, res, err := tryAny(ctx, locker, conn, keys)
		return answer{i, res}, err
	})
	if err != nil || !a.res.OK {
		return 0, backend.SessionResult{}, err
	}
	return (start + a.i) % len(s.keys), a.res, nil
}

// wait waits until it holds a slot or budget ends: woken by the slots'
// releases where they are heard (see waitWoken), else server-side on one
// slot, chosen at random, for a slice, then trying every slot.
func (c slotClaim) wait(ctx, budget context.Context, p *pinned) (int, backend.SessionResult, error) {
	s := c.s
	var lw *leaseWaiter // the slots' releases (UnlockAndSignal), where heard
	if store, ok := c.locker.(backend.LeaseStore); ok {
		if _, signals := c.locker.(backend.ReleaseSignaler); signals {
			lw = joinReleases(ctx, store, s.db, s.lock.key, "")
			lw.listen() // it waits: its try missed
		}
	}
	if lw != nil {
		slot, res, deaf, err := c.waitWoken(ctx, budget, p, lw)
		lw.leave()
		if !deaf {
			return slot, res, err
		}
	}
	for {
		slot := rand.N(len(s.keys))
		slice, cancel := context.WithTimeout(budget, semaphoreSlice)
		res, err := waitSession(ctx, slice, c.locker, p, s.keys[slot])
		cancel()
		if err != nil || res.OK {
			return slot, res, err
		}
		if budget.Err() != nil {
			return 0, backend.SessionResult{}, nil
		}
		actx, cancel := attemptContext(ctx, budget, sliceGrace)
		slot, res, err = c.try(actx, p)
		cancel()
		if err != nil || res.OK {
			return slot, res, err
		}
	}
}

// waitWoken tries every slot at each release heard and at each poll
// (a slot freed by a dead session sends nothing), until it holds one or
// budget ends; it waits on no slot server-side (another slot's release
// could not cut that short). deaf: nobody can be heard (the watch is
// off), nothing is held, and the wait goes on in slices.
func (c slotClaim) waitWoken(ctx, budget context.Context, p *pinned, lw *leaseWaiter) (slot int, res backend.SessionResult, deaf bool, err error) {
	cfg := &c.s.lock.cfg
	longest := max(cfg.poll, leaseWaitCap)
	poll := time.NewTimer(pollPause(cfg.poll, longest, 0))
	defer poll.Stop()
	for n := 1; ; n++ {
		// A try first: a release between the acquire's first try and the
		// join went unheard.
		actx, cancel := attemptContext(ctx, budget, sliceGrace)
		slot, res, err = c.try(actx, p)
		cancel()
		if err != nil || res.OK {
			return slot, res, false, err
		}
		if lw.w.isOff() {
			return 0, backend.SessionResult{}, true, nil
		}
		select {
		case <-budget.Done():
			return 0, backend.SessionResult{}, false, nil
		case <-lw.wake:
		case <-poll.C:
			poll.Reset(pollPause(cfg.poll, longest, n))
		}
	}
}

// leave: a slot's wait leaves nothing on the session once it has missed
// (waitSession's slices end with the wait).
func (c slotClaim) leave(context.Context, *pinned) error { return nil }

func (c slotClaim) held(slot int) *Lock { return c.s.slot(slot) }

// tryAny takes at most one of keys, in order: in one statement if it can.
func tryAny(ctx context.Context, locker backend.SessionLocker, conn *sql.Conn, keys []int64) (int, backend.SessionResult, error) {
	if a, ok := locker.(backend.SlotLocker); ok {
		i, res, err := a.TryLockAny(ctx, conn, keys)
		if !errors.Is(err, ErrUnsupported) {
			return i, res, err
		}
	}
	for i, key := range keys {
		res, err := locker.TryLockSession(ctx, conn, key)
		if err != nil || res.OK {
			return i, res, err
		}
	}
	return 0, backend.SessionResult{}, nil
}

// rowRequests are the lease requests of the slots where slots are rows.
func (s *Semaphore) rowRequests() []backend.LeaseRequest {
	reqs := make([]backend.LeaseRequest, len(s.keys))
	for i := range reqs {
		reqs[i] = s.rowRequest(i)
	}
	return reqs
}

// rowRequest is the lease request of slot i where slots are rows.
func (s *Semaphore) rowRequest(i int) backend.LeaseRequest {
	cfg := &s.lock.cfg
	return backend.LeaseRequest{Kind: backend.KindLock, Name: s.name, Key: s.keys[i], TTL: cfg.ttl, Now: cfg.clock.Now()}
}
