package benchmarks

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	_ "github.com/glebarez/go-sqlite"  // driver "sqlite"
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx"
	_ "github.com/lib/pq"              // driver "postgres"
)

// envPostgres names the DSN of the server to measure against.
const envPostgres = "ADVISORYLOCK_TEST_POSTGRES"

const defaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// setupTimeout bounds everything a benchmark does outside its timed loop.
const setupTimeout = 30 * time.Second

// runID makes this process's lock names and table names unique on a
// server shared with other runs.
var runID = func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// postgresDSN returns the DSN from the environment, or the default.
func postgresDSN() string {
	if dsn := os.Getenv(envPostgres); dsn != "" {
		return dsn
	}
	return defaultDSN
}

// pgDrivers are the PostgreSQL drivers every applicable benchmark runs on:
// lib/pq and pgx's database/sql adapter (its default exec mode,
// cache_statement).
var pgDrivers = []string{"pq", "pgx"}

// openPG opens a handle on driver drv ("pq", "pgx", or "pqbin": lib/pq
// with binary_parameters=yes) to dsn, with a pool of maxOpen connections
// kept idle, and closes it at cleanup.
func openPG(tb testing.TB, drv, dsn string, maxOpen int) *sql.DB {
	tb.Helper()
	name := "postgres"
	switch drv {
	case "pgx":
		name = "pgx"
	case "pqbin":
		dsn = withParam(dsn, "binary_parameters", "yes")
	}
	db, err := sql.Open(name, dsn)
	if err != nil {
		tb.Fatalf("open %s: %v", drv, err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(maxOpen)
	db.SetMaxIdleConns(maxOpen)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		tb.Fatalf("no PostgreSQL at %s (set %s): %v", redact(dsn), envPostgres, err)
	}
	return db
}

// warm opens n connections of db's pool at once and returns them to it.
func warm(tb testing.TB, db *sql.DB, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conns := make([]*sql.Conn, 0, n)
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			tb.Fatalf("warm pool: %v", err)
		}
		if err := c.PingContext(ctx); err != nil {
			tb.Fatalf("warm pool: %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		_ = c.Close()
	}
}

// pin checks out one connection for the whole benchmark.
func pin(tb testing.TB, db *sql.DB) *sql.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		tb.Fatalf("pin a connection: %v", err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// lockName returns a lock name unique to this run and benchmark.
func lockName(tb testing.TB, suffix string) string {
	return "bench/" + runID + "/" + tb.Name() + "/" + suffix
}

// tableName returns a table name unique to this run, for peers and raw
// floors that keep rows.
func tableName(kind string) string {
	return "bench_" + kind + "_" + runID
}

// exec runs setup or cleanup SQL outside the timed loop.
func exec(tb testing.TB, db *sql.DB, q string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, q); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
}

// dropAtCleanup drops table at cleanup, on a connection of its own (db
// may be closed by then).
func dropAtCleanup(tb testing.TB, table string) {
	tb.Cleanup(func() {
		db, err := sql.Open("postgres", postgresDSN())
		if err != nil {
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+table)
	})
}

// forgetLease deletes a PostgreSQL LeaseLock's row at cleanup: lease rows
// stay after release by design (generations never go down), and every run
// uses fresh names.
func forgetLease(tb testing.TB, name string) {
	tb.Cleanup(func() {
		db, err := sql.Open("postgres", postgresDSN())
		if err != nil {
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		_, _ = db.ExecContext(ctx, "DELETE FROM advisorylock_leases WHERE name = $1", name)
	})
}

// openSQLite opens a fresh SQLite file in WAL mode with a busy timeout, as
// an application sharing the file between processes would.
func openSQLite(tb testing.TB, path string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("sqlite", path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		tb.Fatalf("open sqlite: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		tb.Fatalf("open sqlite: %v", err)
	}
	return db
}

// sqlitePath returns a database file path in a fresh temporary directory.
func sqlitePath(tb testing.TB) string {
	return filepath.Join(tb.TempDir(), "bench.db")
}

// withParam adds a parameter to a URL or key=value DSN.
func withParam(dsn, key, value string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set(key, value)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " " + key + "=" + value
}

// withHostPort points a URL or key=value DSN at addr ("host:port").
func withHostPort(dsn, addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = addr
		return u.String()
	}
	var kept []string
	for _, f := range strings.Fields(dsn) {
		if !strings.HasPrefix(f, "host=") && !strings.HasPrefix(f, "port=") && !strings.HasPrefix(f, "hostaddr=") {
			kept = append(kept, f)
		}
	}
	return strings.Join(append(kept, "host="+host, "port="+port), " ")
}

// targetAddr returns the host:port a DSN points at.
func targetAddr(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		host, port := u.Hostname(), u.Port()
		if host == "" {
			host = "127.0.0.1"
		}
		if port == "" {
			port = "5432"
		}
		return net.JoinHostPort(host, port)
	}
	host, port := "127.0.0.1", "5432"
	for _, f := range strings.Fields(dsn) {
		if v, ok := strings.CutPrefix(f, "host="); ok {
			host = v
		}
		if v, ok := strings.CutPrefix(f, "port="); ok {
			port = v
		}
	}
	return net.JoinHostPort(host, port)
}

// redact hides a DSN's password.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxx")
		}
		return u.String()
	}
	var out []string
	for _, f := range strings.Fields(dsn) {
		if strings.HasPrefix(f, "password=") {
			f = "password=xxx"
		}
		out = append(out, f)
	}
	return strings.Join(out, " ")
}

// quote makes a SQL string literal of s (standard_conforming_strings on).
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// must fails the benchmark on a setup error.
func must(tb testing.TB, err error, what string) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

var errNotGranted = fmt.Errorf("uncontended acquire was not granted")

// positiveID derives a lock id >= 1 from name, for goose's table locker,
// which refuses ids below 1.
func positiveID(name string) int64 {
	return int64(uint64(advisorylock.Key(name))>>1) | 1
}
