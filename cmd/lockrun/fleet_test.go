package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// lockrun for fleets. These tests run the built binary in the
// bare environment cron gives a job (env -i, then HOME, LOGNAME, SHELL and
// PATH=/usr/bin:/bin), where LOCKRUN_DSN and DATABASE_URL are not set.

// heldByLockrun reports whether a status row's CLIENT names the
// application lockrun: "lockrun", or "lockrun ADDRESS" quoted.
func heldByLockrun(client string) bool {
	client = strings.Trim(client, `"`)
	return client == "lockrun" || strings.HasPrefix(client, "lockrun ")
}

// The fleet setup end to end: from cron, a config file in the
// user's home reaches PostgreSQL, and the lock is the cluster's: a second
// lockrun with the same config, and the library on the same database,
// find it held.
func TestCronJobWithConfigFileTakesTheClusterLock(t *testing.T) {
	t.Parallel()
	const secret = "cr0n-s3cret-pw"
	dsn := testdb.WithParam(testdb.PostgresDSN(t), "password", secret) // trust auth ignores it
	home, d, name := t.TempDir(), newDir(t), lockName(t)
	writeFile(t, filepath.Join(home, ".config", "lockrun", "lockrun.conf"), "# the fleet's lock database\ndsn = "+dsn+"\n")

	holder := startBare(t, cronEnv(home), append([]string{"-v", name}, d.holdUntil(t, "go")...)...)
	testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the cron job did not start; stderr: %q", holder.stderr)
	// The command can start before the -v line has come through the pipe.
	testdb.WaitFor(t, 0, func() bool {
		_, line, ok := strings.Cut(holder.stderr.String(), "lockrun: database ")
		return ok && strings.Contains(line, "\n")
	}, "-v never said which database; stderr: %q", holder.stderr)
	if s := holder.stderr.String(); !strings.Contains(s, "lockrun: database postgres "+testdb.HostPort(t, dsn)+"/") ||
		!strings.Contains(s, "lockrun.conf:2") || strings.Contains(s, secret) {
		t.Errorf("-v does not say which database (from the config file) without its password: %q", s)
	}

	code, stdout, stderr := runBare(t, cronEnv(home), "-n", name, "touch", d.path("second-ran"))
	if code != exitConflict || stdout != "" || stderr != "" || d.exists("second-ran") {
		t.Errorf("a second cron job with the same config: exit %d, stdout %q, stderr %q, ran %v; want a silent conflict",
			code, stdout, stderr, d.exists("second-ran"))
	}
	code, stdout, stderr = runBare(t, cronEnv(home), "status", name)
	first, table, _ := strings.Cut(stdout, "\n")
	if rows := checkAligned(t, table); code != 0 || !strings.HasPrefix(first, "database postgres ") || strings.Contains(stdout, secret) ||
		len(rows) != 2 || rows[1][1] != "lock" || !heldByLockrun(rows[1][4]) {
		t.Errorf("status from cron: exit %d, stderr %q, stdout:\n%s\nwant the database, then the lock held by lockrun", code, stderr, stdout)
	}
	lock, err := advisorylock.New(testdb.OpenPostgres(t, "pgx"), name)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := lock.TryLock(ctxT(t)); !errors.Is(err, advisorylock.ErrNotAcquired) {
		if g != nil {
			_ = g.Release(ctxT(t))
		}
		t.Fatalf("the library on the same database got the lock the cron job holds (err %v): it is not the cluster's", err)
	}
	d.touch(t, "go")
	if code := holder.wait(t); code != 0 {
		t.Fatalf("the cron job exited %d; stderr %q", code, holder.stderr)
	}
	g, err := lock.TryLock(ctxT(t))
	if err != nil {
		t.Fatalf("after the cron job, the library cannot take the lock: %v", err)
	}
	_ = g.Release(ctxT(t))
}

// --dsn > LOCKRUN_DSN > DATABASE_URL > the user's file
// ($XDG_CONFIG_HOME, else ~/.config) > /etc/lockrun.conf > the default,
// and --config FILE replaces the search. Not parallel: it writes the
// system config file every lockrun of this test binary reads.
func TestConfigPrecedence(t *testing.T) {
	dir, home := t.TempDir(), t.TempDir()
	db := func(n string) string { return filepath.Join(dir, n+".db") }
	sys, user, xdg, explicit := systemConfigPath(t), filepath.Join(home, ".config", "lockrun", "lockrun.conf"),
		filepath.Join(dir, "xdg"), filepath.Join(dir, "explicit.conf")
	writeFile(t, sys, "dsn = sqlite:"+db("system")+"\n")
	t.Cleanup(func() { _ = os.Remove(sys) })
	writeFile(t, explicit, "dsn = sqlite:"+db("explicit")+"\n")
	for _, c := range []struct {
		what string
		user bool
		env  []string
		args []string
		want string
		from string
	}{
		{"system file alone", false, nil, nil, "system", sys + ":1"},
		{"user file over system file", true, nil, nil, "user", user + ":1"},
		{"XDG_CONFIG_HOME's file", false, []string{"XDG_CONFIG_HOME=" + xdg}, nil, "xdg", filepath.Join(xdg, "lockrun", "lockrun.conf") + ":2"},
		{"DATABASE_URL over the files", true, []string{"DATABASE_URL=sqlite:" + db("database-url")}, nil, "database-url", "$DATABASE_URL"},
		{"LOCKRUN_DSN over DATABASE_URL", true, []string{"DATABASE_URL=sqlite:" + db("database-url"), "LOCKRUN_DSN=sqlite:" + db("lockrun-dsn")}, nil, "lockrun-dsn", "$LOCKRUN_DSN"},
		{"--dsn over all", true, []string{"LOCKRUN_DSN=sqlite:" + db("lockrun-dsn")}, []string{"--dsn", "sqlite:" + db("flag")}, "flag", "--dsn"},
		{"--config instead of the files", true, nil, []string{"--config", explicit}, "explicit", explicit + ":1"},
	} {
		_ = os.Remove(user)
		if c.user {
			writeFile(t, user, "dsn = sqlite:"+db("user")+"\n")
		}
		writeFile(t, filepath.Join(xdg, "lockrun", "lockrun.conf"), "\ndsn = sqlite:"+db("xdg")+"\n")
		args := append(append([]string{"-v"}, c.args...), lockName(t), "true")
		code, _, stderr := runBare(t, cronEnv(home, c.env...), args...)
		want := "lockrun: database sqlite " + db(c.want) + " (this host only); dsn from " + c.from + "\n"
		if code != 0 || !strings.HasPrefix(stderr, want) {
			t.Errorf("%s: exit %d, stderr %q; want it to begin %q", c.what, code, stderr, want)
		}
	}
}

// The config file's keys are the flags' defaults; a
// flag on the command line wins.
func TestConfigSetsTheFlagsDefaults(t *testing.T) {
	t.Parallel()
	home, d, name := t.TempDir(), newDir(t), lockName(t)
	conf := filepath.Join(home, ".config", "lockrun", "lockrun.conf")
	writeFile(t, conf, "conflict-exit-code = 9\nlease = true\nlog-format = json\n")
	holder := startBare(t, cronEnv(home), append([]string{name}, d.holdUntil(t, "go")...)...)
	testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start; stderr: %q", holder.stderr)
	if code, _, stderr := runBare(t, cronEnv(home), "-n", name, "true"); code != 9 || stderr != "" {
		t.Errorf("conflict-exit-code = 9: -n exited %d (stderr %q), want 9", code, stderr)
	}
	if code, _, _ := runBare(t, cronEnv(home), "-n", "-E", "3", name, "true"); code != 3 {
		t.Errorf("-E 3 over the file's 9: exited %d, want 3", code)
	}
	d.touch(t, "go")
	holder.wait(t)
	code, stdout, stderr := runBare(t, cronEnv(home), "-v", name, "sh", "-c", `echo "$LOCKRUN_FENCING_TOKEN"`)
	if code != 0 || strings.TrimSpace(stdout) == "" {
		t.Errorf("lease = true: the command got no fencing token (exit %d, stdout %q)", code, stdout)
	}
	if !strings.HasPrefix(stderr, "{") {
		t.Errorf("log-format = json: stderr %q is not JSON lines", stderr)
	}
}

// A config file the user cannot read is exit 78 with
// one line, never a silent fallback to the default SQLite file.
func TestUnreadableConfigFileIsAConfigError(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	conf := filepath.Join(home, ".config", "lockrun", "lockrun.conf")
	writeFile(t, conf, "dsn = sqlite:/tmp/x.db\n")
	if err := os.Chmod(conf, 0o200); err != nil {
		t.Fatal(err)
	}
	args := []string{"job", "touch", filepath.Join(home, "ran")}
	var p *proc
	if os.Getuid() == 0 { // root reads any file: run lockrun as nobody
		p = startAsNobody(t, cronEnv(home), home, args...)
	} else {
		p = startBare(t, cronEnv(home), args...)
	}
	code := p.wait(t)
	if code != exitConfig || !strings.Contains(p.stderr.String(), "cannot read config file "+conf+": permission denied") {
		t.Errorf("unreadable config: exit %d, stderr %q; want %d naming the file", code, p.stderr, exitConfig)
	}
	checkOneLineError(t, p.stdout.String(), p.stderr.String())
	if _, err := os.Stat(filepath.Join(home, "ran")); err == nil {
		t.Error("the command ran despite the unreadable config file")
	}
	if _, err := os.Stat(filepath.Join(home, ".local")); err == nil {
		t.Error("lockrun fell back to the default SQLite file")
	}
}

// startAsNobody starts a copy of lockrun as the user nobody, with home
// (and the directories above it) and the build directory, where the
// system config file would be, searchable by nobody.
func startAsNobody(t *testing.T, env []string, home string, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "lockrun")
	// cp writes the copy, not this process: a file this process had open
	// for writing would be inherited by any child a parallel test forks
	// meanwhile, and exec would then fail with "text file busy".
	if out, err := exec.Command("cp", lockrunBin(t), bin).CombinedOutput(); err != nil {
		t.Fatalf("copy lockrun: %v: %s", err, out)
	}
	for _, p := range []string{bin, dir, filepath.Dir(dir), filepath.Dir(filepath.Dir(systemConfigPath(t))), home, filepath.Dir(home), filepath.Join(home, ".config"), filepath.Join(home, ".config", "lockrun")} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := &proc{cmd: exec.Command(bin, args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env, p.cmd.Stdout, p.cmd.Stderr, p.cmd.Dir = withMutant(env), p.stdout, p.stderr, "/"
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	return p
}

// An unknown key, or a bad value, is exit 78 naming the
// file and line.
func TestUnknownConfigKeyIsAConfigError(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	conf := filepath.Join(home, ".config", "lockrun", "lockrun.conf")
	for text, say := range map[string]string{
		"ttl = 1m\ndsm = postgres://db/x\n": conf + `:2: unknown key "dsm"`,
		"ttl = 0.5\n":                       conf + ":1: ttl: bad value",
	} {
		writeFile(t, conf, text)
		for _, args := range [][]string{{"job", "true"}, {"status"}} {
			code, stdout, stderr := runBare(t, cronEnv(home), args...)
			if code != exitConfig || !strings.Contains(stderr, say) {
				t.Errorf("config %q, %v: exit %d, stderr %q; want %d saying %q", text, args, code, stderr, exitConfig, say)
			}
			checkOneLineError(t, stdout, stderr)
		}
	}
}

// flock's forms: NAME COMMAND [ARG...] without --, and NAME -c 'COMMAND'
// run by sh -c; both hold the lock while they run. A subcommand word
// after -- (or followed by --) is a NAME, after flags too.
func TestFlockFormsRunTheCommand(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		code, stdout, stderr := runLockrun(t, env, name, "echo", "a", "-n", "--", "b")
		if code != 0 || stdout != "a -n -- b\n" || stderr != "" {
			t.Errorf("NAME COMMAND ARGS: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		code, stdout, _ = runLockrun(t, env, "-n", name, "-c", `echo "$LOCKRUN_LOCK_NAME" | tr a-z A-Z; exit 7`)
		if code != 7 || stdout != strings.ToUpper(name)+"\n" {
			t.Errorf("NAME -c: exit %d, stdout %q; want 7 and the name in capitals", code, stdout)
		}
		for _, args := range [][]string{{"--", "status", "echo", "lock status"}, {"-w", "60", "--", "completion", "echo", "lock completion"}, {"status", "--", "echo", "lock status"}, {"-w", "60", "elect", "--", "echo", "lock elect"}} {
			code, stdout, stderr := runLockrun(t, env, args...)
			if code != 0 || stdout != args[len(args)-1]+"\n" {
				t.Errorf("%q: exit %d, stdout %q, stderr %q; want a lock named as the subcommand word, taken", args, code, stdout, stderr)
			}
		}
		script := `echo $PPID > '` + d.path("ran") + `'; ` + waitAt(`'`+d.gate(t, "go")+`'`)
		holder := startLockrun(t, env, name, "-c", script)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "-c holder did not start: %q", holder.stderr)
		if code, _, _ := runLockrun(t, env, "-n", name, "true"); code != exitConflict {
			t.Errorf("while NAME -c 'COMMAND' runs, -n exited %d, want the conflict code: the lock is not held", code)
		}
		d.touch(t, "go")
		if code := holder.wait(t); code != 0 {
			t.Errorf("NAME -c holder exited %d; stderr %q", code, holder.stderr)
		}
	})
}

// Flags go before a subcommand as before NAME, as git's do: in cron's bare
// environment, where nothing else names the database, lockrun --dsn DSN
// -v status NAME asks DSN's database and finds NAME's holder, and flags
// before completion are taken too. A flag that only takes a lock is
// refused there (exit 64), naming how to take a lock so named, and the
// command does not run.
func TestGlobalFlagsGoBeforeASubcommand(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	for _, db := range []struct{ name, dsn string }{
		{"sqlite", "sqlite:" + filepath.Join(home, "locks.db")},
		{"postgres", testdb.PostgresDSN(t)},
	} {
		t.Run(db.name, func(t *testing.T) {
			t.Parallel()
			name, d, env := lockName(t), newDir(t), cronEnv(home)
			holder := startBare(t, env, append([]string{"--dsn", db.dsn, name}, d.holdUntil(t, "release")...)...)
			testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start; stderr: %q", holder.stderr)
			for _, args := range [][]string{
				{"--dsn", db.dsn, "-v", "status", name},
				{"-q", "--dsn=" + db.dsn, "--log-format", "json", "status", name},
				{"-v", "status", "--dsn", db.dsn, name},
			} {
				code, stdout, stderr := runBare(t, env, args...)
				if code != 0 || stderr != "" {
					t.Errorf("lockrun %q: exit %d, stderr %q; want the status of %s", args, code, stderr, name)
					continue
				}
				_, table, _ := strings.Cut(stdout, "\n")
				if rows := checkAligned(t, table); len(rows) != 2 || rows[1][0] != name || rows[1][1] != "lock" {
					t.Errorf("lockrun %q printed %q; want one row: %s held as a lock", args, stdout, name)
				}
			}
			for _, args := range [][]string{{"-v", "completion", "bash"}, {"--dsn", db.dsn, "completion", "zsh"}} {
				if code, stdout, stderr := runBare(t, env, args...); code != 0 || stderr != "" || !strings.Contains(stdout, "_lockrun") {
					t.Errorf("lockrun %q: exit %d, stderr %q; want the completion script", args, code, stderr)
				}
			}
			for word, args := range map[string][]string{
				"status":     {"--dsn", db.dsn, "-n", "status", "echo", "ran"},
				"completion": {"--once", "k", "completion", "bash"},
			} {
				code, stdout, stderr := runBare(t, env, args...)
				if code != exitUsage || stdout != "" || !strings.Contains(stderr, "does not apply to "+word) || !strings.Contains(stderr, "lockrun [flags] -- "+word+" COMMAND") {
					t.Errorf("lockrun %q: exit %d, stdout %q, stderr %q; want %d, refusing the flag and saying how to take a lock so named", args, code, stdout, stderr, exitUsage)
				}
			}
			d.touch(t, "release")
			if code := holder.wait(t); code != 0 {
				t.Errorf("the holder exited %d; stderr %q", code, holder.stderr)
			}
		})
	}
}

// A conflict prints nothing, -n or -w, like flock; the
// waiting and giving up are said only with -v.
func TestConflictsAreSilentUnlessVerbose(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		holder := startLockrun(t, env, append([]string{name}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")
		for _, args := range [][]string{{"-n"}, {"-w", "0.3"}, {"-E", "5", "--wait=0.2"}} {
			want := exitConflict
			if args[0] == "-E" {
				want = 5
			}
			code, stdout, stderr := runLockrun(t, env, append(args, name, "true")...)
			if code != want || stdout != "" || stderr != "" {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d and silence", args, code, stdout, stderr, want)
			}
		}
		code, _, stderr := runLockrun(t, env, "-v", "-w", "1.5", name, "true")
		if code != exitConflict || !strings.Contains(stderr, "waiting for lock "+strconv.Quote(name)+", held by") ||
			!strings.Contains(stderr, "gave up waiting for lock") {
			t.Errorf("-v -w: exit %d, stderr %q; want the wait and the giving up said", code, stderr)
		}
		code, _, stderr = runLockrun(t, env, "-v", "-n", name, "true")
		if code != exitConflict || !strings.Contains(stderr, "lock "+strconv.Quote(name)+" is held by") {
			t.Errorf("-v -n: exit %d, stderr %q; want who holds it", code, stderr)
		}
		d.touch(t, "go")
		holder.wait(t)
	})
}

// --version prints one line on stdout.
func TestVersionPrintsOneLine(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--version", "-V"} {
		code, stdout, stderr := runBare(t, nil, flag)
		if code != 0 || !strings.HasPrefix(stdout, "lockrun ") || strings.Count(stdout, "\n") != 1 || !strings.Contains(stdout, "go1.") || stderr != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", flag, code, stdout, stderr)
		}
	}
}

// status shows the pid of a SQLite holder (the lockrun
// holding it), in the table and in -v's waiting line.
func TestStatusShowsThePIDOfSQLiteHolders(t *testing.T) {
	t.Parallel()
	env := backends[0].env(t)
	name, d := lockName(t), newDir(t)
	for _, lease := range []bool{false, true} {
		args := append([]string{name}, d.holdUntil(t, "go")...)
		if lease {
			args = append([]string{"--lease"}, args...)
		}
		holder := startLockrun(t, env, args...)
		testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")
		pid := strconv.Itoa(holder.cmd.Process.Pid)
		code, stdout, stderr := runLockrun(t, env, "status", name)
		lines := strings.Split(strings.TrimRight(stdout, "\n"), "\n")
		if code != 0 || len(lines) < 2 {
			t.Fatalf("status: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		rows := checkAligned(t, strings.Join(lines[1:], "\n"))
		if len(rows) != 2 || rows[0][3] != "PID" || rows[1][3] != pid {
			t.Errorf("lease=%v: status shows PID %q, want the holder's %s:\n%s", lease, rows[len(rows)-1][3], pid, stdout)
		}
		probe := []string{"-v", "-n", name, "true"}
		if lease {
			probe = append([]string{"--lease"}, probe...)
		}
		_, _, stderr = runLockrun(t, env, probe...)
		if !strings.Contains(stderr, "is held by pid "+pid+",") {
			t.Errorf("lease=%v: -v -n says %q, want the holder's pid %s", lease, stderr, pid)
		}
		d.touch(t, "go")
		holder.wait(t)
		_ = os.Remove(d.path("go"))
		_ = os.Remove(d.path("ran"))
	}
}

// --log-format json makes every line of lockrun's own one JSON
// object (time, level, msg, lock), -v's lines and the lost-lock line.
func TestJSONLogFormat(t *testing.T) {
	t.Parallel()
	env := backends[0].env(t)
	name, d := lockName(t), newDir(t)
	_, _, stderr := runLockrun(t, env, "-v", "--log-format", "json", name, "true")
	lines := jsonLines(t, stderr)
	if len(lines) != 3 || lines[0]["msg"] == nil || !strings.HasPrefix(lines[0]["msg"].(string), "database sqlite ") {
		t.Errorf("-v: %d lines %v; want database, acquired, released", len(lines), lines)
	}
	for _, l := range lines {
		if l["level"] != "INFO" || l["lock"] != name || l["time"] == nil {
			t.Errorf("-v line %v: want level INFO, lock %q and a time", l, name)
		}
	}
	p := startLockrun(t, env, "--log-format=json", "--ttl", "3", "--kill-after", "0.2", name, "sh", "-c", `echo $$ > "$1"; while :; do sleep 0.05; done`, "sh", d.path("ready"))
	testdb.WaitFor(t, 0, func() bool { return d.exists("ready") }, "the command did not start")
	expireSQLiteLock(t, env, name)
	if code := p.wait(t); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr %q", code, exitLost, p.stderr)
	}
	lines = jsonLines(t, p.stderr.String())
	if len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["lock"] != name || !strings.Contains(lines[0]["msg"].(string), "lost while the command ran") {
		t.Errorf("lost lock: %v; want one WARN line", lines)
	}
}

// jsonLines parses every line of s as a JSON object.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// expireSQLiteLock ends the default lock's lease row, as if its renewals
// had stopped.
func expireSQLiteLock(t *testing.T, env []string, name string) {
	t.Helper()
	db, _ := openStore(t, env)
	if _, err := db.ExecContext(ctxT(t), `UPDATE advisorylock_locks SET expires_at = 0 WHERE name = ?1`, name); err != nil {
		t.Fatalf("expiring the lock: %v", err)
	}
}

// A SQLite file in a missing directory is exit 78
// saying so (SQLite itself says "out of memory (14)").
func TestSQLiteFileInAMissingDirectorySaysSo(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	for _, dsn := range []string{"sqlite:" + missing + "/locks.db", "file:" + missing + "/locks.db"} {
		code, stdout, stderr := runBare(t, cronEnv(t.TempDir()), "--dsn", dsn, "job", "true")
		if code != exitConfig || !strings.Contains(stderr, "directory "+missing+" does not exist") || strings.Contains(stderr, "out of memory") {
			t.Errorf("%s: exit %d, stderr %q; want %d saying the directory does not exist", dsn, code, stderr, exitConfig)
		}
		checkOneLineError(t, stdout, stderr)
	}
	code, _, stderr := runBare(t, cronEnv(t.TempDir()), "--log-format", "json", "--dsn", "sqlite:"+missing+"/locks.db", "job", "true")
	if lines := jsonLines(t, stderr); code != exitConfig || len(lines) != 1 || lines[0]["level"] != "ERROR" {
		t.Errorf("with --log-format json: exit %d, stderr %q; want one JSON error line", code, stderr)
	}
}

// The settings of a config file take effect in a run,
// not only in the options: wait = 0.3 gives up behind a holder with the
// conflict code after 0.3s; min-hold = 3 keeps the name taken after the
// command, so a second -n run inside the window exits with the conflict
// code; lease = true with ttl = 7 holds a lease row whose expiry is 7s
// (not the library's 30s) past its grant or last renewal.
func TestConfigFileSettingsTakeEffectInARun(t *testing.T) {
	t.Parallel()
	env := []string{"XDG_STATE_HOME=" + t.TempDir()}
	d := newDir(t)
	conf := func(name, text string) string {
		writeFile(t, d.path(name), text)
		return d.path(name)
	}
	name := lockName(t)
	holder := startLockrun(t, env, append([]string{name, "--"}, d.holdUntil(t, "go")...)...)
	testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")
	p := startLockrun(t, env, "--config", conf("wait.conf", "wait = 0.3\n"), name, "--", "touch", d.path("waiter-ran"))
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("lockrun with wait = 0.3 in its config file still waits after 20s behind a holder")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 || p.ended.Sub(p.start) < 300*time.Millisecond || d.exists("waiter-ran") {
		t.Errorf("wait = 0.3: exited %d after %v (command ran: %v); want the conflict code 1 after 0.3s, command not run", code, p.ended.Sub(p.start), d.exists("waiter-ran"))
	}
	d.touch(t, "go")
	if code := holder.wait(t); code != 0 {
		t.Errorf("holder exited %d", code)
	}

	const window = 3 * time.Second
	windowConf := conf("window.conf", "min-hold = 3\n")
	name = lockName(t)
	start := time.Now()
	if code, out, errOut := runLockrun(t, env, "--config", windowConf, "-n", name, "true"); code != 0 {
		t.Fatalf("first run with min-hold = 3 exited %d: %q %q", code, out, errOut)
	}
	code, out, errOut := runLockrun(t, env, "--config", windowConf, "-n", name, "true")
	if time.Since(start) < window && code != 1 {
		t.Errorf("second run inside the config file's min-hold window exited %d, want the conflict code 1: %q %q", code, out, errOut)
	}

	name = lockName(t)
	leaseConf := conf("lease.conf", "lease = true\nttl = 7\n")
	holder = startLockrun(t, env, append([]string{"--config", leaseConf, name, "--"}, d.holdUntil(t, "go-lease")...)...)
	testdb.WaitFor(t, 0, func() bool { return strings.Count(d.read("ran"), "\n") == 2 }, "the lease holder did not start")
	db, _ := openStore(t, env)
	var ahead int64 // the row's expiry past its grant, in milliseconds
	if err := db.QueryRowContext(ctxT(t), "SELECT expires_at - acquired_at FROM advisorylock_leases WHERE name = ?", name).Scan(&ahead); err != nil {
		t.Fatalf("reading the lease row: %v", err)
	}
	if held := time.Since(start).Milliseconds(); ahead < 7000 || ahead > 7000+held {
		t.Errorf("lease = true, ttl = 7: the row expires %dms past its grant, want 7000ms plus at most the time held", ahead)
	}
	d.touch(t, "go-lease")
	if code := holder.wait(t); code != 0 {
		t.Errorf("lease holder exited %d", code)
	}
}
