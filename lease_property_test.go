package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"pgregory.net/rapid"
)

// propHolder is one lease holder of the model: what it believes it holds.
type propHolder struct {
	name  string
	owner string
	token uint64
	until time.Time // the lease's expiry as last granted or renewed
	held  bool      // it has not released, nor been told the lease is lost
}

// leaseModel drives the SQLite LeaseStore with a clock of its own and
// predicts every answer.
type leaseModel struct {
	ctx      context.Context
	db       *sql.DB
	store    backend.LeaseStore
	ttl      time.Duration
	now      time.Time
	names    []string
	holders  []*propHolder
	issued   map[string]uint64 // the highest token granted per name
	admitted map[string]uint64 // the highest token each fence admitted
	acquires int
}

const propTTL = 10 * time.Second

// valid reports whether h's lease is in force: granted, not released,
// not expired.
func (m *leaseModel) valid(h *propHolder) bool { return h.held && m.now.Before(h.until) }

func (m *leaseModel) request(h *propHolder) backend.LeaseRequest {
	return backend.LeaseRequest{Kind: "lease", Name: h.name, Owner: h.owner, Token: h.token, TTL: m.ttl, Now: m.now}
}

func (m *leaseModel) acquire(t *rapid.T) {
	h := rapid.SampledFrom(m.holders).Draw(t, "holder")
	if h.held {
		t.Skip("holder holds a lease already")
	}
	name := rapid.SampledFrom(m.names).Draw(t, "name")
	free := true
	for _, o := range m.holders {
		if o.name == name && m.valid(o) {
			free = false
		}
	}
	m.acquires++
	owner := fmt.Sprintf("owner-%d", m.acquires)
	token, err := m.store.AcquireLease(m.ctx, m.db, backend.LeaseRequest{Kind: "lease", Name: name, Owner: owner, TTL: m.ttl, Now: m.now})
	switch {
	case errors.Is(err, advisorylock.ErrNotAcquired):
		if free {
			t.Fatalf("acquire of a free lease = %v", err)
		}
	case err != nil:
		t.Fatalf("acquire: %v", err)
	case token <= m.issued[name]:
		t.Fatalf("token %d granted after %d: tokens must strictly increase", token, m.issued[name])
	default:
		// A grant of a lease the model thinks held is recorded as the
		// database made it: check then finds two leases in force.
		m.issued[name] = token
		*h = propHolder{name: name, owner: owner, token: token, until: m.now.Add(m.ttl), held: true}
	}
}

func (m *leaseModel) renew(t *rapid.T) {
	h := rapid.SampledFrom(m.holders).Draw(t, "holder")
	if !h.held {
		t.Skip("holder holds nothing")
	}
	_, err := m.store.RenewLease(m.ctx, m.db, m.request(h))
	switch {
	case m.valid(h) && err == nil:
		h.until = m.now.Add(m.ttl)
	case !m.valid(h) && errors.Is(err, backend.ErrLeaseLost):
		h.held = false
	default:
		t.Fatalf("renew of a lease in force=%v: %v", m.valid(h), err)
	}
}

func (m *leaseModel) release(t *rapid.T) {
	h := rapid.SampledFrom(m.holders).Draw(t, "holder")
	if !h.held {
		t.Skip("holder holds nothing")
	}
	if err := m.store.ReleaseLease(m.ctx, m.db, m.request(h)); err != nil {
		t.Fatalf("release: %v", err)
	}
	h.held = false
}

func (m *leaseModel) advance(t *rapid.T) {
	m.now = m.now.Add(time.Duration(rapid.Int64Range(0, 2*m.ttl.Milliseconds()).Draw(t, "ms")) * time.Millisecond)
}

// expire ends a name's lease in the database, as the database clock
// passing its expiry would (PostgreSQL keeps lease times on its own
// clock, which a test cannot move).
func (m *leaseModel) expire(t *rapid.T) {
	name := rapid.SampledFrom(m.names).Draw(t, "name")
	if _, err := m.db.ExecContext(m.ctx, "UPDATE advisorylock_leases SET expires_at = now() - interval '1 millisecond' WHERE name = $1", name); err != nil {
		t.Fatal(err)
	}
	for _, h := range m.holders {
		if h.name == name && h.until.After(m.now) {
			h.until = m.now
		}
	}
}

// write is a holder, which may have lost its lease without knowing,
// writing to its resource through the fence.
func (m *leaseModel) write(t *rapid.T) {
	h := rapid.SampledFrom(m.holders).Draw(t, "holder")
	if h.token == 0 {
		t.Skip("holder never had a token")
	}
	resource := h.name + "/resource"
	tx, err := m.db.BeginTx(m.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	got, err := m.store.(backend.TokenAdmitter).AdmitToken(m.ctx, tx, resource, h.token)
	highest := m.admitted[resource]
	switch {
	case err != nil:
		t.Fatalf("Admit(%d): %v", h.token, err)
	case got == h.token && h.token < highest:
		t.Fatalf("the fence admitted token %d after admitting %d", h.token, highest)
	case got == h.token:
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		m.admitted[resource] = h.token
	case h.token >= highest || got != highest:
		t.Fatalf("Admit(%d) refused with highest %d; the highest admitted is %d", h.token, got, highest)
	}
}

// check asserts that at most one holder's lease per name is in force,
// and that the database agrees on which.
func (m *leaseModel) check(t *rapid.T) {
	for _, name := range m.names {
		var inForce []*propHolder
		for _, h := range m.holders {
			if h.name == name && m.valid(h) {
				inForce = append(inForce, h)
			}
		}
		if len(inForce) > 1 {
			t.Fatalf("%d leases of %q in force at once", len(inForce), name)
		}
		got, err := m.store.LeaseHolder(m.ctx, m.db, backend.LeaseRequest{Kind: "lease", Name: name, Now: m.now})
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case len(inForce) == 0 && got != nil:
			t.Fatalf("the database says %q is held by %s (token %d); the model says free", name, got.Owner, got.Token)
		case len(inForce) == 1 && (got == nil || got.Owner != inForce[0].owner || got.Token != inForce[0].token):
			t.Fatalf("the database says %q is held by %+v; the model says %s (token %d)", name, got, inForce[0].owner, inForce[0].token)
		}
	}
}

// TestLeaseStoreProperties drives random interleavings of acquire, renew,
// release, expiry (the clock jumping) and fenced writes by several
// holders against a real SQLite file, and checks that tokens per name
// strictly increase, that a fence never admits a token lower than one it
// admitted, and that at most one holder's lease is in force at any time.
func TestLeaseStoreProperties(t *testing.T) {
	testdb.Slow(t, "property test: random interleavings on SQLite")
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), sqliteWAL)
	checkLeaseStore(t, db, advisorylock.SQLite(), propTTL, func(m *leaseModel) map[string]func(*rapid.T) {
		return map[string]func(*rapid.T){"advance": m.advance}
	})
}

// TestPostgresLeaseStoreProperties is TestLeaseStoreProperties on
// PostgreSQL, through both drivers: its statements differ and keep lease
// times on the database clock, so expiry is the database's own (an
// expires_at set in the past) instead of a clock jump.
func TestPostgresLeaseStoreProperties(t *testing.T) {
	testdb.Slow(t, "property test: random interleavings on PostgreSQL")
	t.Parallel() // names of its own; most of it is round trips
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			checkLeaseStore(t, testdb.OpenPostgres(t, drv), advisorylock.Postgres(), time.Minute, func(m *leaseModel) map[string]func(*rapid.T) {
				return map[string]func(*rapid.T){"expire": m.expire}
			})
		})
	}
}

// checkLeaseStore runs the lease model against backend b on db, with
// lease TTL ttl and the backend's own ways of time passing.
func checkLeaseStore(t *testing.T, db *sql.DB, b backend.Backend, ttl time.Duration, timeSteps func(*leaseModel) map[string]func(*rapid.T)) {
	ctx := context.Background()
	store, ok := b.(backend.TokenAdmitter)
	if !ok {
		t.Fatalf("%T is not a LeaseStore that admits tokens", b)
	}
	// NewLeaseLock creates the tables, and NewFence the fence table.
	if _, err := advisorylock.NewFence(db, testdb.UniqueName(t), advisorylock.WithBackend(b)); err != nil {
		t.Fatal(err)
	}
	if _, err := advisorylock.NewLeaseLock(db, testdb.UniqueName(t), advisorylock.WithBackend(b)); err != nil {
		t.Fatal(err)
	}
	base, run := testdb.UniqueName(t), 0
	rapid.Check(t, func(t *rapid.T) {
		run++
		prefix := fmt.Sprintf("%s/%d", base, run)
		m := &leaseModel{
			ctx:      ctx,
			db:       db,
			store:    store,
			ttl:      ttl,
			now:      time.UnixMilli(1_700_000_000_000),
			names:    []string{prefix + "/a", prefix + "/b"},
			issued:   map[string]uint64{},
			admitted: map[string]uint64{},
		}
		for range 3 {
			m.holders = append(m.holders, &propHolder{})
		}
		steps := map[string]func(*rapid.T){
			"acquire": m.acquire,
			"renew":   m.renew,
			"release": m.release,
			"write":   m.write,
			"":        m.check,
		}
		for k, f := range timeSteps(m) {
			steps[k] = f
		}
		t.Repeat(steps)
	})
}
