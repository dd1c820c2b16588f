package benchmarks

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/golang-migrate/migrate/v4/database"
	"github.com/pressly/goose/v3/lock"
)

// handoffContenders is how many goroutines, each with its own *sql.DB,
// contend for one lock in the handoff benchmarks. The first
// handoffContenders handoffs of a run are not measured: by then every
// contender has waited once, so its pool has opened its sessions (and a
// LeaseLock waiter's handle its listener), which a steady handoff does
// not pay for.
const handoffContenders = 3

// Poll periods in the handoff benchmarks. advisorylock polls (LeaseLock,
// and Lock on SQLite) at its default interval, 20ms. goose's session
// locker retries in whole seconds (default 5s, floor 1s); its table locker
// takes any period (default 5s, ±25% jitter) and runs here at 20ms, so
// pollers compare like for like.
const (
	libraryPoll        = 20 * time.Millisecond
	gooseSessionPeriod = 1 // seconds
	gooseTablePeriod   = 20 * time.Millisecond
)

// pollerSettle is the least a holder holds once polling waiters have
// entered their acquire (so each made its first attempt). It then holds
// for a random part of the poll period more, so that releases fall at
// random points of the waiters' poll cycles, as they do in real use.
const pollerSettle = 5 * time.Millisecond

// contender is one party to a handoff: it acquires (waiting as long as
// its library waits) and releases.
type contender struct {
	acquire func(ctx context.Context) error
	release func(ctx context.Context) error
}

// handoffLib builds the contenders of one library. Where its waiters wait
// in the server, setup also returns their probe, and the holder waits
// until every other contender waits before it releases. For pollers it
// waits pollerSettle plus a random part of period instead.
type handoffLib struct {
	name    string
	drivers []string
	period  time.Duration // poll period of a polling library; 0 if it waits server-side
	hold    time.Duration // if set, how long a holder holds once the others wait, instead of period's random part
	setup   func(b *testing.B, drv string) (mk func(i int) contender, waiting waitProbe)
}

var handoffLibs = []handoffLib{
	{"advisorylock", pgDrivers, 0, 0, handoffAdvisoryLock},
	{"raw_blocking", pgDrivers, 0, 0, handoffRawBlocking},
	{"raw_literal", pgDrivers, 0, 0, handoffRawLiteral},
	{"migrate", pgDrivers, 0, 0, handoffMigrate},
	// The session Lock held 15 ms once the others wait, as long as a
	// poller's holder holds on average (pollerSettle and a random part of
	// 20 ms): the same idle server before each release. Run by hand
	// (benchmarks/README.md); no group of the report's runs it.
	{"advisorylock_held15ms", pgDrivers, 0, 15 * time.Millisecond, handoffAdvisoryLock},
	{"leaselock", pgDrivers, libraryPoll, 0, handoffLeaseLock},
	{"leaselock_held50ms", pgDrivers, libraryPoll, 50 * time.Millisecond, handoffLeaseLock},
	{"leaselock_held200ms", pgDrivers, libraryPoll, 200 * time.Millisecond, handoffLeaseLock},
	{"goose_table", pgDrivers, gooseTablePeriod, 0, handoffGooseTable},
	{"goose_session", pgDrivers, gooseSessionPeriod * time.Second, 0, handoffGooseSession},
	{"sqlite_raw", []string{"sqlite"}, libraryPoll, 0, handoffSQLiteRaw},
	{"sqlite_lock", []string{"sqlite"}, libraryPoll, 0, handoffSQLiteLock},
	{"sqlite_leaselock", []string{"sqlite"}, libraryPoll, 0, handoffSQLiteLeaseLock},
}

// BenchmarkHandoff measures, for each library, the time from the moment a
// holder calls its release to the moment another contender, already
// waiting, returns from its acquire. Each iteration is one handoff; p50-us
// and p99-us are the percentiles of those times in microseconds, and
// ns/op is the whole cycle (hold, release, handoff). select1-p50-us is the
// median SELECT 1 timed by the holders right before their releases, and
// p50-x-select1 the ratio of the two medians.
func BenchmarkHandoff(b *testing.B) {
	for _, lib := range handoffLibs {
		for _, drv := range lib.drivers {
			b.Run(lib.name+"/"+drv, func(b *testing.B) {
				mk, waiting := lib.setup(b, drv)
				runHandoff(b, mk, waiting, lib.period, lib.hold, unitProbe(b, drv))
			})
		}
	}
}

// unitProbe returns a SELECT 1 on a connection of its own, with driver drv
// (on a SQLite file of its own for "sqlite"): the unit each handoff is
// compared with, timed by the holder right before it releases, so that
// both see the same load.
func unitProbe(b *testing.B, drv string) func(ctx context.Context) error {
	var conn interface {
		QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
	}
	if drv == "sqlite" {
		conn = pin(b, openSQLite(b, sqlitePath(b)))
	} else {
		conn = pin(b, openPG(b, drv, postgresDSN(), 1))
	}
	return func(ctx context.Context) error {
		var n int
		return conn.QueryRowContext(ctx, "SELECT 1").Scan(&n)
	}
}

// waitProbe reports whether rivals contenders wait for the holder in the
// server, so that it may release: it is nil for a library whose waiters
// poll, whose holder holds a while instead (see awaitWaiters).
type waitProbe func(ctx context.Context, rivals int) (bool, error)

// queuedOn returns a probe of the sessions waiting for key.
func queuedOn(b *testing.B, key int64) waitProbe {
	mon := openPG(b, "pq", postgresDSN(), 1)
	q := "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted" +
		" AND classid = " + strconv.FormatUint(uint64(key)>>32, 10) +
		" AND objid = " + strconv.FormatUint(uint64(key)&0xffffffff, 10) + " AND objsubid = 1"
	return countProbe(mon, q)
}

// countProbe is a waitProbe that counts the waiters with q.
func countProbe(mon *sql.DB, q string) waitProbe {
	return func(ctx context.Context, rivals int) (bool, error) {
		var n int
		err := mon.QueryRowContext(ctx, q).Scan(&n)
		return n >= rivals, err
	}
}

// placedIn returns a probe of the place next in line of the lease name:
// a woken LeaseLock waiter that finds the lease held takes it, and the
// release hands the lease to it (a waiter in the server, as one queued
// in pg_locks is). There is one place: the other rivals, woken by each
// handover, queue for the next one, so the probe reports them all in
// once the place is taken.
func placedIn(b *testing.B, name string) waitProbe {
	mon := openPG(b, "pq", postgresDSN(), 1)
	return func(ctx context.Context, _ int) (bool, error) {
		var in bool
		err := mon.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM advisorylock_leases
WHERE name = $1 AND next_owner IS NOT NULL AND next_expires_at > now())`, name).Scan(&in)
		return in, err
	}
}

// handoffState is shared by the contenders of one run.
type handoffState struct {
	b       *testing.B
	queued  waitProbe
	period  time.Duration
	hold    time.Duration
	unit    func(ctx context.Context) error
	waiting atomic.Int32
	cancel  context.CancelFunc

	mu      sync.Mutex
	cond    *sync.Cond
	gen     int       // acquisitions so far
	relAt   time.Time // the last release's call
	done    bool
	doneAt  time.Time
	samples []time.Duration
	units   []time.Duration // SELECT 1, timed by each holder just before it releases
}

// runHandoff runs handoffContenders goroutines until b.N handoffs are
// measured. A contender that released waits until someone else has
// acquired before it queues again, so every release has the other
// contenders waiting and none barging.
func runHandoff(b *testing.B, mk func(i int) contender, queued waitProbe, period, hold time.Duration, unit func(ctx context.Context) error) {
	cs := make([]contender, handoffContenders)
	for i := range cs {
		cs[i] = mk(i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &handoffState{b: b, queued: queued, period: period, hold: hold, unit: unit, cancel: cancel,
		samples: make([]time.Duration, 0, b.N), units: make([]time.Duration, 0, b.N+1)}
	s.cond = sync.NewCond(&s.mu)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for _, c := range cs {
		wg.Go(func() { s.contend(ctx, c) })
	}
	wg.Wait()
	b.StopTimer()
	if b.Failed() || len(s.samples) == 0 {
		return
	}
	slices.Sort(s.samples)
	pct := func(p float64) float64 {
		i := int(p*float64(len(s.samples))+0.999999) - 1
		return float64(s.samples[max(i, 0)]) / float64(time.Microsecond)
	}
	b.ReportMetric(pct(0.50), "p50-us")
	b.ReportMetric(pct(0.99), "p99-us")
	unitP50 := median(s.units)
	b.ReportMetric(float64(unitP50)/float64(time.Microsecond), "select1-p50-us")
	b.ReportMetric(pct(0.50)*float64(time.Microsecond)/float64(unitP50), "p50-x-select1")
	b.ReportMetric(float64(s.doneAt.Sub(start))/float64(len(s.samples)), "ns/op")
}

func (s *handoffState) contend(ctx context.Context, c contender) {
	rejoinAfter := -1 // the generation of my last hold
	for {
		s.mu.Lock()
		for s.gen == rejoinAfter && !s.done {
			s.cond.Wait()
		}
		done := s.done
		s.mu.Unlock()
		if done {
			return
		}
		s.waiting.Add(1)
		err := c.acquire(ctx)
		s.waiting.Add(-1)
		now := time.Now()
		if err != nil {
			s.mu.Lock()
			if !s.done {
				s.b.Errorf("acquire: %v", err)
				s.finish()
			}
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		if s.done { // draining: a waiter that cannot be cancelled got in
			s.mu.Unlock()
			s.releaseOrFail(c)
			return
		}
		// Acquisition gen follows gen releases: the first is no handoff,
		// and the next handoffContenders warm up.
		if s.gen > handoffContenders {
			s.samples = append(s.samples, now.Sub(s.relAt))
		}
		s.gen++
		rejoinAfter = s.gen
		if len(s.samples) >= s.b.N {
			s.finish()
			s.mu.Unlock()
			s.releaseOrFail(c)
			return
		}
		s.cond.Broadcast()
		s.mu.Unlock()

		if err := s.awaitWaiters(ctx); err != nil {
			s.mu.Lock()
			if !s.done {
				s.b.Errorf("waiters did not queue: %v", err)
				s.finish()
			}
			s.mu.Unlock()
			s.releaseOrFail(c)
			return
		}
		ut := time.Now()
		if err := s.unit(ctx); err != nil && ctx.Err() == nil {
			s.b.Errorf("SELECT 1: %v", err)
		}
		ud := time.Since(ut)
		s.mu.Lock()
		s.units = append(s.units, ud)
		s.relAt = time.Now()
		s.mu.Unlock()
		if !s.releaseOrFail(c) {
			return
		}
	}
}

// finish ends the run; s.mu is held. Waiters that honour ctx return at
// once; the others acquire in turn, see done and release.
func (s *handoffState) finish() {
	s.done = true
	s.doneAt = time.Now()
	s.cancel()
	s.cond.Broadcast()
}

// releaseOrFail releases; a failure during the run fails the benchmark.
// Once the run is over, a contender whose acquire was being cancelled as
// it got the lock may find its connection broken by the cancel; that is
// not a measured failure.
func (s *handoffState) releaseOrFail(c contender) bool {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	err := c.release(ctx)
	if err == nil {
		return true
	}
	s.mu.Lock()
	if !s.done {
		s.b.Errorf("release: %v", err)
		s.finish()
	}
	s.mu.Unlock()
	return false
}

// awaitWaiters returns once every other contender is waiting: for
// libraries that wait in the server, once their sessions are queued on
// the key; for pollers, pollerSettle plus a random part of their period
// after they entered their acquire.
func (s *handoffState) awaitWaiters(ctx context.Context) error {
	deadline := time.Now().Add(setupTimeout)
	for s.waiting.Load() < handoffContenders-1 {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		time.Sleep(50 * time.Microsecond)
	}
	if s.hold > 0 {
		time.Sleep(s.hold)
		return nil
	}
	if s.queued == nil {
		time.Sleep(pollerSettle + rand.N(max(s.period, 1)))
		return nil
	}
	for {
		in, err := s.queued(ctx, handoffContenders-1)
		if err != nil {
			return err
		}
		if in {
			return nil
		}
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// guardContender adapts an acquire returning a releasable guard.
func guardContender[G interface{ Release(context.Context) error }](acquire func(ctx context.Context) (G, error)) contender {
	var held G
	return contender{
		acquire: func(ctx context.Context) error {
			g, err := acquire(ctx)
			held = g
			return err
		},
		release: func(ctx context.Context) error { return held.Release(ctx) },
	}
}

func handoffAdvisoryLock(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	name := lockName(b, "handoff")
	key := advisorylock.Key(name)
	return func(int) contender {
		l := newLock(b, openPG(b, drv, postgresDSN(), 2), name)
		return guardContender(l.Lock)
	}, queuedOn(b, key)
}

// handoffRawBlocking is the floor: pg_advisory_lock waiting server-side
// on a pinned connection, then pg_advisory_unlock, both parameterized.
func handoffRawBlocking(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	key := advisorylock.Key(lockName(b, "handoff"))
	return func(int) contender {
		conn := pin(b, openPG(b, drv, postgresDSN(), 2))
		return contender{
			acquire: func(ctx context.Context) error {
				_, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key)
				return err
			},
			release: func(ctx context.Context) error {
				_, err := conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key)
				return err
			},
		}
	}, queuedOn(b, key)
}

func handoffMigrate(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	table := tableName("migrate_handoff")
	db := openPG(b, drv, postgresDSN(), 1)
	var dbName, schema string
	must(b, db.QueryRow("SELECT current_database(), current_schema()").Scan(&dbName, &schema), "current schema")
	id, err := database.GenerateAdvisoryLockId(dbName, schema, table)
	must(b, err, "migrate lock id")
	key, err := strconv.ParseInt(id, 10, 64)
	must(b, err, "migrate lock id")
	return func(int) contender {
		m := newMigrate(b, openPG(b, drv, postgresDSN(), 2), table)
		return contender{
			acquire: func(context.Context) error { return m.Lock() }, // it waits unboundedly, without a context
			release: func(context.Context) error { return m.Unlock() },
		}
	}, queuedOn(b, key)
}

// handoffLeaseLock contends with LeaseLock. A waiter waits in line in
// the lease's row (see placedIn): on pgx it hears the releases; a plain
// lib/pq handle hears none, and its waiter in line sleeps on the server,
// woken by the handover.
func handoffLeaseLock(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	name := lockName(b, "handoff")
	forgetLease(b, name)
	return func(int) contender {
		// Four connections: a pool of fewer has no listener, and its
		// waiters do not sleep in line (they poll).
		l := newLeaseLock(b, openPG(b, drv, postgresDSN(), 4), name)
		return guardContender(l.Lock)
	}, placedIn(b, name)
}

func handoffGooseTable(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	table := tableName("goose_handoff")
	dropAtCleanup(b, table)
	id := positiveID(lockName(b, "handoff"))
	return func(int) contender {
		db := openPG(b, drv, postgresDSN(), 2)
		l, err := lock.NewPostgresTableLocker(lock.WithTableName(table), lock.WithTableLockID(id),
			lock.WithTableLockTimeout(gooseTablePeriod, 1<<30))
		must(b, err, "goose table locker")
		return contender{
			acquire: func(ctx context.Context) error { return l.Lock(ctx, db) },
			release: func(ctx context.Context) error { return l.Unlock(ctx, db) },
		}
	}, nil
}

func handoffGooseSession(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	id := advisorylock.Key(lockName(b, "handoff"))
	return func(int) contender {
		conn := pin(b, openPG(b, drv, postgresDSN(), 2))
		l, err := lock.NewPostgresSessionLocker(lock.WithLockID(id), lock.WithLockTimeout(gooseSessionPeriod, 1<<30))
		must(b, err, "goose session locker")
		return contender{
			acquire: func(ctx context.Context) error { return l.SessionLock(ctx, conn) },
			release: func(ctx context.Context) error { return l.SessionUnlock(ctx, conn) },
		}
	}, nil
}

func handoffSQLiteLock(b *testing.B, _ string) (func(i int) contender, waitProbe) {
	path := sqlitePath(b)
	name := lockName(b, "handoff")
	return func(int) contender {
		l := newLock(b, openSQLite(b, path), name)
		return guardContender(l.Lock)
	}, nil
}

func handoffSQLiteLeaseLock(b *testing.B, _ string) (func(i int) contender, waitProbe) {
	path := sqlitePath(b)
	name := lockName(b, "handoff")
	return func(int) contender {
		l := newLeaseLock(b, openSQLite(b, path), name)
		return guardContender(l.Lock)
	}, nil
}

// handoffSQLiteRaw is the SQLite floor: the raw upsert polled at
// advisorylock's default interval (20ms), read before write as the
// library does.
func handoffSQLiteRaw(b *testing.B, _ string) (func(i int) contender, waitProbe) {
	path := sqlitePath(b)
	setup := openSQLite(b, path)
	sqliteExec(b, setup, `CREATE TABLE raw_locks (key INTEGER PRIMARY KEY, owner TEXT NOT NULL, expires_at INTEGER NOT NULL)`)
	const acquire = `INSERT INTO raw_locks (key, owner, expires_at) VALUES (1, ?1, ?2)
ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at WHERE raw_locks.expires_at <= ?3`
	const held = `SELECT count(*) FROM raw_locks WHERE key = 1 AND expires_at > ?1`
	return func(i int) contender {
		db := openSQLite(b, path)
		owner := strconv.Itoa(i)
		try := func(ctx context.Context) (bool, error) {
			now := time.Now().UnixMilli()
			res, err := db.ExecContext(ctx, acquire, owner, now+30000, now)
			if err != nil {
				return false, err
			}
			n, err := res.RowsAffected()
			return n == 1, err
		}
		return contender{
			acquire: func(ctx context.Context) error {
				t := time.NewTicker(20 * time.Millisecond)
				defer t.Stop()
				for {
					if ok, err := try(ctx); ok || err != nil {
						return err
					}
					for {
						select {
						case <-ctx.Done():
							return ctx.Err()
						case <-t.C:
						}
						var n int
						if err := db.QueryRowContext(ctx, held, time.Now().UnixMilli()).Scan(&n); err != nil {
							return err
						}
						if n == 0 {
							break
						}
					}
				}
			},
			release: func(ctx context.Context) error {
				_, err := db.ExecContext(ctx, `DELETE FROM raw_locks WHERE key = 1 AND owner = ?1`, owner)
				return err
			},
		}
	}, nil
}
