package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// EnvMySQL names a go-sql-driver DSN of a MySQL or MariaDB server to test
// against (its user must be able to create databases); without it the
// harness uses root on 127.0.0.1:3306.
const EnvMySQL = "ADVISORYLOCK_TEST_MYSQL"

const defaultMySQL = "root@tcp(127.0.0.1:3306)/test"

var mysqlShared struct {
	mu       sync.Mutex
	resolved bool
	dsn      string
	reason   string
}

// MySQLDSN returns a go-sql-driver DSN of a database created for this test
// run (dropped when the test binary ends), on the server of
// ADVISORYLOCK_TEST_MYSQL or 127.0.0.1:3306. When no server answers the
// test is skipped, or failed when ADVISORYLOCK_REQUIRE_DB=1.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	mysqlShared.mu.Lock()
	defer mysqlShared.mu.Unlock()
	if !mysqlShared.resolved {
		mysqlShared.dsn, mysqlShared.reason = freshMySQLDatabase()
		mysqlShared.resolved = true
	}
	if mysqlShared.dsn == "" {
		Unavailable(t, mysqlShared.reason)
	}
	return mysqlShared.dsn
}

// freshMySQLDatabase creates a database of its own on the server, to be
// dropped when the test binary ends, and returns a DSN for it, or why it
// could not.
func freshMySQLDatabase() (dsn, reason string) {
	dsn, drop, err := createMySQLDatabase()
	if err != nil {
		return "", err.Error()
	}
	atTeardown(drop)
	return dsn, ""
}

// NewMySQLDatabase creates an empty database on the test server for one
// test, dropped at t.Cleanup, and returns its DSN.
func NewMySQLDatabase(t testing.TB) string {
	t.Helper()
	MySQLDSN(t) // skips or fails the test when there is no server
	dsn, drop, err := createMySQLDatabase()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(drop)
	return dsn
}

func createMySQLDatabase() (dsn string, drop func(), err error) {
	server := os.Getenv(EnvMySQL)
	if server == "" {
		server = defaultMySQL
	}
	cfg, err := mysql.ParseDSN(server)
	if err != nil {
		return "", nil, fmt.Errorf("testdb: %s: %w", EnvMySQL, err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("advisorylock_%d_%s", os.Getpid(), hex.EncodeToString(b[:]))
	exec := func(stmt string) error {
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			return err
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = db.ExecContext(ctx, stmt)
		return err
	}
	if err := exec("CREATE DATABASE " + name); err != nil {
		return "", nil, fmt.Errorf("testdb: no MySQL for tests at %s (%s unset or wrong): %w", cfg.Addr, EnvMySQL, err)
	}
	cfg.DBName = name
	return cfg.FormatDSN(), func() { _ = exec("DROP DATABASE IF EXISTS " + name) }, nil
}

// MySQLAddr returns the "host:port" of a go-sql-driver DSN.
func MySQLAddr(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return cfg.Addr
}

// WithMySQLAddr returns the go-sql-driver dsn pointed at addr.
func WithMySQLAddr(t testing.TB, dsn, addr string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	cfg.Net, cfg.Addr = "tcp", addr
	return cfg.FormatDSN()
}

// OpenMySQL opens the test database with go-sql-driver/mysql, pings it,
// and closes it at t.Cleanup.
func OpenMySQL(t testing.TB) *sql.DB {
	t.Helper()
	return OpenMySQLDSN(t, MySQLDSN(t))
}

// OpenMySQLProxied opens the test database through a new MySQL-counting
// Proxy in front of the server (closed at t.Cleanup), and returns both.
func OpenMySQLProxied(t testing.TB) (*sql.DB, *Proxy) {
	t.Helper()
	dsn := MySQLDSN(t)
	proxy := NewMySQLProxy(t, MySQLAddr(t, dsn))
	return OpenMySQLDSN(t, WithMySQLAddr(t, dsn, proxy.Addr())), proxy
}

// OpenMySQLDSN opens dsn with go-sql-driver/mysql, pings it (failing the
// test if that does not work within DefaultWait), and closes it at
// t.Cleanup.
func OpenMySQLDSN(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("testdb: open mysql: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("testdb: ping mysql: %v", err)
	}
	return db
}

// MySQLLockHolder returns the connection id that holds the server-side
// named lock name, or 0 when it is free.
func MySQLLockHolder(t testing.TB, db *sql.DB, name string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	var id sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", name).Scan(&id); err != nil {
		t.Fatalf("testdb: IS_USED_LOCK: %v", err)
	}
	return id.Int64
}

// NewMySQLCounter is NewCounter in a MySQL or MariaDB database.
func NewMySQLCounter(t testing.TB, db *sql.DB) *Counter {
	t.Helper()
	return newCounter(t, db, &Counter{MySQL: true})
}

// NewMySQLProxy is NewProxy for the MySQL protocol: RoundTrips counts the
// commands clients send that the server answers (every client packet that
// starts a command, sequence id 0, except COM_STMT_CLOSE and
// COM_STMT_SEND_LONG_DATA, which get no answer, and COM_QUIT).
func NewMySQLProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := NewProxy(t, target)
	p.mu.Lock()
	p.mysql = true
	p.mu.Unlock()
	return p
}

// MySQL command bytes that get no answer.
const (
	comQuit         = 0x01
	comStmtSendLong = 0x18
	comStmtClose    = 0x19
)

// observeMySQLClient frames the client's stream (3-byte little-endian
// length, 1-byte sequence id) and counts commands into rounds. The
// handshake's client packets have sequence ids from 1, so they are not
// counted.
func (pc *proxyConn) observeMySQLClient(b []byte, rounds *atomic.Int64) {
	for len(b) > 0 {
		if pc.mSkip > 0 {
			if pc.mCommand { // the first byte of a command packet says which
				pc.mCommand = false
				switch b[0] {
				case comQuit, comStmtSendLong, comStmtClose:
				default:
					rounds.Add(1)
				}
			}
			k := min(pc.mSkip, len(b))
			pc.mSkip -= k
			b = b[k:]
			continue
		}
		take := min(4-len(pc.mHdr), len(b))
		pc.mHdr = append(pc.mHdr, b[:take]...)
		b = b[take:]
		if len(pc.mHdr) < 4 {
			return
		}
		length := int(pc.mHdr[0]) | int(pc.mHdr[1])<<8 | int(pc.mHdr[2])<<16
		pc.mSkip, pc.mCommand = length, pc.mHdr[3] == 0 && length > 0
		pc.mHdr = pc.mHdr[:0]
	}
}
