package advisorylock_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/observetest"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// eachSemaphoreBackend runs f on every backend; open returns a new handle
// on one database each time (its own pool).
func eachSemaphoreBackend(t *testing.T, f func(t *testing.T, backend string, open func() *sql.DB)) {
	eachServerSemaphoreBackend(t, f)
	t.Run("sqlite", func(t *testing.T) {
		path := testdb.SQLitePath(t)
		f(t, "sqlite", func() *sql.DB { return testdb.OpenSQLite(t, path, sqliteJournals[0].options) })
	})
}

// eachServerSemaphoreBackend is eachSemaphoreBackend without SQLite: the
// backends whose slots are session locks on a server.
func eachServerSemaphoreBackend(t *testing.T, f func(t *testing.T, backend string, open func() *sql.DB)) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			f(t, "postgres", func() *sql.DB { return testdb.OpenPostgres(t, drv) })
		})
	}
	t.Run("mysql", func(t *testing.T) {
		dsn := testdb.MySQLDSN(t)
		f(t, "mysql", func() *sql.DB { return testdb.OpenMySQLDSN(t, dsn) })
	})
}

func newSemaphore(t testing.TB, db advisorylock.DB, name string, slots int, opts ...advisorylock.Option) *advisorylock.Semaphore {
	t.Helper()
	s, err := advisorylock.NewSemaphore(db, name, slots, opts...)
	if err != nil {
		t.Fatalf("NewSemaphore(%q, %d): %v", name, slots, err)
	}
	return s
}

func TestNewSemaphoreRefusesBadArgumentsWithoutIO(t *testing.T) {
	db, err := sql.Open("postgres", "host=192.0.2.1 connect_timeout=1") // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := advisorylock.NewSemaphore(nil, "n", 3); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("nil db: %v, want ErrUnsupported", err)
	}
	for _, slots := range []int{0, -1, advisorylock.MaxSlots + 1} {
		if _, err := advisorylock.NewSemaphore(db, "n", slots); err == nil {
			t.Errorf("NewSemaphore with %d slots: no error", slots)
		}
	}
	s, err := advisorylock.NewSemaphore(db, "n", 3)
	if err != nil || s.Name() != "n" {
		t.Fatalf("NewSemaphore = %v, %v", s, err)
	}
	if st := db.Stats(); st.OpenConnections != 0 {
		t.Fatalf("NewSemaphore opened %d connections", st.OpenConnections)
	}
}

// TestSlotKeyIsTheDocumentedHashAndApartFromKey recomputes SlotKey from
// its documented derivation, and checks that no slot key of a few names
// is the Key of a name nearby.
func TestSlotKeyIsTheDocumentedHashAndApartFromKey(t *testing.T) {
	names := []string{"", "a", "job", "job\x00slot0", "advisorylock:v1:slot", "😀"}
	keys := map[int64]string{}
	for _, name := range names {
		keys[advisorylock.Key(name)] = "Key(" + strconv.Quote(name) + ")"
		keys[advisorylock.Key(name+"\x000")] = "Key of a look-alike"
	}
	for _, name := range names {
		for slot := range 5 {
			sum := sha256.Sum256([]byte("advisorylock:v1:slot\x00" + name + "\x00" + strconv.Itoa(slot)))
			want := int64(binary.BigEndian.Uint64(sum[:8]))
			got := advisorylock.SlotKey(name, slot)
			if got != want {
				t.Fatalf("SlotKey(%q, %d) = %d, want %d", name, slot, got, want)
			}
			if other, ok := keys[got]; ok {
				t.Fatalf("SlotKey(%q, %d) = %s", name, slot, other)
			}
			keys[got] = "slot"
		}
	}
}

// TestSemaphoreAdmitsAtMostSlotsHolders runs 8 workers, each with its
// own pool, on a 3-slot semaphore: never more than 3 inside (an atomic
// count), never two holders on one slot, inside every section the
// holder's own session holds its slot's lock and no other slot's (asked
// in Guard.WithConn, which nothing else can change meanwhile: a slot lock
// left on a recycled connection shows at its next holder), and, read
// from the server while they run, no session holding two slots.
func TestSemaphoreAdmitsAtMostSlotsHolders(t *testing.T) {
	testdb.Slow(t, "8 workers contending for seconds")
	t.Parallel() // names of its own
	eachSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		t.Parallel() // a name of its own on each backend
		const workers, slots, rounds = 8, 3, 25
		name := testdb.UniqueName(t)
		var inside, most atomic.Int32
		var bySlot [slots]atomic.Int32
		enter := func(ctx context.Context, g *advisorylock.Guard) error {
			n := inside.Add(1)
			defer inside.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			if n > slots {
				return fmt.Errorf("%d holders inside a %d-slot semaphore", n, slots)
			}
			slot := g.Slot()
			if bySlot[slot].Add(1) != 1 {
				return fmt.Errorf("two holders on slot %d", slot)
			}
			defer bySlot[slot].Add(-1)
			if own, err := slotsOfSession(ctx, g, backend, name, slots); err != nil || (own != nil && !slices.Equal(own, []int{slot})) {
				return fmt.Errorf("the holder of slot %d: its own session holds slots %v (%v)", slot, own, err)
			}
			time.Sleep(2 * time.Millisecond) // a section's work
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		done := make(chan struct{})
		watcherErr := make(chan error, 1)
		watcher := newSemaphore(t, open(), name, slots)
		admin := open()
		go func() {
			err := watchHolders(ctx, watcher, slots, admin, backend, done)
			if err != nil {
				cancel() // the workers stop at once
			}
			watcherErr <- err
		}()
		var wg sync.WaitGroup
		errs := make(chan error, workers*rounds)
		for w := range workers {
			s := newSemaphore(t, open(), name, slots, advisorylock.WithPollInterval(2*time.Millisecond))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					errs <- semaphoreRound(ctx, s, (w+r)%3, enter)
				}
			}()
		}
		wg.Wait()
		close(done)
		close(errs)
		if err := <-watcherErr; err != nil {
			t.Fatal(err)
		}
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if m := most.Load(); m < 2 {
			t.Fatalf("at most %d holders at once: the workers never overlapped, so the test proves nothing", m)
		}
		t.Logf("%s: at most %d of %d inside", backend, most.Load(), slots)
	})
}

// semaphoreRound takes a slot one of three ways and runs enter in it,
// with the slot's Guard.
func semaphoreRound(ctx context.Context, s *advisorylock.Semaphore, how int, enter func(ctx context.Context, g *advisorylock.Guard) error) error {
	inGuard := func(ctx context.Context) error { return enter(ctx, advisorylock.GuardFromContext(ctx)) }
	switch how {
	case 0:
		g, err := s.Acquire(ctx)
		if err != nil {
			return err
		}
		err = enter(ctx, g)
		return errors.Join(err, g.Release(ctx))
	case 1:
		return s.Do(ctx, inGuard)
	default:
		_, err := s.TryDo(ctx, inGuard)
		return err
	}
}

// watchHolders reads Holders until done: every holder on a distinct slot
// in range, no session (PID) on two slots; and, asked of the server
// directly in one statement, no session holding two slots. On MySQL both
// reads ask IS_USED_LOCK slot after slot, so a session that moves from
// one slot to another between two of them reads on both: there a session
// on two slots is an error when the next read shows it again (a lock
// left on a connection stays), on PostgreSQL (pg_locks, one snapshot) at
// once.
func watchHolders(ctx context.Context, s *advisorylock.Semaphore, slots int, admin *sql.DB, backend string, done <-chan struct{}) error {
	seen := 0
	var suspects map[int64]bool // on two slots in the last read
	for {
		select {
		case <-done:
			if seen == 0 {
				return errors.New("Holders never saw a holder")
			}
			return nil
		default:
		}
		hs, err := s.Holders(ctx)
		if err != nil {
			return err
		}
		twice := map[int64]bool{}
		taken, pids := map[int]bool{}, map[int]bool{}
		for _, h := range hs {
			if h.Slot < 0 || h.Slot >= slots || taken[h.Slot] || h.Name != s.Name() {
				return fmt.Errorf("Holders = %+v: bad or repeated slot", hs)
			}
			if h.PID != 0 && pids[h.PID] {
				twice[int64(h.PID)] = true
			}
			taken[h.Slot], pids[h.PID] = true, true
		}
		per, err := slotSnapshot(admin, backend, s.Name(), slots)
		if err != nil {
			return err
		}
		if len(per) > slots {
			return fmt.Errorf("slot locks held per session: %v, more sessions than slots", per)
		}
		for id, n := range per {
			if n != 1 {
				twice[id] = true
			}
		}
		for id := range twice {
			if backend != "mysql" || suspects[id] {
				return fmt.Errorf("session %d holds two slots (Holders %+v; per session %v)", id, hs, per)
			}
		}
		suspects = twice
		seen += len(hs)
		time.Sleep(5 * time.Millisecond) // pacing only: the server is shared
	}
}

// TestSemaphoreReleaseLeavesNoSlotOnTheConnection takes and releases the
// slots of a 2-slot semaphore, one at a time, on a pool of one
// connection, so that every holder gets the connection of the one before:
// inside each hold that connection's session holds exactly the holder's
// slot, and after each release Holders, asked on another pool, is empty.
// A slot's lock left on a recycled connection rides to the next holder
// (on MySQL, where a session may take a named lock twice, even as the
// same slot).
func TestSemaphoreReleaseLeavesNoSlotOnTheConnection(t *testing.T) {
	t.Parallel() // names and pools of its own
	eachSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		ctx := context.Background()
		const slots = 2
		name := testdb.UniqueName(t)
		db := open()
		db.SetMaxOpenConns(1)
		s, watcher := newSemaphore(t, db, name, slots), newSemaphore(t, open(), name, slots)
		var got [slots]int
		for round := 0; round < 40 && (round < 10 || slices.Contains(got[:], 0)); round++ {
			g, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("round %d: TryAcquire of a free semaphore: %v", round, err)
			}
			got[g.Slot()]++
			if own, err := slotsOfSession(ctx, g, backend, name, slots); err != nil || (own != nil && !slices.Equal(own, []int{g.Slot()})) {
				t.Fatalf("round %d: the holder of slot %d: its session holds slots %v (%v)", round, g.Slot(), own, err)
			}
			mustRelease(t, g)
			if hs, err := watcher.Holders(ctx); err != nil || len(hs) != 0 {
				t.Fatalf("round %d: Holders after the release of slot %d = %+v, %v; want none", round, g.Slot(), hs, err)
			}
		}
		if slices.Contains(got[:], 0) {
			t.Fatalf("slots taken %v times in 40 rounds: the test never moved between slots", got)
		}
	})
}

// TestSemaphoreTryTakesExactlyOneSlot takes every slot of a free
// semaphore one TryAcquire at a time and checks on the server that each
// holder's session holds exactly one slot lock: the one statement that
// tries the slots stops at the first it gets. (SQLite's slots are rows,
// tried one statement each: no session holds them.)
func TestSemaphoreTryTakesExactlyOneSlot(t *testing.T) {
	t.Parallel()
	eachServerSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		ctx := context.Background()
		admin := open()
		name := testdb.UniqueName(t)
		s := newSemaphore(t, open(), name, 5)
		var guards []*advisorylock.Guard
		for range 5 {
			g, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			guards = append(guards, g)
			perSession := slotsPerSession(t, admin, backend, name, 5)
			if len(perSession) != len(guards) {
				t.Fatalf("after %d tries, slot locks held by sessions: %v", len(guards), perSession)
			}
			for id, n := range perSession {
				if n != 1 {
					t.Fatalf("session %d holds %d slots", id, n)
				}
			}
		}
		if _, err := s.TryAcquire(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryAcquire on a full semaphore: %v, want ErrNotAcquired", err)
		}
		// Holders names the same sessions, one per slot, in slot order.
		hs, err := s.Holders(ctx)
		if err != nil || len(hs) != 5 {
			t.Fatalf("Holders = %v, %v", hs, err)
		}
		perSession := slotsPerSession(t, admin, backend, name, 5)
		for i, h := range hs {
			if h.Slot != i || perSession[int64(h.PID)] != 1 || (backend == "postgres" && h.Since.IsZero()) {
				t.Fatalf("Holders[%d] = %+v; sessions holding slots: %v", i, h, perSession)
			}
		}
		seen := map[int]bool{}
		for _, g := range guards {
			if seen[g.Slot()] {
				t.Fatalf("slot %d granted twice", g.Slot())
			}
			seen[g.Slot()] = true
			mustRelease(t, g)
		}
		if n := len(slotsPerSession(t, admin, backend, name, 5)); n != 0 {
			t.Fatalf("%d sessions still hold slots after the releases", n)
		}
	})
}

// slotsPerSession counts, on the server, the slot locks of name that each
// session holds, in one statement.
func slotsPerSession(t *testing.T, admin *sql.DB, backend, name string, slots int) map[int64]int {
	t.Helper()
	per, err := slotSnapshot(admin, backend, name, slots)
	if err != nil {
		t.Fatal(err)
	}
	return per
}

// slotsOfSession lists the slots of name (of slots) whose lock g's own
// session holds, asked in g's WithConn; nil for SQLite, whose slots have
// no session.
func slotsOfSession(ctx context.Context, g *advisorylock.Guard, backend, name string, slots int) (own []int, err error) {
	var q string
	switch backend {
	case "postgres":
		var keys []string
		for i := range slots {
			key := uint64(advisorylock.SlotKey(name, i))
			keys = append(keys, fmt.Sprintf("(%d, %d, %d)", i, key>>32, key&0xFFFFFFFF))
		}
		q = "SELECT s.i FROM (VALUES " + strings.Join(keys, ", ") + ") AS s(i, hi, lo) JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted" +
			" AND l.objsubid = 1 AND l.classid::bigint = s.hi AND l.objid::bigint = s.lo AND l.pid = pg_backend_pid() ORDER BY s.i"
	case "mysql":
		var used []string
		for i := range slots {
			used = append(used, fmt.Sprintf("SELECT %d AS i, IS_USED_LOCK('advisorylock:v1:%016x') AS id", i, uint64(advisorylock.SlotKey(name, i))))
		}
		q = "SELECT i FROM (" + strings.Join(used, " UNION ALL ") + ") AS u WHERE id = CONNECTION_ID() ORDER BY i"
	default:
		return nil, nil
	}
	err = g.WithConn(ctx, func(conn advisorylock.Conn) error {
		rows, err := conn.QueryContext(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		own = []int{}
		for rows.Next() {
			var i int
			if err := rows.Scan(&i); err != nil {
				return err
			}
			own = append(own, i)
		}
		return rows.Err()
	})
	return own, err
}

// slotSnapshot reads which session holds each slot of name, in one
// statement: on PostgreSQL from pg_locks, on MySQL from IS_USED_LOCK of
// every slot's lock name; nil for SQLite, whose slots have no session.
func slotSnapshot(admin *sql.DB, backend, name string, slots int) (map[int64]int, error) {
	var q string
	switch backend {
	case "postgres":
		var keys []string
		for i := range slots {
			key := uint64(advisorylock.SlotKey(name, i))
			keys = append(keys, fmt.Sprintf("(%d, %d)", key>>32, key&0xFFFFFFFF))
		}
		q = "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND (classid::bigint, objid::bigint) IN (" + strings.Join(keys, ", ") + ")"
	case "mysql":
		var used []string
		for i := range slots {
			used = append(used, fmt.Sprintf("SELECT IS_USED_LOCK('advisorylock:v1:%016x') AS id", uint64(advisorylock.SlotKey(name, i))))
		}
		q = "SELECT id FROM (" + strings.Join(used, " UNION ALL ") + ") AS u WHERE id IS NOT NULL"
	default:
		return nil, nil
	}
	rows, err := admin.Query(q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	per := map[int64]int{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		per[id]++
	}
	return per, rows.Err()
}

// TestSemaphoreWaiterGetsTheReleasedSlot fills every slot, starts a
// waiter, and releases one slot: the waiter gets that slot soon.
func TestSemaphoreWaiterGetsTheReleasedSlot(t *testing.T) {
	testdb.Slow(t, "waiters handed slots, per backend")
	t.Parallel() // names of its own
	eachSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		s := newSemaphore(t, open(), name, 3, advisorylock.WithPollInterval(5*time.Millisecond))
		var guards []*advisorylock.Guard
		for range 3 {
			g, err := s.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			guards = append(guards, g)
		}
		bounded, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		if g, err := s.Acquire(bounded); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with a deadline on a full semaphore = %v, %v; want context.DeadlineExceeded", g, err)
		}
		cancel()
		got := make(chan *advisorylock.Guard, 1)
		waiterErr := make(chan error, 1)
		go func() {
			g, err := newSemaphore(t, open(), name, 3).Acquire(ctx)
			waiterErr <- err
			got <- g
		}()
		freed := guards[1].Slot()
		mustRelease(t, guards[1])
		select {
		case err := <-waiterErr:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(wait):
			t.Fatal("the waiter did not get the released slot")
		}
		g := <-got
		if g.Slot() != freed {
			t.Fatalf("the waiter got slot %d, want the freed slot %d", g.Slot(), freed)
		}
		for _, g := range []*advisorylock.Guard{guards[0], guards[2], g} {
			mustRelease(t, g)
		}
	})
}

// TestSemaphoreCancelledWaitLeavesNoSlotHeld cancels waiters on a full
// semaphore: afterwards only the holders' slots are taken.
func TestSemaphoreCancelledWaitLeavesNoSlotHeld(t *testing.T) {
	testdb.Slow(t, "many cancelled waits, per backend")
	eachSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		t.Parallel() // a name of its own on each backend
		ctx := context.Background()
		name := testdb.UniqueName(t)
		s := newSemaphore(t, open(), name, 2)
		a, b := mustAcquire(t, s), mustAcquire(t, s)
		for _, after := range []time.Duration{0, time.Millisecond, 50 * time.Millisecond, 400 * time.Millisecond} {
			cctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(after, cancel)
			if g, err := s.Acquire(cctx); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Acquire = %v, %v", g, err)
			}
			cancel()
		}
		mustRelease(t, a)
		// A cancelled pgx wait's backend can stay in the lock queue for a
		// few milliseconds after its connection is discarded (long enough
		// to be granted a slot briefly): wait that window out.
		var hs []*advisorylock.Holder
		testdb.WaitFor(t, wait, func() bool {
			var err error
			hs, err = s.Holders(ctx)
			return err == nil && len(hs) == 1 && hs[0].Slot == b.Slot()
		}, "Holders after cancelled waits = %v; want only slot %d", hs, b.Slot())
		mustRelease(t, b)
	})
}

func mustAcquire(t testing.TB, s *advisorylock.Semaphore) *advisorylock.Guard {
	t.Helper()
	g, err := s.TryAcquire(context.Background())
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	return g
}

// TestSemaphoreKilledHolderFreesItsSlot ends a holder's server session
// (pg_terminate_backend, MySQL KILL): its guard reports the loss, and a
// waiter gets the slot.
func TestSemaphoreKilledHolderFreesItsSlot(t *testing.T) {
	testdb.Slow(t, "kills holder sessions, per backend")
	// SQLite has no session to kill: TestSQLiteKilledSemaphoreHolderFreesItsSlotAtExpiry.
	eachServerSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		ctx := context.Background()
		admin := open()
		name := testdb.UniqueName(t)
		s := newSemaphore(t, open(), name, 2, advisorylock.WithKeepAlive(100*time.Millisecond))
		a, b := mustAcquire(t, s), mustAcquire(t, s)
		defer mustRelease(t, a)
		hs, err := s.Holders(ctx)
		if err != nil || len(hs) != 2 {
			t.Fatalf("Holders = %v, %v", hs, err)
		}
		var victim *advisorylock.Holder
		for _, h := range hs {
			if h.Slot == b.Slot() {
				victim = h
			}
		}
		kill := fmt.Sprintf("SELECT pg_terminate_backend(%d)", victim.PID)
		if backend == "mysql" {
			kill = fmt.Sprintf("KILL %d", victim.PID)
		}
		waiter := make(chan *advisorylock.Guard, 1)
		go func() {
			bounded, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			g, err := newSemaphore(t, open(), name, 2).Acquire(bounded)
			if err != nil {
				t.Error(err)
			}
			waiter <- g
		}()
		if _, err := admin.Exec(kill); err != nil {
			t.Fatal(err)
		}
		select {
		case <-b.Lost():
		case <-time.After(wait):
			t.Fatal("Lost() did not close after the session ended")
		}
		if err := b.Release(ctx); err != nil {
			t.Fatalf("Release of a lost slot: %v", err)
		}
		g := <-waiter
		if g == nil {
			t.FailNow()
		}
		if g.Slot() != b.Slot() {
			t.Fatalf("the waiter got slot %d, want the killed holder's %d", g.Slot(), b.Slot())
		}
		mustRelease(t, g)
	})
}

// TestSemaphoreReportsItsEventsAsSemaphore checks the Observer's events:
// kind semaphore, with the backend's name.
func TestSemaphoreReportsItsEventsAsSemaphore(t *testing.T) {
	t.Parallel()
	eachSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		ctx := context.Background()
		rec := &observetest.Recorder{}
		s := newSemaphore(t, open(), testdb.UniqueName(t), 1, advisorylock.WithObserver(rec))
		g := mustAcquire(t, s)
		if _, err := s.TryAcquire(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatal(err)
		}
		mustRelease(t, g)
		events := rec.Events()
		if len(events) != 5 {
			t.Fatalf("events = %+v, want start, end, start, end, released", events)
		}
		for _, e := range events {
			if e.Kind != "semaphore" || e.Backend != backend || e.Name != s.Name() {
				t.Fatalf("event %+v: want kind semaphore, backend %s", e, backend)
			}
		}
		if rec.Count("acquire_end", "acquired") != 1 || rec.Count("acquire_end", "not_acquired") != 1 || rec.Count("release", "") != 1 {
			t.Fatalf("events = %+v", events)
		}
	})
}

// TestSemaphoreDoCancelsFnWhenItsSlotIsLost: Do's fn sees ErrLockLost as
// its context's cause when the holder's session ends.
func TestSemaphoreDoCancelsFnWhenItsSlotIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, admin := testdb.OpenPostgres(t, "pgx"), testdb.OpenPostgres(t, "pgx")
	s := newSemaphore(t, db, testdb.UniqueName(t), 3, advisorylock.WithKeepAlive(100*time.Millisecond))
	err := s.Do(ctx, func(fctx context.Context) error {
		hs, err := s.Holders(ctx)
		if err != nil || len(hs) != 1 {
			return fmt.Errorf("Holders = %v, %v", hs, err)
		}
		if _, err := admin.Exec(fmt.Sprintf("SELECT pg_terminate_backend(%d)", hs[0].PID)); err != nil {
			return err
		}
		if err := awaitLoss(fctx); err != nil {
			return err
		}
		if !errors.Is(context.Cause(fctx), advisorylock.ErrLockLost) {
			t.Errorf("fn's context cause = %v, want ErrLockLost", context.Cause(fctx))
		}
		return fctx.Err()
	})
	if !errors.Is(err, advisorylock.ErrLockLost) {
		t.Fatalf("Do = %v, want ErrLockLost", err)
	}
	if st := db.Stats(); st.InUse != 0 {
		t.Fatalf("%d connections still checked out", st.InUse)
	}
}

// helpSemaphoreHold takes a slot of a semaphore of job.Iters slots and
// holds it until killed.
func helpSemaphoreHold(ctx context.Context, t *testing.T, db *sql.DB, job sqliteJob) {
	s := newSemaphore(t, db, job.Name, job.Iters, advisorylock.WithLeaseTTL(job.TTL), advisorylock.WithOwner("helper-"+strconv.Itoa(os.Getpid())))
	err := s.Do(ctx, func(ctx context.Context) error {
		if err := os.WriteFile(job.file("held"), nil, 0o644); err != nil {
			return err
		}
		time.Sleep(time.Hour) // until SIGKILL
		return nil
	})
	t.Fatalf("Do returned: %v", err)
}

// TestSQLiteKilledSemaphoreHolderFreesItsSlotAtExpiry kills a helper
// process that holds one slot of two while this process holds the
// other: the helper's slot stays taken until its lease's expiry, and is
// free afterwards.
func TestSQLiteKilledSemaphoreHolderFreesItsSlotAtExpiry(t *testing.T) {
	testdb.Slow(t, "kills a holder process, waits out its TTL")
	t.Parallel() // a file and a helper process of its own
	const ttl = 2 * time.Second
	path, db := sqliteFile(t, "")
	ctx := context.Background()
	job := sqliteJob{Do: "semhold", Path: path, Name: testdb.UniqueName(t), Dir: t.TempDir(), TTL: ttl, Iters: 2}
	s := newSemaphore(t, db, job.Name, 2)
	cmd := startHelpers(t, 1, job)[0]
	testdb.WaitFor(t, sqliteWait, func() bool { return fileExists(job.file("held")) }, "the helper did not take a slot")
	mine := mustAcquire(t, s)
	defer mustRelease(t, mine)
	hs, err := s.Holders(ctx)
	if err != nil || len(hs) != 2 {
		t.Fatalf("Holders = %v, %v", hs, err)
	}
	var theirs *advisorylock.Holder
	for _, h := range hs {
		if h.Slot != mine.Slot() {
			theirs = h
		}
	}
	if theirs == nil || !strings.HasPrefix(theirs.Owner, fmt.Sprintf("helper-%d/", cmd.Process.Pid)) {
		t.Fatalf("Holders = %+v: want the helper on the other slot", hs)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var ms int64
	if err := db.QueryRow("SELECT expires_at FROM advisorylock_locks WHERE key = ?", advisorylock.SlotKey(job.Name, theirs.Slot)).Scan(&ms); err != nil {
		t.Fatal(err)
	}
	expiry := time.UnixMilli(ms)
	missed := 0
	for deadline := time.Now().Add(sqliteWait); ; {
		sent := time.Now()
		g, err := s.TryAcquire(ctx)
		if err == nil {
			if time.Now().Before(expiry) || g.Slot() != theirs.Slot {
				t.Fatalf("slot %d granted at %v; the dead holder's slot %d expires at %v", g.Slot(), time.Now(), theirs.Slot, expiry)
			}
			mustRelease(t, g)
			break
		}
		if !errors.Is(err, advisorylock.ErrNotAcquired) || !sent.Before(expiry) || time.Now().After(deadline) {
			t.Fatalf("TryAcquire sent at %v (expiry %v): %v", sent, expiry, err)
		}
		missed++
		time.Sleep(50 * time.Millisecond) // pacing between attempts
	}
	if missed == 0 {
		t.Fatal("no attempt ran between the kill and the expiry")
	}
}

// TestSemaphoreRefusesTransactionPooler: a semaphore's slots are session
// locks, refused behind a transaction-mode PgBouncer as a Lock is.
func TestSemaphoreRefusesTransactionPooler(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			_, _, tx := poolerDBs(t, drv)
			s := newSemaphore(t, tx, testdb.UniqueName(t), 3)
			if _, err := s.TryAcquire(context.Background()); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("TryAcquire through a transaction pool = %v, want ErrTransactionPooler", err)
			}
			if err := s.Check(context.Background()); !errors.Is(err, advisorylock.ErrTransactionPooler) {
				t.Fatalf("Check through a transaction pool = %v, want ErrTransactionPooler", err)
			}
		})
	}
}

// TestSemaphorePoolWaitBoundsTheCheckout: with the pool's one connection
// pinned by a held slot, TryAcquire fails with ErrPoolUnavailable once
// WithPoolWait has passed, and Acquire with ctx's deadline. On the
// server backends only: SQLite's slots are rows, which pin no connection.
func TestSemaphorePoolWaitBoundsTheCheckout(t *testing.T) {
	testdb.Slow(t, "waits out a pool wait, per backend")
	t.Parallel() // names and pools of its own
	eachServerSemaphoreBackend(t, func(t *testing.T, _ string, open func() *sql.DB) {
		ctx := context.Background()
		db := open()
		db.SetMaxOpenConns(1)
		s := newSemaphore(t, db, testdb.UniqueName(t), 3, advisorylock.WithPoolWait(100*time.Millisecond))
		g := mustAcquire(t, s)
		defer mustRelease(t, g)
		done := make(chan error, 1)
		go func() {
			_, err := s.TryAcquire(ctx)
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, advisorylock.ErrPoolUnavailable) {
				t.Fatalf("TryAcquire on an exhausted pool = %v, want ErrPoolUnavailable", err)
			}
		case <-time.After(wait):
			t.Fatal("TryAcquire on an exhausted pool hung")
		}
		bounded, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, err := s.Acquire(bounded); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with a deadline on an exhausted pool = %v, want context.DeadlineExceeded", err)
		}
	})
}

// TestSemaphoreOnAPluggedInSessionLocker: a SessionLocker from outside
// the package (here MySQL's, wrapped) tries the slots one statement each,
// still taking one slot per holder.
func TestSemaphoreOnAPluggedInSessionLocker(t *testing.T) {
	ctx := context.Background()
	inner, ok := advisorylock.MySQL().(backend.SessionLocker)
	if !ok {
		t.Fatal("MySQL() is not a SessionLocker")
	}
	b := &countingSessions{SessionLocker: inner, calls: map[string]int{}}
	admin := testdb.OpenMySQL(t)
	name := testdb.UniqueName(t)
	s := newSemaphore(t, testdb.OpenMySQL(t), name, 3, advisorylock.WithBackend(b))
	var guards []*advisorylock.Guard
	tries := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.calls["try"]
	}
	for range 3 {
		guards = append(guards, mustAcquire(t, s))
	}
	// From a random start, the slots are tried until one is granted.
	if n := tries(); n < 3 || n > 1+2+3 {
		t.Fatalf("%d tries for 3 grants on 3 free slots, want 3 to 6", n)
	}
	before := tries()
	if _, err := s.TryAcquire(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a full semaphore = %v", err)
	}
	if n := tries() - before; n != 3 {
		t.Fatalf("TryAcquire on a full semaphore tried %d slots, want all 3", n)
	}
	per := slotsPerSession(t, admin, "mysql", name, 3)
	if len(per) != 3 {
		t.Fatalf("slot locks per session: %v, want one for each of 3 sessions", per)
	}
	for id, n := range per {
		if n != 1 {
			t.Fatalf("session %d holds %d slots", id, n)
		}
	}
	for _, g := range guards {
		mustRelease(t, g)
	}
}

// TestForgottenSemaphoreGuardIsCleanedUp drops a semaphore's Guard without
// Release: the garbage collector's cleanup frees its slot (a session's
// connection discarded, a SQLite row deleted) and a warning names it.
func TestForgottenSemaphoreGuardIsCleanedUp(t *testing.T) {
	t.Parallel()
	eachSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		name := testdb.UniqueName(t)
		var logs syncBuffer
		logger := slog.New(slog.NewTextHandler(&logs, nil))
		s := newSemaphore(t, open(), name, 1, advisorylock.WithLogger(logger), advisorylock.WithLeaseTTL(time.Hour))
		other := newSemaphore(t, open(), name, 1)
		dropGuard(t, func() any { return mustAcquire(t, s) })
		var g *advisorylock.Guard
		testdb.WaitFor(t, wait, func() bool {
			runtime.GC()
			var err error
			g, err = other.TryAcquire(context.Background())
			return err == nil
		}, "a forgotten semaphore guard kept its slot")
		mustRelease(t, g)
		expectForgottenWarning(t, &logs, name)
	})
}

// TestSemaphoreSessionGetsDeadHolderSettings: a slot's pinned session
// gets WithDeadHolderTimeout's settings at its first grant, as a Lock's,
// so the server frees a vanished holder's slot (PostgreSQL: TCP settings;
// MySQL: wait_timeout); the pooled session keeps them.
func TestSemaphoreSessionGetsDeadHolderSettings(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			db := testdb.OpenPostgres(t, drv)
			db.SetMaxOpenConns(1) // the slot's pinned connection is the pool's only one
			s := newSemaphore(t, db, testdb.UniqueName(t), 2, advisorylock.WithDeadHolderTimeout(20*time.Second))
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			for range 2 { // a new session, then one that has the settings
				mustRelease(t, mustAcquire(t, s))
			}
			var userTimeout, idle, idleSession string
			err := db.QueryRowContext(ctx, "SELECT current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_idle'), current_setting('idle_session_timeout')").Scan(&userTimeout, &idle, &idleSession)
			if err != nil {
				t.Fatal(err)
			}
			if userTimeout != "15000" || idle != "5" || idleSession != "0" {
				t.Fatalf("after a hold the session has tcp_user_timeout=%s tcp_keepalives_idle=%s idle_session_timeout=%s; want 15000, 5, 0", userTimeout, idle, idleSession)
			}
		})
	}
	t.Run("mysql", func(t *testing.T) {
		db := testdb.OpenMySQL(t)
		db.SetMaxOpenConns(1)
		s := newSemaphore(t, db, testdb.UniqueName(t), 2, advisorylock.WithDeadHolderTimeout(20*time.Second))
		mustRelease(t, mustAcquire(t, s))
		var waitTimeout int
		if err := db.QueryRow("SELECT @@session.wait_timeout").Scan(&waitTimeout); err != nil {
			t.Fatal(err)
		}
		if waitTimeout != 20 {
			t.Fatalf("after a hold the session has wait_timeout=%d, want 20", waitTimeout)
		}
	})
}

// TestRememberedSessionTriesSemaphoreSlotsWithoutItsChecks: a semaphore's
// try checks a new session (a standby is refused, the dead-holder
// settings are sent), and once the session has passed, later tries on it
// send the lock functions alone; so does a Lock's with the same options,
// which shares what is remembered. A bare try still takes one free slot
// and no held one.
func TestRememberedSessionTriesSemaphoreSlotsWithoutItsChecks(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			ctx := context.Background()
			db, lastTry := testdb.OpenRecording(t, drv, testdb.PostgresDSN(t), "pg_try_advisory_lock")
			db.SetMaxOpenConns(1)
			opts := []advisorylock.Option{advisorylock.WithBackend(advisorylock.Postgres()),
				advisorylock.WithDeadHolderTimeout(20 * time.Second)}
			name := testdb.UniqueName(t)
			s := newSemaphore(t, db, name, 2, opts...)
			l := newLock(t, db, name+"-lock", opts...)
			checked := func(q string) bool {
				return strings.Contains(q, "pg_is_in_recovery") && strings.Contains(q, "advisorylock.dead_holder")
			}
			bare := func(q string) bool {
				return !strings.Contains(q, "pg_is_in_recovery") && !strings.Contains(q, "advisorylock.dead_holder")
			}
			for round := range 2 {
				db.SetMaxIdleConns(0) // close the session: each round gets a new one
				db.SetMaxIdleConns(1)
				mustRelease(t, mustAcquire(t, s))
				if q := lastTry(); !checked(q) {
					t.Fatalf("round %d: first slot try on a session skipped its checks: %s", round, q)
				}
				mustRelease(t, mustAcquire(t, s))
				if q := lastTry(); !bare(q) {
					t.Fatalf("round %d: a remembered session's slot try still checks: %s", round, q)
				}
				g, err := l.TryLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				mustRelease(t, g)
				if q := lastTry(); !bare(q) {
					t.Fatalf("round %d: a Lock's try on a session the semaphore checked still checks: %s", round, q)
				}
				var userTimeout string
				if err := db.QueryRowContext(ctx, "SELECT current_setting('tcp_user_timeout')").Scan(&userTimeout); err != nil {
					t.Fatal(err)
				}
				if userTimeout != "15s" && userTimeout != "15000" {
					t.Fatalf("round %d: tcp_user_timeout on the semaphore's session = %q, want 15s", round, userTimeout)
				}
			}
			// Bare tries beside another holder: the free slot, then none.
			other := newSemaphore(t, testdb.OpenPostgres(t, drv), name, 2)
			held := mustAcquire(t, other)
			g := mustAcquire(t, s)
			if q := lastTry(); !bare(q) || g.Slot() == held.Slot() {
				t.Fatalf("a bare try beside the holder of slot %d took slot %d: %s", held.Slot(), g.Slot(), q)
			}
			mustRelease(t, g)
			second := mustAcquire(t, other)
			if g, err := s.TryAcquire(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				if g != nil {
					mustRelease(t, g)
				}
				t.Fatalf("a bare try on a full semaphore = %v, want ErrNotAcquired", err)
			}
			mustRelease(t, second)
			mustRelease(t, held)
		})
	}
}

// Do's fn learns its slot from its guard in its
// context, on every backend: two holders at once see two different slots,
// each the one Holders lists; a context not from Do has no guard, and a
// Lock's Do's guard has slot 0.
func TestSemaphoreDoTellsFnItsSlot(t *testing.T) {
	testdb.Slow(t, "about 1.5 s on 2 CPUs, over every backend")
	eachSemaphoreBackend(t, func(t *testing.T, backend string, open func() *sql.DB) {
		ctx := context.Background()
		name := testdb.UniqueName(t)
		s := newSemaphore(t, open(), name, 3)
		other := newSemaphore(t, open(), name, 3)
		if g := advisorylock.GuardFromContext(ctx); g != nil {
			t.Errorf("GuardFromContext of a plain context = %v", g)
		}
		err := s.Do(ctx, func(ctx context.Context) error {
			og := advisorylock.GuardFromContext(ctx)
			if og == nil {
				return errors.New("the outer fn has no guard")
			}
			outer := og.Slot()
			return other.Do(ctx, func(ctx context.Context) error {
				ig := advisorylock.GuardFromContext(ctx)
				if ig == nil || ig == og || ig.Slot() == outer {
					return fmt.Errorf("the inner fn's guard is %v; the outer's slot is %d", ig, outer)
				}
				inner := ig.Slot()
				hs, err := s.Holders(ctx)
				if err != nil {
					return err
				}
				var held []int
				for _, h := range hs {
					held = append(held, h.Slot)
				}
				slices.Sort(held)
				if want := []int{min(inner, outer), max(inner, outer)}; !slices.Equal(held, want) {
					return fmt.Errorf("Holders lists slots %v; the fns were told %v", held, want)
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		err = newLock(t, open(), name).Do(ctx, func(ctx context.Context) error {
			if g := advisorylock.GuardFromContext(ctx); g == nil || g.Slot() != 0 {
				return fmt.Errorf("a Lock's fn has guard %v, want one with slot 0", g)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}
