package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestRedactDSNHidesEveryPassword(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://app:hunter22@db:5432/app":                     "postgres://app:xxxxx@db:5432/app",
		"postgresql://app:p%40ss@db/app?sslmode=require":          "postgresql://app:xxxxx@db/app?sslmode=require",
		"postgres://app:p@ss@db/app":                              "postgres://app:xxxxx@db/app",
		"postgres://:onlypw@db/app":                               "postgres://:xxxxx@db/app",
		"postgres://db/app?user=app&password=hunter22&sslmode=no": "postgres://db/app?user=app&password=xxxxx",
		"host=db user=app password=hunter22 dbname=app":           "host=db user=app password=xxxxx dbname=app",
		"host=db password = hunter22":                             "host=db password = xxxxx",
		`host=db password='hunter 22 \' x' dbname=app`:            "host=db password=xxxxx dbname=app",
		"host=db sslpassword=keypw user=app":                      "host=db sslpassword=xxxxx user=app",
		"postgres://app@db:5432/app":                              "postgres://app@db:5432/app",
		"host=db user=app":                                        "host=db user=app",
		"sqlite:/var/lib/lockrun/locks.db":                        "sqlite:/var/lib/lockrun/locks.db",
		"mysql://root:toor@db/x":                                  "mysql://root:xxxxx@db/x",
		"failed: cannot parse `postgres://u:pw@h:bad/x`: port":    "failed: cannot parse `postgres://u:xxxxx@h:bad/x`: port",
	} {
		if got := redactDSN(in); got != want {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDSNSecretsFindsThePasswords(t *testing.T) {
	for in, want := range map[string][]string{
		"postgres://app:hunter22@db/app":            {"hunter22"},
		"postgres://app:p%40ss@db/app":              {"p@ss"},
		"postgres://db/app?password=qq1":            {"qq1", "qq1"},
		`host=db password='a b\'c' user=x`:          {"a b'c"},
		"host=db password=plain sslpassword=keypw ": {"plain", "keypw"},
		"host=db": nil,
	} {
		got := dsnSecrets(in)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("dsnSecrets(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestScrubMakesOneLineWithoutSecrets(t *testing.T) {
	got := scrub("dial error:\n\thost=db password=hunter22\r\nsecret hunter22 and p@ss", []string{"hunter22", "p@ss", "ab"})
	want := "dial error: host=db password=xxxxx secret xxxxx and xxxxx"
	if got != want {
		t.Errorf("scrub = %q, want %q", got, want)
	}
}

func TestOpenKnowsItsSchemes(t *testing.T) {
	dir := t.TempDir()
	for dsn, kind := range map[string]string{
		"postgres://u@127.0.0.1:1/x":                 "postgres",
		"POSTGRESQL://u@127.0.0.1:1/x":               "postgres",
		"host=127.0.0.1 port=1":                      "postgres",
		"sqlite:" + filepath.Join(dir, "a.db"):       "sqlite",
		"sqlite://" + filepath.Join(dir, "b?#%.db"):  "sqlite",
		"file:" + filepath.Join(dir, "c.db?mode=rw"): "sqlite",
	} {
		d, err := open(dsn)
		if err != nil {
			t.Errorf("open(%q): %v", dsn, err)
			continue
		}
		if d.kind != kind {
			t.Errorf("open(%q) is %s, want %s", dsn, d.kind, kind)
		}
		_ = d.Close()
	}
	for _, dsn := range []string{"redis://h", "/var/lib/x.db", "locks.db", "sqlite:", "postgres://u:pw@h:port/x"} {
		_, err := open(dsn)
		var ce configError
		if !errors.As(err, &ce) || codeFor(err) != exitConfig {
			t.Errorf("open(%q): %v; want a configuration error (exit %d)", dsn, err, exitConfig)
		}
	}
}

func TestSQLitePathsSurviveOddCharacters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "odd ?#% name.db")
	d, err := open("sqlite:" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var mode string
	if err := d.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v; want wal", mode, err)
	}
	var file string
	if err := d.QueryRow("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file); err != nil || file != path {
		t.Errorf("opened %q (%v), want %q", file, err, path)
	}
}

func TestDefaultPathFollowsXDG(t *testing.T) {
	state, home := t.TempDir(), t.TempDir()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"XDG_STATE_HOME": state, "HOME": home}, filepath.Join(state, "lockrun", "locks.db")},
		{map[string]string{"HOME": home}, filepath.Join(home, ".local", "state", "lockrun", "locks.db")},
		{map[string]string{"XDG_STATE_HOME": "relative/ignored", "HOME": home}, filepath.Join(home, ".local", "state", "lockrun", "locks.db")},
	} {
		got, from, err := chooseDSN("", env(c.env), nil)
		if err != nil || got != "sqlite:"+c.want || from != "the default" {
			t.Errorf("env %v: %q from %q, %v; want sqlite:%s from the default", c.env, got, from, err, c.want)
		}
	}
	if _, _, err := chooseDSN("", env(nil), nil); codeFor(err) != exitConfig {
		t.Errorf("no HOME, no XDG_STATE_HOME: %v, want a configuration error", err)
	}
}

// --dsn > LOCKRUN_DSN > DATABASE_URL > config files >
// the default (the files' own order is loadConfig's; see config_test.go).
func TestChooseDSNPrecedence(t *testing.T) {
	all := map[string]string{"LOCKRUN_DSN": "a", "DATABASE_URL": "b", "HOME": t.TempDir()}
	file := map[string]setting{"dsn": {value: "c", at: "/etc/lockrun.conf:2"}}
	for _, c := range []struct {
		flag     string
		drop     []string
		settings map[string]setting
		want     string
		from     string
	}{
		{"flag", nil, file, "flag", "--dsn"},
		{"", nil, file, "a", "$LOCKRUN_DSN"},
		{"", []string{"LOCKRUN_DSN"}, file, "b", "$DATABASE_URL"},
		{"", []string{"LOCKRUN_DSN", "DATABASE_URL"}, file, "c", "/etc/lockrun.conf:2"},
		{"", []string{"LOCKRUN_DSN", "DATABASE_URL"}, nil, "sqlite:", "the default"},
	} {
		getenv := func(k string) string {
			if contains(c.drop, k) {
				return ""
			}
			return all[k]
		}
		got, from, err := chooseDSN(c.flag, getenv, c.settings)
		if err != nil || !strings.HasPrefix(got, c.want) || (c.want != "sqlite:" && got != c.want) || from != c.from {
			t.Errorf("flag %q, without %v: %q from %q (%v); want %q from %q", c.flag, c.drop, got, from, err, c.want, c.from)
		}
	}
}

// SQLite in a missing directory says so (SQLite itself
// says "out of memory (14)").
func TestSQLiteInAMissingDirectorySaysSo(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no", "such")
	for _, dsn := range []string{"sqlite:" + missing + "/locks.db", "file:" + missing + "/locks.db?mode=rwc"} {
		_, err := open(dsn)
		if codeFor(err) != exitConfig || err == nil || !strings.Contains(err.Error(), "directory "+missing+" does not exist") {
			t.Errorf("open(%q): %v; want a configuration error naming the missing directory", dsn, err)
		}
	}
	file := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := open("sqlite:" + file + "/locks.db"); codeFor(err) != exitConfig || err == nil || !strings.Contains(err.Error(), file+" is not a directory") {
		t.Errorf("SQLite file under a plain file: %v; want a configuration error saying so", err)
	}
}

// Which database, in words, never with a password.
func TestDatabaseSaysWhichWithoutPassword(t *testing.T) {
	dir := t.TempDir()
	const pgbouncer = "; the DSN looks like pgbouncer, a pooler (in transaction mode a session lock is refused: use --lease there)"
	for dsn, want := range map[string]string{
		"postgres://app:hunter22@db.internal:6432/ops?sslmode=disable": "postgres db.internal:6432/ops; dsn from --dsn" + pgbouncer, // PoolerHint: port 6432
		"host=10.0.0.7 port=5433 dbname=x password=hunter22":           "postgres 10.0.0.7:5433/x; dsn from --dsn",
		"postgres://app@h1:5432,h2:5433/ops":                           "postgres h1:5432,h2:5433/ops; dsn from --dsn",
		"mysql://app:hunter22@proxysql.internal:6033/ops":              "mysql proxysql.internal:6033/ops; dsn from --dsn" + strings.ReplaceAll(pgbouncer, "pgbouncer", "proxysql"),
		"app:hunter22@tcp(db.internal:3306)/ops":                       "mysql db.internal:3306/ops; dsn from --dsn",
		"sqlite:" + filepath.Join(dir, "l.db"):                         "sqlite " + filepath.Join(dir, "l.db") + " (this host only); dsn from --dsn",
	} {
		d, err := open(dsn)
		if err != nil {
			t.Errorf("open(%q): %v", dsn, err)
			continue
		}
		_ = d.Close()
		if got := d.describe("--dsn"); got != "database "+want || strings.Contains(got, "hunter22") {
			t.Errorf("open(%q) describes itself as %q, want %q", dsn, got, "database "+want)
		}
	}
}

func TestCodeForSortsErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{&pgconn.PgError{Code: "08006"}, exitUnavailable},
		{&pgconn.PgError{Code: "53300"}, exitUnavailable},
		{&pgconn.PgError{Code: "57P01"}, exitUnavailable},
		{&pgconn.PgError{Code: "28P01"}, exitConfig},
		{&pgconn.PgError{Code: "3D000"}, exitConfig},
		{&pgconn.PgError{Code: "42P01"}, exitSoftware},
		{fmt.Errorf("wrapped: %w", advisorylock.ErrUnsupported), exitConfig},
		{advisorylock.ErrTransactionPooler, exitConfig},
		{fmt.Errorf("%w: dial tcp: refused", advisorylock.ErrPoolUnavailable), exitUnavailable},
		{errors.New("connection reset by peer"), exitUnavailable},
	} {
		if got := codeFor(c.err); got != c.want {
			t.Errorf("codeFor(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

func TestChildEnvReplacesInheritedLockVariables(t *testing.T) {
	env := childEnv([]string{"A=1", "LOCKRUN_LOCK_NAME=outer", "LOCKRUN_FENCING_TOKEN=9"}, "inner", 0)
	if got := strings.Join(env, " "); got != "A=1 LOCKRUN_LOCK_NAME=inner" {
		t.Errorf("childEnv = %q", got)
	}
	env = childEnv(nil, "inner", 12)
	if got := strings.Join(env, " "); got != "LOCKRUN_LOCK_NAME=inner LOCKRUN_FENCING_TOKEN=12" {
		t.Errorf("childEnv = %q", got)
	}
}
