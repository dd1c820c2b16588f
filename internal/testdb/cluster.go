package testdb

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EnvPGBin names a directory holding initdb and postgres, tried before PATH
// and /usr/lib/postgresql/*/bin.
const EnvPGBin = "ADVISORYLOCK_PG_BIN"

// errNoLocalPostgres means a throwaway cluster cannot be had here at all (no
// binaries, or root with no postgres user), as opposed to one that failed.
var errNoLocalPostgres = errors.New("no local PostgreSQL")

// Cluster is a throwaway PostgreSQL cluster the harness started from local
// binaries: trust auth, listening on 127.0.0.1 and on a unix socket in its
// own temporary directory, with durability turned off for speed.
type Cluster struct {
	// DSN is postgres://postgres@127.0.0.1:port/postgres?sslmode=disable.
	DSN string

	dir    string // temporary directory: data/, the socket, postgres.log
	binDir string
	port   int
	cred   *syscall.Credential // nil unless running as root
	// settings are postgres's -c settings beyond the harness's
	settings []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// OwnCluster starts a new throwaway cluster for this test alone (for restart
// tests), with settings ("max_connections=10") given to postgres as -c
// after the harness's own, and destroys it at t.Cleanup. Without local PostgreSQL binaries it
// skips, or fails when ADVISORYLOCK_REQUIRE_DB=1; a cluster that will not
// start fails the test.
func OwnCluster(t testing.TB, settings ...string) *Cluster {
	t.Helper()
	c, err := startCluster(settings...)
	if errors.Is(err, errNoLocalPostgres) {
		Unavailable(t, "testdb: no throwaway cluster: "+err.Error())
	}
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() { // what the server said, before its directory goes
			t.Logf("testdb: the throwaway cluster at %s; the end of its log: %s", c.DSN, lastLines(c.log(), 20))
		}
		c.destroy()
	})
	return c
}

// Restart stops the cluster in fast mode (as pg_ctl stop -m fast: sessions
// are terminated) and starts it again on the same port, returning once it
// accepts connections.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	if err := c.stop(); err != nil {
		t.Fatalf("testdb: stopping cluster: %v", err)
	}
	if err := c.start(); err != nil {
		t.Fatalf("testdb: restarting cluster: %v", err)
	}
}

// Stop stops the cluster in fast mode. Restart starts it again.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if err := c.stop(); err != nil {
		t.Fatalf("testdb: stopping cluster: %v", err)
	}
}

// startCluster runs initdb into a new temporary directory and starts the
// server on a free loopback port.
func startCluster(settings ...string) (*Cluster, error) {
	binDir, err := findPGBin()
	if err != nil {
		return nil, err
	}
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	dir, err := ownedTempDir("advisorylock-pg-", cred)
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, binDir: binDir, cred: cred, settings: settings}
	initdb := exec.Command(filepath.Join(binDir, "initdb"),
		"-D", c.dataDir(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, lastLines(string(out), 5))
	}
	for attempt := 0; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			break
		}
		c.DSN = urlDSN("postgres", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), "postgres")
		if err = c.start(); err == nil || attempt == 2 {
			break
		}
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) logPath() string { return filepath.Join(c.dir, "postgres.log") }

// start runs postgres as a child process that dies with the test binary,
// and waits until it answers.
func (c *Cluster) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("cluster already running")
	}
	logFile, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-D", c.dataDir(), "-p", strconv.Itoa(c.port), "-k", c.dir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "logging_collector=off"}
	for _, s := range c.settings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	c.cmd, c.exited = cmd, exited

	deadline := time.Now().Add(60 * time.Second)
	for {
		err := pingDSN(c.DSN)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			c.cmd = nil
			return fmt.Errorf("postgres exited at start: %s", c.logTail())
		default:
		}
		if time.Now().After(deadline) {
			_ = c.stopLocked()
			return fmt.Errorf("postgres did not answer in time (%v): %s", err, c.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop shuts the server down in fast mode (SIGINT), killing it if it has
// not exited within 30 seconds. Stopping a stopped cluster does nothing.
func (c *Cluster) stop() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopLocked()
}

func (c *Cluster) stopLocked() error {
	if c.cmd == nil {
		return nil
	}
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-exited:
		return nil
	case <-time.After(30 * time.Second):
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("postgres ignored a fast shutdown for 30s and was killed: %s", c.logTail())
}

// destroy stops the cluster and removes its directory.
func (c *Cluster) destroy() {
	_ = c.stop()
	_ = os.RemoveAll(c.dir)
}

func (c *Cluster) logTail() string { return lastLines(c.log(), 5) }

func (c *Cluster) log() string {
	b, _ := os.ReadFile(c.logPath())
	return string(b)
}

// lastLines returns the last n non-empty lines of s joined by " | ", so a
// failure stays on one line.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// findPGBin finds a directory holding both initdb and postgres.
func findPGBin() (string, error) {
	var candidates []string
	if d := os.Getenv(EnvPGBin); d != "" {
		candidates = append(candidates, d)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			candidates = append(candidates, filepath.Dir(real))
		}
	}
	versioned, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(versioned, func(i, j int) bool { return pgVersion(versioned[i]) > pgVersion(versioned[j]) })
	candidates = append(candidates, versioned...)
	candidates = append(candidates, "/usr/local/pgsql/bin")
	for _, d := range candidates {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%w: no initdb and postgres binaries in %s, PATH or /usr/lib/postgresql/*/bin", errNoLocalPostgres, EnvPGBin)
}

func pgVersion(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// postgresCredential returns the credential of the postgres OS user when
// running as root (initdb, postgres and pgbouncer refuse to run as root),
// and nil otherwise.
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: running as root and there is no postgres OS user to run the server as", errNoLocalPostgres)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("%w: postgres user has a non-numeric uid/gid", errNoLocalPostgres)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// ownedTempDir makes a temporary directory (mode 0700) owned by cred's
// user, or by the current user when cred is nil.
func ownedTempDir(pattern string, cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
