package advisorylockcron_test

import (
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/extra/advisorylockcron"
	"github.com/advisorylock/advisorylock/internal/schedtest"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/robfig/cron/v3"
)

// Three groups of three replica processes, each its own cron on an
// every-second schedule, each group's firings of a tick spread over 0, 200
// or 450 ms around it (see schedtest.CheckProcesses): OncePerTick runs
// every tick of eleven exactly once per group, on PostgreSQL and on a
// SQLite file.
func TestOncePerTickRunsEachTickOnceAcrossReplicaProcesses(t *testing.T) {
	for _, backend := range schedtest.ProcessBackends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			schedtest.CheckProcesses(t, "TestHelperOncePerTickReplica", backend)
		})
	}
}

// TestHelperOncePerTickReplica is one replica of the test above: a cron
// whose every-second schedule fires at its offset from each whole second.
func TestHelperOncePerTickReplica(t *testing.T) {
	r, db, ok := schedtest.HelperReplica(t)
	if !ok {
		t.Skip("helper process")
	}
	log := helperLog{t, r.Index}
	job := advisorylockcron.TickFunc(func(tick time.Time) {
		r.Ran(t, tick)
		time.Sleep(schedtest.Job) // the job's work
	})
	c := cron.New(cron.WithLogger(log))
	c.Schedule(skewed{cron.Every(time.Second), r.Offset},
		cron.NewChain(advisorylockcron.OncePerTick(log, db, r.Name, cron.Every(time.Second))).Then(job))
	c.Start()
	r.Serve(t)
	<-c.Stop().Done()
}

// helperLog is a replica process's cron.Logger: an error fails it.
type helperLog struct {
	t       *testing.T
	replica int
}

func (helperLog) Info(string, ...any) {}

func (l helperLog) Error(err error, msg string, kv ...any) {
	l.t.Errorf("replica %d: %s %v: %v", l.replica, msg, kv, err)
}

// On an every-minute schedule (a crontab, an interval), with the firing
// time read from a fake clock, replicas firing each minute 25 s early, on
// time and 25 s late run each of ten minutes once, and the job reads the
// minute.
func TestOncePerTickRunsEachMinuteOnceOnAFakeClock(t *testing.T) {
	crontab, err := cron.ParseStandard("* * * * *")
	if err != nil {
		t.Fatal(err)
	}
	for _, backend := range schedtest.ProcessBackends {
		for spec, schedule := range map[string]cron.Schedule{"crontab": crontab, "every": cron.Every(time.Minute)} {
			t.Run(backend+"/"+spec, func(t *testing.T) { checkEachMinuteOnce(t, backend, schedule) })
		}
	}
}

// checkEachMinuteOnce is TestOncePerTickRunsEachMinuteOnceOnAFakeClock on
// backend with schedule.
func checkEachMinuteOnce(t *testing.T, backend string, schedule cron.Schedule) {
	const minutes = 10
	skew := 50 * time.Second
	dbs := schedtest.OpenReplicas(t, backend, schedtest.Replicas)
	name := testdb.UniqueName(t)
	origin := time.Date(2026, 12, 3, 2, 0, 0, 0, time.UTC)
	clock := testdb.FakeClockAt(origin.Add(-time.Minute))
	log := &errorLog{}
	runs := map[time.Time][]int{}
	jobs := make([]cron.Job, len(dbs))
	for i, db := range dbs {
		jobs[i] = cron.NewChain(advisorylockcron.OncePerTickAt(clock.Now, log, db, name, schedule)).
			Then(advisorylockcron.TickFunc(func(tick time.Time) { runs[tick] = append(runs[tick], i) }))
	}
	// Each replica's cron fires each minute at its offset from it, in
	// turn: what each would do with the clock at that time.
	for k := range minutes {
		for i, job := range jobs {
			clock.Add(origin.Add(time.Duration(k)*time.Minute + schedtest.Offset(i, skew)).Sub(clock.Now()))
			job.Run()
		}
	}
	if len(log.errs) != 0 {
		t.Fatalf("errors logged: %v", log.errs)
	}
	for k := range minutes {
		tick := origin.Add(time.Duration(k) * time.Minute)
		// The replicas fire in turn, so the first to fire runs it: each
		// firing, early or late, is of the nearest minute.
		if by := runs[tick]; len(by) != 1 || by[0] != 0 {
			t.Errorf("minute %s ran %d times (replicas %v), want once, by the earliest (0)", tick.Format("15:04"), len(by), by)
		}
		delete(runs, tick)
	}
	if len(runs) != 0 {
		t.Errorf("runs for ticks that are not whole minutes: %v", runs)
	}
}
