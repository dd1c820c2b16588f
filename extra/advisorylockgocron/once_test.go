package advisorylockgocron_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/extra/advisorylockgocron"
	"github.com/advisorylock/advisorylock/internal/schedtest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	"github.com/robfig/cron/v3"
)

// Three groups of three replica processes, each its own gocron scheduler
// on an every-second schedule, each group's firings of a tick spread over
// 0, 200 or 450 ms around it (see schedtest.CheckProcesses): OncePerTick
// runs every tick of eleven exactly once per group, on PostgreSQL and on a
// SQLite file.
func TestOncePerTickRunsEachTickOnceAcrossReplicaProcesses(t *testing.T) {
	for _, backend := range schedtest.ProcessBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			schedtest.CheckProcesses(t, "TestHelperOncePerTickReplica", backend)
		})
	}
}

// TestHelperOncePerTickReplica is one replica of the test above: a
// scheduler whose every-second job starts at its offset from a whole
// second.
func TestHelperOncePerTickReplica(t *testing.T) {
	r, db, ok := schedtest.HelperReplica(t)
	if !ok {
		t.Skip("helper process")
	}
	task, err := advisorylockgocron.OncePerTick(db, r.Name, cron.Every(time.Second), func(_ context.Context, tick time.Time) error {
		r.Ran(t, tick)
		time.Sleep(schedtest.Job) // the job's work
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	var stopping atomic.Bool // Shutdown cancels a job still trying
	_, err = s.NewJob(gocron.DurationJob(time.Second), task,
		gocron.WithStartAt(gocron.WithStartDateTime(r.Start())),
		gocron.WithEventListeners(gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
			if !stopping.Load() || !errors.Is(err, context.Canceled) {
				t.Errorf("replica %d: %v", r.Index, err)
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	r.Serve(t)
	stopping.Store(true)
	if err := s.Shutdown(); err != nil {
		t.Error(err)
	}
}

// On an every-minute schedule, with the schedulers on a fake clock,
// replicas firing each minute 25 s early, on time and 25 s late run each
// of ten minutes once, and the job reads the minute.
func TestOncePerTickRunsEachMinuteOnceOnAFakeClock(t *testing.T) {
	const minutes = 10
	skew := 50 * time.Second
	for _, backend := range schedtest.ProcessBackends {
		t.Run(backend, func(t *testing.T) {
			dbs := schedtest.OpenReplicas(t, backend, schedtest.Replicas)
			name := testdb.UniqueName(t)
			origin := time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC)
			clock := clockwork.NewFakeClockAt(origin.Add(-time.Minute))
			returned := make(chan struct{}, schedtest.Replicas) // a replica's job returned
			var mu sync.Mutex
			runs := map[time.Time][]int{}
			for i, db := range dbs {
				task, err := advisorylockgocron.OncePerTickAt(clock.Now, db, name, cron.Every(time.Minute), func(_ context.Context, tick time.Time) error {
					mu.Lock()
					defer mu.Unlock()
					runs[tick] = append(runs[tick], i)
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				s, err := gocron.NewScheduler(gocron.WithClock(clock), gocron.WithLocation(time.UTC))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = s.Shutdown() })
				_, err = s.NewJob(gocron.DurationJob(time.Minute), task,
					gocron.WithStartAt(gocron.WithStartDateTime(origin.Add(schedtest.Offset(i, skew)))),
					gocron.WithEventListeners(
						gocron.AfterJobRuns(func(uuid.UUID, string) { returned <- struct{}{} }),
						gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
							t.Errorf("replica %d: %v", i, err)
							returned <- struct{}{}
						})))
				if err != nil {
					t.Fatal(err)
				}
				s.Start()
			}
			// Move the clock to each replica's firing of each minute in
			// turn, once every scheduler has set its timer, and wait for
			// that job.
			for k := range minutes {
				for i := range schedtest.Replicas {
					ctx, cancel := context.WithTimeout(context.Background(), testdb.DefaultWait)
					err := clock.BlockUntilContext(ctx, schedtest.Replicas)
					cancel()
					if err != nil {
						t.Fatalf("minute %d: not every scheduler set its timer: %v", k, err)
					}
					clock.Advance(origin.Add(time.Duration(k)*time.Minute + schedtest.Offset(i, skew)).Sub(clock.Now()))
					select {
					case <-returned:
					case <-time.After(testdb.DefaultWait):
						t.Fatalf("minute %d: replica %d's job did not return within %v", k, i, testdb.DefaultWait)
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for k := range minutes {
				tick := origin.Add(time.Duration(k) * time.Minute)
				// The replicas fire in turn, so the first to fire runs it:
				// each firing, early or late, is of the nearest minute.
				if by := runs[tick]; len(by) != 1 || by[0] != 0 {
					t.Errorf("minute %s ran %d times (replicas %v), want once, by the earliest (0)", tick.Format("15:04"), len(by), by)
				}
				delete(runs, tick)
			}
			if len(runs) != 0 {
				t.Errorf("runs for ticks that are not whole minutes: %v", runs)
			}
		})
	}
}

// Tick is the scheduled time nearest to the firing: replicas firing a
// tick early or late by up to just under half the interval agree on it,
// for an interval (its multiples) and a crontab schedule.
func TestTickIsTheNearestScheduledTime(t *testing.T) {
	every5, err := cron.ParseStandard("*/5 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 2, 5, 0, 0, time.UTC)
	for _, c := range []struct {
		name     string
		schedule cron.Schedule
		half     time.Duration
	}{
		{"every second", cron.Every(time.Second), 500 * time.Millisecond},
		{"every 5 minutes", cron.Every(5 * time.Minute), 150 * time.Second},
		{"*/5 * * * *", every5, 150 * time.Second},
	} {
		for _, off := range []time.Duration{0, time.Millisecond, c.half - time.Millisecond, -c.half + time.Millisecond} {
			if got := advisorylockgocron.Tick(c.schedule, at.Add(off)); !got.Equal(at) {
				t.Errorf("%s: Tick at %v from the tick = %v, want %v", c.name, off, got, at)
			}
		}
		if got := advisorylockgocron.Tick(c.schedule, at.Add(c.half+time.Millisecond)); got.Equal(at) {
			t.Errorf("%s: a firing past half the interval still counted as the tick before", c.name)
		}
	}
}

// A job's error is the task's (gocron's AfterJobRunsWithError sees it),
// and its tick is not done: the next firing of that tick runs it.
func TestOncePerTickRunsAFailedTickAgain(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC))
	failed := errors.New("the report failed")
	var ran []time.Time
	task, err := advisorylockgocron.OncePerTickAt(clock.Now, db, testdb.UniqueName(t), cron.Every(time.Hour), func(_ context.Context, tick time.Time) error {
		ran = append(ran, tick)
		if len(ran) == 1 {
			return failed
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := gocron.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	errs := make(chan error, 3)
	job, err := s.NewJob(gocron.DurationJob(time.Hour), task, gocron.WithEventListeners(
		gocron.AfterJobRuns(func(uuid.UUID, string) { errs <- nil }),
		gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) { errs <- err })))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	for i, want := range []error{failed, nil, nil} { // fails, runs again, done
		clock.Advance(time.Minute)
		if err := job.RunNow(); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-errs:
			if !errors.Is(err, want) {
				t.Fatalf("firing %d: %v, want %v", i, err, want)
			}
		case <-time.After(testdb.DefaultWait):
			t.Fatalf("firing %d did not return within %v", i, testdb.DefaultWait)
		}
	}
	want := time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC)
	if len(ran) != 2 || !ran[0].Equal(want) || !ran[1].Equal(want) {
		t.Fatalf("the job ran for %v, want twice for %v (a failure, then the run)", ran, want)
	}
}

func TestOncePerTickRefusesANilJobOrDB(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	if _, err := advisorylockgocron.OncePerTick(db, "x", cron.Every(time.Second), nil); err == nil {
		t.Error("OncePerTick with a nil job: no error")
	}
	job := func(context.Context, time.Time) error { return nil }
	if _, err := advisorylockgocron.OncePerTick(nil, "x", cron.Every(time.Second), job); err == nil {
		t.Error("OncePerTick with a nil db: no error")
	}
}
