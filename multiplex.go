package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Multiplexing (WithMultiplexing; New's and NewSet's default where the
// backend is a backend.MultiplexLocker): the session locks of every Lock
// on one *sql.DB with the same settings share a few pinned connections,
// each of whose sessions holds many locks. The rules:
//
//   - One statement at a time runs on a shared session (its mu), and no
//     caller's context can end one: a cancelled statement may cost the
//     connection, and with it every lock on it. Statements are bounded
//     by the release timeout instead; one that gets no answer by then
//     ends the session.
//   - A key is held at most once per pool (held): a session lock is
//     reentrant on its session, so a second try of a key this process
//     holds, or is trying, would be granted again. It is a miss without
//     a round trip.
//   - A session whose state is unknown (a statement failed or got no
//     answer, or the keep-alive could not ask) is ended: every lock on it
//     is told it is lost, and then its connection is discarded, which
//     frees them on the server. No lock on another session is touched.
//   - A session that holds no lock and runs no statement goes back to the
//     pool (retire); one keep-alive per session asks, in one statement,
//     which of its keys it still holds (backend.MultiplexLocker).
//
// A wait (Lock, LockTimeout) tries on a shared session first, then waits
// server-side on a connection of its own, which holds the lock if granted
// there: it hands off within a round trip, where a poll would not.

// muxKey names the sessions that Locks may share: the same handle, the
// same backend and settings on the sessions, the same keep-alive and
// bound on statements.
type muxKey struct {
	db        DB
	backend   string
	settings  sessionSettings
	keepAlive time.Duration
	timeout   time.Duration
	size      int
}

// muxPools are the shared sessions in use, by muxKey. A pool leaves it
// when its last session is retired, so an idle handle keeps nothing here.
var muxPools = struct {
	mu sync.Mutex
	m  map[muxKey]*muxPool
}{m: map[muxKey]*muxPool{}}

// muxPool is the shared sessions of one muxKey.
type muxPool struct {
	key     muxKey
	locker  backend.MultiplexLocker
	bounded bool
	logger  *slog.Logger
	obs     *observed // told of discards: the first Lock's that opened a session

	mu       sync.Mutex
	sessions []*muxSession
	opening  int                // sessions being opened
	opened   chan struct{}      // closed when an opening ends (made by the first to wait)
	held     map[int64]*muxHold // keys held, or being tried (nil), on this pool's sessions
	private  bool               // not in muxPools (a handle that is not comparable)
	left     bool               // taken out of muxPools: a Lock that finds it so asks again
}

// muxSession is one shared pinned connection.
type muxSession struct {
	pool *muxPool
	p    pinned

	mu sync.Mutex // one statement at a time; held through each statement

	// Under pool.mu:
	holds    map[int64]*muxHold
	inflight int  // callers that chose it and have not finished their statement
	ended    bool // its connection is discarded or back in the pool
	timer    *time.Timer
	busy     bool     // an op leads a statement on it (see exec)
	queue    []*muxOp // ops waiting for the next statement
}

// muxOp is one statement that a Lock wants on a shared session: a try,
// or the unlock of a hold. While a statement runs on the session, the ops
// that come queue, and the next statement carries them all where the
// backend is a backend.BatchLocker (see exec); a set's runs alone.
type muxOp struct {
	key   int64
	name  string
	grant *muxHold        // a try's hold, registered on s if granted
	hold  *muxHold        // the hold an unlock frees; nil for a try
	claim claim           // a try's, for its statement on its own
	ctx   context.Context // a try's caller's (its values; never its end)

	ok   bool          // granted, or freed
	err  error         // the statement's, errSessionEnded, or a full lock table's
	done chan struct{} // closed once answered, or to make it lead the next statement
	lead bool
}

// muxHold is a lock held on a shared session: one key, or a set's.
type muxHold struct {
	hold
	s    *muxSession
	keys []int64
}

// newMuxPool returns the pool of l's shared sessions on lb (see
// WithMultiplexing): one of its own where l's handle cannot be a map key,
// else nil, for muxPoolFor to find the one that l shares.
func newMuxPool(l *Lock, lb *lockBackend) *muxPool {
	if reflect.TypeOf(l.db).Comparable() {
		return nil
	}
	mp := muxPoolOf(l, lb, muxKeyOf(l, lb))
	mp.private = true
	return mp
}

// muxKeyOf is the muxKey of l's sessions on lb.
func muxKeyOf(l *Lock, lb *lockBackend) muxKey {
	return muxKey{db: l.db, backend: lb.session.Name(), settings: lb.settings, keepAlive: l.cfg.keepAlive, timeout: l.cfg.releaseTimeout, size: l.cfg.multiplex}
}

// muxPoolOf makes the pool of key for l's sessions on lb.
func muxPoolOf(l *Lock, lb *lockBackend, key muxKey) *muxPool {
	return &muxPool{key: key, locker: lb.session.(backend.MultiplexLocker), bounded: lb.bounded, logger: l.cfg.log(),
		obs: l.observedAs(false), held: map[int64]*muxHold{}}
}

// muxPoolFor returns the pool of the sessions that l, with lb, shares.
func muxPoolFor(l *Lock, lb *lockBackend) *muxPool {
	if lb.privateMux != nil {
		return lb.privateMux
	}
	k := muxKeyOf(l, lb)
	muxPools.mu.Lock()
	defer muxPools.mu.Unlock()
	mp := muxPools.m[k]
	if mp == nil {
		mp = muxPoolOf(l, lb, k)
		muxPools.m[k] = mp
	}
	return mp
}

// errMuxHeldHere is the miss of a key that this process already holds, or
// is trying, on a shared session.
var errMuxHeldHere = fmt.Errorf("%w (held in this process, on a shared session)", ErrNotAcquired)

// pgOutOfSharedMemory is PostgreSQL's SQLSTATE for a full lock table.
const pgOutOfSharedMemory = "53200"

// errSessionEnded is the error of a statement whose shared session ended
// before it could run: the caller chooses another.
var errSessionEnded = errors.New("advisorylock: the shared session ended")

// tryMux makes one attempt on a shared session of l's pool: a Guard, or
// ErrNotAcquired.
func (l *Lock) tryMux(ctx, budget context.Context, lb *lockBackend) (*Guard, error) {
	mp := muxPoolFor(l, lb)
	mp.mu.Lock()
	for mp.left { // it went idle as we found it
		mp.mu.Unlock()
		mp = muxPoolFor(l, lb)
		mp.mu.Lock()
	}
	keys := l.keysOf()
	for _, k := range keys {
		if _, ok := mp.held[k]; ok {
			mp.mu.Unlock()
			return nil, errMuxHeldHere
		}
	}
	for _, k := range keys {
		mp.held[k] = nil // this try's, until it ends
	}
	mp.mu.Unlock()
	claim := l.claimOn(mp.locker, nil)
	for {
		s, err := mp.choose(budget, l)
		if err != nil {
			mp.unreserve(keys)
			return nil, err
		}
		// The try is an op of s's next statement; s's inflight counts it.
		h := s.newHold(l)
		op := &muxOp{key: l.key, name: l.name, grant: h, ctx: ctx, claim: claim}
		s.exec(op)
		switch {
		case errors.Is(op.err, errSessionEnded):
			continue // another session; the keys stay reserved
		case op.err != nil:
			mp.unreserve(keys)
			return nil, op.err
		case !op.ok:
			mp.unreserve(keys)
			return nil, ErrNotAcquired
		case ctx.Err() != nil:
			// Granted as the caller went away: let it go again.
			_ = h.release(context.Background(), h.relTO)
			return nil, context.Cause(ctx)
		}
		return newGuard(&h.hold), nil
	}
}

// unreserve ends a try's claim on keys that did not become a hold.
func (mp *muxPool) unreserve(keys []int64) {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	for _, k := range keys {
		if h, ok := mp.held[k]; ok && h == nil {
			delete(mp.held, k)
		}
	}
	mp.leaveIfIdle()
}

// choose returns a session for one statement, counted in its inflight:
// one with no statement in flight, else a new one while the pool has fewer
// than its size, else the least busy. A new session's connection comes
// from the handle's pool like any acquire's (WithPoolWait); if none comes
// and the pool has a session, that one is used.
func (mp *muxPool) choose(budget context.Context, l *Lock) (*muxSession, error) {
	size := mp.size()
	mp.mu.Lock()
	for {
		var best *muxSession
		for _, s := range mp.sessions {
			if best == nil || s.inflight < best.inflight {
				best = s
			}
		}
		full := len(mp.sessions)+mp.opening >= size
		if best != nil && (best.inflight == 0 || full) {
			best.inflight++
			mp.mu.Unlock()
			return best, nil
		}
		if !full {
			break
		}
		// Every session is being opened: wait for one.
		if mp.opened == nil {
			mp.opened = make(chan struct{})
		}
		opened := mp.opened
		mp.mu.Unlock()
		select {
		case <-opened:
		case <-budget.Done():
			return nil, context.Cause(budget)
		}
		mp.mu.Lock()
	}
	mp.opening++
	mp.mu.Unlock()

	s := &muxSession{pool: mp, p: pinned{bounded: mp.bounded, obs: mp.obs}, holds: map[int64]*muxHold{}}
	cg, err := checkout(budget, l.db, &s.p, l.cfg.poolWait)
	mp.mu.Lock()
	defer mp.mu.Unlock()
	mp.opening--
	if mp.opened != nil {
		close(mp.opened)
		mp.opened = nil
	}
	if err != nil {
		if len(mp.sessions) > 0 && budget.Err() == nil {
			s := mp.sessions[0]
			s.inflight++
			return s, nil
		}
		mp.leaveIfIdle()
		return nil, err
	}
	cg.take()
	s.inflight = 1
	mp.sessions = append(mp.sessions, s)
	return s, nil
}

// size is how many sessions mp may keep: WithMultiplexing's count, but
// fewer than the handle's SetMaxOpenConns limit (and at least one), so
// that sessions holding locks leave the pool a connection. The limit is
// read at each choice: it may be set after New.
func (mp *muxPool) size() int {
	if limit := dbutil.MaxOpenConns(mp.key.db); limit > 0 && mp.key.size >= limit {
		return max(limit-1, 1)
	}
	return mp.key.size
}

// leaveIfIdle takes mp out of muxPools once it has no session and nothing
// under way. mp.mu is held.
func (mp *muxPool) leaveIfIdle() {
	if mp.private || mp.left || len(mp.sessions) > 0 || mp.opening > 0 || len(mp.held) > 0 {
		return
	}
	mp.left = true
	muxPools.mu.Lock()
	if muxPools.m[mp.key] == mp {
		delete(muxPools.m, mp.key)
	}
	muxPools.mu.Unlock()
}

// newHold returns l's hold on s, not yet registered (see addHold).
func (s *muxSession) newHold(l *Lock) *muxHold {
	h := &muxHold{s: s, keys: l.keysOf()}
	h.hold = hold{name: l.name, key: l.key, logger: l.cfg.log(), relTO: l.cfg.releaseTimeout, end: h}
	return h
}

// addHold registers h on s and its pool, and starts s's keep-alive if it
// is not running. mp.mu is held.
func (s *muxSession) addHold(h *muxHold) {
	mp := s.pool
	for _, k := range h.keys {
		s.holds[k] = h
		mp.held[k] = h
	}
	if s.timer == nil && mp.key.keepAlive > 0 {
		s.timer = time.AfterFunc(mp.key.keepAlive, s.check)
	}
}

// dropHold unregisters h, where it is still s's, and then ends a
// caller's statement on s (see done). mp.mu is held.
func (s *muxSession) dropHold(h *muxHold) {
	for _, k := range h.keys {
		if s.holds[k] == h {
			delete(s.holds, k)
			delete(s.pool.held, k)
		}
	}
	s.done()
}

// exec runs op on s: it waits for the statement in flight on s, if any,
// and goes in the next, with every op that queued by then (one of them
// leads it). The ops with nothing left to do on s settle first (see
// settled); the rest go in one statement where the backend batches
// (backend.BatchLocker), else one statement each. What it buys:
// throughput where many goroutines share few sessions. A session runs one
// statement at a time, so with 32 goroutines on 4 sessions each try and
// release waited for up to 7 others' round trips; batched, one round trip
// answers them all (BenchmarkPeers/throughput, 32 goroutines over 256
// names, WithMultiplexing(4); see benchmarks/README.md for the figures).
func (s *muxSession) exec(op *muxOp) {
	mp := s.pool
	op.done = make(chan struct{})
	mp.mu.Lock()
	if s.busy {
		s.queue = append(s.queue, op)
		mp.mu.Unlock()
		<-op.done
		if !op.lead {
			return // answered
		}
		mp.mu.Lock()
	}
	s.busy = true
	mp.mu.Unlock()

	s.mu.Lock()
	mp.mu.Lock()
	batch := append([]*muxOp{op}, s.queue...)
	s.queue = nil
	mp.mu.Unlock()
	live := slices.DeleteFunc(slices.Clone(batch), s.settled)
	if bl, ok := mp.locker.(backend.BatchLocker); ok && len(live) > 1 {
		live = s.runBatch(bl, live)
	}
	for _, o := range live { // one statement each
		if s.settled(o) { // an op before it ended s
			continue
		}
		var ok bool
		var err error
		if o.hold == nil {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(o.ctx), mp.key.timeout)
			var res backend.SessionResult
			_, res, err = o.claim.try(sctx, &s.p)
			ok = res.OK
			cancel()
		} else {
			err = unlockKeys(context.Background(), mp.locker, &s.p, o.hold.keys, mp.key.timeout)
			ok = err == nil
		}
		s.settle(o, ok, err)
	}
	mp.mu.Lock()
	var next *muxOp
	if len(s.queue) > 0 {
		next, s.queue = s.queue[0], s.queue[1:]
	} else {
		s.busy = false
	}
	mp.mu.Unlock()
	s.mu.Unlock()
	for _, o := range batch[1:] {
		close(o.done)
	}
	if next != nil {
		next.lead = true
		close(next.done)
	}
}

// runBatch runs ops on s in one statement, and returns those left to run
// one statement each: all of them where the backend could not batch them
// (nothing was sent), those the statement may not have done where the
// server's lock table was full. s.mu is held.
func (s *muxSession) runBatch(bl backend.BatchLocker, ops []*muxOp) []*muxOp {
	mp := s.pool
	if slices.ContainsFunc(ops, (*muxOp).ofSet) {
		return ops // a set's statement may take some of its keys: it runs alone
	}
	var tries, unlocks []int64
	for _, o := range ops {
		if o.hold == nil {
			tries = append(tries, o.key)
		} else {
			unlocks = append(unlocks, o.key)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), mp.key.timeout)
	defer cancel()
	type answer struct{ granted, freed []bool }
	a, err := ask(ctx, &s.p, func(ctx context.Context, conn *sql.Conn) (answer, error) {
		g, f, err := bl.TryUnlock(ctx, conn, tries, unlocks)
		return answer{g, f}, err
	})
	if errors.Is(err, ErrUnsupported) {
		return ops
	}
	recovered := false
	if err != nil && dbutil.SQLState(err) == pgOutOfSharedMemory && !s.p.abandoned.Load() {
		// The server's lock table is full, and the session answered:
		// ask it what the statement did, and run what it did not alone.
		held, herr := ask(ctx, &s.p, func(ctx context.Context, conn *sql.Conn) ([]bool, error) {
			return mp.locker.HeldKeys(ctx, conn, append(slices.Clip(tries), unlocks...))
		})
		if herr == nil && len(held) == len(tries)+len(unlocks) {
			a = answer{held[:len(tries)], make([]bool, len(unlocks))}
			for j := range unlocks {
				a.freed[j] = !held[len(tries)+j]
			}
			err, recovered = nil, true
		}
	}
	var rest []*muxOp
	i, j := 0, 0
	for _, o := range ops {
		var done bool
		if o.hold == nil {
			done = err == nil && a.granted[i]
			i++
		} else {
			done = err == nil && a.freed[j]
			j++
		}
		switch {
		case err != nil:
			s.settle(o, false, err)
		case done:
			s.settle(o, true, nil)
		case recovered:
			rest = append(rest, o)
		case o.hold == nil:
			s.settle(o, false, nil)
		default:
			s.settle(o, false, fmt.Errorf("advisorylock: the session did not hold key %d", o.key))
		}
	}
	return rest
}

// ofSet reports whether o is a set's try or unlock.
func (o *muxOp) ofSet() bool {
	h := o.hold
	if h == nil {
		h = o.grant
	}
	return len(h.keys) > 1
}

// settled settles o, and reports true, where it has nothing to do on s:
// a try on an ended session (the caller chooses another), an unlock of a
// hold that s no longer has (lost, and told). s.mu is held.
func (s *muxSession) settled(o *muxOp) bool {
	mp := s.pool
	mp.mu.Lock()
	defer mp.mu.Unlock()
	switch {
	case s.ended && o.hold == nil:
		o.err = errSessionEnded
	case s.ended || o.hold != nil && s.holds[o.hold.keys[0]] != o.hold:
	default:
		return false
	}
	s.done()
	return true
}

// settle records what o's statement did: a granted try's hold is s's
// (or, where s has ended meanwhile, the try is to go to another
// session); an unlock's hold leaves s; a failed statement ends s (see
// the rules above), except a try refused for a full lock table. Then o is
// no longer in flight. s.mu is held.
func (s *muxSession) settle(o *muxOp, ok bool, err error) {
	mp := s.pool
	switch {
	case err != nil && o.hold == nil && !o.ofSet() && dbutil.SQLState(err) == pgOutOfSharedMemory && !s.p.abandoned.Load():
		// The try of one key took nothing, and the session, which
		// answered, is as it was. (A set's may have taken some keys.)
		err = fmt.Errorf("%w (the server's lock table holds at least max_locks_per_transaction × (server processes + max_prepared_transactions) locks, shared with table locks; raise max_locks_per_transaction to hold more at once)", err)
	case err != nil && o.hold == nil:
		// The session may hold the key now, or be mid-statement: end it.
		s.end(CauseSessionEnded, fmt.Errorf("%w: a try of %q on its shared session failed: %w", ErrLockLost, o.name, err))
	case err != nil:
		s.end(CauseSessionEnded, fmt.Errorf("%w: the unlock of %q on its shared session failed, so the session is ended: %w", ErrLockLost, o.name, err))
	}
	o.ok, o.err = ok && err == nil, err
	mp.mu.Lock()
	defer mp.mu.Unlock()
	switch {
	case o.hold != nil:
		s.dropHold(o.hold)
	case o.ok && s.ended:
		s.inflight--
		o.ok, o.err = false, errSessionEnded // its grant ended with the session
	case o.ok:
		s.inflight--
		s.addHold(o.grant)
	default:
		s.done()
	}
}

// done ends a caller's statement on s: it is no longer in flight, and s
// goes back to the handle's pool if it now holds nothing. mp.mu is held.
func (s *muxSession) done() {
	s.inflight--
	s.retireIfIdle()
}

// retireIfIdle hands s's connection back to the handle's pool when it
// holds no lock and no caller is about to run a statement on it: its
// session holds none of ours. s.mu and mp.mu are held.
func (s *muxSession) retireIfIdle() {
	mp := s.pool
	if s.ended || len(s.holds) > 0 || s.inflight > 0 {
		return
	}
	s.ended = true
	mp.sessions = slices.DeleteFunc(mp.sessions, func(o *muxSession) bool { return o == s })
	if s.timer != nil {
		s.timer.Stop()
	}
	dbutil.Recycle(s.p.conn)
	mp.leaveIfIdle()
}

// end ends s, whose state is unknown: every lock on it is told it is lost
// (with err, for cause), and then its connection is discarded (for the
// same cause), which frees them. s.mu is held.
func (s *muxSession) end(cause Cause, err error) {
	mp := s.pool
	mp.mu.Lock()
	if s.ended {
		mp.mu.Unlock()
		return
	}
	s.ended = true
	mp.sessions = slices.DeleteFunc(mp.sessions, func(o *muxSession) bool { return o == s })
	var holds []*muxHold
	for k, h := range s.holds {
		if h.keys[0] == k { // once per hold
			holds = append(holds, h)
		}
		delete(mp.held, k)
	}
	clear(s.holds)
	if s.timer != nil {
		s.timer.Stop()
	}
	mp.mu.Unlock()
	if len(holds) > 0 {
		mp.logger.Warn("advisorylock: shared session ended; its locks are lost", "locks", len(holds), "err", err)
	}
	for _, h := range holds {
		h.lose(cause, err)
	}
	s.p.discard(cause, err)
	mp.mu.Lock()
	mp.leaveIfIdle()
	mp.mu.Unlock()
}

// release frees the lock on its shared session. A lock already lost has
// nothing left to free. An unlock whose outcome is unknown ends the
// session (see end). ctx never ends (see doRelease).
func (h *muxHold) release(context.Context, time.Duration) error {
	s := h.s
	mp := s.pool
	mp.mu.Lock()
	if s.ended || s.holds[h.keys[0]] != h {
		mp.mu.Unlock()
		// Lost: whoever found it so (end, check) holds s.mu until it
		// has told every lock and dealt with the connection.
		s.mu.Lock()
		s.mu.Unlock() //lint:ignore SA2001 the empty section waits for the loss's end
		return nil
	}
	s.inflight++
	mp.mu.Unlock()
	op := &muxOp{key: h.key, name: h.name, hold: h}
	s.exec(op)
	return op.err
}

// forget releases a forgotten Guard's lock in a goroutine of its own (it
// runs in the runtime's cleanup goroutine, which must not wait on I/O):
// discarding the connection, as a pinned lock's cleanup does, would end
// its neighbours too.
func (h *muxHold) forget() {
	go func() { _ = h.release(context.Background(), h.relTO) }()
}

// check is s's keep-alive: one statement asks which of its keys the
// session still holds. A lock it no longer holds is lost; a session that
// cannot be asked is ended, and all its locks with it.
func (s *muxSession) check() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkLocked()
}

// checkLocked is check's statement and what it finds, with s.mu held:
// the keep-alive's, and WithConn's once fn has returned.
func (s *muxSession) checkLocked() {
	mp := s.pool
	mp.mu.Lock()
	if s.ended || len(s.holds) == 0 {
		s.timer = nil
		mp.mu.Unlock()
		return
	}
	keys := make([]int64, 0, len(s.holds))
	for k := range s.holds {
		keys = append(keys, k)
	}
	mp.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), mp.key.timeout)
	held, err := ask(ctx, &s.p, func(ctx context.Context, conn *sql.Conn) ([]bool, error) {
		return mp.locker.HeldKeys(ctx, conn, keys)
	})
	timedOut := ctx.Err() != nil
	cancel()
	if err == nil && len(held) != len(keys) {
		err = fmt.Errorf("advisorylock: HeldKeys answered %d of %d keys", len(held), len(keys))
	}
	if err != nil {
		cause := CauseSessionEnded
		if timedOut {
			cause = CauseNoAnswer
		}
		s.end(cause, fmt.Errorf("%w: %w", ErrLockLost, err))
		return
	}
	// A hold is gone when any of its keys is; a set's others are let go.
	var gone []*muxHold
	var rest []int64
	mp.mu.Lock()
	for i, k := range keys {
		if h := s.holds[k]; !held[i] && h != nil {
			gone = append(gone, h)
			for _, hk := range h.keys {
				delete(s.holds, hk)
				delete(mp.held, hk)
				if j := slices.Index(keys, hk); j >= 0 && held[j] {
					rest = append(rest, hk)
				}
			}
		}
	}
	mp.mu.Unlock()
	for _, h := range gone {
		h.warn("advisorylock: lock lost", "lock", h.name, "key", h.key, "err", "session no longer holds it")
		h.lose(CauseNotHeld, fmt.Errorf("%w: session no longer holds it", ErrLockLost))
	}
	if len(rest) > 0 {
		if err := unlockKeys(context.Background(), mp.locker, &s.p, rest, mp.key.timeout); err != nil {
			s.end(CauseSessionEnded, fmt.Errorf("%w: the unlock of a lost set's other keys on its shared session failed, so the session is ended: %w", ErrLockLost, err))
			return
		}
	}
	mp.mu.Lock()
	defer mp.mu.Unlock()
	switch {
	case len(s.holds) == 0:
		if s.timer != nil {
			s.timer.Stop()
		}
		s.timer = nil
		s.retireIfIdle()
	case s.timer != nil: // nil without a keep-alive (WithKeepAlive(0))
		s.timer.Reset(mp.key.keepAlive)
	}
}

// lend lends h's shared session to WithConn's fn under s.mu, so that no
// other statement runs on the session meanwhile (see takeBack); it fails
// once h was released or lost, and when ctx ends first.
func (h *muxHold) lend(ctx context.Context) (*lentConn, error) {
	s := h.s
	if err := lockBy(ctx, &s.mu); err != nil {
		return nil, err
	}
	s.pool.mu.Lock()
	held := !s.ended && s.holds[h.keys[0]] == h
	if held {
		s.inflight++ // a session of its own for a try that fn makes, where the pool may open one
	}
	s.pool.mu.Unlock()
	if !held {
		s.mu.Unlock()
		if _, lost := h.isLost(); lost != nil {
			return nil, lost
		}
		return nil, fmt.Errorf("%w: released", ErrLockLost)
	}
	c := newLentConn(s.p.conn)
	c.enter() // cannot be over: it has just begun
	return c, nil
}

// takeBack ends c's lending once fn has returned: what fn left open is
// ended (see lentConn.end), and then, s.mu still held, the keep-alive
// check runs, so that a lock that fn freed, or a session that fn broke,
// is told before the session runs anything else; a session whose state
// is unknown is ended. It returns the error of ending what fn left open.
func (h *muxHold) takeBack(c *lentConn) error {
	s := h.s
	defer s.mu.Unlock()
	s.pool.mu.Lock()
	s.inflight--
	s.pool.mu.Unlock()
	c.leave()
	err := c.end()
	dbutil.ForgetSession(s.p.conn) // fn may have changed its settings
	if err != nil {
		s.end(CauseSessionEnded, fmt.Errorf("%w: ending what WithConn's fn left open on the shared session: %w", ErrLockLost, err))
		return err
	}
	s.checkLocked()
	return nil
}

// lockBy locks mu, unless ctx ends first: then it returns ctx's cause,
// and mu, once a goroutine has locked it, is unlocked again.
func lockBy(ctx context.Context, mu *sync.Mutex) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	locked := make(chan struct{})
	go func() {
		mu.Lock()
		close(locked)
	}()
	select {
	case <-locked:
		return nil
	case <-ctx.Done():
		go func() {
			<-locked
			mu.Unlock()
		}()
		return context.Cause(ctx)
	}
}
