package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/go-sql-driver/mysql"
)

// mysqlURL is the test database as a mysql:// URL.
func mysqlURL(t *testing.T) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	user := cfg.User
	if cfg.Passwd != "" {
		user += ":" + cfg.Passwd
	}
	return "mysql://" + user + "@" + cfg.Addr + "/" + cfg.DBName
}

func TestMySQLDSNFormsOpenTheServer(t *testing.T) {
	for _, dsn := range []string{mysqlURL(t), testdb.MySQLDSN(t), strings.Replace(mysqlURL(t), "mysql://", "MariaDB://", 1)} {
		d, err := openDatabase(context.Background(), dsn)
		if err != nil {
			t.Fatalf("openDatabase(%q): %v", dsn, err)
		}
		if d.kind != "mysql" || !strings.HasPrefix(d.describe("--dsn"), "database mysql 127.0.0.1:") {
			t.Errorf("openDatabase(%q) is %s (%s), want mysql", dsn, d.kind, d.describe("--dsn"))
		}
		var v string
		if err := d.QueryRow("SELECT @@version").Scan(&v); err != nil {
			t.Fatalf("%q: %v", dsn, err)
		}
		_ = d.Close()
	}
}

func TestMySQLDSNPasswordsNeverShow(t *testing.T) {
	const secret = "Sup3r-s3cret.pw"
	port := closedPort(t)
	for _, dsn := range []string{
		"mysql://lockuser:" + secret + "@127.0.0.1:" + port + "/db",
		"lockuser:" + secret + "@tcp(127.0.0.1:" + port + ")/db",
	} {
		d, ok, err := openMySQL(dsn)
		if !ok || err != nil {
			t.Fatalf("openMySQL(%q) = %v, %v", dsn, ok, err)
		}
		if strings.Contains(d.shown, secret) {
			t.Errorf("shown DSN %q has the password", d.shown)
		}
		_ = d.Close()
		code, stdout, stderr := runLockrun(t, nil, "--dsn", dsn, "job", "--", "true")
		if strings.Contains(stdout+stderr, "s3cret") || code != exitUnavailable {
			t.Errorf("lockrun on %q: exit %d (want %d), output %q", dsn, code, exitUnavailable, stdout+stderr)
		}
	}
	for _, dsn := range []string{"mysql://", "mysql://u:" + secret + "@h:notaport/db", "u@tcp(h:1)/db?timeout=soon"} {
		_, ok, err := openMySQL(dsn)
		var ce configError
		if !ok || !errors.As(err, &ce) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("openMySQL(%q) = %v, %v; want a configuration error without the password", dsn, ok, err)
		}
	}
	for _, dsn := range []string{"postgres://u@h/x", "host=h user=u", "sqlite:/x.db"} {
		if _, ok, _ := openMySQL(dsn); ok {
			t.Errorf("openMySQL(%q) took a DSN that is not MySQL", dsn)
		}
	}
}

// lockrun excludes across processes on MySQL, and -n reports a conflict
// while another lockrun holds the lock.
func TestLockrunOnMySQLExcludesAndReportsConflicts(t *testing.T) {
	t.Parallel() // a name of its own
	env := []string{"LOCKRUN_DSN=" + mysqlURL(t)}
	name, d := lockName(t), newDir(t)
	holder := startLockrun(t, env, append([]string{name, "--"}, d.holdUntil(t, "go")...)...)
	testdb.WaitFor(t, 0, func() bool { return d.exists("ran") }, "the holder did not start")
	if code, _, stderr := runLockrun(t, env, "-n", name, "--", "true"); code != 1 {
		t.Fatalf("-n while held: exit %d, want 1; stderr %q", code, stderr)
	}
	code, stdout, _ := runLockrun(t, env, "status", name)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if f := strings.Fields(lines[len(lines)-1]); code != 0 || len(f) < 4 || f[0] != name || f[1] != "lock" || f[3] == "-" {
		t.Fatalf("status while held: exit %d, %q; want the lock with its holder's connection id", code, stdout)
	}
	d.touch(t, "go")
	if code := holder.wait(t); code != 0 {
		t.Fatalf("holder exit %d", code)
	}
	if code, _, stderr := runLockrun(t, env, "-n", name, "--", "true"); code != 0 {
		t.Fatalf("-n after release: exit %d; stderr %q", code, stderr)
	}
	if code, _, stderr := runLockrun(t, env, "--lease", "-n", name, "--", "sh", "-c", `test "$LOCKRUN_FENCING_TOKEN" -gt 0`); code != 0 {
		t.Fatalf("--lease on MySQL: exit %d; stderr %q", code, stderr)
	}
}
