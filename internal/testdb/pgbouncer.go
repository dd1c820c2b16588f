package testdb

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PgBouncerPoolSize is the pool size of the shared PgBouncer's "txpool"
// database: small, so that clients are multiplexed over few server
// connections.
const PgBouncerPoolSize = 3

// PgBouncerSessionPoolSize is the pool size of its "sessionpool" database.
// In session mode every open client connection holds a server connection,
// so a small pool would only make tests queue (up to query_wait_timeout,
// 30s here) behind the idle connections of database/sql pools.
const PgBouncerSessionPoolSize = 20

var bouncer struct {
	mu       sync.Mutex
	resolved bool
	txDSN    string
	session  string
	missing  string // why pgbouncer cannot be had: skip (or fail when required)
	failed   string // why it would not start: always fail
}

// errNoPgBouncer means pgbouncer is not installed and could not be.
var errNoPgBouncer = errors.New("no pgbouncer")

// PgBouncer starts, once per process, a PgBouncer on a free loopback port in
// front of PostgresDSN's server, and returns lib/pq-ready URL DSNs of its two
// databases: "txpool" (pool_mode=transaction) and "sessionpool"
// (pool_mode=session), with pool sizes PgBouncerPoolSize and
// PgBouncerSessionPoolSize, trust auth, no prepared-statement support (the
// classic transaction-mode behaviour) and a 30s query_wait_timeout, so a
// client starved of a server connection fails rather than hangs. A missing pgbouncer is installed with apt-get when running as
// root; otherwise the test is skipped, or failed when
// ADVISORYLOCK_REQUIRE_DB=1. Main's teardown stops it.
func PgBouncer(t testing.TB) (txDSN, sessionDSN string) {
	t.Helper()
	upstream := PostgresDSN(t)
	bouncer.mu.Lock()
	defer bouncer.mu.Unlock()
	if !bouncer.resolved {
		bouncer.resolved = true
		tx, session, stop, err := startPgBouncer(t, upstream)
		switch {
		case errors.Is(err, errNoPgBouncer):
			bouncer.missing = "testdb: " + err.Error()
		case err != nil:
			bouncer.failed = "testdb: pgbouncer: " + err.Error()
		default:
			bouncer.txDSN, bouncer.session = tx, session
			atTeardown(stop)
		}
	}
	if bouncer.failed != "" {
		t.Fatal(bouncer.failed)
	}
	if bouncer.missing != "" {
		Unavailable(t, bouncer.missing)
	}
	return bouncer.txDSN, bouncer.session
}

// PgBouncerStatementPool returns the DSN of the same PgBouncer's third
// database, "stmtpool" (pool_mode=statement, pool size PgBouncerPoolSize),
// where every statement may land on another server session and
// transactions are refused.
func PgBouncerStatementPool(t testing.TB) string {
	t.Helper()
	txDSN, _ := PgBouncer(t)
	return WithDatabase(txDSN, "stmtpool")
}

func startPgBouncer(t testing.TB, upstream string) (txDSN, sessionDSN string, stop func(), err error) {
	bin, err := findPgBouncer(t)
	if err != nil {
		return "", "", nil, err
	}
	up, err := parseConnParams(upstream)
	if err != nil {
		return "", "", nil, fmt.Errorf("reading upstream DSN: %w", err)
	}
	cred, err := postgresCredential()
	if err != nil {
		return "", "", nil, fmt.Errorf("%w: %v", errNoPgBouncer, err)
	}
	dir, err := ownedTempDir("advisorylock-pgbouncer-", cred)
	if err != nil {
		return "", "", nil, err
	}
	b := &bouncerProc{bin: bin, dir: dir, cred: cred, version: pgBouncerVersion(bin)}
	for attempt := 0; ; attempt++ {
		var port int
		if port, err = freePort(); err != nil {
			break
		}
		hostport := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		txDSN = urlDSN(up.user, hostport, "txpool")
		sessionDSN = urlDSN(up.user, hostport, "sessionpool")
		if err = b.writeConfig(port, up); err != nil {
			break
		}
		if err = b.start(sessionDSN); err == nil || attempt == 2 {
			break
		}
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", "", nil, err
	}
	t.Logf("testdb: started PgBouncer %s on %s (databases txpool, sessionpool, stmtpool)", b.version, HostPort(t, txDSN))
	return txDSN, sessionDSN, b.stop, nil
}

// findPgBouncer looks for pgbouncer, installing it with apt-get when root.
func findPgBouncer(t testing.TB) (string, error) {
	lookup := func() (string, bool) {
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			return p, true
		}
		for _, p := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
			if isExecutable(p) {
				return p, true
			}
		}
		return "", false
	}
	if p, ok := lookup(); ok {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%w: pgbouncer is not installed (and not root, so not installing it)", errNoPgBouncer)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return "", fmt.Errorf("%w: pgbouncer is not installed and there is no apt-get", errNoPgBouncer)
	}
	t.Logf("testdb: pgbouncer not found, installing it with apt-get")
	if err := aptGet("install", "-y", "pgbouncer"); err != nil {
		t.Logf("testdb: apt-get install failed (%v), running apt-get update first", err)
		if err := aptGet("update"); err != nil {
			return "", fmt.Errorf("%w: apt-get update: %v", errNoPgBouncer, err)
		}
		if err := aptGet("install", "-y", "pgbouncer"); err != nil {
			return "", fmt.Errorf("%w: apt-get install pgbouncer: %v", errNoPgBouncer, err)
		}
	}
	if p, ok := lookup(); ok {
		return p, nil
	}
	return "", fmt.Errorf("%w: apt-get installed pgbouncer but it is not on PATH or in /usr/sbin", errNoPgBouncer)
}

func aptGet(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Test binaries of several packages may get here at once: wait for dpkg's lock.
	args = append([]string{"-o", "DPkg::Lock::Timeout=300", "-q"}, args...)
	cmd := exec.CommandContext(ctx, "apt-get", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, lastLines(string(out), 3))
	}
	return nil
}

var versionRE = regexp.MustCompile(`(\d+)\.(\d+)(?:\.(\d+))?`)

// pgBouncerVersion returns "major.minor.patch" from pgbouncer --version, or
// "" if it cannot tell.
func pgBouncerVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return ""
	}
	return versionRE.FindString(string(out))
}

// atLeast reports whether version ("1.18.0") is at least major.minor.
func atLeast(version string, major, minor int) bool {
	m := versionRE.FindStringSubmatch(version)
	if m == nil {
		return false
	}
	maj, _ := strconv.Atoi(m[1])
	mnr, _ := strconv.Atoi(m[2])
	return maj > major || (maj == major && mnr >= minor)
}

// bouncerProc is a running pgbouncer, a child of the test binary.
type bouncerProc struct {
	bin, dir, version string
	cred              *syscall.Credential

	cmd    *exec.Cmd
	exited chan struct{}
}

func (b *bouncerProc) writeConfig(port int, up connParams) error {
	server := fmt.Sprintf("host=%s port=%s dbname=%s user=%s", quoteIni(up.host), up.port, quoteIni(up.dbname), quoteIni(up.user))
	if up.password != "" {
		server += " password=" + quoteIni(up.password)
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[databases]\n")
	fmt.Fprintf(&cfg, "txpool = %s pool_mode=transaction pool_size=%d\n", server, PgBouncerPoolSize)
	fmt.Fprintf(&cfg, "sessionpool = %s pool_mode=session pool_size=%d\n", server, PgBouncerSessionPoolSize)
	fmt.Fprintf(&cfg, "stmtpool = %s pool_mode=statement pool_size=%d\n", server, PgBouncerPoolSize)
	fmt.Fprintf(&cfg, "\n[pgbouncer]\n")
	settings := [][2]string{
		{"listen_addr", "127.0.0.1"},
		{"listen_port", strconv.Itoa(port)},
		{"unix_socket_dir", b.dir},
		{"auth_type", "trust"},
		{"auth_file", filepath.Join(b.dir, "userlist.txt")},
		{"admin_users", up.user},
		{"pidfile", filepath.Join(b.dir, "pgbouncer.pid")},
		{"logfile", filepath.Join(b.dir, "pgbouncer.log")},
		{"pool_mode", "session"},
		{"default_pool_size", strconv.Itoa(PgBouncerPoolSize)},
		{"min_pool_size", "0"},
		{"reserve_pool_size", "0"},
		{"max_client_conn", "500"},
		// lib/pq sends extra_float_digits; pgx may send search_path/options from DSNs.
		{"ignore_startup_parameters", "extra_float_digits,options,search_path"},
		{"server_reset_query", "DISCARD ALL"},
		{"server_login_retry", "1"},
		{"query_wait_timeout", "30"},
	}
	if atLeast(b.version, 1, 21) {
		// Protocol-level prepared statements are only tracked from 1.21 on;
		// 0 keeps them off, as on older versions.
		settings = append(settings, [2]string{"max_prepared_statements", "0"})
	}
	for _, s := range settings {
		fmt.Fprintf(&cfg, "%s = %s\n", s[0], s[1])
	}
	if err := os.WriteFile(filepath.Join(b.dir, "pgbouncer.ini"), []byte(cfg.String()), 0o644); err != nil {
		return err
	}
	users := fmt.Sprintf("%q \"\"\n", up.user)
	return os.WriteFile(filepath.Join(b.dir, "userlist.txt"), []byte(users), 0o644)
}

// quoteIni quotes a connection-string value for pgbouncer's [databases].
func quoteIni(v string) string {
	if v != "" && !strings.ContainsAny(v, " \t'\\") {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", "''") + "'"
}

// start runs pgbouncer in the foreground as the postgres user (when root)
// and waits until sessionDSN answers.
func (b *bouncerProc) start(sessionDSN string) error {
	stderrPath := filepath.Join(b.dir, "stderr.log")
	logFile, err := os.OpenFile(stderrPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = b.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	b.cmd, b.exited = cmd, exited
	deadline := time.Now().Add(DefaultWait)
	for {
		err := pingDSN(sessionDSN)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			out, _ := os.ReadFile(stderrPath)
			return fmt.Errorf("pgbouncer exited at start: %s", lastLines(string(out), 5))
		default:
		}
		if time.Now().After(deadline) {
			b.kill()
			out, _ := os.ReadFile(stderrPath)
			return fmt.Errorf("pgbouncer did not answer (%v): %s", err, lastLines(string(out), 5))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills pgbouncer and removes its directory.
func (b *bouncerProc) stop() {
	b.kill()
	_ = os.RemoveAll(b.dir)
}

// kill stops pgbouncer with SIGTERM (its immediate shutdown), or SIGKILL if
// that takes more than 10 seconds.
func (b *bouncerProc) kill() {
	if b.cmd != nil {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.exited:
		case <-time.After(10 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.exited
		}
		b.cmd = nil
	}
}

// KeepBusy runs clients goroutines, each on its own connection to dsn,
// sending short statements until the returned stop is called (also at
// cleanup), so that a pooler in front of dsn is busy with other clients.
func KeepBusy(t testing.TB, driverName, dsn string, clients int) (stop func()) {
	t.Helper()
	db := OpenPostgresDSN(t, driverName, dsn)
	db.SetMaxOpenConns(clients)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, _ = db.ExecContext(ctx, "SELECT pg_sleep(0.0002)")
			}
		})
	}
	stop = sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})
	t.Cleanup(stop)
	return stop
}
