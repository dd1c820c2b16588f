package advisorylock_test

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// rowsLoad is the soak's row of Locks on lease rows (WithLeaseRows)
// through PgBouncer's transaction pool: Lock.Do workers on two pools (as
// two processes), one with lib/pq and one with pgx in exec mode, bumping
// a counter the unsafe way, their sections recorded for the history check.
type rowsLoad struct {
	admin   *sql.DB // direct, for the counter's state and the leak check
	pools   []*sql.DB
	name    string
	counter *testdb.Counter
	bumps   atomic.Int64 // counter bumps that succeeded
	lock    *figures
	secs    []*sections
	stop    context.CancelFunc
	wg      sync.WaitGroup
}

func startRowsLoad(t *testing.T, workers int) *rowsLoad {
	t.Helper()
	txDSN, _ := testdb.PgBouncer(t)
	l := &rowsLoad{admin: testdb.OpenPostgres(t, "postgres"), name: testdb.UniqueName(t), lock: &figures{}}
	l.counter = testdb.NewCounter(t, l.admin, false)
	secs := newSections(l.name, l.lock, t.Logf)
	l.secs = []*sections{secs}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	t.Cleanup(func() { stop(); l.wg.Wait() })
	opts := []advisorylock.Option{quiet, advisorylock.WithLeaseRows(), advisorylock.WithPollInterval(5 * time.Millisecond), advisorylock.WithLeaseTTL(3 * time.Second)}
	for _, c := range []struct{ driver, params string }{{"postgres", ""}, {"pgx", "&default_query_exec_mode=exec"}} {
		db := testdb.OpenPostgresDSN(t, c.driver, txDSN+c.params)
		l.pools = append(l.pools, db)
		for range workers {
			lock := newLock(t, db, l.name, opts...)
			l.wg.Go(func() { lockDoWorker(ctx, lock, db, secs, l.counter, &l.bumps, l.lock) })
		}
	}
	return l
}

// halt stops the workers (failing t if they hang) and counts the
// violations, also those only the database shows.
func (l *rowsLoad) halt(t *testing.T) {
	t.Helper()
	l.stop()
	waitGroupWithin(t, &l.wg, 2*wait, "lease-row workers")
	for _, s := range l.secs {
		s.settle()
	}
	s, err := l.counter.State(context.Background(), l.admin)
	if err != nil {
		t.Fatal(err)
	}
	if s.N != l.bumps.Load() || s.Violations != 0 || s.Holders != 0 {
		l.lock.violations.Add(1)
		t.Logf("VIOLATION: lease-row counter %d after %d bumps; %d overlapping holders seen, %d inside at the end", s.N, l.bumps.Load(), s.Violations, s.Holders)
	}
}

// check checks a halted load: no violation, no live row left, every
// connection back.
func (l *rowsLoad) check(t *testing.T) {
	t.Helper()
	if v := l.lock.violations.Load(); v != 0 {
		t.Errorf("lease rows through PgBouncer: %d violations (see the log)", v)
	}
	testdb.WaitFor(t, wait, func() bool {
		return countRows(t, l.admin, "SELECT count(*) FROM advisorylock_locks WHERE key = $1 AND expires_at > now()", advisorylock.Key(l.name)) == 0
	}, "lock row %q left held", l.name)
	checkLeaks(t, leakCheck{db: l.admin, pools: l.pools})
}
