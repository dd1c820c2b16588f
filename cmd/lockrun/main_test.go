package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// The tests build lockrun once (with -race when the tests run with it)
// and run it as real processes, against the default SQLite file and
// against PostgreSQL. The build reads its system config file from the
// build directory (systemConfigPath) instead of /etc/lockrun.conf.

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(removeBuildAfter{testdb.Main(m)})
}

type removeBuildAfter struct{ m interface{ Run() int } }

func (r removeBuildAfter) Run() int {
	defer func() {
		if build.dir != "" {
			_ = os.RemoveAll(build.dir)
		}
	}()
	return r.m.Run()
}

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
	out  []byte
}

// lockrunBin builds lockrun into a temporary directory, once per test
// binary, and returns its path.
func lockrunBin(t *testing.T) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "lockrun-test-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "lockrun")
		args := []string{"build", "-o", build.bin, "-ldflags=-X main.systemConfig=" + filepath.Join(build.dir, "etc", "lockrun.conf")}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, ".")...)
		build.out, build.err = cmd.CombinedOutput()
	})
	if build.err != nil {
		t.Fatalf("building lockrun: %v\n%s", build.err, build.out)
	}
	return build.bin
}

// systemConfigPath is where the built lockrun looks for its system config
// file. Only a test that does not run in parallel may write it (and must
// remove it before it ends): every lockrun of the other tests reads it.
func systemConfigPath(t *testing.T) string {
	lockrunBin(t)
	return filepath.Join(build.dir, "etc", "lockrun.conf")
}

// backend is where the locks of a test live: the environment lockrun
// runs with.
type backend struct {
	name string
	env  func(t *testing.T) []string
}

var backends = []backend{
	{"sqlite", func(t *testing.T) []string { return []string{"XDG_STATE_HOME=" + t.TempDir()} }},
	{"postgres", func(t *testing.T) []string { return []string{"LOCKRUN_DSN=" + testdb.PostgresDSN(t)} }},
	{"mysql", func(t *testing.T) []string { return []string{"LOCKRUN_DSN=" + mysqlURL(t)} }},
}

// eachBackend runs f as a parallel subtest per backend.
func eachBackend(t *testing.T, f func(t *testing.T, env []string)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b.env(t))
		})
	}
}

// lockName is a lock name no other test (or agent) uses.
func lockName(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + hex.EncodeToString(b[:])
}

// baseEnv is the test's environment without what would steer lockrun,
// and with no user config file.
func baseEnv() []string {
	env := []string{"XDG_CONFIG_HOME=" + filepath.Join(build.dir, "no-config")}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "LOCKRUN_DSN", "DATABASE_URL", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "LOCKRUN_LOCK_NAME", "LOCKRUN_FENCING_TOKEN":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// cronEnv is the bare environment cron gives a job (HOME, LOGNAME,
// SHELL, PATH=/usr/bin:/bin), with home as HOME, plus env.
func cronEnv(home string, env ...string) []string {
	return append([]string{"HOME=" + home, "LOGNAME=root", "SHELL=/bin/sh", "PATH=/usr/bin:/bin"}, env...)
}

// withMutant adds scripts/mutate.sh's ADVISORYLOCK_MUTANT, when it is
// set, to the environment of a lockrun started with an environment of its
// own: lockrun is built from the tree the tests run in and must run the
// mutant the tests do.
func withMutant(env []string) []string {
	if v, ok := os.LookupEnv("ADVISORYLOCK_MUTANT"); ok {
		return append(env, "ADVISORYLOCK_MUTANT="+v)
	}
	return env
}

// proc is a running lockrun.
type proc struct {
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	start  time.Time
	ended  time.Time
}

// startLockrun starts lockrun with env added to baseEnv; it is killed at
// the end of the test if still running.
func startLockrun(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	lockrunBin(t)
	return startWithEnv(t, append(baseEnv(), env...), args...)
}

// startBare starts lockrun with env as its whole environment (as env -i
// does; see cronEnv).
func startBare(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startWithEnv(t, env, args...)
}

func startWithEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(lockrunBin(t), args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = withMutant(env)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.Dir = t.TempDir()
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting lockrun: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.ended = time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits (generously) for lockrun to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("lockrun %q still running after 60s; stderr: %s", p.cmd.Args, p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

// runLockrun runs lockrun to the end.
func runLockrun(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startLockrun(t, env, args...)
	code = p.wait(t)
	return code, p.stdout.String(), p.stderr.String()
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// dirFiles are the files a test's commands use to say what they did,
// and the gates they wait at.
type dirFiles struct {
	dir   string
	gates *gates
}

// gates are files the test holds an exclusive flock on: a command that
// waits at one (holdUntil) blocks in flock(1) until touch opens it,
// instead of polling for a file with a sleep(1) every few milliseconds
// (which cost the fast tier about 1,400 processes). A file that exists
// and is not locked is an open gate, as the polling read it.
type gates struct {
	mu     sync.Mutex
	closed map[string]*os.File // a gate's locked file, until touch
}

func newDir(t *testing.T) dirFiles {
	d := dirFiles{t.TempDir(), &gates{closed: map[string]*os.File{}}}
	t.Cleanup(func() { // a failed test's commands go on, and end
		d.gates.mu.Lock()
		defer d.gates.mu.Unlock()
		for _, f := range d.gates.closed {
			_ = f.Close()
		}
	})
	return d
}

func (d dirFiles) path(name string) string { return filepath.Join(d.dir, name) }

func (d dirFiles) read(name string) string {
	b, _ := os.ReadFile(d.path(name))
	return string(b)
}

func (d dirFiles) exists(name string) bool {
	_, err := os.Stat(d.path(name))
	return err == nil
}

// gate returns the path of the gate name, closed until touch(name) (or,
// once touched, again after the test removed the file): the file exists,
// locked exclusive by the test (the descriptor is close-on-exec: no
// command inherits the lock).
func (d dirFiles) gate(t *testing.T, name string) string {
	t.Helper()
	g := d.gates
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed[name] == nil && !d.exists(name) {
		f, err := os.OpenFile(d.path(name), os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			_ = f.Close()
			t.Fatalf("closing the gate %s: %v", name, err)
		}
		g.closed[name] = f
	}
	return d.path(name)
}

// touch creates the file name, or opens the gate name: every command
// waiting there goes on, and so does any that comes later.
func (d dirFiles) touch(t *testing.T, name string) {
	t.Helper()
	g := d.gates
	g.mu.Lock()
	f := g.closed[name]
	delete(g.closed, name)
	g.mu.Unlock()
	if f != nil {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(d.path(name), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitAt is the shell's last words: it becomes flock(1), which blocks
// until the gate at file (a shell word: "$2", or a quoted path) opens.
// Becoming it (exec), not running it, keeps a lockrun that dies from
// leaving a blocked flock behind: the command lockrun started is flock
// itself, which gets lockrun's SIGTERM on Linux. Its output goes
// nowhere, so that even a flock that outlived lockrun holds no pipe of
// the test's open (the test's wait for lockrun waits for those), and it
// ends when the test's cleanup opens the gate.
func waitAt(file string) string {
	return `exec 9<` + file + `; exec flock -s 9 </dev/null >/dev/null 2>&1`
}

// holdUntil is a command that records its lockrun's pid in ran and holds
// the lock until the gate release opens (touch).
func (d dirFiles) holdUntil(t *testing.T, release string) []string {
	return []string{"sh", "-c", `echo $PPID >> "$1"; ` + waitAt(`"$2"`), "sh", d.path("ran"), d.gate(t, release)}
}

// envValue returns the value of key in env (the last one wins).
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// openStore opens the database lockrun uses under env, for the test to
// look at or tamper with.
func openStore(t *testing.T, env []string) (*sql.DB, string) {
	t.Helper()
	if dsn := envValue(env, "LOCKRUN_DSN"); dsn != "" {
		return testdb.OpenPostgres(t, "pgx"), "postgres"
	}
	path := filepath.Join(envValue(env, "XDG_STATE_HOME"), "lockrun", "locks.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db, "sqlite"
}

// groupGone reports whether no process is left in process group pgid.
func groupGone(pgid int) bool {
	return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

// ctxT is a context for the test's own queries.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testdb.DefaultWait)
	t.Cleanup(cancel)
	return ctx
}

// runBare runs lockrun to the end with env as its whole environment.
func runBare(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startBare(t, env, args...)
	code = p.wait(t)
	return code, p.stdout.String(), p.stderr.String()
}

// writeFile writes content to path, creating its directory.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
