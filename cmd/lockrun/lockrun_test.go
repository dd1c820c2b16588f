package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// lockrun -n runs the command exactly once among lockruns started
// together; the others exit at once, silent, with the conflict code
// (-E's where given).
func TestNonblockRunsTheCommandExactlyOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		const n = 6
		procs := make([]*proc, n)
		for i := range procs {
			args := []string{"-n", name, "--"}
			if i%2 == 1 {
				args = []string{"-n", "-E", "3", name, "--"}
			}
			procs[i] = startLockrun(t, env, append(args, d.holdUntil(t, "go")...)...)
		}
		testdb.WaitFor(t, 0, func() bool { return d.read("ran") != "" }, "no lockrun ran the command")
		holder := strings.TrimSpace(d.read("ran"))
		for i, p := range procs {
			if strconv.Itoa(p.cmd.Process.Pid) == holder {
				continue
			}
			want := 1
			if i%2 == 1 {
				want = 3
			}
			if code := p.wait(t); code != want {
				t.Errorf("lockrun %d (not the holder) exited %d, want the conflict code %d; stderr: %q", i, code, want, p.stderr)
			}
			if p.stderr.String() != "" || p.stdout.String() != "" {
				t.Errorf("lockrun -n said something on conflict (flock does not): %q %q", p.stdout, p.stderr)
			}
		}
		d.touch(t, "go")
		for _, p := range procs {
			if strconv.Itoa(p.cmd.Process.Pid) == holder {
				if code := p.wait(t); code != 0 {
					t.Errorf("the holder exited %d; stderr: %q", code, p.stderr)
				}
			}
		}
		if ran := strings.Fields(d.read("ran")); len(ran) != 1 {
			t.Errorf("the command ran %d times (%v), want exactly once", len(ran), ran)
		}
	})
}

// Without -n, lockruns take turns.
func TestWaitersTakeTurns(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		log := d.path("log")
		const n = 4
		procs := make([]*proc, n)
		for i := range procs {
			procs[i] = startLockrun(t, env, name, "--", "sh", "-c",
				`echo "enter $PPID" >> "$1"; sleep 0.1; echo "exit $PPID" >> "$1"`, "sh", log)
		}
		for i, p := range procs {
			if code := p.wait(t); code != 0 {
				t.Fatalf("lockrun %d exited %d; stderr: %q", i, code, p.stderr)
			}
		}
		lines := strings.Split(strings.TrimSpace(d.read("log")), "\n")
		if len(lines) != 2*n {
			t.Fatalf("log has %d lines, want %d:\n%s", len(lines), 2*n, d.read("log"))
		}
		seen := map[string]bool{}
		for i := 0; i < len(lines); i += 2 {
			enter, exit := strings.Fields(lines[i]), strings.Fields(lines[i+1])
			if enter[0] != "enter" || exit[0] != "exit" || enter[1] != exit[1] || seen[enter[1]] {
				t.Fatalf("runs overlapped or repeated at line %d:\n%s", i+1, d.read("log"))
			}
			seen[enter[1]] = true
		}
	})
}

// -w gives up on time with the conflict code, and a
// waiter whose lock comes free within -w runs.
func TestWaitGivesUpOnTime(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		holder := startLockrun(t, env, append([]string{name, "--"}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")

		p := startLockrun(t, env, "-w", "0.3", name, "--", "touch", d.path("waiter-ran"))
		if code := p.wait(t); code != 1 {
			t.Fatalf("-w 0.3 exited %d, want the conflict code 1; stderr: %q", code, p.stderr)
		}
		if waited := p.ended.Sub(p.start); waited < 300*time.Millisecond {
			t.Errorf("-w 0.3 gave up after %v, before its 0.3s", waited)
		}
		if p.stderr.String() != "" {
			t.Errorf("-w said something on giving up (flock does not, without -v): %q", p.stderr)
		}
		if code, _, stderr := runLockrun(t, env, "-q", "--timeout=200ms", "-E", "7", name, "--", "touch", d.path("waiter-ran")); code != 7 || stderr != "" {
			t.Errorf("-q --timeout=200ms -E 7 exited %d with stderr %q, want 7 and silence", code, stderr)
		}
		if d.exists("waiter-ran") {
			t.Error("a waiter that gave up ran its command")
		}

		patient := startLockrun(t, env, "-w", "60", name, "--", "touch", d.path("waiter-ran"))
		d.touch(t, "go")
		if code := holder.wait(t); code != 0 {
			t.Errorf("holder exited %d", code)
		}
		if code := patient.wait(t); code != 0 || !d.exists("waiter-ran") {
			t.Errorf("-w 60 exited %d (ran: %v) after the lock came free; stderr: %q", code, d.exists("waiter-ran"), patient.stderr)
		}
	})
}

// TestSharedAndSlotWaitsGiveUpOnTime: -w bounds a --shared wait and a
// --slots wait as it bounds an exclusive one (the library bounds those
// by a context deadline): the conflict code, silence without -v, "gave up
// waiting" with it, and the command not run.
func TestSharedAndSlotWaitsGiveUpOnTime(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		holder := startLockrun(t, env, append([]string{name, "--"}, d.holdUntil(t, "go")...)...)
		slot := startLockrun(t, env, append([]string{"--slots", "1", name + "-slots", "--"}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return len(strings.Fields(d.read("ran"))) == 2 }, "the holders did not start")
		for _, args := range [][]string{{"--shared", name}, {"--slots", "1", name + "-slots"}} {
			start := time.Now()
			code, _, stderr := runLockrun(t, env, append(append([]string{"-w", "0.3"}, args...), "--", "touch", d.path("waiter-ran"))...)
			if code != 1 || stderr != "" {
				t.Errorf("-w 0.3 %q exited %d with stderr %q, want the conflict code 1 and silence", args, code, stderr)
			}
			if waited := time.Since(start); waited < 300*time.Millisecond {
				t.Errorf("-w 0.3 %q gave up after %v, before its 0.3s", args, waited)
			}
			code, _, stderr = runLockrun(t, env, append(append([]string{"-v", "-w", "0.2"}, args...), "--", "touch", d.path("waiter-ran"))...)
			if code != 1 || !strings.Contains(stderr, "gave up waiting for lock") {
				t.Errorf("-v -w 0.2 %q exited %d with stderr %q, want 1 and the giving up told", args, code, stderr)
			}
		}
		if d.exists("waiter-ran") {
			t.Error("a waiter that gave up ran its command")
		}
		d.touch(t, "go")
		for _, p := range []*proc{holder, slot} {
			if code := p.wait(t); code != 0 {
				t.Errorf("a holder exited %d; stderr: %q", code, p.stderr)
			}
		}
	})
}

// lockrun exits with the command's status (128+N for a signal) and
// passes its output through.
func TestExitStatusIsTheCommands(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name := lockName(t)
		for _, c := range []struct {
			script string
			want   int
		}{
			{"exit 0", 0},
			{"exit 42", 42},
			{"exit 1", 1},
			{"kill -KILL $$", 128 + int(syscall.SIGKILL)},
			{"kill -TERM $$", 128 + int(syscall.SIGTERM)},
			{"echo out; echo err >&2", 0},
		} {
			code, stdout, stderr := runLockrun(t, env, name, "--", "sh", "-c", c.script)
			if code != c.want {
				t.Errorf("%q: lockrun exited %d, want %d; stderr: %q", c.script, code, c.want, stderr)
			}
			if c.script == "echo out; echo err >&2" && (stdout != "out\n" || stderr != "err\n") {
				t.Errorf("the command's output was not passed through: stdout %q, stderr %q", stdout, stderr)
			}
		}
	})
}

// SIGTERM (SIGHUP, SIGINT) to lockrun reaches the command, lockrun exits
// with the command's status, and the lock is free afterwards.
func TestSignalReachesCommandThenLockIsReleased(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		for _, c := range []struct {
			sig  syscall.Signal
			trap string
			want int
		}{
			{syscall.SIGTERM, `trap 'echo TERM >> "$1"; exit 3' TERM;`, 3},
			{syscall.SIGHUP, `trap 'echo HUP >> "$1"; exit 4' HUP;`, 4},
			{syscall.SIGTERM, "", 128 + int(syscall.SIGTERM)},
			{syscall.SIGINT, "", 128 + int(syscall.SIGINT)},
		} {
			name, d := lockName(t), newDir(t)
			script := c.trap + ` echo $$ > "$2"; while :; do sleep 0.05; done`
			p := startLockrun(t, env, name, "--", "sh", "-c", script, "sh", d.path("marks"), d.path("ready"))
			testdb.WaitFor(t, 0, func() bool { return strings.TrimSpace(d.read("ready")) != "" }, "the command did not start")
			if err := p.cmd.Process.Signal(c.sig); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != c.want {
				t.Errorf("%v, trap %q: lockrun exited %d, want the command's %d; stderr: %q", c.sig, c.trap, code, c.want, p.stderr)
			}
			if name := map[syscall.Signal]string{syscall.SIGTERM: "TERM", syscall.SIGHUP: "HUP"}[c.sig]; c.trap != "" && d.read("marks") != name+"\n" {
				t.Errorf("the command did not get %v once: marks %q", c.sig, d.read("marks"))
			}
			if code, _, stderr := runLockrun(t, env, "-n", name, "--", "true"); code != 0 {
				t.Errorf("the lock was not released after the command ended: -n exited %d; stderr: %q", code, stderr)
			}
		}
	})
}

// A signal while waiting for the lock ends lockrun with 128+N, and the
// command never runs.
func TestSignalWhileWaitingEndsLockrun(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		holder := startLockrun(t, env, append([]string{name, "--"}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")
		waiter := startLockrun(t, env, "-v", name, "--", "touch", d.path("waiter-ran"))
		testdb.WaitFor(t, 0, func() bool { return strings.Contains(waiter.stderr.String(), "waiting for lock") }, "the waiter is not waiting: %q", waiter.stderr)
		if err := waiter.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if code := waiter.wait(t); code != 128+int(syscall.SIGINT) {
			t.Errorf("interrupted waiter exited %d, want %d", code, 128+int(syscall.SIGINT))
		}
		d.touch(t, "go")
		if code := holder.wait(t); code != 0 || d.exists("waiter-ran") {
			t.Errorf("holder exited %d; waiter ran: %v", code, d.exists("waiter-ran"))
		}
	})
}

// The command sees its lease's name and token, tokens
// grow from run to run.
func TestLeaseGivesTheCommandItsToken(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name := lockName(t)
		var last uint64
		for i := 0; i < 3; i++ {
			code, stdout, stderr := runLockrun(t, env, "--lease", name, "--", "sh", "-c", `echo "$LOCKRUN_LOCK_NAME"; echo "$LOCKRUN_FENCING_TOKEN"`)
			lines := strings.Split(strings.TrimSpace(stdout), "\n")
			if code != 0 || len(lines) != 2 {
				t.Fatalf("lockrun --lease exited %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			token, err := strconv.ParseUint(lines[1], 10, 64)
			if lines[0] != name || err != nil || token <= last {
				t.Fatalf("run %d: the command saw name %q and token %q; want %q and a token above %d", i, lines[0], lines[1], name, last)
			}
			last = token
		}
		code, stdout, _ := runLockrun(t, env, name, "--", "sh", "-c", `echo "$LOCKRUN_LOCK_NAME:$LOCKRUN_FENCING_TOKEN"`)
		if code != 0 || stdout != name+":\n" {
			t.Errorf("without --lease the command saw %q, want the name and no token", stdout)
		}
	})
}

// A lost lease stops the command, SIGTERM first, SIGKILL
// after --kill-after (the command ignores SIGTERM), and lockrun exits 75.
// On SQLite the same is proven for the default lock (a lease row too).
func TestLostLockStopsTheCommand(t *testing.T) {
	testdb.Slow(t, "waits out 3 s TTLs and a 1 s --kill-after, per backend")
	cases := []struct {
		backend string
		lease   bool
		expire  string
	}{
		{"postgres", true, `UPDATE advisorylock_leases SET expires_at = now() - interval '1 hour' WHERE name = $1`},
		{"sqlite", true, `UPDATE advisorylock_leases SET expires_at = 0 WHERE name = ?1`},
		{"sqlite", false, `UPDATE advisorylock_locks SET expires_at = 0 WHERE name = ?1`},
	}
	for _, b := range backends {
		for _, c := range cases {
			if c.backend != b.name {
				continue
			}
			t.Run(fmt.Sprintf("%s/lease=%v", c.backend, c.lease), func(t *testing.T) {
				t.Parallel()
				env := b.env(t)
				name, d := lockName(t), newDir(t)
				const grace = time.Second
				args := []string{"--ttl", "3", "--kill-after", grace.String(), name, "--", "sh", "-c",
					`trap 'echo TERM >> "$1"' TERM; echo $$ > "$2"; while :; do sleep 0.05; done`, "sh", d.path("marks"), d.path("ready")}
				if c.lease {
					args = append([]string{"--lease"}, args...)
				}
				p := startLockrun(t, env, args...)
				testdb.WaitFor(t, 0, func() bool { return strings.TrimSpace(d.read("ready")) != "" }, "the command did not start")
				db, _ := openStore(t, env)
				if _, err := db.ExecContext(ctxT(t), c.expire, name); err != nil {
					t.Fatalf("expiring the lease: %v", err)
				}
				expired := time.Now()
				if code := p.wait(t); code != exitLost {
					t.Fatalf("lockrun exited %d, want %d (lock lost); stderr: %q", code, exitLost, p.stderr)
				}
				if !strings.Contains(d.read("marks"), "TERM") {
					t.Errorf("the command never got SIGTERM; stderr: %q", p.stderr)
				}
				if took := p.ended.Sub(expired); took < grace {
					t.Errorf("lockrun exited %v after the loss, before the %v grace: SIGKILL came early", took, grace)
				}
				pgid, _ := strconv.Atoi(strings.TrimSpace(d.read("ready")))
				testdb.WaitFor(t, 0, func() bool { return groupGone(pgid) }, "processes of the command's group %d survive", pgid)
				if !strings.Contains(p.stderr.String(), "lost while the command ran (lease lost: ") || strings.Count(p.stderr.String(), "lockrun: ") != 1 {
					t.Errorf("lockrun did not say the lock was lost, and why, in one line: %q", p.stderr)
				}
			})
		}
	}
}

// A PostgreSQL session lock whose session dies stops the command too
// (found by the keep-alive check, every 10s).
func TestLostSessionStopsTheCommand(t *testing.T) {
	testdb.Slow(t, "server kill: ends lockrun's session and waits for its 10 s keep-alive check")
	t.Parallel()
	env := []string{"LOCKRUN_DSN=" + testdb.PostgresDSN(t)}
	name, d := lockName(t), newDir(t)
	p := startLockrun(t, env, "--kill-after", "0.5", name, "--", "sh", "-c", `echo $$ > "$1"; while :; do sleep 0.05; done`, "sh", d.path("ready"))
	testdb.WaitFor(t, 0, func() bool { return strings.TrimSpace(d.read("ready")) != "" }, "the command did not start")
	db := testdb.OpenPostgres(t, "pgx")
	var pid int
	err := db.QueryRowContext(ctxT(t), "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND "+keyWhere(name)).Scan(&pid)
	if err != nil {
		t.Fatalf("finding our lock's session: %v", err)
	}
	if _, err := db.ExecContext(ctxT(t), "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != exitLost {
		t.Fatalf("lockrun exited %d, want %d; stderr: %q", code, exitLost, p.stderr)
	}
	if s := p.stderr.String(); !strings.Contains(s, "lost while the command ran (") || strings.Count(s, "lockrun: ") != 1 {
		t.Errorf("lockrun did not say the lock was lost, and why, in one line: %q", s)
	}
	pgid, _ := strconv.Atoi(strings.TrimSpace(d.read("ready")))
	testdb.WaitFor(t, 0, func() bool { return groupGone(pgid) }, "processes of the command's group %d survive", pgid)
}

// TestLateGrantDoesNotRunTheCommand: lockrun's grant comes back past its
// local deadline (its SQLite upsert waited on another writer of the file
// for longer than two thirds of --ttl, as it can on a busy host): the lock
// is lost as it is granted, so the command never starts. lockrun says so
// in one line and exits 75. Before, the command started and was stopped
// an instant later, having run unprotected.
func TestLateGrantDoesNotRunTheCommand(t *testing.T) {
	testdb.Slow(t, "holds SQLite's write lock for 3 s")
	t.Parallel()
	path := filepath.Join(t.TempDir(), "locks.db")
	env := []string{"LOCKRUN_DSN=file:" + path + "?_pragma=busy_timeout(60000)"}
	name, d := lockName(t), newDir(t)
	if code, _, stderr := runLockrun(t, env, name, "--", "true"); code != 0 {
		t.Fatalf("creating the tables: exit %d, stderr %q", code, stderr)
	}
	writer := testdb.OpenSQLite(t, path, "_pragma=busy_timeout(10000)")
	conn, err := writer.Conn(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctxT(t), "BEGIN IMMEDIATE"); err != nil {
		t.Fatalf("taking the file's write lock: %v", err)
	}
	p := startLockrun(t, env, "-v", "--ttl", "1", name, "--", "sh", "-c", `echo ran > "$1"`, "sh", d.path("ran"))
	testdb.WaitFor(t, 0, func() bool { return strings.Contains(p.stderr.String(), "lockrun: database ") },
		"lockrun never connected; stderr %q", p.stderr)
	// lockrun's next statement is its acquire, which waits on the write
	// lock. The fault: this writer keeps the file 3s, three times the TTL.
	<-time.After(3 * time.Second)
	if _, err := conn.ExecContext(ctxT(t), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	code := p.wait(t)
	if d.exists("ran") {
		t.Fatalf("the command ran under a lock lost as it was granted; exit %d, stderr %q", code, p.stderr)
	}
	if s := p.stderr.String(); code != exitLost || !strings.Contains(s, fmt.Sprintf("lockrun: lock %q lost as it was granted (", name)) {
		t.Fatalf("exit %d, want %d, and the loss and its cause said; stderr %q", code, exitLost, s)
	}
}

// A waiter is silent, as flock; with -v it says at once what it waits
// for and who holds it.
func TestVerboseWaitingSaysWhoHolds(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		holder := startLockrun(t, env, append([]string{name, "--"}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")
		quiet := startLockrun(t, env, name, "--", "true")
		if strings.HasPrefix(envValue(env, "LOCKRUN_DSN"), "postgres") {
			// On PostgreSQL the silent waiter can be seen waiting.
			db := testdb.OpenPostgres(t, "pgx")
			testdb.WaitFor(t, 0, func() bool {
				var n int
				_ = db.QueryRowContext(ctxT(t), "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND "+keyWhere(name)).Scan(&n)
				return n > 0
			}, "the silent waiter is not waiting")
		}
		loud := startLockrun(t, env, "-v", name, "--", "true")
		testdb.WaitFor(t, 0, func() bool { return strings.Contains(loud.stderr.String(), "waiting for lock") }, "the -v waiter said nothing in 20s")
		msg := loud.stderr.String()
		want := []string{strconv.Quote(name), "held by"}
		var client *regexp.Regexp // what the message says of the holder's session
		switch dsn := envValue(env, "LOCKRUN_DSN"); {
		case strings.HasPrefix(dsn, "postgres"): // the backend pid and the application, lockrun
			want = append(want, "pid ")
			client = regexp.MustCompile(`, client "?lockrun\b`)
		case strings.HasPrefix(dsn, "mysql"): // the connection id and the client's address
			want = append(want, "pid ")
			client = regexp.MustCompile(`, client ([^ ,]*@)?127\.0\.0\.1:\d+`)
		default:
			want = append(want, fmt.Sprintf("pid %d, owner %s:%d/", holder.cmd.Process.Pid, hostname(t), holder.cmd.Process.Pid))
		}
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("the waiting message %q does not say %q", msg, w)
			}
		}
		if client != nil && !client.MatchString(msg) {
			t.Errorf("the waiting message %q does not say the holder's client (%s)", msg, client)
		}
		d.touch(t, "go")
		for _, p := range []*proc{holder, quiet, loud} {
			if code := p.wait(t); code != 0 {
				t.Errorf("exit %d; stderr %q", code, p.stderr)
			}
		}
		if s := quiet.stderr.String(); s != "" {
			t.Errorf("a waiter without -v said %q", s)
		}
	})
}

// keyWhere matches name's key in pg_locks (classid = high 32 bits, objid =
// low 32 bits, objsubid = 1) in the current database.
func keyWhere(name string) string {
	k := uint64(advisorylock.Key(name))
	return fmt.Sprintf("classid = %d AND objid = %d AND objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())", k>>32, k&0xFFFFFFFF)
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// status prints holders as an aligned table.
func TestStatusPrintsAlignedTable(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		d := newDir(t)
		locked, leased, free := lockName(t), lockName(t)+" leased", lockName(t)
		holdEnv := env
		dsn := envValue(env, "LOCKRUN_DSN")
		pg, my := strings.HasPrefix(dsn, "postgres"), strings.HasPrefix(dsn, "mysql")
		if pg {
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			holdEnv = append(append([]string{}, env...), "LOCKRUN_DSN="+dsn+sep+"application_name=nightly-host-7")
		}
		h1 := startLockrun(t, holdEnv, append([]string{locked, "--"}, d.holdUntil(t, "go")...)...)
		h2 := startLockrun(t, env, append([]string{"--lease", leased, "--"}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return len(strings.Fields(d.read("ran"))) == 2 }, "the holders did not start")

		code, stdout, stderr := runLockrun(t, env, "status", locked, leased, free)
		if code != 0 || stderr != "" {
			t.Fatalf("status exited %d; stderr %q", code, stderr)
		}
		first, table, _ := strings.Cut(stdout, "\n")
		kind := "sqlite "
		switch {
		case pg:
			kind = "postgres "
		case my:
			kind = "mysql "
		}
		if !strings.HasPrefix(first, "database "+kind) {
			t.Errorf("status's first line %q does not say which database", first)
		}
		rows := checkAligned(t, table)
		if len(rows) != 4 {
			t.Fatalf("status printed %d lines, want a header and 3 rows:\n%s", len(rows), stdout)
		}
		wantRow := func(row []string, name, kind string, more ...string) {
			t.Helper()
			line := strings.Join(row, " | ")
			if row[0] != name && row[0] != strconv.Quote(name) || row[1] != kind {
				t.Errorf("row %q: want name %q, kind %s", line, name, kind)
			}
			if row[2] != strconv.FormatInt(advisorylock.Key(name), 10) {
				t.Errorf("row %q: key is not Key(%q)", line, name)
			}
			for _, m := range more {
				if !strings.Contains(line, m) {
					t.Errorf("row %q lacks %q", line, m)
				}
			}
		}
		switch {
		case pg:
			wantRow(rows[1], locked, "lock", "nightly-host-7")
		case my: // the holder's connection id, user and address
			wantRow(rows[1], locked, "lock", "127.0.0.1:")
		default:
			wantRow(rows[1], locked, "lock", fmt.Sprintf("%s:%d/", hostname(t), h1.cmd.Process.Pid))
		}
		wantRow(rows[2], leased, "lease", fmt.Sprintf("%s:%d/", hostname(t), h2.cmd.Process.Pid))
		wantRow(rows[3], free, "free")

		code, stdout, _ = runLockrun(t, env, "status")
		_, stdout, _ = strings.Cut(stdout, "\n")
		// MySQL cannot list named locks portably: there, leases and shared holders only.
		if code != 0 || !strings.Contains(stdout, strconv.Quote(leased)) || !my && !strings.Contains(stdout, strconv.FormatInt(advisorylock.Key(locked), 10)) {
			t.Errorf("status with no names exited %d and misses our lease or lock:\n%s", code, stdout)
		}
		checkAligned(t, stdout)
		d.touch(t, "go")
		h1.wait(t)
		h2.wait(t)
	})
}

// checkAligned checks that every field of every line starts in its
// header's column (counted in runes, as tabwriter does), and returns the
// fields.
func checkAligned(t *testing.T, table string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	var starts []int
	header := []rune(lines[0])
	for i := range header {
		if header[i] != ' ' && (i == 0 || header[i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	var rows [][]string
	for _, text := range lines {
		line := []rune(text)
		var row []string
		for c, s := range starts {
			if len(line) <= s || line[s] == ' ' || (s > 0 && line[s-1] != ' ') {
				t.Fatalf("column %d does not start at %d in %q:\n%s", c, s, text, table)
			}
			end := len(line)
			if c+1 < len(starts) {
				end = starts[c+1]
			}
			row = append(row, strings.TrimSpace(string(line[s:end])))
		}
		rows = append(rows, row)
	}
	return rows
}

// A DSN's password never shows, whatever fails.
func TestNoPasswordInAnyOutput(t *testing.T) {
	t.Parallel()
	const secret = "Sup3r-s3cret.pw"
	port := closedPort(t)
	dsns := map[string]int{
		"postgres://lockuser:" + secret + "@127.0.0.1:" + port + "/db?sslmode=disable":              exitUnavailable,
		"postgresql://127.0.0.1:" + port + "/db?user=u&password=" + secret:                          exitUnavailable,
		"host=127.0.0.1 port=" + port + " user=u password=" + secret + " dbname=db sslmode=disable": exitUnavailable,
		"host=127.0.0.1 port=" + port + " password='" + secret + " x' dbname=db":                    exitUnavailable,
		"postgres://lockuser:" + secret + "@127.0.0.1:notaport/db":                                  exitConfig,
		"mysql://lockuser:" + secret + "@127.0.0.1:" + port + "/db":                                 exitUnavailable,
		"redis://:" + secret + "@cache:6379":                                                        exitConfig,
	}
	for dsn, want := range dsns {
		for _, how := range [][]string{
			{"--dsn", dsn, "-v", "job", "--", "true"},
			{"--dsn=" + dsn, "--lease", "job", "--", "true"},
			{"status", "--dsn", dsn, "job"},
			{"status", "--dsn", dsn},
			{"env:LOCKRUN_DSN", "job", "--", "true"},
			{"env:DATABASE_URL", "-n", "job", "--", "true"},
		} {
			var env []string
			if v, ok := strings.CutPrefix(how[0], "env:"); ok {
				env, how = []string{v + "=" + dsn}, how[1:]
			}
			code, stdout, stderr := runLockrun(t, env, how...)
			out := stdout + stderr
			if strings.Contains(out, secret) || strings.Contains(out, "s3cret") {
				t.Errorf("%v with env %v printed the password: %q", how, env, out)
			}
			if code != want {
				t.Errorf("%v with env %v: exit %d, want %d; stderr %q", how, env, code, want, stderr)
			}
			checkOneLineError(t, stdout, stderr)
		}
	}
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	_ = ln.Close()
	return port
}

func checkOneLineError(t *testing.T, stdout, stderr string) {
	t.Helper()
	if stdout != "" {
		t.Errorf("an error printed on stdout: %q", stdout)
	}
	if !strings.HasPrefix(stderr, "lockrun: ") || strings.Count(stderr, "\n") != 1 || !strings.HasSuffix(stderr, "\n") {
		t.Errorf("the error is not one line starting with \"lockrun: \": %q", stderr)
	}
	for _, bad := range []string{"goroutine ", "panic", ".go:"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("the error looks like a stack trace (%q): %q", bad, stderr)
		}
	}
}

// Bad input gets one line and its documented exit code.
func TestBadInputGetsOneLineAndItsExitCode(t *testing.T) {
	t.Parallel()
	state := []string{"XDG_STATE_HOME=" + t.TempDir()}
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port := closedPort(t)
	for _, c := range []struct {
		what string
		args []string
		want int
	}{
		{"no arguments", nil, exitUsage},
		{"unknown long flag", []string{"--frobnicate", "job", "--", "true"}, exitUsage},
		{"unknown short flag", []string{"-Z", "job", "--", "true"}, exitUsage},
		{"value given to a boolean flag", []string{"--lease=yes", "job", "--", "true"}, exitUsage},
		{"missing value at the end", []string{"job", "-w"}, exitUsage},
		{"a flag after NAME", []string{"job", "-n", "echo", "hi"}, exitUsage},
		{"no command", []string{"--", "true"}, exitUsage},
		{"empty name", []string{"", "true"}, exitUsage},
		{"-c with two words", []string{"job", "-c", "echo", "hi"}, exitUsage},
		{"TTL below the 1s floor", []string{"--ttl", "500ms", "job", "true"}, exitUsage},
		{"TTL above 24h", []string{"--ttl", "25h", "job", "true"}, exitUsage},
		{"unknown log format", []string{"--log-format", "xml", "job", "true"}, exitUsage},
		{"elect, reserved", []string{"elect", "leader", "true"}, exitUsage},
		{"completion for an unknown shell", []string{"completion", "fish"}, exitUsage},
		{"--config naming no file", []string{"--config", "/nonexistent/lockrun.conf", "job", "true"}, exitConfig},
		{"SQLite file in a missing directory", []string{"--dsn", "sqlite:/nonexistent/dir/locks.db", "job", "true"}, exitConfig},
		{"empty command", []string{"job", "--"}, exitUsage},
		{"empty command name", []string{"job", "--", ""}, exitUsage},
		{"unparsable -w", []string{"-w", "soon", "job", "--", "true"}, exitUsage},
		{"negative -w", []string{"-w", "-1", "job", "--", "true"}, exitUsage},
		{"-E out of range", []string{"-E", "256", "job", "--", "true"}, exitUsage},
		{"zero TTL", []string{"--ttl", "0", "job", "--", "true"}, exitUsage},
		{"-n with -w", []string{"-n", "-w", "3", "job", "--", "true"}, exitUsage},
		{"status with -n", []string{"status", "-n", "job"}, exitUsage},
		{"-n before status", []string{"-n", "status", "job"}, exitUsage},
		{"--done-exit-code out of range", []string{"--done-exit-code", "256", "--once", "k", "job", "true"}, exitUsage},
		{"unreachable database", []string{"--dsn", "postgres://u@127.0.0.1:" + port + "/db?sslmode=disable", "job", "--", "true"}, exitUnavailable},
		{"unknown DSN scheme", []string{"--dsn", "mongodb://h/db", "job", "--", "true"}, exitConfig},
		{"a bare path as DSN", []string{"--dsn", "/var/lib/locks.db", "job", "--", "true"}, exitConfig},
		{"in-memory SQLite", []string{"--dsn", "sqlite::memory:", "job", "--", "true"}, exitConfig},
		{"command not found", []string{"job", "--", "no-such-command-lockrun-test"}, exitNotFound},
		{"command not executable", []string{"job", "--", notExec}, exitNotRunnable},
	} {
		code, stdout, stderr := runLockrun(t, state, c.args...)
		if code != c.want {
			t.Errorf("%s: exit %d, want %d; stderr %q", c.what, code, c.want, stderr)
		}
		checkOneLineError(t, stdout, stderr)
	}
}

// --help (and -h) prints a man page: its sections, every form, flag and
// environment variable, and every exit code.
func TestHelpReadsLikeAManPage(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--help", "-h"} {
		code, stdout, stderr := runLockrun(t, nil, flag)
		if code != 0 || stderr != "" {
			t.Fatalf("%s: exit %d, stderr %q", flag, code, stderr)
		}
		for _, want := range []string{
			"NAME\n", "SYNOPSIS\n", "lockrun [flags] NAME COMMAND [ARG...]", "lockrun [flags] NAME -c 'COMMAND'",
			"lockrun [flags] NAME -- COMMAND [ARG...]", "lockrun [flags] status [NAME...]", "lockrun [flags] completion bash|zsh",
			"lockrun [flags] -l NAME [-l NAME...] -- COMMAND [ARG...]", "-l, --lock NAME",
			"CONFIGURATION\n", "/etc/lockrun.conf", "XDG_CONFIG_HOME", "--config FILE", "--log-format", "-V, --version",
			"DESCRIPTION\n", "FLAGS\n", "EXIT STATUS\n", "EXAMPLES\n",
			"-n, --nonblock", "-w, --wait", "-E, --conflict-exit-code", "--once RUNKEY", "--done-exit-code N", "--lease", "--ttl", "--kill-after", "-q, --quiet", "-v, --verbose",
			"LOCKRUN_DSN", "DATABASE_URL", "XDG_STATE_HOME", "LOCKRUN_FENCING_TOKEN", "LOCKRUN_LOCK_NAME",
			"0 3 * * * lockrun -n", "Deploy hook", "128+N", "mysql://", "@tcp(HOST:3306)",
		} {
			if !strings.Contains(stdout, want) {
				t.Errorf("%s does not show %q", flag, want)
			}
		}
		for _, code := range []int{exitConflict, exitUsage, exitUnavailable, exitSoftware, exitLost, exitConfig, exitNotRunnable, exitNotFound} {
			if !strings.Contains(stdout, fmt.Sprintf("\n    %-6d ", code)) {
				t.Errorf("%s does not document exit code %d", flag, code)
			}
		}
	}
}

// The README's first command works on a fresh machine: no server, no
// DSN, no state directory yet.
func TestFreshMachineRunsWithTheSQLiteDefault(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	code, stdout, stderr := runLockrun(t, []string{"HOME=" + home}, "nightly-report", "--", "echo", "hello")
	if code != 0 || stdout != "hello\n" || stderr != "" {
		t.Fatalf("exit %d, stdout %q, stderr %q; want 0, \"hello\\n\", nothing", code, stdout, stderr)
	}
	dir := filepath.Join(home, ".local", "state", "lockrun")
	fi, err := os.Stat(dir)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state directory %s: %v, mode %v; want 0700", dir, err, fi.Mode().Perm())
	}
	if _, err := os.Stat(filepath.Join(dir, "locks.db")); err != nil {
		t.Errorf("no SQLite file: %v", err)
	}
}

// Behind PgBouncer in transaction mode the session lock is refused with a
// hint, and --lease works.
func TestTransactionPoolerWantsLease(t *testing.T) {
	t.Parallel()
	txDSN, _ := testdb.PgBouncer(t)
	env := []string{"LOCKRUN_DSN=" + txDSN}
	name := lockName(t)
	code, stdout, stderr := runLockrun(t, env, name, "--", "echo", "ran")
	if code != exitConfig || !strings.Contains(stderr, "--lease-rows") || strings.Contains(stderr, "LeaseLock") || stdout != "" {
		t.Errorf("session lock through a transaction pooler: exit %d, stdout %q, stderr %q; want %d and a hint to use --lease", code, stdout, stderr, exitConfig)
	}
	checkOneLineError(t, stdout, stderr)
	for i := 0; i < 3; i++ {
		code, stdout, stderr = runLockrun(t, env, "--lease", name, "--", "sh", "-c", `echo "$LOCKRUN_FENCING_TOKEN"`)
		if code != 0 || strings.TrimSpace(stdout) == "" {
			t.Errorf("--lease through a transaction pooler: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
	}
}

// Behind PgBouncer in transaction mode --lease-rows keeps a lock, a set
// and slots as rows: each runs its command, a second lockrun with -n on
// the held name gets the conflict code, and lockrun status lists the
// holder as a "lock row".
func TestTransactionPoolerTakesLeaseRows(t *testing.T) {
	t.Parallel()
	txDSN, _ := testdb.PgBouncer(t)
	env := []string{"LOCKRUN_DSN=" + txDSN}
	name := lockName(t)
	inner := lockrunBin(t) + " -n -E 7 --lease-rows " + name + " -- true; echo $?; " + lockrunBin(t) + " status " + name
	code, stdout, stderr := runLockrun(t, env, "--lease-rows", name, "--", "sh", "-c", inner)
	if code != 0 || !strings.HasPrefix(stdout, "7\n") {
		t.Errorf("--lease-rows through a transaction pooler, -n inside: exit %d, stdout %q, stderr %q; want 0 and the inner conflict code 7", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "lock row") {
		t.Errorf("lockrun status of a name held with --lease-rows: stdout %q, stderr %q; want a \"lock row\" holder", stdout, stderr)
	}
	for _, args := range [][]string{
		{"--lease-rows", "-l", name + "-a", "-l", name + "-b", "--", "echo", "ran"},
		{"--lease-rows", "--slots", "2", name + "-slots", "--", "echo", "ran"},
	} {
		if code, stdout, stderr := runLockrun(t, env, args...); code != 0 || stdout != "ran\n" {
			t.Errorf("lockrun %q through a transaction pooler: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

// -v says when the lock is taken and released.
func TestVerboseSaysAcquiredAndReleased(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name := lockName(t)
		code, _, stderr := runLockrun(t, env, "-v", "--lease", name, "--", "true")
		lines := strings.SplitAfter(stderr, "\n")
		want := fmt.Sprintf("lockrun: acquired lock %q (fencing token ", name)
		if code != 0 || len(lines) != 4 || !strings.HasPrefix(lines[0], "lockrun: database ") || !strings.HasPrefix(lines[1], want) || !strings.HasSuffix(stderr, fmt.Sprintf("lockrun: released lock %q\n", name)) {
			t.Errorf("-v: exit %d, stderr %q", code, stderr)
		}
		if code, _, stderr := runLockrun(t, env, "-v", "-q", name, "--", "true"); code != 0 || stderr != "" {
			t.Errorf("-v -q: exit %d, stderr %q; -q wins", code, stderr)
		}
	})
}

// --min-hold keeps the name taken after the command ends,
// until the window (counted from the grant) is over: a second host's cron
// job that starts a little later does not run it again; after the window
// it runs again.
func TestMinHoldRunsOncePerWindow(t *testing.T) {
	testdb.Slow(t, "waits out 3 s min-hold windows, per backend")
	eachBackend(t, func(t *testing.T, env []string) {
		name := lockName(t)
		const window = 3 * time.Second
		args := []string{"-n", "--min-hold", window.String(), name, "true"}
		start := time.Now()
		if code, out, errOut := runLockrun(t, env, args...); code != 0 {
			t.Fatalf("first run exited %d: %q %q", code, out, errOut)
		}
		code, out, errOut := runLockrun(t, env, args...)
		if time.Since(start) < window && code != 1 {
			t.Fatalf("second run inside the window exited %d, want the conflict code 1: %q %q", code, out, errOut)
		}
		if out != "" || errOut != "" {
			t.Errorf("a conflict inside the window said something (flock does not): %q %q", out, errOut)
		}
		var again time.Duration
		testdb.WaitFor(t, 0, func() bool {
			code, _, _ := runLockrun(t, env, args...)
			again = time.Since(start)
			return code == 0
		}, "lockrun never ran the command again after the window")
		if again < window-250*time.Millisecond { // the host's and the database's clocks may differ a little
			t.Fatalf("ran again %v after the first grant, inside the %v window", again, window)
		}
	})
}

// -s takes the lock shared, as flock -s: shared lockruns run
// their commands side by side, and an exclusive lockrun -n beside them
// exits with the conflict code; once they end it runs.
func TestSharedRunsSideBySideAndExcludesExclusive(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		procs := []*proc{
			startLockrun(t, env, append([]string{"-s", "-n", name, "--"}, d.holdUntil(t, "go")...)...),
			startLockrun(t, env, append([]string{"--shared", "-w", "30", name, "--"}, d.holdUntil(t, "go")...)...),
		}
		testdb.WaitFor(t, 0, func() bool { return len(strings.Fields(d.read("ran"))) == 2 }, "the two shared lockruns did not both run their commands")
		if code, out, errOut := runLockrun(t, env, "-n", name, "true"); code != 1 {
			t.Fatalf("exclusive lockrun -n beside shared holders exited %d, want 1: %q %q", code, out, errOut)
		}
		if code, out, errOut := runLockrun(t, env, "status", name); code != 0 || strings.Count(out, "shared") != 2 {
			t.Fatalf("status of a name with two shared holders exited %d, want two shared rows: %q %q", code, out, errOut)
		}
		// SQLite lists the held names from the rows (a file per test here).
		if strings.HasSuffix(t.Name(), "/sqlite") {
			if code, out, errOut := runLockrun(t, env, "status"); code != 0 || strings.Count(out, "shared") != 2 || strings.Count(out, name) != 2 {
				t.Fatalf("status with no names beside two shared holders exited %d, want their two shared rows alone: %q %q", code, out, errOut)
			}
		}
		d.touch(t, "go")
		for i, p := range procs {
			if code := p.wait(t); code != 0 {
				t.Errorf("shared lockrun %d exited %d; stderr: %q", i, code, p.stderr)
			}
		}
		if code, out, errOut := runLockrun(t, env, "-n", name, "true"); code != 0 {
			t.Fatalf("exclusive lockrun -n after the shared holders exited %d: %q %q", code, out, errOut)
		}
		if code, _, errOut := runLockrun(t, env, "-s", "--lease", name, "true"); code == 0 || !strings.Contains(errOut, "shared") {
			t.Fatalf("-s --lease exited %d, %q; want a usage error", code, errOut)
		}
	})
}
