package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// lockrun -l NAME -l NAME takes a set. These tests run
// lockrun processes against each backend.

// setArgs is -l NAME for each of names.
func setArgs(names ...string) []string {
	var args []string
	for _, n := range names {
		args = append(args, "-l", n)
	}
	return args
}

// Lockruns whose sets share names, given in opposite orders, all run
// (none deadlocks: a wait takes the names in key order) and never hold a
// shared name at once: every command logs "enter" when it starts and
// "exit" before it ends, for each of its names, and the log never shows a
// name entered twice without an exit between.
func TestSetsInOppositeOrdersNeverDeadlockNorOverlap(t *testing.T) {
	testdb.Slow(t, "many lockruns contending for seconds, per backend")
	eachBackend(t, func(t *testing.T, env []string) {
		a, b, c := lockName(t)+"-a", lockName(t)+"-b", lockName(t)+"-c"
		d := newDir(t)
		log := d.path("log")
		sets := [][]string{{a, b}, {b, a}, {b, c, a}, {c, a}, {a, c, b}}
		const rounds = 3
		var wg sync.WaitGroup
		codes := make([][]string, len(sets))
		for i, set := range sets {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range rounds {
					script := `for n in $NAMES; do echo "enter $n $PPID" >> "$1"; done; sleep 0.05; for n in $NAMES; do echo "exit $n $PPID" >> "$1"; done`
					args := append(setArgs(set...), "--", "sh", "-c", script, "sh", log)
					p := startLockrun(t, append(env, "NAMES="+strings.Join(set, " ")), args...)
					select {
					case <-p.done:
					case <-time.After(90 * time.Second):
						codes[i] = append(codes[i], fmt.Sprintf("round %d of %q: still waiting after 90s (a deadlock?); stderr %q", r, set, p.stderr))
						return
					}
					if code := p.cmd.ProcessState.ExitCode(); code != 0 {
						codes[i] = append(codes[i], fmt.Sprintf("round %d of %q: exit %d, stderr %q", r, set, code, p.stderr))
					}
				}
			}()
		}
		wg.Wait()
		for _, fails := range codes {
			for _, f := range fails {
				t.Error(f)
			}
		}
		lines := strings.Split(strings.TrimSpace(d.read("log")), "\n")
		want := 0
		for _, set := range sets {
			want += 2 * rounds * len(set)
		}
		if len(lines) != want {
			t.Fatalf("the log has %d lines, want %d:\n%s", len(lines), want, d.read("log"))
		}
		holder := map[string]string{} // name -> the pid of the lockrun whose command holds it
		for i, line := range lines {
			f := strings.Fields(line)
			if len(f) != 3 {
				t.Fatalf("line %d: %q", i+1, line)
			}
			switch h := holder[f[1]]; f[0] {
			case "enter":
				if h != "" {
					t.Fatalf("line %d: lockrun %s entered %s while lockrun %s held it:\n%s", i+1, f[2], f[1], h, d.read("log"))
				}
				holder[f[1]] = f[2]
			case "exit":
				if h != f[2] {
					t.Fatalf("line %d: lockrun %s left %s, held by %q:\n%s", i+1, f[2], f[1], h, d.read("log"))
				}
				delete(holder, f[1])
			}
		}
	})
}

// -n on a set gives the conflict code while any one of its names is held
// by another lockrun (of that name alone), runs nothing and takes none
// of the others (all or none); once all are free it runs, holding all of
// them, and the command sees the set's name. -v names the set and the
// name held; -w gives up on time with the conflict code.
func TestSetNonblockRefusesWhileAnyNameIsHeld(t *testing.T) {
	t.Parallel() // names and state of its own: overlaps with the other parallel tests
	eachBackend(t, func(t *testing.T, env []string) {
		names := []string{lockName(t) + "-a", lockName(t) + "-b", lockName(t) + "-c"}
		set := setArgs(names...)
		d := newDir(t)
		for i, held := range names {
			hd := newDir(t)
			holder := startLockrun(t, env, append([]string{held, "--"}, hd.holdUntil(t, "go")...)...)
			testdb.WaitFor(t, 0, func() bool { return hd.exists("ran") }, "the holder of %s did not start; stderr %q", held, holder.stderr)
			for _, flags := range [][]string{{"-n"}, {"-n", "-E", "3"}} {
				want := exitConflict
				if len(flags) > 1 {
					want = 3
				}
				code, stdout, stderr := runLockrun(t, env, append(append(flags, set...), "--", "touch", d.path("set-ran"))...)
				if code != want || stdout != "" || stderr != "" {
					t.Errorf("%v while %s is held: exit %d, stdout %q, stderr %q; want %d and silence", flags, held, code, stdout, stderr, want)
				}
			}
			if d.exists("set-ran") {
				t.Fatalf("the set's command ran while %s was held", held)
			}
			for _, other := range names {
				if other == held {
					continue
				}
				if code, _, stderr := runLockrun(t, env, "-n", other, "--", "true"); code != 0 {
					t.Errorf("after the set was refused, %s is not free (exit %d, stderr %q): the set kept part of itself", other, code, stderr)
				}
			}
			if i == 0 {
				code, _, stderr := runLockrun(t, env, append([]string{"-v", "-n"}, append(set, "--", "true")...)...)
				if want := fmt.Sprintf("lock %q is held by ", setName(names)); code != exitConflict || !strings.Contains(stderr, want) || !strings.Contains(stderr, fmt.Sprintf("(name %q)", held)) {
					t.Errorf("-v -n: exit %d, stderr %q; want it to say %q and the name %q", code, stderr, want, held)
				}
				p := startLockrun(t, env, append([]string{"-w", "0.5"}, append(set, "--", "touch", d.path("set-ran"))...)...)
				if code := p.wait(t); code != exitConflict || p.ended.Sub(p.start) < 500*time.Millisecond {
					t.Errorf("-w 0.5 while %s is held: exit %d after %v; want the conflict code after 0.5s", held, code, p.ended.Sub(p.start))
				}
			}
			hd.touch(t, "go")
			if code := holder.wait(t); code != 0 {
				t.Fatalf("the holder of %s exited %d; stderr %q", held, code, holder.stderr)
			}
		}

		code, stdout, stderr := runLockrun(t, env, append([]string{"-v", "-n"}, append(set, "--", "sh", "-c", `echo "$LOCKRUN_LOCK_NAME"`)...)...)
		if code != 0 || stdout != setName(names)+"\n" {
			t.Fatalf("-n on a free set: exit %d, stdout %q, stderr %q; want 0 and the set's name %q", code, stdout, stderr, setName(names))
		}
		if !strings.Contains(stderr, fmt.Sprintf("acquired lock %q", setName(names))) || !strings.Contains(stderr, fmt.Sprintf("released lock %q", setName(names))) {
			t.Errorf("-v does not name the set: %q", stderr)
		}

		// --log-format json names the set on every line, from the first.
		_, _, stderr = runLockrun(t, env, append([]string{"-v", "--log-format", "json"}, append(set, "--", "true")...)...)
		for _, l := range jsonLines(t, stderr) {
			if l["lock"] != setName(names) {
				t.Errorf("JSON line %v: lock is not the set's name %q", l, setName(names))
			}
		}

		// While the set runs, each of its names is held.
		hd := newDir(t)
		holder := startLockrun(t, env, append(append([]string{"-n"}, set...), append([]string{"--"}, hd.holdUntil(t, "go")...)...)...)
		testdb.WaitFor(t, 0, func() bool { return hd.exists("ran") }, "the set did not start; stderr %q", holder.stderr)
		for _, n := range names {
			if code, _, stderr := runLockrun(t, env, "-n", n, "--", "true"); code != exitConflict {
				t.Errorf("-n %s while the set runs: exit %d (stderr %q), want the conflict code", n, code, stderr)
			}
		}
		hd.touch(t, "go")
		if code := holder.wait(t); code != 0 {
			t.Fatalf("the set's lockrun exited %d; stderr %q", code, holder.stderr)
		}
		for _, n := range names {
			if code, _, stderr := runLockrun(t, env, "-n", n, "--", "true"); code != 0 {
				t.Errorf("-n %s after the set: exit %d (stderr %q); the set did not release it", n, code, stderr)
			}
		}
	})
}

// A min-hold window open on one name of a set keeps the set out, as a
// held name does, on every backend (on PostgreSQL and MySQL lockrun reads
// each name's window; on SQLite the window is the name's row).
func TestSetIsRefusedInsideAWindowOnOneName(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		a, b := lockName(t)+"-a", lockName(t)+"-b"
		const window = 2 * time.Minute // longer than any run of this test takes
		if code, _, stderr := runLockrun(t, env, "-n", "--min-hold", window.String(), b, "true"); code != 0 {
			t.Fatalf("opening the window on %s: exit %d, stderr %q", b, code, stderr)
		}
		code, _, stderr := runLockrun(t, env, append([]string{"-n"}, append(setArgs(a, b), "--", "true")...)...)
		if code != exitConflict {
			t.Fatalf("-n on a set inside a window on %s: exit %d, stderr %q; want the conflict code", b, code, stderr)
		}
		if code, _, stderr := runLockrun(t, env, "-n", a, "--", "true"); code != 0 {
			t.Errorf("after the set was refused, %s is not free: exit %d, stderr %q", a, code, stderr)
		}
	})
}

// --once on a set runs the command once per run key, whatever the order
// of the -l flags (the run is the set's name, in key order); while one of
// its names is held elsewhere it exits 0 without running, leaving the run
// to a later lockrun.
func TestSetOnceRunsOncePerRunKey(t *testing.T) {
	t.Parallel() // names and state of its own: overlaps with the other parallel tests
	eachBackend(t, func(t *testing.T, env []string) {
		a, b := lockName(t)+"-a", lockName(t)+"-b"
		d := newDir(t)
		once := func(key, mark string, names ...string) {
			t.Helper()
			args := append([]string{"--once", key}, setArgs(names...)...)
			args = append(args, "--", "sh", "-c", `echo "$1 $LOCKRUN_LOCK_NAME" >> "$2"`, "sh", mark, d.path("runs"))
			if code, _, stderr := runLockrun(t, env, args...); code != 0 {
				t.Fatalf("--once %s %v: exit %d, stderr %q", key, names, code, stderr)
			}
		}
		once("k1", "first", a, b)
		once("k1", "again", b, a)
		hd := newDir(t)
		holder := startLockrun(t, env, append([]string{b, "--"}, hd.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return hd.exists("ran") }, "the holder of %s did not start; stderr %q", b, holder.stderr)
		once("k2", "beside", a, b)
		hd.touch(t, "go")
		if code := holder.wait(t); code != 0 {
			t.Fatalf("the holder exited %d", code)
		}
		once("k2", "after", b, a)
		once("k2", "twice", a, b)
		set := setName([]string{a, b})
		if got, want := d.read("runs"), "first "+set+"\nafter "+set+"\n"; got != want {
			t.Fatalf("the runs were %q, want %q (k1 once, k2 once its name was free)", got, want)
		}
	})
}

// The combinations a set cannot be are usage errors (64) on the command
// line and configuration errors (78) from the config file; one -l is
// NAME, and takes them.
func TestSetRefusesWhatCannotWork(t *testing.T) {
	t.Parallel()
	env := []string{"XDG_STATE_HOME=" + t.TempDir()}
	a, b := lockName(t)+"-a", lockName(t)+"-b"
	d := newDir(t)
	for _, args := range [][]string{
		{"--lease", "--"}, {"--slots", "2", "--"}, {"--min-hold", "1m", "--"}, {"-s", "--"}, {"-l", a, "--"}, {"-l", "x,y", "--"},
		{"a-word-before", "--"}, {}, // with -l, the command follows --
	} {
		all := append(append(setArgs(a, b), args...), "touch", d.path("ran"))
		code, stdout, stderr := runLockrun(t, env, all...)
		if code != exitUsage {
			t.Errorf("lockrun %q: exit %d, stderr %q; want %d", all, code, stderr, exitUsage)
		}
		checkOneLineError(t, stdout, stderr)
	}
	for i, line := range []string{"lease = true\n", "slots = 2\n", "min-hold = 1m\n"} {
		conf := d.path("lockrun.conf" + strconv.Itoa(i))
		writeFile(t, conf, line)
		for _, once := range [][]string{nil, {"--once", "k"}} {
			args := append(append(append([]string{"--config", conf}, once...), setArgs(a, b)...), "--", "touch", d.path("ran"))
			code, stdout, stderr := runLockrun(t, env, args...)
			if code != exitConfig || !strings.Contains(stderr, "from the config file") {
				t.Errorf("%q in the config file, %q: exit %d, stderr %q; want %d", strings.TrimSpace(line), args, code, stderr, exitConfig)
			}
			checkOneLineError(t, stdout, stderr)
		}
	}
	if d.exists("ran") {
		t.Error("a refused set ran its command")
	}
	for _, flags := range [][]string{{"--lease"}, {"--slots", "2"}, {"-s"}} {
		args := append(append(flags, "-l", a), "--", "true")
		if code, _, stderr := runLockrun(t, env, args...); code != 0 {
			t.Errorf("lockrun %q (one -l): exit %d, stderr %q; want it run as NAME", args, code, stderr)
		}
	}
}
