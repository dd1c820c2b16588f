package testdb

import (
	"bufio"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// HelperCommand returns a command that re-runs the current test binary as a
// helper process: only the test named testName runs (-test.run=^name$,
// -test.v=false), with ADVISORYLOCK_HELPER=role in its environment, then
// env ("KEY=value" entries, which win over inherited ones). When
// PostgresDSN has already found a server, the child gets it in
// ADVISORYLOCK_TEST_POSTGRES so it does not search (or start a cluster)
// again.
//
// The child's stdout and stderr go to the test log, one t.Log line per
// line, prefixed with the role. The caller starts and waits for the
// command; at t.Cleanup a child still running is killed.
//
// A helper test skips itself in the parent run:
//
//	func TestHelperX(t *testing.T) {
//		if testdb.HelperRole() == "" {
//			t.Skip("helper process")
//		}
//		...
//	}
func HelperCommand(t testing.TB, testName, role string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe, "-test.run=^"+testName+"$", "-test.v=false", "-test.count=1")
	cmd.Env = append(os.Environ(), EnvHelper+"="+role)
	if dsn := resolvedDSN(); dsn != "" {
		cmd.Env = append(cmd.Env, EnvPostgres+"="+dsn)
	}
	cmd.Env = append(cmd.Env, env...)

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatalf("testdb: pipe for helper output: %v", err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	var logged sync.WaitGroup
	logged.Add(1)
	go func() {
		defer logged.Done()
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			t.Logf("[%s] %s", role, sc.Text())
		}
	}()
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
		// Once the child is gone and our copy of the write end is closed,
		// the reader sees EOF.
		_ = w.Close()
		logged.Wait()
	})
	return cmd
}

// HelperRole returns the role this process was started with by
// HelperCommand, or "" when it is not a helper.
func HelperRole() string {
	return os.Getenv(EnvHelper)
}
