package advisorylockcron_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockcron"
	"github.com/advisorylock/advisorylock/internal/schedtest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/robfig/cron/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// skewed is a cron.Schedule seen through a clock that runs behind by
// behind: it fires when that clock reaches the inner schedule's times.
type skewed struct {
	inner  cron.Schedule
	behind time.Duration
}

func (s skewed) Next(t time.Time) time.Time { return s.inner.Next(t.Add(-s.behind)).Add(s.behind) }

// replicaLog is the cron.Logger of one replica: the wrapper's "skip" is
// the event that counts a tick this replica did not run; errors fail the
// test.
type replicaLog struct {
	t       *testing.T
	replica int
	c       *schedtest.Counter
}

func (l replicaLog) Info(msg string, kv ...any) {
	if msg == "skip" {
		l.c.Fired(l.replica, false)
	}
}

func (l replicaLog) Error(err error, msg string, kv ...any) {
	l.t.Errorf("replica %d: %s %v: %v", l.replica, msg, kv, err)
}

// startSkewed starts one cron per replica that runs a schedtest.Job-long
// job "@every" schedtest.Period through wrap, replica i's clock
// i*schedtest.Skew behind; they stop (waiting for running jobs) at
// t.Cleanup. Its Counter's tick 0 is replica 0's next whole second: tick 1
// is the first that every replica fires after every cron started.
func startSkewed(t *testing.T, wrap func(replica int, log cron.Logger) cron.JobWrapper) *schedtest.Counter {
	t.Helper()
	c := schedtest.NewCounter(time.Now().Truncate(schedtest.Period).Add(schedtest.Period))
	for i := range schedtest.Replicas {
		log := replicaLog{t, i, c}
		job := cron.FuncJob(func() {
			c.Fired(i, true)
			time.Sleep(schedtest.Job) // the job's work
		})
		cr := cron.New(cron.WithLogger(log))
		cr.Schedule(skewed{cron.Every(schedtest.Period), time.Duration(i) * schedtest.Skew}, cron.NewChain(wrap(i, log)).Then(job))
		cr.Start()
		t.Cleanup(func() { <-cr.Stop().Done() })
	}
	return c
}

// eachTickOnceOnEveryBackend starts the skewed crons on each backend, the
// job of replica i wrapped by wrap(db of replica i, name, its logger), and
// checks that every tick ran once.
func eachTickOnceOnEveryBackend(t *testing.T, wrap func(db advisorylock.DB, name string, log cron.Logger) cron.JobWrapper) {
	for _, backend := range schedtest.Backends {
		t.Run(backend, func(t *testing.T) {
			dbs := schedtest.OpenReplicas(t, backend, schedtest.Replicas)
			name := testdb.UniqueName(t)
			c := startSkewed(t, func(i int, log cron.Logger) cron.JobWrapper { return wrap(dbs[i], name, log) })
			c.Check(t, 1)
		})
	}
}

func TestOnOneReplicaRunsEachTickOnceAcrossSkewedCrons(t *testing.T) {
	eachTickOnceOnEveryBackend(t, func(db advisorylock.DB, name string, log cron.Logger) cron.JobWrapper {
		return advisorylockcron.OnOneReplica(log, db, name, advisorylock.WithMinHold(schedtest.MinHold))
	})
}

// Without the min-hold the same crons run a tick more than once: the test
// above can fail.
func TestOnOneReplicaWithoutMinHoldRunsATickOnSeveralReplicas(t *testing.T) {
	dbs := schedtest.OpenReplicas(t, "postgres", schedtest.Replicas)
	name := testdb.UniqueName(t)
	c := startSkewed(t, func(i int, log cron.Logger) cron.JobWrapper {
		return advisorylockcron.OnOneReplica(log, dbs[i], name, advisorylock.WithMinHold(0))
	})
	c.CheckRunsTwice(t, 1)
}

// errorLog records what a wrapper logs.
type errorLog struct {
	mu    sync.Mutex
	infos []string
	errs  []error
}

func (l *errorLog) Info(msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.infos = append(l.infos, fmt.Sprint(msg, kv))
}

func (l *errorLog) Error(err error, msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func TestOnOneReplicaSkipsWhileHeldAndLogsErrors(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	ctx := context.Background()
	held, err := advisorylock.New(db, name, advisorylock.WithMinHold(advisorylockcron.DefaultMinHold))
	if err != nil {
		t.Fatal(err)
	}
	g, err := held.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = g.Release(ctx) }()

	var log errorLog
	ran := false
	advisorylockcron.OnOneReplica(&log, db, name)(cron.FuncJob(func() { ran = true })).Run()
	if ran || len(log.infos) != 1 || len(log.errs) != 0 {
		t.Fatalf("run while held elsewhere: ran %v, infos %q, errors %v; want a skip logged at Info", ran, log.infos, log.errs)
	}

	// An attempt that fails (a closed pool) is an error, and no run.
	closed := testdb.OpenPostgres(t, "pgx")
	job := advisorylockcron.OnOneReplica(&log, closed, name)(cron.FuncJob(func() { ran = true }))
	_ = closed.Close()
	job.Run()
	if ran || len(log.errs) != 1 {
		t.Fatalf("run on a closed pool: ran %v, errors %v; want one error", ran, log.errs)
	}
	if errors.Is(log.errs[0], advisorylock.ErrNotAcquired) {
		t.Errorf("error on a closed pool: %v, want the failure, not ErrNotAcquired", log.errs[0])
	}
}

func TestOnOneReplicaPanicsOnANilDB(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("OnOneReplica(nil db) did not panic")
		}
	}()
	advisorylockcron.OnOneReplica(cron.DiscardLogger, nil, "x")
}

// OncePerTick runs each tick once across crons up to 240 ms apart with no
// window to choose, on every backend; the job reads its tick.
func TestOncePerTickRunsEachTickOnceAcrossSkewedCrons(t *testing.T) {
	eachTickOnceOnEveryBackend(t, func(db advisorylock.DB, name string, log cron.Logger) cron.JobWrapper {
		return advisorylockcron.OncePerTick(log, db, name, cron.Every(schedtest.Period))
	})
}

// Tick is the scheduled time nearest to the firing: replicas firing a
// tick early or late by up to just under half the interval agree on it,
// for an interval (its multiples, wherever each cron started) and a
// crontab schedule.
func TestTickIsTheNearestScheduledTime(t *testing.T) {
	every5, err := cron.ParseStandard("*/5 * * * *")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 3, 2, 5, 0, 0, time.UTC)
	for _, c := range []struct {
		name     string
		schedule cron.Schedule
		tick     time.Time
		half     time.Duration
	}{
		{"every second", cron.Every(time.Second), at, 500 * time.Millisecond},
		{"every 5 minutes", cron.Every(5 * time.Minute), at, 150 * time.Second},
		{"*/5 * * * *", every5, at, 150 * time.Second},
	} {
		for _, off := range []time.Duration{0, time.Millisecond, c.half - time.Millisecond, -c.half + time.Millisecond} {
			if got := advisorylockcron.Tick(c.schedule, c.tick.Add(off)); !got.Equal(c.tick) {
				t.Errorf("%s: Tick at %v from the tick = %v, want %v", c.name, off, got, c.tick)
			}
		}
		if got := advisorylockcron.Tick(c.schedule, c.tick.Add(c.half+time.Millisecond)); got.Equal(c.tick) {
			t.Errorf("%s: a firing past half the interval still counted as the tick before", c.name)
		}
	}
}

// A TickFunc job under OncePerTick gets the tick it runs for; a second
// replica firing the same tick skips it.
func TestOncePerTickTellsTheJobItsTick(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	name := testdb.UniqueName(t)
	// Hourly at this minute: the tick's neighbours are half an hour away,
	// whatever the time of day the test runs at.
	schedule, err := cron.ParseStandard(fmt.Sprintf("%d * * * *", time.Now().Minute()))
	if err != nil {
		t.Fatal(err)
	}
	var got []time.Time
	job := advisorylockcron.TickFunc(func(tick time.Time) { got = append(got, tick) })
	log := &errorLog{}
	for range 2 {
		cron.NewChain(advisorylockcron.OncePerTick(log, db, name, schedule)).Then(job).Run()
	}
	want := advisorylockcron.Tick(schedule, time.Now())
	if len(got) != 1 || !got[0].Equal(want) {
		t.Fatalf("the job ran for ticks %v, want once for %v", got, want)
	}
	if len(log.errs) != 0 || len(log.infos) != 1 || !strings.HasPrefix(log.infos[0], "skip") {
		t.Fatalf("logged %v and errors %v; want one skip", log.infos, log.errs)
	}
}

// A TickJob says its tick failed by returning an error: the error is
// logged and the tick is not done, so its next firing runs it again; once
// it succeeds, later firings skip it. Under OnOneReplica its error is
// logged too.
func TestTickJobsErrorLeavesTheTickToRunAgain(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	clock := testdb.FakeClockAt(time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC))
	failed := errors.New("the report failed")
	var ran []time.Time
	job := advisorylockcron.TickJob(func(ctx context.Context, tick time.Time) error {
		if ctx.Err() != nil {
			t.Errorf("the job's context ended before it ran: %v", ctx.Err())
		}
		ran = append(ran, tick)
		if len(ran) == 1 {
			return failed
		}
		return nil
	})
	log := &errorLog{}
	wrapped := cron.NewChain(advisorylockcron.OncePerTickAt(clock.Now, log, db, testdb.UniqueName(t), cron.Every(time.Hour))).Then(job)
	for range 3 { // fails, runs again, done
		clock.Add(time.Minute)
		wrapped.Run()
	}
	tick := time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC)
	if len(ran) != 2 || !ran[0].Equal(tick) || !ran[1].Equal(tick) {
		t.Errorf("the job ran for %v, want twice for %v (failed, then again)", ran, tick)
	}
	if len(log.errs) != 1 || !errors.Is(log.errs[0], failed) {
		t.Errorf("errors logged: %v, want the job's one", log.errs)
	}
	if len(log.infos) != 1 || !strings.HasPrefix(log.infos[0], "skip") {
		t.Errorf("logged %q, want the third firing's skip", log.infos)
	}

	log = &errorLog{}
	ran = nil
	advisorylockcron.OnOneReplica(log, db, testdb.UniqueName(t))(job).Run()
	if len(ran) != 1 || len(log.errs) != 1 || !errors.Is(log.errs[0], failed) {
		t.Errorf("under OnOneReplica: ran %d times, errors logged %v; want one run and its error", len(ran), log.errs)
	}
}
