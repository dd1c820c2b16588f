package advisorylocktest

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
)

// Memory is an in-memory backend: an advisorylock.LeaseStore that keeps
// the rows of every lock constructed with its Options in maps guarded by
// one mutex, so that a test runs the library's own acquire, wait, renewal
// and release code without a database. Locks on one Memory exclude each
// other as locks on one database do, whatever handle they were given;
// locks on two Memories never meet.
//
// Every Lock is kept as a lease row, as on SQLite: it is renewed every
// third of its TTL (advisorylock.WithLeaseTTL) and lost when a renewal
// finds it gone. Lock, LeaseLock (with fencing tokens), shared holds
// (RLock), once-per-window locks (advisorylock.WithMinHold), runs done
// once (Lock.TryDoOnce), Semaphore, Election and Fence work. Times are
// each request's Now, the lock's clock (advisorylock.WithClock), so a
// test clock drives expiry.
//
// It is safe for concurrent use. The zero Memory is empty and ready to
// use; it must not be copied after first use.
type Memory struct {
	mu     sync.Mutex
	locks  map[int64]*memRow            // a Lock's row, by key
	shared map[int64]map[string]*memRow // shared holders' rows, by key and owner
	claims map[int64]*memRow            // a waiting writer's claim, by key
	leases map[string]*memLease         // a LeaseLock's row, by name
	fences map[string]uint64
	last   uint64                          // the highest token granted
	runs   map[string]map[string]time.Time // runs recorded done, by name and run
}

// memRow is a holder's row: live until expires.
type memRow struct {
	name, owner       string
	acquired, expires time.Time
}

func (r *memRow) live(now time.Time) bool { return r != nil && r.expires.After(now) }

// memLease is a lease row. It stays when freed, so that its token never
// goes down.
type memLease struct {
	memRow
	held  bool
	token uint64
}

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{} }

// Options returns the options that make a lock keep its rows in m: pass
// them to New, NewLeaseLock, NewSemaphore, NewElection or NewFence, with
// any handle (see OpenDB). Options given after them override them.
func (m *Memory) Options() []advisorylock.Option {
	return []advisorylock.Option{advisorylock.WithBackend(m)}
}

// OpenDB returns a new handle for locks on m, opened as sql.OpenDB opens
// one: close it when done. Its statements fail with ErrNoStatements, so a
// lock constructed without m's Options fails at its first operation
// instead of reaching a database; transactions begin and commit, empty,
// for Fence.Admit. The handle plays no part in locking: two handles are
// like two processes' handles on one database, whose locks on m exclude
// each other, and a lock with m's Options may be given any other handle.
func (m *Memory) OpenDB() *sql.DB { return sql.OpenDB(noStatements{}) }

// Revoke frees every hold of the Lock or LeaseLock named name, as an
// operator deleting its rows would: another lock on m can take it at
// once, while the holder learns of it only at its next renewal (a third
// of its TTL, 10s by default), which finds it gone and closes the Guard's
// Lost channel. Renewals run on real timers, so a test clock does not
// hasten them: a test that waits for Lost gives the holder a short TTL
// (advisorylock.WithLeaseTTL(time.Second), the shortest, closes it within
// about 333ms). A semaphore's slots are not revoked.
func (m *Memory) Revoke(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := advisorylock.Key(name)
	delete(m.locks, key)
	delete(m.shared, key)
	delete(m.claims, key)
	if l := m.leases[name]; l != nil {
		l.held = false
	}
}

// Name returns "memory", as the Observer's Event.Backend shows it.
func (m *Memory) Name() string { return "memory" }

// Schema returns "": m keeps no tables.
func (m *Memory) Schema() string { return "" }

// Traits reports that m honours LeaseRequest.MinHold
// (advisorylock.WithMinHold). It keeps shared rows (RLock: LeaseHolders)
// and signals no releases (it is no backend.ReleaseListener), so
// LeaseLock waiters poll.
func (m *Memory) Traits() backend.Traits {
	return backend.Traits{KeepsWindows: true}
}

// RunDone reports whether run of name is recorded done. A done ctx
// returns its cause.
func (m *Memory) RunDone(ctx context.Context, db backend.DB, name, run string) (bool, error) {
	if err := m.begin(ctx); err != nil {
		return false, err
	}
	defer m.mu.Unlock()
	_, done := m.runs[name][run]
	return done, nil
}

// RecordRun records run of name done at now (a record already there is
// kept), and deletes name's other records older than keep before now. A
// done ctx returns its cause.
func (m *Memory) RecordRun(ctx context.Context, db backend.DB, name, run string, now time.Time, keep time.Duration) error {
	if err := m.begin(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	byRun := m.runs[name]
	if byRun == nil {
		byRun = map[string]time.Time{}
		m.runs[name] = byRun
	}
	if _, ok := byRun[run]; !ok {
		byRun[run] = now
	}
	for r, at := range byRun {
		if r != run && at.Before(now.Add(-keep)) {
			delete(byRun, r)
		}
	}
	return nil
}

// now is r.Now, or the system clock's time where it is zero.
func now(r backend.LeaseRequest) time.Time {
	if r.Now.IsZero() {
		return time.Now()
	}
	return r.Now
}

// begin locks m for one statement's worth of work, after checking ctx as
// a statement would: a done ctx returns its cause.
func (m *Memory) begin(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	m.mu.Lock()
	if m.locks == nil {
		m.locks = map[int64]*memRow{}
		m.shared = map[int64]map[string]*memRow{}
		m.claims = map[int64]*memRow{}
		m.leases = map[string]*memLease{}
		m.fences = map[string]uint64{}
		m.runs = map[string]map[string]time.Time{}
	}
	return nil
}

// errKind refuses a request of a kind m does not know.
func errKind(k string) error {
	return fmt.Errorf("%w: advisorylocktest: Memory has no rows of kind %q", backend.ErrUnsupported, k)
}

// AcquireLease takes the row of r if it is free or expired and returns
// the grant, whose token is higher than any m granted before; an error
// matching backend.ErrNotAcquired if it is held. A Lock's row
// ("lock") is held by a live exclusive row or a live shared holder; a
// waiting writer (r.Wait) that misses claims the key, which keeps new
// shared holders out until its grant, its release or its claim's expiry.
// A shared holder's row ("shared") is held by a live exclusive row or a
// live claim. A done ctx returns its cause.
func (m *Memory) AcquireLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	if err := m.begin(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	t := now(r)
	row := &memRow{name: r.Name, owner: r.Owner, acquired: t, expires: t.Add(max(r.TTL, r.MinHold))}
	switch r.Kind {
	case "lock":
		if m.locks[r.Key].live(t) || m.sharedIn(r.Key, t) {
			if r.Wait {
				m.claims[r.Key] = row
			}
			return 0, backend.ErrNotAcquired
		}
		m.locks[r.Key] = row
		if c := m.claims[r.Key]; c != nil && c.owner == r.Owner {
			delete(m.claims, r.Key)
		}
	case "shared":
		if m.locks[r.Key].live(t) || m.claims[r.Key].live(t) {
			return 0, backend.ErrNotAcquired
		}
		if m.shared[r.Key] == nil {
			m.shared[r.Key] = map[string]*memRow{}
		}
		m.shared[r.Key][r.Owner] = row
	case "lease":
		if l := m.leases[r.Name]; l != nil && l.held && l.live(t) {
			return 0, backend.ErrNotAcquired
		}
		m.leases[r.Name] = &memLease{memRow: *row, held: true, token: m.last + 1}
	default:
		return 0, errKind(r.Kind)
	}
	m.last++
	return m.last, nil
}

// sharedIn reports whether a live shared holder of key is in.
func (m *Memory) sharedIn(key int64, t time.Time) bool {
	for _, s := range m.shared[key] {
		if s.live(t) {
			return true
		}
	}
	return false
}

// RenewLease extends the row by r.TTL from r.Now (with r.MinHold, never
// before the window's end) if r.Owner, and for a lease r.Token, still
// hold it unexpired; an error matching backend.ErrLeaseLost
// otherwise. A done ctx returns its cause.
func (m *Memory) RenewLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) (uint64, error) {
	if err := m.begin(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	t := now(r)
	var row *memRow
	switch r.Kind {
	case "lock":
		row = m.locks[r.Key]
	case "shared":
		row = m.shared[r.Key][r.Owner]
	case "lease":
		if l := m.leases[r.Name]; l != nil && l.held && l.token == r.Token {
			row = &l.memRow
		}
	default:
		return 0, errKind(r.Kind)
	}
	if !row.live(t) || row.owner != r.Owner {
		return 0, fmt.Errorf("%w: advisorylocktest: its row expired or was taken over", backend.ErrLeaseLost)
	}
	row.expires = later(t.Add(r.TTL), row.acquired.Add(r.MinHold))
	return max(r.Token, 1), nil
}

// ReleaseLease frees the row if r still holds it: a Lock's or a shared
// holder's row by r.Owner, a lease by r.Token (with Token 0, an acquire
// whose outcome was unknown, whatever r.Owner holds, and its claim). A row
// held by someone else is left alone. With r.MinHold the row stays taken
// until the window's end. A done ctx returns its cause.
func (m *Memory) ReleaseLease(ctx context.Context, db backend.DB, r backend.LeaseRequest) error {
	if err := m.begin(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	t := now(r)
	windowEnd := func(row *memRow) time.Time {
		return earlier(row.expires, later(t, row.acquired.Add(r.MinHold)))
	}
	switch r.Kind {
	case "lock":
		row := m.locks[r.Key]
		switch {
		case row == nil || row.owner != r.Owner:
		case r.MinHold > 0 && r.Token != 0:
			row.expires = windowEnd(row)
		default:
			delete(m.locks, r.Key)
		}
		if c := m.claims[r.Key]; r.Token == 0 && c != nil && c.owner == r.Owner {
			delete(m.claims, r.Key)
		}
	case "shared":
		for owner, s := range m.shared[r.Key] {
			if owner == r.Owner || !s.live(t) {
				delete(m.shared[r.Key], owner)
			}
		}
		if len(m.shared[r.Key]) == 0 {
			delete(m.shared, r.Key)
		}
	case "lease":
		l := m.leases[r.Name]
		switch {
		case l == nil || !l.held:
		case r.Token == 0 && l.owner == r.Owner, r.Token != 0 && l.token == r.Token && r.MinHold == 0:
			l.held, l.expires = false, earlier(l.expires, t)
		case r.Token != 0 && l.token == r.Token:
			l.expires = windowEnd(&l.memRow)
			l.held = l.expires.After(t) // its owner shows as holder until the window's end
		}
	default:
		return errKind(r.Kind)
	}
	return nil
}

// LeaseHolder reports the live holder of r's row as of r.Now, or nil: for
// a Lock ("lock") its exclusive holder, else one of its shared holders;
// for a shared holder ("shared") what keeps it out, the exclusive
// holder or else a waiting writer's claim (Name ""); for a lease its
// holder and token. A done ctx returns its cause.
func (m *Memory) LeaseHolder(ctx context.Context, db backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	if err := m.begin(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	t := now(r)
	switch r.Kind {
	case "lock":
		if hs := m.holders(r.Key, t); len(hs) > 0 {
			return hs[0], nil
		}
	case "shared":
		if row := m.locks[r.Key]; row.live(t) {
			return m.holder(r.Key, row, false), nil
		}
		if c := m.claims[r.Key]; c.live(t) {
			h := m.holder(r.Key, c, false)
			h.Name = ""
			return h, nil
		}
	case "lease":
		if l := m.leases[r.Name]; l != nil && l.held && l.live(t) {
			h := m.holder(r.Key, &l.memRow, false)
			h.Token = l.token
			return h, nil
		}
	default:
		return nil, errKind(r.Kind)
	}
	return nil, nil
}

// LeaseHolders lists every live holder of r.Key as of r.Now, the
// exclusive one first, then the shared ones in the order they came (the
// list of a store with shared rows, for Lock.Holders). A done ctx returns its
// cause.
func (m *Memory) LeaseHolders(ctx context.Context, db backend.DB, r backend.LeaseRequest) ([]*backend.Holder, error) {
	if err := m.begin(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	return m.holders(r.Key, now(r)), nil
}

// holders lists key's live holders at t (m locked).
func (m *Memory) holders(key int64, t time.Time) []*backend.Holder {
	var hs []*backend.Holder
	if row := m.locks[key]; row.live(t) {
		hs = append(hs, m.holder(key, row, false))
	}
	var shared []*memRow
	for _, s := range m.shared[key] {
		if s.live(t) {
			shared = append(shared, s)
		}
	}
	slices.SortFunc(shared, func(a, b *memRow) int {
		return cmp.Or(a.acquired.Compare(b.acquired), cmp.Compare(a.owner, b.owner))
	})
	for _, s := range shared {
		hs = append(hs, m.holder(key, s, true))
	}
	return hs
}

func (m *Memory) holder(key int64, row *memRow, shared bool) *backend.Holder {
	return &backend.Holder{Name: row.name, Backend: m.Name(), Key: key, Owner: row.owner,
		Since: row.acquired, ExpiresAt: row.expires, Shared: shared}
}

// AdmitToken stores token as resource's highest if it is not lower than
// the stored one, and returns the highest (token, if admitted; a higher
// one refuses it, and Fence.Admit returns an error matching
// advisorylock.ErrStaleToken).
// It takes effect at once: unlike a database's, it is not undone when tx
// rolls back, and tx (which may come from any handle, such as OpenDB's)
// runs nothing. A done ctx returns its cause.
func (m *Memory) AdmitToken(ctx context.Context, tx *sql.Tx, resource string, token uint64) (uint64, error) {
	if err := m.begin(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	m.fences[resource] = max(m.fences[resource], token)
	return m.fences[resource], nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Memory is a LeaseStore whose Traits say it keeps windows, and which
// keeps shared rows, runs and fences.
var (
	_ backend.SharedRowStore = (*Memory)(nil)
	_ backend.RunRecorder    = (*Memory)(nil)
	_ backend.TokenAdmitter  = (*Memory)(nil)
)
