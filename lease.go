package advisorylock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Schema returns the DDL of the tables that backend b keeps (leases, the
// SQLite lock rows, fences), for teams that run schema changes through
// their own migration tool. The package also creates them on first use.
// It returns "" for a backend without tables.
func Schema(b backend.Backend) string {
	if s, ok := b.(backend.LeaseStore); ok {
		return s.Schema()
	}
	return ""
}

// checkTables, where b can (a TableChecker), creates b's tables if they
// are missing and proves the role may read and write tables (names of the
// library's own), so that Check refuses a missing grant as the first
// operation would.
func checkTables(ctx context.Context, db DB, b backend.Backend, tables ...string) error {
	if s, ok := b.(backend.TableChecker); ok {
		return s.CheckTables(ctx, db, tables...)
	}
	return nil
}

// The lease schedule. A holder renews every TTL/3. It keeps a local
// deadline of TTL minus one renew interval, measured on its own clock from
// the moment the acquire or renew statement was sent, so it believes the
// lease lost before the database can grant it to anyone else. After a
// failed renew it retries sooner, until the deadline.
func renewInterval(ttl time.Duration) time.Duration { return ttl / 3 }

func localDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - renewInterval(ttl))
}

// leaseState is a held lease: its request, its local deadline and its
// keeper. It never points at the Guard that owns it.
type leaseState struct {
	store backend.LeaseStore
	db    DB
	req   backend.LeaseRequest
	clock clockFunc
	hold  // the Guard's state; leaseState is its end

	mu       sync.Mutex
	deadline time.Time
	starter  *time.Timer // starts keep at the first renewal
	stopped  bool
	quit     chan struct{} // made when keep starts
	done     chan struct{}
}

// ownerLabel makes the owner label of one acquire: the configured label
// (or host:pid) and a random suffix, so no two acquires share an owner.
func ownerLabel(label string) string {
	if label == "" {
		label = hostPID()
	}
	var r [8]byte
	_, _ = rand.Read(r[:])
	var x [16]byte
	hex.Encode(x[:], r[:])
	var b strings.Builder
	b.Grow(len(label) + 1 + len(x))
	b.WriteString(label)
	b.WriteByte('/')
	b.Write(x[:])
	return b.String()
}

// hostPID is this process's default owner label, host:pid.
var hostPID = sync.OnceValue(func() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
})

// acquireLease takes a lease row: one attempt, or (wait) attempts until
// budget ends, waiting for the row to read free between them.
func acquireLease(ctx, budget context.Context, store backend.LeaseStore, db DB, cfg *config, req backend.LeaseRequest, wait bool) (*leaseState, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if _, shared := store.(backend.SharedRowStore); wait && req.Kind == backend.KindLock && shared {
		return claimLease(ctx, budget, store, db, cfg, req)
	}
	var lw *leaseWaiter // nil: releases are not heard, and waiting is polling
	if wait && req.Kind == backend.KindLease {
		queue, queues := store.(backend.LeaseQueuer)
		queues = queues && cfg.minHold == 0
		owner := ""
		if queues {
			owner = ownerLabel(cfg.owner)
		}
		// Joined before the first attempt, so that a release after it
		// misses is heard (see releaseWatch).
		if lw = joinReleases(ctx, store, db, req.Key, owner); lw != nil {
			defer lw.leave()
		}
		if s := sleeper(store, db); queues && (lw != nil || s != nil) {
			req.Owner = owner
			return waitInLine(ctx, budget, queue, db, cfg, req, lw, s)
		}
	}
	for {
		s, err := tryLease(ctx, budget, store, db, cfg, req)
		if !wait || !errors.Is(err, ErrNotAcquired) {
			return s, err
		}
		lw.listen()
		if err := waitUntilFree(budget, store, db, cfg, req, lw.wakes()); err != nil {
			return nil, err
		}
	}
}

// inLine is a LeaseLock waiter that queues (see waitInLine).
type inLine struct {
	store   backend.LeaseQueuer
	db      DB
	cfg     *config
	req     backend.LeaseRequest // Owner set for the whole wait
	lw      *leaseWaiter         // where releases are heard; nil where they are not
	placed  time.Time            // when the last place the store confirmed was sent; zero before one
	queued  bool                 // that place is believed live
	token   FencingToken         // the token of its grant
	moved   bool                 // a later place drew another token: a grant heard may be an earlier place's
	cannot  bool                 // the store said it keeps no places (ErrUnsupported): wait as acquireLease does
	asked   bool                 // a place was asked for, so a wait that ends withdraws it
	sleeper backend.LeaseSleeper // where it may sleep in line once releases are known unheard; nil once it cannot
	conn    *sql.Conn            // the connection it sleeps in line on, kept until the wait ends
	slot    chan struct{}        // the sleepers' slot it holds while it keeps conn
}

// sleeper returns store as a backend.LeaseSleeper where a waiter on db may sleep
// in line: the store can, and db's pool can spare the connection the
// waiter keeps (see sparesAConn).
func sleeper(store backend.LeaseStore, db DB) backend.LeaseSleeper {
	s, ok := store.(backend.LeaseSleeper)
	if !ok || !sparesAConn(db) {
		return nil
	}
	return s
}

// maxSleepers bounds the waiters that sleep in line at once on one
// *sql.DB, each on a connection of its own: a quarter of a limited pool,
// so that holders' releases still find connections, and at most
// maxSleepersUnlimited, so that a thousand waiting keys do not take a
// thousand server connections. The waiters beyond it poll.
func maxSleepers(db DB) int {
	if n := dbutil.MaxOpenConns(db); n > 0 {
		return max(n/4, 1)
	}
	return maxSleepersUnlimited
}

const maxSleepersUnlimited = 16

// sleepSlots returns db's sleepers' slots (see maxSleepers): a channel
// that holds one value per waiter sleeping in line.
func sleepSlots(ctx context.Context, db DB) chan struct{} {
	slots, _ := dbutil.CachedVerdict(ctx, db, "sleepers in line", func(context.Context) (chan struct{}, error) {
		return make(chan struct{}, maxSleepers(db)), nil
	})
	return slots
}

// waitInLine is acquireLease for a LeaseLock waiter that hears releases
// on a store whose waiters queue (backend.LeaseQueuer). After a miss it takes the
// place next in line, renewing it every renew interval while it waits,
// and the holder's release hands it the lease: told so by the release's
// signal, or else by reading the row at its next wake or poll, it holds
// the lease without a statement of its own. Its local deadline counts
// from when it sent the place the release consumed, the last one the
// store confirmed (a renewal after a handover finds the lease its own and
// fails): the grant expires when that place does, on the database's
// clock. Between wakes it polls as waitUntilFree does, reading before it
// writes. Where releases are not heard (lw is nil, or its watch is off)
// and the store can (s, not nil: see sleeper), it sleeps in line on the
// server instead, on a connection it keeps for the whole wait, and the release
// that hands it the lease wakes it. A wait that ends without the lease
// withdraws the place, and frees a lease handed over meanwhile.
func waitInLine(ctx, budget context.Context, store backend.LeaseQueuer, db DB, cfg *config, req backend.LeaseRequest, lw *leaseWaiter, s backend.LeaseSleeper) (_ *leaseState, err error) {
	l := &inLine{store: store, db: db, cfg: cfg, req: req, lw: lw, sleeper: s}
	defer func() { l.letGo(err == nil) }()
	longest := max(cfg.poll, leaseWaitCap)
	poll := time.NewTimer(time.Hour)
	defer poll.Stop()
	woken, wokenGranted := true, false // the first pass tries at once
	for n := 0; ; n++ {
		granted, passed := lw.heard()
		s, h, err := l.pass(ctx, budget, woken, granted || wokenGranted, woken && passed)
		if !errors.Is(err, ErrNotAcquired) {
			if err != nil {
				l.withdraw(ctx)
			}
			return s, err
		}
		lw.listen()
		if woken, wokenGranted, err = l.wait(budget, l.pause(h, pollPause(cfg.poll, longest, n)), poll); err != nil {
			l.withdraw(ctx)
			return nil, err
		}
	}
}

// wait waits up to pause for the next pass: asleep in line where the
// waiter sleeps (see waitInLine), else until a release is heard (woken).
// A sleep that the handover ends reports woken and granted; a sleeper
// whose connection failed polls from then on.
func (l *inLine) wait(budget context.Context, pause time.Duration, poll *time.Timer) (woken, granted bool, err error) {
	if l.queued && l.conn != nil && l.sleeps() {
		req := l.req
		req.Token = uint64(l.token)
		sleep, cancel := context.WithTimeout(budget, pause+sliceGrace) // as a session wait's slice: only a dead network takes that long
		granted, err := l.sleeper.SleepInLine(sleep, l.db, l.conn, req, pause)
		cancel()
		switch {
		case err == nil:
			return granted, granted, nil
		case budget.Err() != nil:
			return false, false, context.Cause(budget)
		}
		l.stopSleeping()
		return false, false, nil
	}
	poll.Reset(pause)
	select {
	case <-budget.Done():
		return false, false, context.Cause(budget)
	case <-l.lw.wakes():
		return true, false, nil
	case <-poll.C:
		return false, false, nil
	}
}

// keepConn takes the connection the waiter will sleep in line on, and a
// sleepers' slot for it; without either it polls.
func (l *inLine) keepConn(budget context.Context) error {
	slots := sleepSlots(budget, l.db)
	select {
	case slots <- struct{}{}:
	default:
		l.sleeper = nil // enough sleep already
		return nil
	}
	c, err := dbutil.TakeConn(budget, l.db)
	if err != nil {
		<-slots
		l.sleeper = nil
		if budget.Err() != nil {
			return context.Cause(budget)
		}
		return nil
	}
	l.conn, l.slot = c, slots
	return nil
}

// stopSleeping gives up the kept connection (closed in the background:
// a sleep cut short may still run on it) and its slot; the waiter polls
// from then on.
func (l *inLine) stopSleeping() {
	go dbutil.Discard(l.conn)
	<-l.slot
	l.conn, l.slot, l.sleeper = nil, nil, nil
}

// sleeps reports whether the waiter sleeps in line: it may, and releases
// are not heard.
func (l *inLine) sleeps() bool {
	return l.sleeper != nil && (l.lw == nil || l.lw.w.isOff())
}

// letGo returns the connection the waiter slept on, once the wait has
// ended: to the pool after a clean end, else as stopSleeping does.
func (l *inLine) letGo(clean bool) {
	switch {
	case l.conn == nil:
	case clean:
		dbutil.Recycle(l.conn)
		<-l.slot
	default:
		l.stopSleeping()
	}
}

// pass makes one pass of waitInLine: it takes a lease a release was heard
// handing over, unless its place has moved (a release signal names the
// owner, not the place: one heard late may be of a place handed over
// unnoticed and since lost, and trusted it would hold the new place's
// token while another holds the lease); else, holding a place or not
// woken, it reads the row (taking the lease if it was handed over
// unheard) and, free, tries to take it; woken without a place it tries
// at once, unless the release it heard handed the lease to another
// waiter (passed). A miss queues, or renews the place when due. It
// returns the holder it read, if any.
func (l *inLine) pass(ctx, budget context.Context, woken, granted, passed bool) (*leaseState, *Holder, error) {
	if granted && l.queued && !l.moved {
		return l.handedOver(l.token), nil, nil
	}
	var h *Holder
	if !l.placed.IsZero() || !woken {
		var err error
		if h, err = holderNow(budget, l.store, l.db, l.cfg, l.req); err != nil {
			return nil, nil, err
		}
		if h != nil && h.Owner == l.req.Owner {
			return l.handedOver(h.Token), nil, nil
		}
	} else if passed {
		return nil, nil, l.queue(budget)
	}
	if h == nil {
		s, err := tryLease(ctx, budget, l.store, l.db, l.cfg, l.req)
		if !errors.Is(err, ErrNotAcquired) {
			return s, nil, err
		}
	}
	return nil, h, l.queue(budget)
}

// queue takes the place next in line, or renews it when a renew interval
// has passed since it was sent, or when the waiter is to sleep in line:
// the place is then taken again on the connection it sleeps on, whose
// backend the handover wakes. ErrNotAcquired unless it fails.
func (l *inLine) queue(budget context.Context) error {
	toSleep := l.conn == nil && l.sleeps()
	if l.cannot || l.queued && !toSleep && l.cfg.clock.Now().Sub(l.placed) < renewInterval(l.cfg.ttl) {
		return ErrNotAcquired
	}
	if toSleep {
		if err := l.keepConn(budget); err != nil {
			return err
		}
	}
	req := l.req
	sent := l.cfg.clock.Now()
	req.Now, req.TTL = sent, l.cfg.ttl
	l.asked = true
	token, err := l.store.QueueLease(budget, l.db, l.conn, req)
	switch {
	case err == nil:
		l.moved = l.moved || l.token != 0 && FencingToken(token) != l.token
		l.placed, l.token, l.queued = sent, FencingToken(token), true
	case errors.Is(err, ErrNotAcquired):
		l.queued = false // the place went (or was never had); l.placed stays, should it have been handed the lease
	case errors.Is(err, ErrUnsupported):
		l.cannot = true
	case budget.Err() != nil:
		return context.Cause(budget)
	default:
		return err
	}
	return ErrNotAcquired
}

// pause is how long to wait before the next pass: the poll's pause, no
// longer than until the holder's expiry or the place's renewal.
func (l *inLine) pause(h *Holder, pause time.Duration) time.Duration {
	now := l.cfg.clock.Now()
	pause = untilExpiry(h, now, pause)
	if l.queued {
		pause = min(pause, max(l.placed.Add(renewInterval(l.cfg.ttl)).Sub(now), 0))
	}
	return pause
}

// handedOver holds the lease a release handed over, with token, counting
// its local deadline from when its place was sent.
func (l *inLine) handedOver(token FencingToken) *leaseState {
	req := l.req
	req.Token, req.TTL = uint64(token), l.cfg.ttl
	return keepLease(l.store, l.db, l.cfg, req, l.placed)
}

// withdraw gives up the place of a wait that ends without the lease, and
// frees the lease should a release have handed it over meanwhile: before
// returning, or in the background if the caller has gone.
func (l *inLine) withdraw(ctx context.Context) {
	if !l.asked {
		return
	}
	if ctx.Err() != nil {
		go abandonLease(l.store, l.db, l.cfg.releaseTimeout, l.cfg.clock, l.req)
		return
	}
	abandonLease(l.store, l.db, l.cfg.releaseTimeout, l.cfg.clock, l.req)
}

// claimLease is acquireLease for a waiting writer of a Lock that can be
// held shared: each attempt, with one owner label for the whole wait,
// claims the row while shared holders have it (see backend.SharedRowStore), so
// that no new shared holder enters. While shared holders are in, the
// waiter tries again every poll interval, which keeps its claim fresh;
// while an exclusive holder is, it waits as acquireLease does, reading
// only. A wait that ends without the lock withdraws its claim.
func claimLease(ctx, budget context.Context, store backend.LeaseStore, db DB, cfg *config, req backend.LeaseRequest) (*leaseState, error) {
	req.Owner, req.Wait = ownerLabel(cfg.owner), true
	for {
		s, err := tryLease(ctx, budget, store, db, cfg, req)
		if !errors.Is(err, ErrNotAcquired) {
			return s, err // an unknown outcome was abandoned by tryLease, claim and all
		}
		req.Retry = true // this attempt missed: it may have claimed the row
		if err := waitForTurn(budget, store, db, cfg, req); err != nil {
			// Withdrawn before returning, so that shared holders can enter
			// as soon as the caller hears of the timeout; in the background
			// if the caller has gone.
			if ctx.Err() != nil {
				go abandonLease(store, db, cfg.releaseTimeout, cfg.clock, req)
			} else {
				abandonLease(store, db, cfg.releaseTimeout, cfg.clock, req)
			}
			return nil, err
		}
	}
}

// waitForTurn waits one poll interval while shared holders have the row,
// else until the exclusive holder has gone (see waitUntilFree).
func waitForTurn(budget context.Context, store backend.LeaseStore, db DB, cfg *config, req backend.LeaseRequest) error {
	h, err := holderNow(budget, store, db, cfg, req)
	switch {
	case err != nil:
		return err
	case h != nil && !h.Shared:
		return waitUntilFree(budget, store, db, cfg, req, nil)
	}
	poll := time.NewTimer(pollPause(cfg.poll, cfg.poll, 0))
	defer poll.Stop()
	select {
	case <-budget.Done():
		return context.Cause(budget)
	case <-poll.C:
		return nil
	}
}

// holderNow reads the row's holder as of now (nil when free or
// expired); a read that fails because budget ended returns budget's cause.
func holderNow(budget context.Context, store backend.LeaseStore, db DB, cfg *config, req backend.LeaseRequest) (*Holder, error) {
	req.Now = cfg.clock.Now()
	h, err := store.LeaseHolder(budget, db, req)
	if err != nil && budget.Err() != nil {
		return nil, context.Cause(budget)
	}
	return holderOf(h), err
}

// tryLease makes one attempt. An attempt whose outcome is unknown may
// have granted the lease without our hearing of it: it frees that grant,
// unless nothing was sent.
func tryLease(ctx, budget context.Context, store backend.LeaseStore, db DB, cfg *config, req backend.LeaseRequest) (*leaseState, error) {
	if req.Owner == "" {
		req.Owner = ownerLabel(cfg.owner)
	}
	req.TTL = cfg.ttl
	req.MinHold = cfg.minHold
	sent := cfg.clock.Now()
	req.Now = sent
	token, err := store.AcquireLease(budget, db, req)
	switch {
	case err == nil:
		req.Token = token
		return keepLease(store, db, cfg, req, sent), nil
	case errors.Is(err, ErrNotAcquired):
		return nil, err
	case errors.Is(err, ErrPoolUnavailable): // nothing was sent
	case budget.Err() != nil && (ctx.Err() != nil || !req.Wait):
		// The caller's time is up: free it in the background. A waiting
		// writer's claim (req.Wait) keeps shared holders out, so while
		// the caller is there it is withdrawn before returning, as
		// claimLease does.
		go abandonLease(store, db, cfg.releaseTimeout, cfg.clock, req)
	default:
		abandonLease(store, db, cfg.releaseTimeout, cfg.clock, req)
	}
	if budget.Err() != nil && ctx.Err() == nil {
		return nil, context.Cause(budget)
	}
	return nil, err
}

// waitUntilFree polls the row until it reads free or expired, or budget
// ends, or (wake) a release of it is heard, when it returns at once to
// try again. A poll reads before anyone writes, so many waiters do not
// fight for the database's writer. A LeaseLock waiter backs off (see
// pollPause), so that a hundred waiting replicas do not send thousands of
// queries a second; a Lock kept as a row (SQLite) polls every interval.
func waitUntilFree(budget context.Context, store backend.LeaseStore, db DB, cfg *config, req backend.LeaseRequest, wake <-chan struct{}) error {
	longest := cfg.poll
	if req.Kind == backend.KindLease {
		longest = max(cfg.poll, leaseWaitCap)
	}
	poll := time.NewTimer(pollPause(cfg.poll, longest, 0))
	defer poll.Stop()
	for n := 1; ; n++ {
		select {
		case <-budget.Done():
			return context.Cause(budget)
		case <-wake:
			return nil
		case <-poll.C:
		}
		h, err := holderNow(budget, store, db, cfg, req)
		switch {
		case err != nil:
			return err
		case h == nil:
			return nil
		}
		poll.Reset(untilExpiry(h, cfg.clock.Now(), pollPause(cfg.poll, longest, n)))
	}
}

// untilExpiry is a waiter's pause, no longer than until h's known expiry
// (but at least minPollInterval): it looks again once the lease has
// expired, not a whole pause later.
func untilExpiry(h *Holder, now time.Time, pause time.Duration) time.Duration {
	if h != nil && !h.ExpiresAt.IsZero() {
		if left := h.ExpiresAt.Sub(now); left < pause {
			return max(left, minPollInterval)
		}
	}
	return pause
}

// leaseWaitCap is the longest pause between a LeaseLock waiter's polls
// (or the poll interval, if longer): a lease released early is seen
// within it.
const leaseWaitCap = 500 * time.Millisecond

// pollPause is the pause before poll n (from 0) of a waiter: the poll
// interval doubled n times, at most longest, drawn at random from the
// upper half of that, so that waiters that started together spread out.
func pollPause(interval, longest time.Duration, n int) time.Duration {
	d := interval
	for ; n > 0 && d < longest; n-- {
		d *= 2
	}
	d = min(d, longest)
	if d < 2 {
		return d
	}
	return d/2 + mathrand.N(d/2+1)
}

// abandonLease frees a grant that an interrupted acquire may have made
// without our knowing: the owner label is unique to that acquire, so this
// can free nobody else's lease. It is bounded by the release timeout, also
// when it runs in the background.
func abandonLease(store backend.LeaseStore, db DB, timeout time.Duration, clock clockFunc, req backend.LeaseRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req.Now = clock.Now()
	_ = store.ReleaseLease(ctx, db, req)
}

// keepLease holds a granted lease. Its keeper starts at the first
// renewal, on a timer: a lease released before then (most are) costs no
// goroutine. The first renewal comes a renew interval from now, or
// halfway to the local deadline if that is sooner: a lease handed over
// on a place sent a while ago (see waitInLine) has less than the usual
// time left, and a renewal at its deadline would come too late.
func keepLease(store backend.LeaseStore, db DB, cfg *config, req backend.LeaseRequest, sent time.Time) *leaseState {
	s := &leaseState{store: store, db: db, req: req, clock: cfg.clock, deadline: localDeadline(sent, req.TTL)}
	s.hold = hold{name: req.Name, key: req.Key, logger: cfg.log(), relTO: cfg.releaseTimeout, end: s}
	// A grant that arrived past its local deadline (a slow answer) is lost
	// before anyone sees it: the acquire's Observer hears the loss as the
	// acquire ends, and no keeper starts (Lost and Do would find it lost
	// anyway: see hold.checkDeadline). Otherwise the keeper starts at the
	// first renewal.
	left := s.untilDeadline()
	if left <= 0 {
		s.lose(CauseExpired, s.lostErr(), errors.New("granted past its local deadline (the answer came too late)"))
		return s
	}
	start := min(renewInterval(req.TTL), left/2)
	s.mu.Lock()
	s.starter = time.AfterFunc(start, s.startKeeping)
	s.mu.Unlock()
	return s
}

func (s *leaseState) startKeeping() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.quit, s.done = make(chan struct{}), make(chan struct{})
	s.mu.Unlock()
	s.keep()
}

// stop ends the keeper, waiting for it if it runs.
func (s *leaseState) stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	quit, done, starter := s.quit, s.done, s.starter
	s.mu.Unlock()
	if starter != nil { // nil for a grant lost on arrival
		starter.Stop()
	}
	if quit != nil {
		close(quit)
		<-done
	}
}

func (s *leaseState) release(ctx context.Context, timeout time.Duration) error {
	s.stop()
	r := s.req
	r.Now = s.clock.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return s.store.ReleaseLease(ctx, s.db, r)
}

func (s *leaseState) forget() {
	s.stop()
	go abandonLease(s.store, s.db, s.relTO, s.clock, s.req) // cleanups must not wait on I/O
}

// lostErr is the error a lost grant reports.
func (s *leaseState) lostErr() error {
	if s.req.Kind == backend.KindLease {
		return leaseLostErr(s.req.Name, FencingToken(s.req.Token))
	}
	return ErrLockLost
}

func (s *leaseState) localDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// expireIfPast marks the lease lost when its local deadline has passed,
// also when no goroutine has run since: what Lost promises.
func (s *leaseState) expireIfPast() {
	if gone, _ := s.isLost(); gone || s.clock.Now().Before(s.localDeadline()) {
		return
	}
	s.lose(CauseExpired, s.lostErr(), errors.New("no renewal before the local deadline"))
}

// keep renews the lease every renew interval until stopped, and marks it
// lost when a renew finds it gone or when the local deadline passes first.
// Each renew runs in a goroutine of its own, bounded by its context, so
// that a renew stuck on a dead network (some drivers do not return until
// the network does) cannot hold the deadline back. A renew still in flight
// when keep returns finishes on its own; its result is dropped, and it can
// extend nothing but this grant's own row. (One select loop owns the
// keeper's timers and its renewal in flight, which is why it runs past
// forty lines: split, they would need sharing.)
func (s *leaseState) keep() {
	defer close(s.done)
	lostErr := s.lostErr()
	interval := renewInterval(s.req.TTL)
	renewAt := time.NewTimer(0) // started at the first renewal
	defer renewAt.Stop()
	expiry := time.NewTimer(s.untilDeadline())
	defer expiry.Stop()
	var inFlight <-chan error   // non-nil while a renew runs
	var sent, started time.Time // started: by the wall clock, for the Observer
	for {
		select {
		case <-s.quit:
			return
		case <-expiry.C:
			if left := s.untilDeadline(); left > 0 { // the clock is not the timer's
				expiry.Reset(left)
				continue
			}
			s.lose(CauseExpired, lostErr, errors.New("no renewal before the local deadline"))
			return
		case <-renewAt.C:
			if s.untilDeadline() <= 0 {
				// Past the deadline (a grant that arrived late): Lost
				// reads closed already, and a renewal would revive it.
				s.lose(CauseExpired, lostErr, errors.New("no renewal before the local deadline"))
				return
			}
			sent, started = s.clock.Now(), time.Now()
			inFlight = s.renew(sent, min(interval, s.untilDeadline()))
		case err := <-inFlight:
			inFlight = nil
			if ob := s.observer().ob; ob != nil {
				ob.renewed(time.Since(started), err)
			}
			switch {
			case err == nil:
				s.mu.Lock()
				s.deadline = localDeadline(sent, s.req.TTL)
				s.mu.Unlock()
				expiry.Reset(s.untilDeadline())
				renewAt.Reset(interval)
			case errors.Is(err, backend.ErrLeaseLost):
				s.lose(CauseTakenOver, lostErr, err)
				return
			default: // unknown outcome: try again sooner, until the deadline
				renewAt.Reset(min(interval/4, max(s.untilDeadline(), 0)))
			}
		}
	}
}

// untilDeadline is how long the local deadline is away, by the lock's clock.
func (s *leaseState) untilDeadline() time.Duration {
	return s.localDeadline().Sub(s.clock.Now())
}

// renew sends one renew statement, sent at sent, in its own goroutine,
// and delivers its outcome on the returned channel.
func (s *leaseState) renew(sent time.Time, timeout time.Duration) <-chan error {
	out := make(chan error, 1)
	r := s.req
	r.Now = sent
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Millisecond))
		defer cancel()
		_, err := s.store.RenewLease(ctx, s.db, r)
		out <- err
	}()
	return out
}

func (s *leaseState) lose(cause Cause, lostErr, why error) {
	if gone, _ := s.isLost(); gone {
		return
	}
	s.warn("advisorylock: lease lost", "lock", s.req.Name, "token", s.req.Token, "err", why)
	s.hold.lose(cause, lostErr)
}

// rowClaim is what one acquire takes as lease rows (on SQLite, or with
// WithLeaseRows): every one of reqs, in order (a Lock's row, exclusive
// or a shared holder's, or a set's rows in key order), or (anyOne) any
// one of them (a Semaphore's slots).
type rowClaim struct {
	reqs   []backend.LeaseRequest
	anyOne bool
}

// acquireRows takes c's rows in store. Every one: each as acquireLease
// takes it, releasing those it took on a miss or an error. Any one: a
// pass tries each from a random start and stops at the first it gets,
// and a wait (wait) polls between passes until one reads free. It
// returns the holds taken, and the index in c.reqs of the one taken by
// anyOne.
func acquireRows(ctx, budget context.Context, store backend.LeaseStore, db DB, cfg *config, c rowClaim, wait bool) ([]*hold, int, error) {
	if c.anyOne {
		for {
			s, i, err := tryAnyRow(ctx, budget, store, db, cfg, c.reqs)
			if err == nil {
				return []*hold{&s.hold}, i, nil
			}
			if !wait || !errors.Is(err, ErrNotAcquired) {
				return nil, 0, err
			}
			if err := waitAnyRow(budget, store, db, cfg, c.reqs); err != nil {
				return nil, 0, err
			}
		}
	}
	parts := make([]*hold, 0, len(c.reqs))
	for _, req := range c.reqs {
		s, err := acquireLease(ctx, budget, store, db, cfg, req, wait)
		if err != nil {
			for _, p := range parts {
				_ = p.doRelease(ctx)
			}
			return nil, 0, err
		}
		parts = append(parts, &s.hold)
	}
	return parts, 0, nil
}

// tryAnyRow makes one attempt on each of reqs, from a random start, and
// stops at the first it gets.
func tryAnyRow(ctx, budget context.Context, store backend.LeaseStore, db DB, cfg *config, reqs []backend.LeaseRequest) (*leaseState, int, error) {
	start := mathrand.N(len(reqs))
	for n := range reqs {
		i := (start + n) % len(reqs)
		s, err := tryLease(ctx, budget, store, db, cfg, reqs[i])
		if !errors.Is(err, ErrNotAcquired) {
			return s, i, err
		}
	}
	return nil, 0, ErrNotAcquired
}

// waitAnyRow polls every poll interval until one of reqs' rows reads
// free or expired, or budget ends. It only reads, so waiters do not
// fight for the database's writer.
func waitAnyRow(budget context.Context, store backend.LeaseStore, db DB, cfg *config, reqs []backend.LeaseRequest) error {
	poll := time.NewTimer(pollPause(cfg.poll, cfg.poll, 0))
	defer poll.Stop()
	for {
		select {
		case <-budget.Done():
			return context.Cause(budget)
		case <-poll.C:
		}
		for _, req := range reqs {
			if h, err := holderNow(budget, store, db, cfg, req); err != nil || h == nil {
				return err
			}
		}
		poll.Reset(pollPause(cfg.poll, cfg.poll, 0))
	}
}

// acquireRows takes l's rows (see rowClaim): its row, exclusive or
// (b.isShared) a shared holder's, or a set's rows.
func (l *Lock) acquireRows(ctx, budget context.Context, b *lockBackend, wait bool) (*Guard, error) {
	parts, _, err := acquireRows(ctx, budget, b.rows, l.db, &l.cfg, rowClaim{reqs: l.rowRequests(b.isShared)}, wait)
	switch {
	case err != nil:
		return nil, err
	case len(parts) == 1:
		return newGuard(parts[0]), nil
	}
	return newGuard(l.setOfRows(parts)), nil
}

// rowRequests are the lease requests of l's rows: its one row, or each
// name's of its set.
func (l *Lock) rowRequests(shared bool) []backend.LeaseRequest {
	if l.set == nil {
		req := l.rowRequest("")
		if shared {
			req.Kind = backend.KindShared
		}
		return []backend.LeaseRequest{req}
	}
	reqs := make([]backend.LeaseRequest, len(l.set))
	for i, k := range l.set {
		reqs[i] = l.rowRequest("")
		reqs[i].Name, reqs[i].Key = l.setNames[i], k
	}
	return reqs
}

func (l *Lock) rowRequest(owner string) backend.LeaseRequest {
	return backend.LeaseRequest{Kind: backend.KindLock, Name: l.name, Key: l.key, Owner: owner, TTL: l.cfg.ttl, Now: l.cfg.clock.Now()}
}

// LeaseLock is a named lease with fencing tokens, kept as a row that holds
// no connection while held. Every grant gets a FencingToken larger than
// any earlier grant of the name. It works on PostgreSQL (also through a
// transaction-mode pooler) and MySQL/MariaDB, where times come from the
// database clock, and on SQLite (where times come from WithClock). It is
// safe for concurrent use.
type LeaseLock struct {
	db    DB
	name  string
	key   int64
	cfg   config
	setup firstUse[backend.LeaseStore]
	obs   atomic.Pointer[observed] // see observed
	kind  string                   // what its events say it is: "lease", or "election"
}

// NewLeaseLock returns a LeaseLock on name. It does no I/O (see New): it
// fails only for a nil db, an empty name, a name or owner label that the
// database cannot store (a NUL byte, invalid UTF-8), or an option that
// does not apply to a lease (WithKeepAlive, WithDeadHolderTimeout,
// WithPoolerCheck) or whose value is out of bounds. The first operation picks the
// backend and runs the first-use checks; the table is created on first
// use (see Schema for its DDL).
func NewLeaseLock(db DB, name string, opts ...Option) (*LeaseLock, error) {
	cfg, err := leaseConfig(db, name, "a LeaseLock", leaseOptions, opts)
	if err != nil {
		return nil, wrapErr(name, "new lease", err)
	}
	return newLeaseLock(db, name, cfg, backend.KindLease), nil
}

// leaseOptions are the options a LeaseLock takes: not those of a pinned
// session (keep-alive, dead-holder timeout, pooler probe).
const leaseOptions = optAll &^ (optKeepAlive | optDeadHolder | optPoolerCheck | optRunRetention | optMultiplexing | optLeaseRows)

// leaseConfig is constructed for a name kept in a row: the name and the
// owner label must be storable too.
func leaseConfig(db DB, name, what string, takes optionSet, opts []Option) (config, error) {
	cfg, err := constructed(db, name, what, takes, opts)
	if err != nil {
		return cfg, err
	}
	if err := storableName(name); err != nil {
		return cfg, err
	}
	if err := storableName(cfg.owner); err != nil {
		return cfg, fmt.Errorf("owner label: %w", err)
	}
	return cfg, nil
}

// newLeaseLock returns a LeaseLock of kind on name with cfg, checked.
func newLeaseLock(db DB, name string, cfg config, kind string) *LeaseLock {
	return &LeaseLock{db: db, name: name, key: Key(name), cfg: cfg, setup: newFirstUse[backend.LeaseStore](), kind: kind}
}

// Check runs the first-use work now (see New), for a service that wants
// to fail at start-up, and creates the tables if they are missing, so
// that a hot standby, a backend that keeps no leases, a role that may not
// create the tables and one that lacks a grant on them (or on the token
// sequence) are refused here; later operations skip it.
func (l *LeaseLock) Check(ctx context.Context) error {
	s, err := l.store(ctx)
	if err == nil {
		err = checkTables(ctx, l.db, s, "advisorylock_leases")
	}
	return wrapErr(l.name, "check", err)
}

// store returns l's backend, doing the first-use work once.
func (l *LeaseLock) store(ctx context.Context) (backend.LeaseStore, error) {
	s, err := l.setup.get(ctx, func(ctx context.Context) (*backend.LeaseStore, error) {
		s, err := leaseStoreOf(ctx, l.db, &l.cfg)
		if err != nil {
			return nil, err
		}
		return s, checkRowWindows(&l.cfg, *s)
	})
	if err != nil {
		return nil, err
	}
	return *s, nil
}

// storableName refuses names a text column cannot hold.
func storableName(name string) error {
	if !utf8.ValidString(name) {
		return errors.New("name is not valid UTF-8")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return errors.New("name contains a NUL byte")
	}
	return nil
}

// leaseStoreOf resolves db's backend and requires it to keep leases.
func leaseStoreOf(ctx context.Context, db DB, cfg *config) (*backend.LeaseStore, error) {
	b, err := resolveBackend(ctx, db, cfg)
	if err != nil {
		return nil, err
	}
	s, ok := b.(backend.LeaseStore)
	if !ok {
		return nil, fmt.Errorf("%w: backend %q keeps no leases", ErrUnsupported, b.Name())
	}
	return &s, nil
}

// Name returns the lease's name.
func (l *LeaseLock) Name() string { return l.name }

// TryLock makes one attempt; ErrNotAcquired if the lease is held.
func (l *LeaseLock) TryLock(ctx context.Context) (*LeaseGuard, error) {
	return acquire(ctx, l, "try lock", false)
}

// Lock polls (WithPollInterval) until it holds the lease or ctx ends.
func (l *LeaseLock) Lock(ctx context.Context) (*LeaseGuard, error) {
	return acquire(ctx, l, "lock", true)
}

// LockTimeout is Lock bounded by d; it returns an error matching
// ErrTimeout, naming the lease, d and how long it waited, when d runs out.
// With d <= 0 it makes exactly one attempt.
func (l *LeaseLock) LockTimeout(ctx context.Context, d time.Duration) (*LeaseGuard, error) {
	return acquireWithin(ctx, l, "lock", d)
}

// observed returns what l's events need, nil without an Observer.
func (l *LeaseLock) observed() *observed {
	return observedOf(&l.obs, l.db, &l.cfg, l.kind, l.name, func() backend.Backend {
		if s := l.setup.v.Load(); s != nil {
			return *s
		}
		return nil
	})
}

// settings returns l's name and configuration (see frontEnd).
func (l *LeaseLock) settings() (string, *config) { return l.name, &l.cfg }

// take takes the lease (see frontEnd).
func (l *LeaseLock) take(ctx, budget context.Context, wait bool) (*LeaseGuard, error) {
	store, err := l.store(budget)
	if err != nil {
		return nil, err
	}
	req := backend.LeaseRequest{Kind: backend.KindLease, Name: l.name, Key: l.key}
	s, err := acquireLease(ctx, budget, store, l.db, &l.cfg, req, wait)
	if err != nil {
		return nil, err
	}
	lease := Lease{token: FencingToken(s.req.Token), s: s}
	g := &LeaseGuard{g: Guard{h: &s.hold}, lease: lease} // one allocation for both
	runtime.AddCleanup(g, (*hold).forgotten, &s.hold)
	return g, nil
}

// Holder reports who holds the lease now, or nil when it is free or
// expired. With WithMinHold, a lease released in its window reports its
// last holder until the window's end (ExpiresAt).
func (l *LeaseLock) Holder(ctx context.Context) (*Holder, error) {
	store, err := l.store(ctx)
	if err != nil {
		return nil, wrapErr(l.name, "holder", err)
	}
	h, err := store.LeaseHolder(ctx, l.db, backend.LeaseRequest{Kind: backend.KindLease, Name: l.name, Key: l.key, Now: l.cfg.clock.Now()})
	if h != nil {
		h.Name, h.Key = l.name, l.key
	}
	return holderOf(h), wrapErr(l.name, "holder", err)
}

// Do waits for the lease, runs fn with it, and releases it when fn
// returns, fails or panics. fn's context is cancelled with a
// cause matching ErrLockLost (naming the lease and its token) if the
// lease is lost, and Do then returns that error unless fn returned one of
// its own. A lease lost by the time fn would start (its grant came back
// past its local deadline, or the deadline passed before fn's turn) does
// not run fn: Do returns that loss. Pass lease.Token() to the resource's
// Fence with every write.
func (l *LeaseLock) Do(ctx context.Context, fn func(ctx context.Context, lease Lease) error) error {
	return do(ctx, l.name, l.Lock, fn)
}

// DoTimeout is Do with the wait bounded as in LockTimeout.
func (l *LeaseLock) DoTimeout(ctx context.Context, d time.Duration, fn func(ctx context.Context, lease Lease) error) error {
	return do(ctx, l.name, func(ctx context.Context) (*LeaseGuard, error) { return l.LockTimeout(ctx, d) }, fn)
}

// TryDo runs fn only if it can take the lease at once; (false, nil) when
// it is held elsewhere, (false, the loss, matching ErrLockLost) when the lease was
// lost as it was granted (see Do).
func (l *LeaseLock) TryDo(ctx context.Context, fn func(ctx context.Context, lease Lease) error) (ran bool, err error) {
	return tryDo(ctx, l.name, l.TryLock, fn)
}

// Lease is one grant of a LeaseLock. It is cheap to copy; copies share
// the grant's state.
type Lease struct {
	token FencingToken
	s     *leaseState
}

// Token returns the grant's fencing token.
func (l Lease) Token() FencingToken { return l.token }

// Lost returns a channel closed when the lease no longer protects
// anything: it is known lost, or it was released (Release, or the cleanup
// of a forgotten guard). A call made once the local deadline has passed
// finds it closed even if no goroutine noticed yet, so a check right
// before an action that must not run without the lease is
//
//	select {
//	case <-lease.Lost():
//		// lost or released: do not act
//	default:
//		// still held
//	}
func (l Lease) Lost() <-chan struct{} {
	l.s.expireIfPast()
	return l.s.lost()
}

// LeaseGuard is a held lease. Release it when done; Release is idempotent.
type LeaseGuard struct {
	g     Guard
	lease Lease
}

// hold returns g's hold, nil for a nil g.
func (g *LeaseGuard) hold() *hold {
	if g == nil {
		return nil
	}
	return g.g.h
}

// Lease returns the grant.
func (g *LeaseGuard) Lease() Lease { return g.lease }

// Release stops renewing and frees the lease if this grant still holds it;
// it never frees a successor's lease. It runs on its own context bounded by
// WithReleaseTimeout. Second and later calls return nil.
func (g *LeaseGuard) Release(ctx context.Context) error { return g.g.Release(ctx) }

func (g *LeaseGuard) run(ctx context.Context, fn func(ctx context.Context, lease Lease) error) (bool, error) {
	return g.g.run(ctx, func(ctx context.Context) error { return fn(ctx, g.lease) })
}
