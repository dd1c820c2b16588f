package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// openWindowFor runs lockrun -n --min-hold window NAME true to its end:
// the name's window is then open, and its holder gone. It returns the
// window's end as status and -v print it, and the PID they show for its
// last holder, both read from the database.
func openWindowFor(t *testing.T, env []string, name string, window time.Duration) (end, pid string) {
	t.Helper()
	p := startLockrun(t, env, "-n", "--min-hold", window.String(), name, "true")
	if code := p.wait(t); code != 0 {
		t.Fatalf("opening the window: exit %d; stderr %q", code, p.stderr)
	}
	until, pid := windowRow(t, env, name, window)
	if pid == "" { // SQLite: the lockrun that held it
		pid = strconv.Itoa(p.cmd.Process.Pid)
	}
	return until.Local().Format(time.DateTime), pid
}

// windowRow reads name's window from where the backend keeps it: its end,
// and on PostgreSQL and MySQL the granting session's pid or connection id.
// On SQLite the end is the grant plus window (the lock row's expiry is
// the lease's while its holder lives).
func windowRow(t *testing.T, env []string, name string, window time.Duration) (until time.Time, pid string) {
	t.Helper()
	key := advisorylock.Key(name)
	switch dsn := envValue(env, "LOCKRUN_DSN"); {
	case strings.HasPrefix(dsn, "postgres"):
		db := testdb.OpenPostgres(t, "pgx")
		var id int
		if err := db.QueryRowContext(ctxT(t), "SELECT taken_until, pid FROM advisorylock_windows WHERE key = $1", key).Scan(&until, &id); err != nil {
			t.Fatalf("reading the window: %v", err)
		}
		return until, strconv.Itoa(id)
	case strings.HasPrefix(dsn, "mysql"):
		db := testdb.OpenMySQL(t)
		var micros, id int64
		if err := db.QueryRowContext(ctxT(t), "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', taken_until), connection_id FROM advisorylock_windows WHERE lock_key = ?", key).Scan(&micros, &id); err != nil {
			t.Fatalf("reading the window: %v", err)
		}
		return time.UnixMicro(micros), strconv.FormatInt(id, 10)
	}
	db, _ := openStore(t, env)
	var ms int64
	if err := db.QueryRowContext(ctxT(t), "SELECT acquired_at FROM advisorylock_locks WHERE key = ?", key).Scan(&ms); err != nil {
		t.Fatalf("reading the window: %v", err)
	}
	return time.UnixMilli(ms).Add(window), ""
}

// Defect 1: status shows an open min-hold window, whose holder is gone,
// as a window row (the name taken until its end, and its last holder),
// not as free, on every backend; with no names too. -v of a run with
// --min-hold says the lock is held by the window, not by the exited pid.
func TestStatusShowsAnOpenMinHoldWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name := lockName(t)
		end, pid := openWindowFor(t, env, name, time.Minute)
		key := strconv.FormatInt(advisorylock.Key(name), 10)

		code, stdout, stderr := runLockrun(t, env, "status", name)
		if code != 0 || stderr != "" {
			t.Fatalf("status exited %d; stderr %q", code, stderr)
		}
		_, table, _ := strings.Cut(stdout, "\n")
		rows := checkAligned(t, table)
		if len(rows) != 2 {
			t.Fatalf("status printed %d lines, want a header and the window:\n%s", len(rows), stdout)
		}
		// NAME KIND KEY PID CLIENT OWNER TOKEN SINCE EXPIRES
		if w := rows[1]; w[0] != name || w[1] != "window" || w[2] != key || w[3] != pid || w[7] == "-" || w[8] != end {
			t.Errorf("status shows %q, want NAME %s, KIND window, KEY %s, PID %s (its last holder), a SINCE, EXPIRES %s:\n%s",
				w, name, key, pid, end, stdout)
		}

		code, stdout, _ = runLockrun(t, env, "status")
		_, table, _ = strings.Cut(stdout, "\n")
		listed := false
		for _, r := range checkAligned(t, table) {
			listed = listed || r[0] == name && r[1] == "window" && r[2] == key && r[3] == pid && r[8] == end
		}
		if code != 0 || !listed {
			t.Errorf("status with no names exited %d and does not list the window of %s:\n%s", code, name, stdout)
		}

		code, _, stderr = runLockrun(t, env, "-v", "-n", "--min-hold", "1m", name, "true")
		want := fmt.Sprintf("lockrun: lock %q is held by a min-hold window until %s (last holder: pid %s, ", name, end, pid)
		if code != 1 || !strings.Contains(stderr, want) || strings.Contains(stderr, "run with the same --min-hold") {
			t.Errorf("-v -n --min-hold inside the window: exit %d, stderr %q; want 1 and %q", code, stderr, want)
		}
	})
}

// Defect 2: inside a min-hold window a run without --min-hold gets what
// a held lock gives, on every backend: -n (and -s -n) the conflict code,
// silent without -v, and with -v a line saying the window is open until
// when and to pass the same --min-hold; -w gives up when it runs out.
func TestRunWithoutMinHoldIsRefusedInsideAWindow(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		end, pid := openWindowFor(t, env, name, time.Minute)
		touch := []string{"touch", d.path("ran")}

		if code, stdout, stderr := runLockrun(t, env, append([]string{"-n", name}, touch...)...); code != 1 || stdout != "" || stderr != "" {
			t.Errorf("-n without --min-hold inside the window: exit %d, stdout %q, stderr %q; want 1 and silence", code, stdout, stderr)
		}
		if code, _, stderr := runLockrun(t, env, append([]string{"-s", "-n", name}, touch...)...); code != 1 {
			t.Errorf("-s -n without --min-hold inside the window: exit %d, stderr %q; want 1", code, stderr)
		}
		code, _, stderr := runLockrun(t, env, append([]string{"-v", "-n", "-E", "7", name}, touch...)...)
		want := fmt.Sprintf("lockrun: lock %q is held by a min-hold window until %s (last holder: pid %s, ", name, end, pid)
		if code != 7 || !strings.Contains(stderr, want) || !strings.HasSuffix(stderr, "); run with the same --min-hold as its holders\n") {
			t.Errorf("-v -n -E 7 without --min-hold inside the window: exit %d, stderr %q; want 7, %q and to pass the same --min-hold", code, stderr, want)
		}
		p := startLockrun(t, env, append([]string{"-w", "0.5", name}, touch...)...)
		if code := p.wait(t); code != 1 || p.ended.Sub(p.start) < 500*time.Millisecond {
			t.Errorf("-w 0.5 without --min-hold inside the window: exit %d after %v, stderr %q; want 1 after 0.5s", code, p.ended.Sub(p.start), p.stderr)
		}
		if d.exists("ran") {
			t.Error("a run without --min-hold ran its command inside the window")
		}
	})
}

// Defect 2: a waiting run without --min-hold, queued behind a holder with
// --min-hold, does not run when that holder releases inside its window
// (the window was recorded at the holder's grant, after the waiter looked
// at nothing): it runs once the window has ended.
func TestWaiterWithoutMinHoldRunsAfterTheWindow(t *testing.T) {
	testdb.Slow(t, "waits out 3 s min-hold windows, per backend")
	t.Parallel() // names and state of its own: overlaps with the other parallel tests
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		const window = 3 * time.Second
		holder := startLockrun(t, env, append([]string{"--min-hold", window.String(), name, "--"}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")
		until, _ := windowRow(t, env, name, window)

		waiter := startLockrun(t, env, "-v", "-w", "60", name, "sh", "-c", `date +%s%N > "$1"`, "sh", d.path("waiter-ran"))
		testdb.WaitFor(t, 0, func() bool { return strings.Contains(waiter.stderr.String(), "waiting for lock") }, "the waiter is not waiting: %q", waiter.stderr)
		d.touch(t, "go")
		if code := holder.wait(t); code != 0 {
			t.Fatalf("holder exited %d; stderr %q", code, holder.stderr)
		}
		if code := waiter.wait(t); code != 0 {
			t.Fatalf("waiter exited %d; stderr %q", code, waiter.stderr)
		}
		nanos, err := strconv.ParseInt(strings.TrimSpace(d.read("waiter-ran")), 10, 64)
		if err != nil {
			t.Fatalf("the waiter's command wrote %q: %v", d.read("waiter-ran"), err)
		}
		// The window ends by the database's clock, on this host here.
		if ran := time.Unix(0, nanos); ran.Before(until.Add(-250 * time.Millisecond)) {
			t.Errorf("the waiter without --min-hold ran at %s, inside the window that ends at %s",
				ran.Format(time.StampMilli), until.Format(time.StampMilli))
		}
	})
}
