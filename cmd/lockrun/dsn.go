package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	_ "github.com/glebarez/go-sqlite" // registers driver "sqlite" (pure Go)
)

// Why pgx and not lib/pq for PostgreSQL: pgx parses URL and key=value DSNs
// into one structure (with PG* variables, .pgpass and service files), so
// lockrun sets application_name and a connect timeout without editing the
// DSN text; its exec mode can be chosen per connection, and lockrun picks
// one that uses no named prepared statements, so --lease works through a
// transaction-mode pooler; and it drops the connection at once when a
// wait is interrupted.

// sqlitePragmas make a SQLite file usable by many processes at once: a
// writer waits up to 4s for another instead of failing (below the 5s
// release timeout: an interrupt does not end that wait), and readers do
// not block the writer.
const sqlitePragmas = "_pragma=busy_timeout(4000)&_pragma=journal_mode(WAL)"

// connectTimeout applies to PostgreSQL DSNs that set no connect_timeout.
const connectTimeout = 15 * time.Second

// configError is an error in the configuration (exit 78).
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

func configErrorf(format string, args ...any) error {
	return configError{fmt.Errorf(format, args...)}
}

// database is an open database and how to talk about it.
type database struct {
	*sql.DB
	kind    string   // "postgres" or "sqlite"
	shown   string   // the DSN with its password redacted
	where   string   // which database, for people: "postgres HOST:PORT/DB"
	pooler  string   // advisorylock.PoolerHint's sign of a pooler in the DSN, or ""
	secrets []string // passwords to scrub from messages
}

// describe says which database this is and where its DSN came from,
// without a password: "database postgres HOST:PORT/DB; dsn from --dsn",
// and what the DSN suggests of a pooler in front of it.
func (d *database) describe(from string) string {
	s := "database " + d.where + "; dsn from " + from
	if d.pooler != "" {
		s += "; the DSN looks like " + d.pooler + ", a pooler (in transaction mode a session lock is refused: use --lease there)"
	}
	return s
}

// chooseDSN returns the DSN to use and where it comes from: --dsn, else
// $LOCKRUN_DSN, else $DATABASE_URL, else the config files' dsn, else the
// default SQLite file.
func chooseDSN(flagDSN string, getenv func(string) string, settings map[string]setting) (dsn, from string, err error) {
	for _, c := range []struct{ dsn, from string }{
		{flagDSN, "--dsn"}, {getenv("LOCKRUN_DSN"), "$LOCKRUN_DSN"}, {getenv("DATABASE_URL"), "$DATABASE_URL"},
		{settings["dsn"].value, settings["dsn"].at},
	} {
		if c.dsn != "" {
			return c.dsn, c.from, nil
		}
	}
	path, err := defaultPath(getenv)
	if err != nil {
		return "", "", err
	}
	return "sqlite:" + path, "the default", nil
}

// defaultPath is $XDG_STATE_HOME/lockrun/locks.db (XDG's default for the
// state directory is ~/.local/state); the directory is created, private
// to the user, on first use.
func defaultPath(getenv func(string) string) (string, error) {
	state := getenv("XDG_STATE_HOME")
	if !filepath.IsAbs(state) {
		home := getenv("HOME")
		if home == "" {
			return "", configErrorf("no --dsn, LOCKRUN_DSN, DATABASE_URL or dsn in a config file, and neither XDG_STATE_HOME nor HOME is set for the default SQLite file")
		}
		state = filepath.Join(home, ".local", "state")
	}
	dir := filepath.Join(state, "lockrun")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", configErrorf("creating the state directory for the default SQLite file: %w", err)
	}
	return filepath.Join(dir, "locks.db"), nil
}

// schemeRE matches a URL scheme at the start of a DSN.
var schemeRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]*):`)

// openDatabase opens dsn and checks that the database answers.
func openDatabase(ctx context.Context, dsn string) (*database, error) {
	d, err := open(dsn)
	if err != nil {
		return nil, err
	}
	err = d.PingContext(ctx)
	// Several lockruns starting at once on a new SQLite file race to switch
	// it to WAL, which fails at once with SQLITE_BUSY (no busy handler
	// runs for it): try again for a few seconds.
	for pause := 10 * time.Millisecond; err != nil && strings.Contains(err.Error(), "SQLITE_BUSY") && pause < 3*time.Second && ctx.Err() == nil; pause *= 2 {
		select {
		case <-ctx.Done():
		case <-time.After(pause):
			err = d.PingContext(ctx)
		}
	}
	if err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("cannot connect to the database %s: %w", d.shown, err)
	}
	return d, nil
}

// open opens dsn with the driver its scheme names (one case per scheme).
func open(dsn string) (*database, error) {
	if d, ok, err := openMySQL(dsn); ok {
		return d, err
	}
	scheme := ""
	if m := schemeRE.FindStringSubmatch(dsn); m != nil {
		scheme = strings.ToLower(m[1])
	}
	switch scheme {
	case "postgres", "postgresql":
		return openPostgres(scheme + dsn[len(scheme):])
	case "sqlite":
		path := strings.TrimPrefix(dsn[len("sqlite:"):], "//")
		return openSQLite(dsn, path, "file:"+escapeSQLitePath(path)+"?"+sqlitePragmas)
	case "file":
		file, query, _ := strings.Cut(dsn, "?")
		if query != "" {
			query = "&" + query // the caller's pragmas run after ours
		}
		path := strings.TrimPrefix(file[len("file:"):], "//")
		return openSQLite(dsn, path, file+"?"+sqlitePragmas+query)
	case "":
		if strings.Contains(dsn, "=") {
			return openPostgres(dsn)
		}
		return nil, configErrorf("cannot tell what DSN %q is: use %s", redactDSN(dsn), knownForms)
	}
	return nil, configErrorf("unknown DSN scheme %q: use %s", scheme, knownForms)
}

// knownForms lists the DSN forms lockrun takes, for its errors.
const knownForms = "postgres://, postgresql://, key=value, mysql://, sqlite:PATH or file:PATH"

// escapeSQLitePath escapes what a SQLite URI filename cannot hold.
func escapeSQLitePath(path string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(path)
}

// openSQLite opens the SQLite file at path (a URI path for file:) with
// driverDSN. A file in a directory that does not exist is a configError
// (SQLite itself only says "out of memory").
func openSQLite(dsn, path, driverDSN string) (*database, error) {
	if path == "" {
		return nil, configErrorf("DSN %q names no file (sqlite:PATH)", dsn)
	}
	if !strings.HasPrefix(path, ":memory:") {
		if abs, err := filepath.Abs(path); err == nil {
			path = abs
		}
		dir := filepath.Dir(path)
		switch fi, err := os.Stat(dir); {
		case errors.Is(err, fs.ErrNotExist):
			return nil, configErrorf("SQLite file %s: directory %s does not exist", path, dir)
		case err == nil && !fi.IsDir():
			return nil, configErrorf("SQLite file %s: %s is not a directory", path, dir)
		}
	}
	db, err := sql.Open("sqlite", driverDSN)
	if err != nil {
		return nil, configError{err}
	}
	return &database{DB: db, kind: "sqlite", shown: dsn, where: "sqlite " + path + " (this host only)"}, nil
}

// openPostgres opens a URL or key=value DSN with pgx: application_name is
// lockrun unless the DSN (or PGAPPNAME) sets one, the connect timeout is
// connectTimeout unless set, and no statement is prepared by name unless
// the DSN chooses default_query_exec_mode.
func openPostgres(dsn string) (*database, error) {
	shown := redactDSN(dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, configErrorf("bad DSN: %s", scrub(err.Error(), dsnSecrets(dsn)))
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "lockrun"
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	if !strings.Contains(dsn, "default_query_exec_mode") {
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	d := &database{DB: stdlib.OpenDB(*cfg), kind: "postgres", shown: shown, where: "postgres " + serverOf(cfg)}
	d.pooler, _ = advisorylock.PoolerHint(dsn)
	d.secrets = append(dsnSecrets(dsn), cfg.Password)
	return d, nil
}

// serverOf is HOST:PORT/DB, with any other hosts of a multi-host DSN
// after a comma (pgx lists each host once more per TLS fallback).
func serverOf(cfg *pgx.ConnConfig) string {
	hosts := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, f := range cfg.Fallbacks {
		if h := net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port))); !contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",") + "/" + cfg.Database
}

// The password forms redactDSN knows: a URL's user info, and password=
// (or sslpassword=) in key=value form or a URL query, quoted or not.
var (
	urlUserInfoRE = regexp.MustCompile(`(?i)(\b[a-z][a-z0-9+.-]*://[^:/?#@\s]*:)\S*@`)
	passwordKVRE  = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)`)
)

const redacted = "xxxxx"

// redactDSN returns dsn with every password replaced by xxxxx: the
// password in a URL's user info, and password=... in key=value form or a
// URL's query. It errs on the side of hiding too much. Anything else is
// kept, so the result still says which database was meant.
func redactDSN(dsn string) string {
	dsn = urlUserInfoRE.ReplaceAllString(dsn, "${1}"+redacted+"@")
	return passwordKVRE.ReplaceAllString(dsn, "${1}"+redacted)
}

// dsnSecrets extracts the passwords a DSN spells out.
func dsnSecrets(dsn string) []string {
	var out []string
	if u, err := url.Parse(dsn); err == nil && u.Scheme != "" {
		if pw, ok := u.User.Password(); ok {
			out = append(out, pw)
		}
		q := u.Query()
		out = append(out, q["password"]...)
		out = append(out, q["sslpassword"]...)
	}
	for _, m := range passwordKVRE.FindAllStringSubmatch(dsn, -1) {
		pw := m[2]
		if strings.HasPrefix(pw, "'") {
			pw = strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(strings.Trim(pw, "'"))
		}
		out = append(out, pw)
	}
	return out
}

// scrub makes msg one line, with DSN passwords redacted and every secret
// of three characters or more replaced (shorter ones would mangle the
// message, and the DSN forms catch them where they are spelled out).
func scrub(msg string, secrets []string) string {
	msg = redactDSN(msg)
	for _, s := range secrets {
		if len(s) >= 3 {
			msg = strings.ReplaceAll(msg, s, redacted)
		}
	}
	return strings.Join(strings.FieldsFunc(msg, func(r rune) bool { return r == '\n' || r == '\r' || r == '\t' }), " ")
}
