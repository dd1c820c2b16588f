package main

import (
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// lockrun --once RUNKEY: on every backend the command runs once per run
// key, however many lockruns come with it, while another holds the run
// the others exit 0 without running it, a failed command leaves the run
// to the next lockrun (which runs it), and the next run key runs again.
func TestOnceRunsACommandOncePerRunKey(t *testing.T) {
	t.Parallel() // names and state of its own: overlaps with the other parallel tests
	eachBackend(t, func(t *testing.T, env []string) {
		name := lockName(t)
		d := newDir(t)
		appendRun := []string{"sh", "-c", `echo "$1" >> "$2"`, "sh"}
		once := func(key, mark string, extra ...string) (int, string) {
			t.Helper()
			args := append([]string{"-v", "--once", key, name}, append(appendRun, mark, d.path("runs"))...)
			code, _, stderr := runLockrun(t, env, append(extra, args...)...)
			return code, stderr
		}

		// While a first lockrun holds the run, another --once exits 0
		// without running it.
		holder := startLockrun(t, env, append([]string{"--once", "02:00", name}, d.holdUntil(t, "release")...)...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder of run 02:00 did not start; stderr: %q", holder.stderr)
		if code, stderr := once("02:00", "beside"); code != 0 || !strings.Contains(stderr, "is done, or running elsewhere") {
			t.Fatalf("--once beside a holder of the run: exit %d, stderr %q; want 0, saying it did not run", code, stderr)
		}
		d.touch(t, "release")
		if code := holder.wait(t); code != 0 {
			t.Fatalf("the holder of run 02:00 exited %d; stderr %s", code, holder.stderr)
		}
		// Done: the same key later runs nothing.
		for range 2 {
			if code, stderr := once("02:00", "again"); code != 0 || !strings.Contains(stderr, "is done") {
				t.Fatalf("--once of a done run: exit %d, stderr %q", code, stderr)
			}
		}
		// A failing command leaves its run to the next lockrun.
		fail := append([]string{"--once", "02:01", name}, "sh", "-c", `echo failed >> "$1"; exit 3`, "sh", d.path("runs"))
		if code, _, stderr := runLockrun(t, env, fail...); code != 3 {
			t.Fatalf("--once of a failing command: exit %d, want its 3; stderr %q", code, stderr)
		}
		if code, stderr := once("02:01", "retried"); code != 0 || strings.Contains(stderr, "is done") {
			t.Fatalf("--once after a failed run: exit %d, stderr %q; want it run", code, stderr)
		}
		if code, _ := once("02:01", "twice"); code != 0 {
			t.Fatalf("--once of the retried run: exit %d", code)
		}
		if got, want := d.read("runs"), "failed\nretried\n"; got != want {
			t.Fatalf("the runs were %q, want %q (02:00 by the holder only, 02:01 failed then retried once)", got, want)
		}
	})
}

// --done-exit-code N lets a script tell whether --once ran the command:
// lockrun exits N without running it while another lockrun runs the run
// and once the run is done, and with the command's own status when it
// runs. done-exit-code in the config file does the same, the flag wins
// over it, and without either lockrun exits 0 as before.
func TestOnceDoneExitCodeSaysTheCommandDidNotRun(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		once := func(key string, flags ...string) int {
			t.Helper()
			args := append(flags, "--once", key, name, "sh", "-c", `echo "$1" >> "$2"`, "sh", key, d.path("runs"))
			code, _, stderr := runLockrun(t, env, args...)
			if stderr != "" {
				t.Errorf("lockrun %q wrote %q", args, stderr)
			}
			return code
		}
		conf := d.path("lockrun.conf")
		writeFile(t, conf, "done-exit-code = 4\n")

		holder := startLockrun(t, env, append([]string{"--done-exit-code", "3", "--once", "k", name}, d.holdUntil(t, "release")...)...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder of run k did not start; stderr: %q", holder.stderr)
		if code := once("k", "--done-exit-code", "3"); code != 3 {
			t.Errorf("--done-exit-code 3 beside the holder of the run: exit %d, want 3", code)
		}
		d.touch(t, "release")
		if code := holder.wait(t); code != 0 {
			t.Fatalf("the holder of run k exited %d, want its command's 0; stderr %q", code, holder.stderr)
		}
		for flags, want := range map[string]int{"--done-exit-code 3": 3, "--config " + conf: 4, "--config " + conf + " --done-exit-code 5": 5, "": 0} {
			if code := once("k", strings.Fields(flags)...); code != want {
				t.Errorf("lockrun %s --once of a done run: exit %d, want %d", flags, code, want)
			}
		}
		if code := once("k2", "--done-exit-code", "3"); code != 0 {
			t.Errorf("--done-exit-code 3 --once of a new run: exit %d, want the command's 0", code)
		}
		if got := d.read("runs"); got != "k2\n" {
			t.Errorf("the commands run wrote %q, want only the new run's k2", got)
		}
	})
}

// --once makes one try of an exclusive lock: it refuses the flags that
// wait, share, lease or keep a window, as a usage error.
func TestOnceRefusesFlagsThatDoNotApply(t *testing.T) {
	for _, flags := range [][]string{{"-w", "5"}, {"--lease"}, {"--min-hold", "1m"}, {"--slots", "2"}, {"-s"}} {
		args := append(append(flags, "--once", "k"), lockName(t), "true")
		if code, _, stderr := runLockrun(t, baseEnv(), args...); code != 64 || !strings.Contains(stderr, "--once and --") {
			t.Errorf("lockrun %q: exit %d, stderr %q; want 64 saying --once excludes it", args, code, stderr)
		}
	}
	if code, _, stderr := runLockrun(t, baseEnv(), "--once", "", lockName(t), "true"); code != 64 || !strings.Contains(stderr, "run key") {
		t.Errorf("--once with an empty run key: exit %d, stderr %q", code, stderr)
	}
}

// --once with lease, slots or min-hold from the config file is a
// configuration error, not a silent --once without them.
func TestOnceRefusesAConfigFileWindowLeaseOrSlots(t *testing.T) {
	env := []string{"XDG_STATE_HOME=" + t.TempDir()}
	d := newDir(t)
	for i, line := range []string{"lease = true\n", "slots = 2\n", "min-hold = 1m\n"} {
		conf := d.path("lockrun.conf" + string(rune('a'+i)))
		writeFile(t, conf, line)
		code, _, stderr := runLockrun(t, env, "--config", conf, "--once", "k", lockName(t), "true")
		if code != exitConfig || !strings.Contains(stderr, "--once takes an exclusive lock") {
			t.Errorf("--once with %q in the config file: exit %d, stderr %q; want %d", strings.TrimSpace(line), code, stderr, exitConfig)
		}
	}
}

// lockrun status NAME lists NAME's runs recorded done, the newest five
// first, then a row counting the older ones; a failed run is not among
// them, and a name with runs but no holder is free.
func TestStatusListsTheRunsRecordedDone(t *testing.T) {
	t.Parallel() // names and state of its own: overlaps with the other parallel tests
	eachBackend(t, func(t *testing.T, env []string) {
		name := lockName(t)
		keys := []string{"02:00", "02:01", "02:02", "02:03", "02:04", "02:05", "the run at 02:06"}
		for _, key := range keys {
			if code, _, stderr := runLockrun(t, env, "--once", key, name, "true"); code != 0 {
				t.Fatalf("--once %s: exit %d; stderr %q", key, code, stderr)
			}
		}
		if code, _, _ := runLockrun(t, env, "--once", "02:07", name, "false"); code != 1 {
			t.Fatalf("--once of a failing command: exit %d, want its 1", code)
		}

		code, stdout, stderr := runLockrun(t, env, "status", name)
		if code != 0 || stderr != "" {
			t.Fatalf("status exited %d; stderr %q", code, stderr)
		}
		_, table, _ := strings.Cut(stdout, "\n")
		rows := checkAligned(t, table)
		want := []string{"free", `run "the run at 02:06"`, "run 02:05", "run 02:04", "run 02:03", "run 02:02", "2 older runs"}
		if len(rows) != len(want)+1 {
			t.Fatalf("status printed %d rows, want a header and %d:\n%s", len(rows), len(want), stdout)
		}
		for i, kind := range want {
			row := rows[i+1]
			if row[0] != name || row[1] != kind {
				t.Errorf("row %d: name %q, kind %q; want %q, %q", i+1, row[0], row[1], name, kind)
			}
			if since := row[7]; kind != "free" && since == "-" {
				t.Errorf("row %d (%s) has no SINCE: when the run was recorded", i+1, kind)
			}
		}
	})
}
