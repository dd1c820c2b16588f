package advisorylockgocron_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockgocron"
	"github.com/advisorylock/advisorylock/internal/schedtest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// monitor reports one replica's job outcomes to a schedtest.Counter:
// gocron tells a Monitor of every run (success, fail) and every skip (the
// Locker or Elector said no).
type monitor struct {
	replica int
	c       *schedtest.Counter
}

func (m monitor) IncrementJob(_ uuid.UUID, _ string, _ []string, status gocron.JobStatus) {
	switch status {
	case gocron.Success, gocron.Fail:
		m.c.Fired(m.replica, true)
	case gocron.Skip:
		m.c.Fired(m.replica, false)
	}
}

func (monitor) RecordJobTiming(time.Time, time.Time, uuid.UUID, string, []string) {}

// startSkewed starts one scheduler per replica with opts, each running job
// every schedtest.Period from origin plus the replica's skew, and shuts
// them down at t.Cleanup.
func startSkewed(t *testing.T, c *schedtest.Counter, name string, opts func(replica int) []gocron.SchedulerOption) {
	t.Helper()
	for i := range schedtest.Replicas {
		s, err := gocron.NewScheduler(append(opts(i), gocron.WithMonitor(monitor{i, c}))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := s.Shutdown(); err != nil {
				t.Error(err)
			}
		})
		_, err = s.NewJob(gocron.DurationJob(schedtest.Period),
			gocron.NewTask(func() { time.Sleep(schedtest.Job) }), // the job's work
			gocron.WithName(name),
			gocron.WithStartAt(gocron.WithStartDateTime(c.Origin.Add(time.Duration(i)*schedtest.Skew))))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
	}
}

// nextOrigin is a whole tick at least one tick from now: the schedulers
// start before it.
func nextOrigin() time.Time {
	return time.Now().Add(schedtest.Period).Truncate(schedtest.Period).Add(schedtest.Period)
}

func TestLockerRunsEachTickOnceAcrossSkewedSchedulers(t *testing.T) {
	for _, backend := range schedtest.Backends {
		t.Run(backend, func(t *testing.T) {
			dbs := schedtest.OpenReplicas(t, backend, schedtest.Replicas)
			c := schedtest.NewCounter(nextOrigin())
			startSkewed(t, c, testdb.UniqueName(t), func(i int) []gocron.SchedulerOption {
				locker, err := advisorylockgocron.NewLocker(dbs[i], advisorylock.WithMinHold(schedtest.MinHold))
				if err != nil {
					t.Fatal(err)
				}
				return []gocron.SchedulerOption{gocron.WithDistributedLocker(locker)}
			})
			c.Check(t, 0)
		})
	}
}

// Without the min-hold the same schedulers run a tick more than once: the
// test above can fail.
func TestLockerWithoutMinHoldRunsATickOnSeveralSchedulers(t *testing.T) {
	dbs := schedtest.OpenReplicas(t, "postgres", schedtest.Replicas)
	c := schedtest.NewCounter(nextOrigin())
	startSkewed(t, c, testdb.UniqueName(t), func(i int) []gocron.SchedulerOption {
		locker, err := advisorylockgocron.NewLocker(dbs[i], advisorylock.WithMinHold(0))
		if err != nil {
			t.Fatal(err)
		}
		return []gocron.SchedulerOption{gocron.WithDistributedLocker(locker)}
	})
	c.CheckRunsTwice(t, 0)
}

func TestLockerReportsHeldElsewhere(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	key := testdb.UniqueName(t)
	locker, err := advisorylockgocron.NewLocker(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := time.Now()
	lock, err := locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Lock(ctx, key); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("second Lock while held: %v, want ErrNotAcquired", err)
	}
	// The lock is the one LockName names.
	l, err := advisorylock.New(db, advisorylockgocron.LockName(key), advisorylock.WithMinHold(advisorylockgocron.DefaultMinHold))
	if err != nil {
		t.Fatal(err)
	}
	if h, err := l.Holder(ctx); err != nil || h == nil {
		t.Fatalf("Holder of %s while a job holds it: %v, %v; want the job's session", l.Name(), h, err)
	}
	if err := lock.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The default window (a second from the grant) still keeps it taken.
	again, err := locker.Lock(ctx, key)
	took := time.Since(before)
	switch {
	case errors.Is(err, advisorylock.ErrNotAcquired):
	case err == nil && took < advisorylockgocron.DefaultMinHold:
		t.Errorf("Lock %v after the first grant, in its window, was granted; want ErrNotAcquired", took)
	case err == nil:
		t.Logf("inconclusive: the machine took %v, past the window, to try again", took)
	default:
		t.Fatal(err)
	}
	if again != nil {
		_ = again.Unlock(ctx)
	}
}

// The caller's WithMinHold sets the window, not DefaultMinHold: the
// window recorded at the grant (advisorylock_windows) is the caller's.
func TestLockerCallersWindowWins(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	key := testdb.UniqueName(t)
	locker, err := advisorylockgocron.NewLocker(db, advisorylock.WithMinHold(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	lock, err := locker.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Unlock(ctx) }()
	var window float64
	if err := db.QueryRowContext(ctx, "SELECT EXTRACT(EPOCH FROM taken_until - acquired_at) FROM advisorylock_windows WHERE key = $1",
		advisorylock.Key(advisorylockgocron.LockName(key))).Scan(&window); err != nil {
		t.Fatal(err)
	}
	if window < 0.25 || window > 0.5 {
		t.Fatalf("window recorded at the grant: %.3fs, want the caller's 0.3s (DefaultMinHold is %v)", window, advisorylockgocron.DefaultMinHold)
	}
}

func TestNewLockerRefusesANilDB(t *testing.T) {
	if _, err := advisorylockgocron.NewLocker(nil); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Fatalf("NewLocker(nil): %v, want ErrUnsupported", err)
	}
}
