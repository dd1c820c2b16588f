//go:build linux

package main

import (
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// SIGQUIT, SIGUSR1 and SIGUSR2 sent to lockrun reach the command once
// (README: they are passed on), and neither ends lockrun nor releases the
// lock early: the command goes on and lockrun exits with its status.
func TestQuitAndUserSignalsReachTheCommand(t *testing.T) {
	env := backends[0].env(t) // SQLite: the forwarding does not depend on the backend
	for _, c := range []struct {
		sig  syscall.Signal
		name string
	}{
		{syscall.SIGQUIT, "QUIT"},
		{syscall.SIGUSR1, "USR1"},
		{syscall.SIGUSR2, "USR2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			name, d := lockName(t), newDir(t)
			script := `trap 'echo ` + c.name + ` >> "$1"' ` + c.name + `; echo $$ > "$2"; while [ ! -e "$3" ]; do sleep 0.02; done; exit 7`
			p := startLockrun(t, env, name, "--", "sh", "-c", script, "sh", d.path("marks"), d.path("ready"), d.path("stop"))
			testdb.WaitFor(t, 0, func() bool { return strings.TrimSpace(d.read("ready")) != "" }, "the command did not start")
			if err := p.cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			testdb.WaitFor(t, 0, func() bool { return d.read("marks") != "" }, "the command never got %v", c.sig)
			if code, _, _ := runLockrun(t, env, "-n", name, "--", "true"); code == 0 {
				t.Errorf("the lock was free while the command still ran after %v", c.sig)
			}
			d.touch(t, "stop")
			if code := p.wait(t); code != 7 {
				t.Errorf("lockrun exited %d after %v, want the command's 7; stderr: %q", code, c.sig, p.stderr)
			}
			if got := d.read("marks"); got != c.name+"\n" {
				t.Errorf("the command got %q, want %v once", got, c.sig)
			}
		})
	}
}

// On Linux the command gets SIGTERM when lockrun itself dies (README):
// lockrun is killed with SIGKILL, which it cannot pass on, and the
// command is told all the same.
func TestCommandGetsSIGTERMWhenLockrunDies(t *testing.T) {
	testdb.Slow(t, "kills lockrun with SIGKILL and waits for its command to be told")
	env := backends[0].env(t)
	name, d := lockName(t), newDir(t)
	script := `trap 'echo TERM >> "$1"; exit 0' TERM; echo $$ > "$2"; while :; do sleep 0.02; done`
	p := startLockrun(t, env, name, "--", "sh", "-c", script, "sh", d.path("marks"), d.path("ready"))
	testdb.WaitFor(t, 0, func() bool { return strings.TrimSpace(d.read("ready")) != "" }, "the command did not start")
	pid, err := strconv.Atoi(strings.TrimSpace(d.read("ready")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	p.wait(t)
	// At least once: the kernel's parent-death signal and lockrun's own
	// process-group handling may both deliver it before the trap exits.
	testdb.WaitFor(t, 0, func() bool { return strings.HasPrefix(d.read("marks"), "TERM\n") }, "the command never got SIGTERM after lockrun died; marks %q", d.read("marks"))
	testdb.WaitFor(t, 0, func() bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }, "the command still runs after lockrun died")
}
