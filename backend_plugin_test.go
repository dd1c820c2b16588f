package advisorylock_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/lib/pq"
)

// mapBackend is a third backend, written outside the package: leases kept
// in a map. It proves Backend is pluggable through exported names alone,
// and that a LeaseStore needs nothing more: it implements one optional
// interface (TokenAdmitter), and the library takes the documented
// fallbacks for the rest.
type mapBackend struct {
	mu     sync.Mutex
	rows   map[string]*mapRow
	fences map[string]uint64
}

type mapRow struct {
	owner   string
	gen     uint64
	expires time.Time
}

func newMapBackend() *mapBackend {
	return &mapBackend{rows: map[string]*mapRow{}, fences: map[string]uint64{}}
}

var _ backend.TokenAdmitter = (*mapBackend)(nil)

func (m *mapBackend) Name() string           { return "map" }
func (m *mapBackend) Traits() backend.Traits { return backend.Traits{} }
func (m *mapBackend) Schema() string         { return "" }

func (m *mapBackend) row(r backend.LeaseRequest) *mapRow {
	id := r.Name
	if r.Kind == "lock" {
		id = "lock:" + r.Name
	}
	if m.rows[id] == nil {
		m.rows[id] = &mapRow{}
	}
	return m.rows[id]
}

func (m *mapBackend) AcquireLease(_ context.Context, _ backend.DB, r backend.LeaseRequest) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	row := m.row(r)
	if row.owner != "" && r.Now.Before(row.expires) {
		return 0, backend.ErrNotAcquired
	}
	row.owner, row.gen, row.expires = r.Owner, row.gen+1, r.Now.Add(r.TTL)
	return row.gen, nil
}

func (m *mapBackend) RenewLease(_ context.Context, _ backend.DB, r backend.LeaseRequest) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	row := m.row(r)
	if row.owner != r.Owner || !r.Now.Before(row.expires) {
		return 0, backend.ErrLeaseLost
	}
	row.expires = r.Now.Add(r.TTL)
	return row.gen, nil
}

func (m *mapBackend) ReleaseLease(_ context.Context, _ backend.DB, r backend.LeaseRequest) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if row := m.row(r); row.owner == r.Owner {
		row.owner = ""
	}
	return nil
}

func (m *mapBackend) LeaseHolder(_ context.Context, _ backend.DB, r backend.LeaseRequest) (*backend.Holder, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	row := m.row(r)
	if row.owner == "" || !r.Now.Before(row.expires) {
		return nil, nil
	}
	return &backend.Holder{Backend: m.Name(), Owner: row.owner, Token: row.gen, ExpiresAt: row.expires}, nil
}

func (m *mapBackend) AdmitToken(_ context.Context, _ *sql.Tx, resource string, token uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fences[resource] = max(m.fences[resource], token)
	return m.fences[resource], nil
}

// noDB is a handle the map backend never uses.
type noDB struct{}

func (noDB) Conn(context.Context) (*sql.Conn, error) { return nil, errors.New("no database") }
func (noDB) Driver() driver.Driver                   { return nil }

func TestThirdBackendPlugsIn(t *testing.T) {
	ctx := context.Background()
	b := newMapBackend()
	l, err := advisorylock.New(noDB{}, "plugged", advisorylock.WithBackend(b))
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second TryLock = %v, want ErrNotAcquired", err)
	}
	if h, err := l.Holder(ctx); err != nil || h == nil || h.Name != "plugged" || h.Owner == "" {
		t.Fatalf("Holder = %+v, %v; want the map's holder of plugged", h, err)
	}
	// A store without shared rows (no SharedRowStore) lists its one
	// holder through LeaseHolder, and refuses shared holds.
	if hs, err := l.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Name != "plugged" || hs[0].Owner == "" {
		t.Fatalf("Holders = %+v, %v; want the one holder", hs, err)
	}
	if _, err := l.TryRLock(ctx); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("TryRLock on a store without shared rows = %v, want ErrUnsupported", err)
	}
	mustRelease(t, g)

	// A store that keeps no runs (no RunRecorder): TryDoOnce fails with
	// ErrUnsupported and runs nothing.
	ran, err := l.TryDoOnce(ctx, "r", func(context.Context) error {
		t.Error("TryDoOnce ran fn on a store that keeps no runs")
		return nil
	})
	if ran || !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("TryDoOnce on a store without runs = %v, %v; want false, ErrUnsupported", ran, err)
	}
	if g, err := l.TryLock(ctx); err != nil {
		t.Fatalf("TryLock after the refused TryDoOnce = %v, want the lock free", err)
	} else {
		mustRelease(t, g)
	}

	ll, err := advisorylock.NewLeaseLock(noDB{}, "plugged", advisorylock.WithBackend(b))
	if err != nil {
		t.Fatal(err)
	}
	var tokens []advisorylock.FencingToken
	for range 3 {
		if _, err := ll.TryDo(ctx, func(_ context.Context, lease advisorylock.Lease) error {
			tokens = append(tokens, lease.Token())
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(tokens) != 3 || tokens[0] != 1 || tokens[1] != 2 || tokens[2] != 3 {
		t.Fatalf("tokens = %v, want [1 2 3]", tokens)
	}
}

// TestThirdBackendHoldsElections: a backend that keeps leases holds
// elections with nothing more; its lease tokens are the terms.
func TestThirdBackendHoldsElections(t *testing.T) {
	testdb.Slow(t, "campaigns several terms")
	t.Parallel() // a backend of its own, in the process: nothing shared
	e, err := advisorylock.NewElection(noDB{}, "plugged", advisorylock.WithBackend(newMapBackend()), advisorylock.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	var terms []advisorylock.FencingToken
	done := errors.New("done")
	err = e.Run(context.Background(), func(ctx context.Context, term advisorylock.FencingToken) error {
		if h, err := e.Leader(ctx); err != nil || h == nil || h.Owner != "me" || h.Token != term || h.Name != "plugged" {
			return fmt.Errorf("Leader during term %v: %+v, %v", term, h, err)
		}
		if terms = append(terms, term); len(terms) < 2 {
			return nil
		}
		return done
	})
	if !errors.Is(err, done) || len(terms) != 2 || terms[0] >= terms[1] {
		t.Fatalf("Run = %v with terms %v, want two increasing terms", err, terms)
	}
}

// wrappedDriver hides lib/pq's type, as instrumentation wrappers do.
type wrappedDriver struct{ driver.Driver }

var registerWrapped sync.Once

func TestWrappedDriverIsDetectedByAskingTheDatabase(t *testing.T) {
	registerWrapped.Do(func() { sql.Register("wrapped-pq", wrappedDriver{&pq.Driver{}}) })
	dsn := testdb.PostgresDSN(t)
	db, err := sql.Open("wrapped-pq", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l, err := advisorylock.New(db, testdb.UniqueName(t))
	if err != nil {
		t.Fatalf("New on a wrapped driver: %v", err)
	}
	g, err := l.TryLock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := l.Holder(context.Background()); h == nil || h.PID <= 0 || h.Owner != "" {
		t.Fatalf("Holder = %+v, want the postgres backend's: a session lock, read with its backend pid", h)
	}
	mustRelease(t, g)
}
