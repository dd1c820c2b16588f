// Package testdb is the test harness shared by advisorylock's tests: it finds
// or starts a PostgreSQL server, a PgBouncer in front of it, cuttable TCP
// proxies, SQLite files and helper processes, and stops what it started when
// the test binary ends.
//
// A test package that uses it declares
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }
//
// Environment:
//
//	ADVISORYLOCK_TEST_POSTGRES  a DSN (URL or key=value) to use instead of searching
//	ADVISORYLOCK_REQUIRE_DB=1   fail, rather than skip, when no PostgreSQL or PgBouncer can be had
//	ADVISORYLOCK_HELPER         set in helper processes started by HelperCommand
//
// Under go test -short, the tests that call Slow are skipped: the fast tier.
package testdb

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Environment variables read or set by the harness.
const (
	EnvPostgres  = "ADVISORYLOCK_TEST_POSTGRES"
	EnvRequireDB = "ADVISORYLOCK_REQUIRE_DB"
	EnvHelper    = "ADVISORYLOCK_HELPER"
)

// DefaultWait is the deadline the harness uses when waiting for a server or
// process it started.
const DefaultWait = 20 * time.Second

// teardown holds the stop functions of process-wide resources (the shared
// throwaway cluster, PgBouncer, a Docker container), run by Main in reverse
// order of registration.
var teardown struct {
	mu    sync.Mutex
	funcs []func()
}

func atTeardown(f func()) {
	teardown.mu.Lock()
	defer teardown.mu.Unlock()
	teardown.funcs = append(teardown.funcs, f)
}

func runTeardown() {
	teardown.mu.Lock()
	funcs := teardown.funcs
	teardown.funcs = nil
	teardown.mu.Unlock()
	for i := len(funcs) - 1; i >= 0; i-- {
		funcs[i]()
	}
}

type mainRunner struct{ m *testing.M }

// Run runs the tests, then stops everything the harness started for the
// whole process.
func (r mainRunner) Run() int {
	defer runTeardown()
	raiseParallel()
	return r.m.Run()
}

// Parallel is how many tests that call t.Parallel run at once when the
// command line does not say (go test -parallel n): at least this many,
// rather than go test's default of GOMAXPROCS, because the harness's tests
// mostly wait (on servers, helper processes and timers) rather than
// compute, and each such test uses names, pools and files of its own.
const Parallel = 4

// raiseParallel sets -test.parallel to Parallel unless it was given or
// GOMAXPROCS is already larger.
func raiseParallel() {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if given || runtime.GOMAXPROCS(0) >= Parallel {
		return
	}
	if err := flag.Set("test.parallel", strconv.Itoa(Parallel)); err != nil {
		panic("testdb: " + err.Error())
	}
}

// Main wraps m for TestMain: its Run runs the tests and then stops whatever
// the harness started (throwaway clusters, PgBouncer, Docker containers), so
// that goleak, checking after Run returns, sees none of their goroutines.
func Main(m *testing.M) interface{ Run() int } {
	return mainRunner{m: m}
}

// requireDB reports whether a missing database must fail the test.
func requireDB() bool {
	return os.Getenv(EnvRequireDB) == "1"
}

// Unavailable skips t with the one-line reason, or fails it when
// ADVISORYLOCK_REQUIRE_DB=1.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if requireDB() {
		t.Fatalf("%s (%s=1)", reason, EnvRequireDB)
		return
	}
	t.Skipf("%s (set %s=1 to fail instead)", reason, EnvRequireDB)
}

// Slow skips t under go test -short, saying in one line why it is slow (a
// soak, injected faults, a private server it kills or fails over, iptables,
// or simply seconds of waiting), so that -short is the fast tier to run while
// working. Without -short it does nothing: ADVISORYLOCK_REQUIRE_DB=1 and CI
// still run the test, and the skip is never the refusal unavailable makes.
// Call it first, before the test starts anything.
func Slow(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("slow, skipped under -short: %s", why)
	}
}

// WaitFor polls cond every few milliseconds until it returns true, or fails
// the test with the formatted message once timeout has passed. A timeout of
// zero or less means DefaultWait.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if timeout <= 0 {
		timeout = DefaultWait
	}
	if poll(timeout, cond) {
		return
	}
	t.Fatalf("after %v: %s", timeout, fmt.Sprintf(format, args...))
}

// poll calls cond until it returns true (reporting true) or timeout passes
// (reporting false). The interval grows from 1ms to 50ms.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	interval := time.Millisecond
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
		if interval < 50*time.Millisecond {
			interval *= 2
		}
	}
}

// Poll calls cond until it returns true (reporting true) or timeout passes
// (reporting false), for a test that has something to do when an event
// does not come; WaitFor fails the test instead.
func Poll(timeout time.Duration, cond func() bool) bool { return poll(timeout, cond) }
