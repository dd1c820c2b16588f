package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// EnvMariaDBBin names a directory holding mariadbd and mariadb-install-db,
// tried before PATH and /usr/sbin.
const EnvMariaDBBin = "ADVISORYLOCK_MARIADB_BIN"

// MariaDB is a throwaway MariaDB server the harness started from local
// binaries for one test: root with no password on 127.0.0.1 and on a unix
// socket in its own temporary directory, a database "test", InnoDB
// writing its log at each commit and flushing it once a second (so a
// killed server, the machine still up, keeps every acknowledged commit).
type MariaDB struct {
	// DSN is root@tcp(127.0.0.1:port)/test, for go-sql-driver/mysql.
	DSN string

	dir  string // temporary directory: data/, the socket, mariadbd.log
	bin  string // mariadbd
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
}

// OwnMariaDB starts a new throwaway MariaDB server for this test alone
// (for tests that kill the server) and destroys it at t.Cleanup. Without
// local MariaDB binaries it skips, or fails when ADVISORYLOCK_REQUIRE_DB=1;
// a server that will not start fails the test.
func OwnMariaDB(t testing.TB) *MariaDB {
	t.Helper()
	server, install, err := findMariaDBBin()
	if err != nil {
		Unavailable(t, "testdb: no throwaway MariaDB: "+err.Error())
	}
	dir, err := os.MkdirTemp("", "advisorylock-mariadb-")
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	m := &MariaDB{dir: dir, bin: server}
	t.Cleanup(func() {
		if t.Failed() { // what the server said, before its directory goes
			t.Logf("testdb: the throwaway MariaDB on port %d%s; the end of its log: %s", m.port, m.exitedAlone(), lastLines(m.log(), 20))
		}
		m.destroy()
	})
	initdb := exec.Command(install, append([]string{"--no-defaults", "--datadir=" + m.dataDir(),
		"--auth-root-authentication-method=normal", "--skip-test-db"}, asRoot()...)...)
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("testdb: mariadb-install-db: %v: %s", err, lastLines(string(out), 5))
	}
	for attempt := 0; ; attempt++ {
		if m.port, err = freePort(); err != nil {
			break
		}
		if err = m.start(); err == nil || attempt == 2 {
			break
		}
	}
	if err != nil {
		t.Fatalf("testdb: starting MariaDB: %v", err)
	}
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port))
	if err := m.exec(cfg.FormatDSN(), "CREATE DATABASE test"); err != nil {
		t.Fatalf("testdb: creating database test on MariaDB port %d: %v", m.port, err)
	}
	cfg.DBName = "test"
	m.DSN = cfg.FormatDSN()
	return m
}

// Kill kills the server with SIGKILL, as the kernel's OOM killer would
// (no shutdown: sessions dropped, named locks gone, InnoDB left to crash
// recovery), and waits for it to exit. Start starts it again.
func (m *MariaDB) Kill(t testing.TB) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return
	}
	cmd, exited := m.cmd, m.exited
	m.cmd = nil
	_ = cmd.Process.Kill()
	<-exited
}

// Start starts a stopped server again on the same port and data
// directory, returning once it accepts connections (after its crash
// recovery).
func (m *MariaDB) Start(t testing.TB) {
	t.Helper()
	if err := m.start(); err != nil {
		t.Fatalf("testdb: restarting MariaDB on port %d: %v", m.port, err)
	}
}

// Port returns the server's TCP port on 127.0.0.1.
func (m *MariaDB) Port() int { return m.port }

func (m *MariaDB) dataDir() string { return filepath.Join(m.dir, "data") }
func (m *MariaDB) logPath() string { return filepath.Join(m.dir, "mariadbd.log") }

// start runs mariadbd as a child process that dies with the test binary,
// and waits until it answers.
func (m *MariaDB) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		return errors.New("MariaDB already running")
	}
	logFile, err := os.OpenFile(m.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := append([]string{"--no-defaults", "--datadir=" + m.dataDir(),
		"--port=" + strconv.Itoa(m.port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--socket=" + filepath.Join(m.dir, "mysqld.sock"), "--pid-file=" + filepath.Join(m.dir, "mysqld.pid"),
		"--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=2", "--max-connections=200"}, asRoot()...)
	cmd := exec.Command(m.bin, args...)
	cmd.Dir = m.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting mariadbd: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	m.cmd, m.exited = cmd, exited

	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port))
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := m.exec(cfg.FormatDSN(), "SELECT 1")
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			m.cmd = nil
			return fmt.Errorf("mariadbd exited at start: %s", m.logTail())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			m.cmd = nil
			return fmt.Errorf("mariadbd did not answer in time (%v): %s", err, m.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exec runs one statement on dsn with a short deadline.
func (m *MariaDB) exec(dsn, stmt string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = db.ExecContext(ctx, stmt)
	return err
}

// destroy kills the server and removes its directory.
func (m *MariaDB) destroy() {
	m.mu.Lock()
	if m.cmd != nil {
		_ = m.cmd.Process.Kill()
		<-m.exited
		m.cmd = nil
	}
	m.mu.Unlock()
	_ = os.RemoveAll(m.dir)
}

func (m *MariaDB) logTail() string { return lastLines(m.log(), 5) }

func (m *MariaDB) log() string {
	b, _ := os.ReadFile(m.logPath())
	return string(b)
}

// exitedAlone says whether the server, meant to be running, had exited
// without being killed.
func (m *MariaDB) exitedAlone() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return ""
	}
	select {
	case <-m.exited:
		return " (it had exited on its own: " + m.cmd.ProcessState.String() + ")"
	default:
		return ""
	}
}

// findMariaDBBin finds mariadbd and mariadb-install-db.
func findMariaDBBin() (server, install string, err error) {
	var dirs []string
	if d := os.Getenv(EnvMariaDBBin); d != "" {
		dirs = append(dirs, d)
	}
	for _, name := range []string{"mariadbd", "mariadb-install-db"} {
		if p, err := exec.LookPath(name); err == nil {
			dirs = append(dirs, filepath.Dir(p))
		}
	}
	dirs = append(dirs, "/usr/sbin", "/usr/bin", "/usr/local/mysql/bin", "/usr/local/mysql/scripts")
	find := func(name string) string {
		for _, d := range dirs {
			if p := filepath.Join(d, name); isExecutable(p) {
				return p
			}
		}
		return ""
	}
	server, install = find("mariadbd"), find("mariadb-install-db")
	if server == "" || install == "" {
		return "", "", fmt.Errorf("no mariadbd and mariadb-install-db in %s, PATH or /usr/sbin and /usr/bin (install mariadb-server)", EnvMariaDBBin)
	}
	return server, install, nil
}

// asRoot returns the flag mariadbd and mariadb-install-db need to run as
// root (they refuse otherwise), or nothing for any other user.
func asRoot() []string {
	if os.Geteuid() == 0 {
		return []string{"--user=root"}
	}
	return nil
}
