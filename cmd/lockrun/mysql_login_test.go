package main

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// mysqlUser creates a user on the test server for one test, with the
// authentication that how gives it (IDENTIFIED ...), dropped at
// t.Cleanup, and returns its name; the test fails if the server's user
// may not create users or the server does not know how.
func mysqlUser(t *testing.T, how string) string {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	user := "lockrun_" + hex.EncodeToString(b[:])
	db := testdb.OpenMySQL(t)
	if _, err := db.ExecContext(ctxT(t), "CREATE USER '"+user+"'@'%' "+how); err != nil {
		t.Fatalf("cannot create a MySQL user %s: %v", how, err)
	}
	t.Cleanup(func() { _, _ = db.ExecContext(ctxT(t), "DROP USER '"+user+"'@'%'") })
	return user
}

// Defect 3: MySQL's refusals of a login that the DSN must fix exit 78
// (EX_CONFIG), as PostgreSQL's do, with the server's error in the one
// line and never the password: an unknown user or a wrong password
// (1045), a user that logs in another way (1698, MariaDB's unix_socket),
// a database the user may not use (1044) or that does not exist (1049).
func TestMySQLLoginRefusalsAreConfigErrors(t *testing.T) {
	t.Parallel()
	const secret = "n0t-th3-pa55word"
	cfg, err := mysql.ParseDSN(testdb.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	at := func(user, db string) string {
		return "mysql://" + url.UserPassword(user, secret).String() + "@" + cfg.Addr + "/" + db
	}
	for _, c := range []struct {
		what   string
		dsn    func(t *testing.T) string
		errnos []string // the server's error: one of these
	}{
		// MariaDB answers an unknown user as if it logged in some way at
		// random, so the refusal is 1045 or 1698.
		{"unknown user", func(*testing.T) string { return at("lockrun_nobody", cfg.DBName) }, []string{"Error 1045", "Error 1698"}},
		{"wrong password", func(*testing.T) string { return at(cfg.User, cfg.DBName) }, []string{"Error 1045"}},
		{"unknown database", func(t *testing.T) string {
			return strings.Replace(mysqlURL(t), "/"+cfg.DBName, "/lockrun_no_such_db", 1)
		}, []string{"Error 1049"}},
		{"user that logs in by unix_socket", func(t *testing.T) string {
			return at(mysqlUser(t, "IDENTIFIED VIA unix_socket"), cfg.DBName)
		}, []string{"Error 1698"}},
		{"database the user may not use", func(t *testing.T) string {
			return at(mysqlUser(t, "IDENTIFIED BY '"+secret+"'"), cfg.DBName)
		}, []string{"Error 1044"}},
	} {
		t.Run(strings.ReplaceAll(c.what, " ", "_"), func(t *testing.T) {
			dsn := c.dsn(t)
			for _, args := range [][]string{{"--dsn", dsn, "-n", "job", "true"}, {"status", "--dsn", dsn, "job"}} {
				code, stdout, stderr := runLockrun(t, nil, args...)
				if code != exitConfig || !slices.ContainsFunc(c.errnos, func(e string) bool { return strings.Contains(stderr, e) }) {
					t.Errorf("%s (%s): exit %d, stderr %q; want %d and the server's %s", c.what, args[0], code, stderr, exitConfig, strings.Join(c.errnos, " or "))
				}
				if strings.Contains(stdout+stderr, secret) {
					t.Errorf("%s (%s): the password is printed: %q", c.what, args[0], stderr)
				}
				checkOneLineError(t, stdout, stderr)
			}
		})
	}
}
