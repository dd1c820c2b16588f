package advisorylock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// Election elects one leader among the replicas that campaign on a name:
// the shape of etcd's concurrency.Election, on a SQL database. Run
// campaigns, runs a function while leader and campaigns again after a
// loss; Resign steps down; Leader says who leads; Observe follows the leader from a replica
// that does not lead.
//
// On PostgreSQL and MySQL the leader holds a session Lock on the name
// (see Lock): a resign frees it at once and a waiting candidate, waiting
// server-side, takes over within about one round trip; when the leader's
// process dies its socket closes and the server frees the lock at once;
// when its host vanishes without closing the socket, the server frees it
// within WithDeadHolderTimeout. Each leader then records its term, a
// FencingToken from the source leases take theirs from (larger than every
// token issued before it), in a row naming the leader
// (advisorylock_elections; see Schema). On SQLite, and on any backend
// with WithLeaseRows (behind a transaction-mode pooler, say), the leader
// holds a LeaseLock on the name, whose token is the term: a dead leader
// is replaced within the lease TTL.
//
// Two leaders at once: a leader learns that its session was killed (or
// cut off) at its next keep-alive check (WithKeepAlive [10s]), and a
// SQLite leader at its lease's local deadline. In between, the server has
// freed the lock and another candidate may already lead, so for up to
// one keep-alive interval the old leader still runs. Pass the term to a
// Fence with every write that must come from the leader alone: the new
// leader's term is larger, and once it has written, the old one's writes
// are refused.
//
// On PostgreSQL and MySQL a leader's lock pins one connection of db's
// pool for the whole term (see Lock): count it in SetMaxOpenConns, or
// Leader and other statements of the leader wait for a connection.
//
// An Election's name is its own: a Lock (PostgreSQL, MySQL) or LeaseLock
// (SQLite) of the same name would take part in it. It is safe for
// concurrent use.
type Election struct {
	db    DB
	name  string
	owner string // the label the term row records (WithOwner, else host:pid)
	cfg   config
	lock  *Lock      // leadership on a session backend
	lease *LeaseLock // leadership on a row backend
	setup firstUse[electionBackend]

	mu      sync.Mutex
	serving map[*leadership]struct{} // the terms that Runs of e lead now
}

// leadership is a term that a Run of the Election serves: Resign cancels
// its lead with errResigned and waits for done, closed once it is freed.
type leadership struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// errResigned is the cause of a lead's context cancelled by Resign.
var errResigned = errors.New("advisorylock: leadership resigned")

// electionBackend is how an Election elects: terms beside a lock, or a lease.
type electionBackend struct {
	terms backend.TermKeeper // nil on a row backend
}

// NewElection returns an Election on name. It does no I/O (see New): it
// fails only for a nil db, an empty name, an invalid option set (one out
// of bounds, or WithMinHold, which does not apply), or a name or owner
// label that the database cannot store (a NUL byte, invalid UTF-8). The
// first operation (or Check) picks the backend, runs the first-use checks
// and creates the tables if needed.
//
// Options: WithOwner labels this candidate in Leader [hostname:pid];
// WithKeepAlive bounds how long a leader whose session died goes on
// leading (see Election); WithDeadHolderTimeout, WithLeaseTTL (SQLite),
// WithPollInterval (Observe), WithObserver (events of kind
// "election") and WithLogger apply as they do to locks; WithLeaseRows
// elects through a lease on any backend (see Election).
func NewElection(db DB, name string, opts ...Option) (*Election, error) {
	cfg, err := leaseConfig(db, name, "an Election", lockOptions&^(optMinHold|optRunRetention|optMultiplexing), opts)
	if err != nil {
		return nil, wrapErr(name, "new election", err)
	}
	lock, lease := newLock(db, name, cfg, kindElection), newLeaseLock(db, name, cfg, kindElection)
	owner := cfg.owner
	if owner == "" {
		owner = hostPID()
	}
	return &Election{db: db, name: name, owner: owner, cfg: lock.cfg, lock: lock, lease: lease, setup: newFirstUse[electionBackend]()}, nil
}

// Check runs the first-use work now (see NewElection), for a service that
// wants to fail at start-up, and creates the tables if they are missing:
// what Run would return at once (a hot standby, a transaction pooler, a
// role that may not create the tables or lacks a grant on them) Check
// returns; later operations skip it.
func (e *Election) Check(ctx context.Context) error {
	eb, err := e.backend(ctx)
	if err == nil && eb.terms == nil {
		return e.lease.Check(ctx) // the leader's lease
	}
	if err == nil { // terms, beside a session lock
		err = checkTables(ctx, e.db, eb.terms, "advisorylock_elections")
	}
	return wrapErr(e.name, "check", err)
}

// backend returns how e elects, doing the first-use work once.
func (e *Election) backend(ctx context.Context) (*electionBackend, error) {
	return e.setup.get(ctx, func(ctx context.Context) (*electionBackend, error) {
		b, err := resolveBackend(ctx, e.db, &e.cfg)
		if err != nil {
			return nil, err
		}
		_, session := b.(backend.SessionLocker)
		if _, rows := b.(backend.LeaseStore); !session || rows && e.cfg.leaseRows { // see WithLeaseRows
			_, err := e.lease.store(ctx)
			return &electionBackend{}, err
		}
		terms, ok := b.(backend.TermKeeper)
		if !ok {
			return nil, fmt.Errorf("%w: backend %q records no election terms", ErrUnsupported, b.Name())
		}
		if _, err := e.lock.backend(ctx); err != nil {
			return nil, err
		}
		if err := terms.PrepareElections(ctx, e.db); err != nil {
			return nil, err
		}
		return &electionBackend{terms: terms}, nil
	})
}

// Run campaigns until this candidate leads, then runs lead with the
// term's FencingToken, and campaigns again when leadership ends, until
// ctx ends or lead returns an error:
//
//   - lead's ctx is cancelled when leadership is lost (cause ErrLockLost,
//     whose message names the lease on SQLite), or when Run's ctx ends. A lead
//     that then returns (nil, or an error matching context.Canceled or
//     that cause) has lost its term, and Run campaigns again.
//   - lead returning nil resigns: Run frees the leadership, so another
//     candidate can take over, and campaigns again (on SQLite, where
//     candidates poll, after a pause of about a second that lets a
//     waiting one in).
//   - lead returning an error of its own resigns and Run returns it.
//   - When ctx ends Run resigns and returns ctx.Err().
//
// A panic in lead resigns too, and goes on. A lead that returns nil
// soon after its term began (within a second, or WithPollInterval if
// longer) is taken for one with nothing to do for now: Run pauses before
// it campaigns again, about the poll interval after the first such term
// and twice as long after each next one in a row, up to that second (or
// poll interval), drawn at random from the upper half so that candidates
// spread out; a lead that returns nil at once thus begins about one term
// a second, not one per round trip. Meanwhile another candidate may
// lead.
//
// Run returns at once, naming the election, an error that trying again
// does not heal: the first-use work's refusal, an error matching
// ErrUnsupported or ErrTransactionPooler (see Check), and the server's
// refusal of a privilege (the role lacks INSERT, UPDATE or SELECT on
// advisorylock_elections or USAGE on the token sequence, or may not
// create the missing tables: PostgreSQL's SQLSTATE 42501, MySQL's errors
// 1142, 1143 and 1044; the driver's error stays reachable with
// errors.As). Other errors of a campaign (the database restarting, a
// connection lost, a standby reached during a failover) are logged and
// the campaign is tried again, backing off to 5s between tries. Two Runs
// of one Election campaign against each other, as two replicas would.
func (e *Election) Run(ctx context.Context, lead func(ctx context.Context, term FencingToken) error) error {
	if lead == nil {
		return wrapErr(e.name, "run", errors.New("nil lead function"))
	}
	for failures, quick := 0, 0; ; {
		t, err := e.campaign(ctx)
		if ctx.Err() != nil {
			if err == nil {
				e.resign(ctx, t)
			}
			return ctx.Err()
		}
		if err != nil {
			if err := e.refused(err); err != nil {
				return err
			}
			e.cfg.log().Warn("advisorylock: campaign failed; trying again", "election", e.name, "err", err)
			if !sleepWithin(ctx, pollPause(e.cfg.poll, campaignBackoff, failures)) {
				return ctx.Err()
			}
			failures++
			continue
		}
		failures = 0
		began := time.Now()
		err = e.serve(ctx, t, lead)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errResigned):
			// Resign asked for another leader: give one that is not yet
			// waiting (still starting, or between two wait slices) the
			// time to take over.
			if !e.standAside(ctx, resignPause) {
				return ctx.Err()
			}
		case err == nil:
			if !e.standAside(ctx, 0) || !e.rest(ctx, began, &quick) {
				return ctx.Err()
			}
		case t.lostBy(err):
		default:
			return err
		}
	}
}

// refused returns a campaign's err as Run returns it when trying again
// does not help, else nil: a refusal by the first use (not after one
// succeeded: a failover may reach a standby for a while), or of a
// privilege.
func (e *Election) refused(err error) error {
	if e.setup.v.Load() == nil && (errors.Is(err, ErrUnsupported) || errors.Is(err, ErrTransactionPooler)) {
		return err
	}
	if !dbutil.DeniedByServer(err) {
		return nil
	}
	var le *lockError
	if errors.As(err, &le) {
		err = le.err
	}
	return fmt.Errorf("advisorylock: election %s: the server refused a privilege, not tried again: %w", quoteName(e.name), err)
}

// standAside pauses a candidate that just resigned for at least least,
// and where the others poll (a lease) for twice their longest pause, so
// that one of them takes over; false if ctx ended. Server-side waiters
// need no pause; a Resign asks for resignPause, for one not yet waiting.
func (e *Election) standAside(ctx context.Context, least time.Duration) bool {
	pause := least
	if b := e.setup.v.Load(); b != nil && b.terms == nil {
		pause = max(pause, 2*max(e.cfg.poll, leaseWaitCap))
	}
	return pause <= 0 || sleepWithin(ctx, pause)
}

// resignPause is the least a Run stands aside after a Resign.
const resignPause = time.Second

// quickLeadPause is rest's longest pause (or the poll interval).
const quickLeadPause = time.Second

// rest pauses a candidate whose lead returned nil within quickLeadPause
// (or the poll interval) of began, until pollPause(poll, that, quick)
// since began; quick counts such terms in a row. False if ctx ended.
func (e *Election) rest(ctx context.Context, began time.Time, quick *int) bool {
	longest := max(e.cfg.poll, quickLeadPause)
	ran := time.Since(began)
	if ran >= longest {
		*quick = 0
		return true
	}
	pause := pollPause(e.cfg.poll, longest, *quick) - ran
	*quick++
	return pause <= 0 || sleepWithin(ctx, pause)
}

// campaignBackoff is the longest pause between campaigns that failed.
const campaignBackoff = 5 * time.Second

// term is one leadership: the held lock and its token.
type term struct {
	g     *Guard
	token FencingToken
}

// lostBy reports whether lead's error err only says that t was lost.
func (t term) lostBy(err error) bool {
	_, why := t.g.h.isLost()
	if why == nil {
		return false
	}
	return errors.Is(err, context.Canceled) || errors.Is(err, ErrLockLost)
}

// campaign waits until this candidate leads, or ctx ends.
func (e *Election) campaign(ctx context.Context) (term, error) {
	b, err := e.backend(ctx)
	if err != nil {
		return term{}, wrapErr(e.name, "campaign", err)
	}
	if b.terms == nil {
		lg, err := e.lease.Lock(ctx)
		if err != nil {
			return term{}, err
		}
		return term{g: &lg.g, token: lg.lease.token}, nil
	}
	g, err := e.lock.Lock(ctx)
	if err != nil {
		return term{}, err
	}
	token, err := onLeaderConn(ctx, g, e.cfg.releaseTimeout, func(ctx context.Context, conn *sql.Conn) (FencingToken, error) {
		t, err := b.terms.BeginTerm(ctx, conn, e.lock.key, e.name, e.owner)
		return FencingToken(t), err
	})
	if err != nil {
		_ = g.Release(ctx) // discards the connection (see onLeaderConn)
		return term{}, wrapErr(e.name, "begin term", err)
	}
	return term{g: g, token: token}, nil
}

// onLeaderConn runs a term statement on g's pinned connection (see
// onPinned), bounded by timeout. If it fails the session's state is
// unknown: g is marked lost, so that its release discards the connection.
func onLeaderConn[T any](ctx context.Context, g *Guard, timeout time.Duration, stmt func(ctx context.Context, conn *sql.Conn) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	v, err := onPinned(ctx, g, stmt)
	if err != nil {
		g.h.lose("", err)
	}
	return v, err
}

// serve runs lead for t, cancelled on t's loss, and resigns after it.
func (e *Election) serve(ctx context.Context, t term, lead func(ctx context.Context, term FencingToken) error) error {
	lctx, cancel := context.WithCancelCause(ctx)
	t.g.h.onLost(cancel)
	l := e.begin(cancel)
	defer func() {
		t.g.h.onLost(nil)
		cancel(nil)
		e.resign(ctx, t)
		e.end(l)
	}()
	err := lead(lctx, t.token)
	if context.Cause(lctx) == errResigned && (err == nil || errors.Is(err, context.Canceled) || errors.Is(err, errResigned)) {
		return errResigned // resigned by Resign (see Run)
	}
	return err
}

// begin records a term that a Run serves, for Resign.
func (e *Election) begin(cancel context.CancelCauseFunc) *leadership {
	l := &leadership{cancel: cancel, done: make(chan struct{})}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.serving == nil {
		e.serving = map[*leadership]struct{}{}
	}
	e.serving[l] = struct{}{}
	return l
}

// end records that the term l is freed.
func (e *Election) end(l *leadership) {
	e.mu.Lock()
	delete(e.serving, l)
	e.mu.Unlock()
	close(l.done)
}

// Resign gives up the leadership that a Run of e holds, if it leads: its
// lead's context is cancelled, and once lead returns the term is ended
// and the lock freed, so that another candidate takes over (on
// PostgreSQL and MySQL a waiting one within about a round trip). That Run
// then stands aside for about a second (longer where candidates poll:
// SQLite), so that a candidate not yet waiting takes over, and campaigns
// again; it may lead again if no other candidate took over. A lead that returns its
// context's error after Resign counts as returning nil; Run returns any
// other error it returns.
//
// Resign returns once every term that e's Runs led when it was called
// has been freed; nil also when e did not lead. If ctx ends first it
// returns ctx's error, and the terms still end when their leads return.
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	terms := make([]*leadership, 0, len(e.serving))
	for l := range e.serving {
		terms = append(terms, l)
	}
	e.mu.Unlock()
	for _, l := range terms {
		l.cancel(errResigned)
	}
	for _, l := range terms {
		select {
		case <-l.done:
		case <-ctx.Done():
			return wrapErr(e.name, "resign", context.Cause(ctx))
		}
	}
	return nil
}

// resign ends t's term in its row (the pool may hand the session to the
// next campaign, whose grant Leader would take for the old term), then
// frees the leadership; a failed release is logged (it discarded its
// connection, which frees the lock anyway).
func (e *Election) resign(ctx context.Context, t term) {
	e.endTerm(ctx, t)
	if err := t.g.Release(ctx); err != nil {
		e.cfg.log().Warn("advisorylock: resign failed", "election", e.name, "term", t.token, "err", err)
	}
}

// endTerm marks t ended in its row, bounded as a release (session only).
func (e *Election) endTerm(ctx context.Context, t term) {
	b := e.setup.v.Load()
	if b == nil {
		return
	}
	if gone, _ := t.g.h.isLost(); b.terms == nil || gone {
		return
	}
	_, _ = onLeaderConn(context.WithoutCancel(ctx), t.g, e.cfg.releaseTimeout, func(ctx context.Context, conn *sql.Conn) (struct{}, error) {
		return struct{}{}, b.terms.EndTerm(ctx, conn, e.name, uint64(t.token))
	})
}

// Leader reports who leads now: Owner is the leader's WithOwner label,
// Token its term, Since the term's start, and on PostgreSQL and MySQL PID
// the leader's server session (and Client, where
// known); on SQLite ExpiresAt is the leader's lease expiry. It returns nil
// when nobody leads, also between a leader's grant and the recording of
// its term (about one round trip).
func (e *Election) Leader(ctx context.Context) (*Holder, error) {
	b, err := e.backend(ctx)
	if err != nil {
		return nil, wrapErr(e.name, "leader", err)
	}
	var h *Holder
	if b.terms != nil {
		var th *backend.Holder
		th, err = b.terms.TermHolder(ctx, e.db, e.lock.key, e.name)
		h = holderOf(th)
	} else if h, err = e.lease.Holder(ctx); h != nil {
		h.Owner = ownerLabelOf(h.Owner)
	}
	if h != nil {
		h.Name = e.name
	}
	return h, wrapErr(e.name, "leader", err)
}

// ownerLabelOf strips the suffix that ownerLabel adds to a label.
func ownerLabelOf(owner string) string {
	const suffix = 17 // "/" and 16 hex digits
	if n := len(owner) - suffix; n >= 0 && owner[n] == '/' {
		return owner[:n]
	}
	return owner
}

// Observe follows the leader for a replica that need not lead: the
// channel delivers the current leader (nil when nobody leads) and then
// every change (a new term, or nobody leading), and is closed when ctx
// ends. It polls Leader every WithPollInterval, or every second without
// that option, in one goroutine that ends with ctx. A receiver that falls
// behind misses intermediate leaders, never the latest. Errors of a poll
// are logged (once until a poll succeeds again), and the poll retried.
func (e *Election) Observe(ctx context.Context) <-chan *Holder {
	out := make(chan *Holder, 1)
	every := time.Second
	if e.cfg.pollSet {
		every = e.cfg.poll
	}
	go e.observe(ctx, out, every)
	return out
}

// observe is Observe's goroutine.
func (e *Election) observe(ctx context.Context, out chan *Holder, every time.Duration) {
	defer close(out)
	tick := time.NewTicker(every)
	defer tick.Stop()
	var last *Holder
	first, failing := true, false
	for {
		h, err := e.Leader(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				e.cfg.log().Warn("advisorylock: observing the leader failed; trying again", "election", e.name, "err", err)
			}
			failing = true
		case first || changed(last, h):
			first, failing, last = false, false, h
			deliverLatest(out, h)
		default:
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// changed reports whether the leader changed from a to b.
func changed(a, b *Holder) bool {
	if a == nil || b == nil {
		return a != b
	}
	return a.Token != b.Token || a.Owner != b.Owner
}

// deliverLatest puts h in out, a channel of capacity one that only this
// goroutine sends on, replacing a value the receiver has not taken yet.
func deliverLatest(out chan *Holder, h *Holder) {
	select {
	case out <- h:
		return
	default:
	}
	select {
	case <-out:
	default:
	}
	out <- h
}
