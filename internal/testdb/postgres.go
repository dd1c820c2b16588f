package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers driver "pgx"
	"github.com/lib/pq"                // registers driver "postgres"
)

// Drivers lists the PostgreSQL database/sql drivers tests should range over:
// lib/pq ("postgres") and pgx v5's stdlib ("pgx").
var Drivers = []string{"postgres", "pgx"}

// The machine's own server, tried second. A variable so that tests can
// point it at nothing.
var defaultHostPort = "127.0.0.1:5432"

const defaultDatabase = "test"

var shared struct {
	mu       sync.Mutex
	resolved bool
	dsn      string
	reason   string // why there is no dsn
}

// PostgresDSN returns the DSN of a PostgreSQL server for tests, found once
// per process in this order: the environment variable
// ADVISORYLOCK_TEST_POSTGRES (returned as given); a server answering on
// 127.0.0.1:5432 (database "test", user postgres; the database is created if
// missing); a throwaway cluster started from local PostgreSQL binaries; a
// postgres:15 container when a Docker daemon answers. The DSNs the harness
// builds are URLs, postgres://user@host:port/db?sslmode=disable. When none
// works the test is skipped with one line saying why, or failed when
// ADVISORYLOCK_REQUIRE_DB=1.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !shared.resolved {
		shared.dsn, shared.reason = findPostgres(t)
		shared.resolved = true
	}
	if shared.dsn == "" {
		Unavailable(t, shared.reason)
	}
	return shared.dsn
}

// resolvedDSN is PostgresDSN's cached answer, or "" if it has none (yet).
func resolvedDSN() string {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	return shared.dsn
}

func findPostgres(t testing.TB) (dsn, reason string) {
	if env := os.Getenv(EnvPostgres); env != "" {
		return env, ""
	}
	var reasons []string
	dsn = urlDSN("postgres", defaultHostPort, defaultDatabase)
	err := probeDefaultServer(dsn)
	if err == nil {
		return dsn, ""
	}
	reasons = append(reasons, fmt.Sprintf("%s unset", EnvPostgres), fmt.Sprintf("%s: %v", defaultHostPort, err))

	c, err := startCluster()
	if err == nil {
		t.Logf("testdb: started a throwaway PostgreSQL cluster at %s", c.DSN)
		atTeardown(c.destroy)
		return c.DSN, ""
	}
	reasons = append(reasons, "local cluster: "+err.Error())

	dsn, stop, err := startDocker(t)
	if err == nil {
		atTeardown(stop)
		return dsn, ""
	}
	reasons = append(reasons, "docker: "+err.Error())
	return "", "testdb: no PostgreSQL for tests: " + strings.Join(reasons, "; ")
}

// probeDefaultServer pings dsn, creating its database when the server says
// it does not exist.
func probeDefaultServer(dsn string) error {
	err := pingDSN(dsn)
	var pqErr *pq.Error
	if !errors.As(err, &pqErr) || pqErr.Code != "3D000" {
		return err
	}
	admin := WithDatabase(dsn, "postgres")
	db, err := sql.Open("postgres", admin)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+pq.QuoteIdentifier(defaultDatabase)); err != nil {
		return fmt.Errorf("creating database %s: %w", defaultDatabase, err)
	}
	return pingDSN(dsn)
}

// pingDSN opens dsn with lib/pq, pings it once with a short deadline and
// closes it.
func pingDSN(dsn string) error {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// WithDatabase returns dsn (URL or key=value) with its database replaced by name.
func WithDatabase(dsn, name string) string {
	if !isURL(dsn) {
		kv, err := parseKeyValue(dsn)
		if err != nil {
			return dsn
		}
		kv["dbname"] = name
		return formatKeyValue(kv)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return dsn
	}
	u.Path = "/" + name
	u.RawPath = ""
	return u.String()
}

// OpenPostgres opens a *sql.DB on PostgresDSN with driverName ("postgres"
// for lib/pq, "pgx" for pgx v5), pings it, and closes it at t.Cleanup.
func OpenPostgres(t testing.TB, driverName string) *sql.DB {
	t.Helper()
	return OpenPostgresDSN(t, driverName, PostgresDSN(t))
}

// OpenPostgresProxied opens the test server with driverName through a new
// Proxy in front of it (closed at t.Cleanup), and returns both.
func OpenPostgresProxied(t testing.TB, driverName string) (*sql.DB, *Proxy) {
	t.Helper()
	dsn := PostgresDSN(t)
	proxy := NewProxy(t, HostPort(t, dsn))
	return OpenPostgresDSN(t, driverName, proxy.DSN(dsn)), proxy
}

// OpenPostgresDSN opens a *sql.DB on dsn with driverName, pings it (failing
// the test if that does not work within DefaultWait), and closes it at
// t.Cleanup.
func OpenPostgresDSN(t testing.TB, driverName, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatalf("testdb: open %s %s: %v", driverName, dsn, err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("testdb: ping %s %s: %v", driverName, dsn, err)
	}
	return db
}

// AdvisoryLocks counts the advisory locks granted in db's current database
// to sessions other than the querying one. With a key, only that bigint key
// is counted (pg_locks shows it as classid = high 32 bits, objid = low 32
// bits, objsubid = 1); with nil, every advisory lock is.
func AdvisoryLocks(t testing.TB, db *sql.DB, key *int64) int {
	t.Helper()
	q := `SELECT count(*) FROM pg_locks
	WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
	if key != nil {
		k := uint64(*key)
		q += fmt.Sprintf(" AND classid = %d AND objid = %d AND objsubid = 1", k>>32, k&0xFFFFFFFF)
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	var n int
	if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
		t.Fatalf("testdb: counting advisory locks: %v", err)
	}
	return n
}
