package benchmarks

// MySQL/MariaDB: advisorylock against the bare statements it sends, on
// the server of ADVISORYLOCK_TEST_MYSQL (a go-sql-driver DSN) or root on
// 127.0.0.1:3306, database test.

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/go-sql-driver/mysql" // and its driver "mysql"
)

const envMySQL = "ADVISORYLOCK_TEST_MYSQL"

func mysqlDSN() string {
	if dsn := os.Getenv(envMySQL); dsn != "" {
		return dsn
	}
	return "root@tcp(127.0.0.1:3306)/test"
}

// openMySQL opens the MySQL server with a pool of maxOpen connections kept
// idle, and closes it at cleanup.
func openMySQL(tb testing.TB, maxOpen int) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", mysqlDSN())
	if err != nil {
		tb.Fatalf("open mysql: %v", err)
	}
	tb.Cleanup(func() { _ = db.Close() })
	db.SetMaxOpenConns(maxOpen)
	db.SetMaxIdleConns(maxOpen)
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		tb.Fatalf("no MySQL (set %s): %v", envMySQL, err)
	}
	return db
}

// mysqlServerName is the server-side lock name advisorylock uses for name.
func mysqlServerName(name string) string {
	return fmt.Sprintf("'advisorylock:v1:%016x'", uint64(advisorylock.Key(name)))
}

// mysqlOps are the uncontended operations on MySQL; each setup gets a
// handle with a small warm pool.
var mysqlOps = map[string]func(b *testing.B, db *sql.DB) func(ctx context.Context) error{
	"select1_pinned": func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		conn := pin(b, db)
		return func(ctx context.Context) error { return conn.QueryRowContext(ctx, "SELECT 1").Scan(new(int)) }
	},
	// The floor of TryLock+Release: the two statements advisorylock
	// sends, on a pinned connection.
	"raw_literal": func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		conn := pin(b, db)
		lock := mysqlServerName(lockName(b, "raw"))
		return func(ctx context.Context) error {
			var got, id int64
			if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lock+", 0), CONNECTION_ID(), @@read_only").Scan(&got, &id, new(bool)); err != nil || got != 1 {
				return fmt.Errorf("GET_LOCK = %d, %v", got, err)
			}
			var released, holder sql.NullInt64
			return conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK("+lock+"), CONNECTION_ID(), IS_USED_LOCK("+lock+")").Scan(&released, &id, &holder)
		}
	},
	// raw_literal with a pool checkout per iteration, as TryLock does.
	"raw_pool": setupMySQLRawPool(false),
	// raw_pool with the release bounded by a context with a deadline, as
	// Release bounds it (WithReleaseTimeout): database/sql and the driver
	// then watch the context.
	"raw_pool_bounded": setupMySQLRawPool(true),
	// The decomposition of TryLock+Release: its grab statement, bare on a
	// pinned connection, with the look for shared holders it makes once
	// GET_LOCK grants (see mysqlGrab) replaced by a test of one named lock
	// (what a bounded set of holder locks would cost), as advisorylock
	// makes it (an InnoDB read of advisorylock_shared), and the same read
	// of an ENGINE=MEMORY table of the same shape.
	"raw_named_check": setupMySQLGrab(func(b *testing.B, db *sql.DB, lock string, key int64) string {
		return "NOT IS_FREE_LOCK(" + lock[:len(lock)-1] + ":s0')"
	}),
	"raw_shared_read": setupMySQLGrab(func(b *testing.B, db *sql.DB, lock string, key int64) string {
		mustBeTheLibrarysGrab(b)
		return mysqlReadersIn("advisorylock_shared", lock, key)
	}),
	"raw_shared_read_memory": setupMySQLGrab(func(b *testing.B, db *sql.DB, lock string, key int64) string {
		table := tableName("myshared_memory")
		mysqlExec(b, db, "CREATE TABLE "+table+` (lock_key BIGINT NOT NULL, conn_id BIGINT UNSIGNED NOT NULL, acquired_at DATETIME(6) NOT NULL,
	PRIMARY KEY (lock_key, conn_id) USING HASH) ENGINE=MEMORY`)
		b.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
		return mysqlReadersIn(table, lock, key)
	}),
	"trylock_release": func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		l := newLock(b, db, lockName(b, "lock"))
		return func(ctx context.Context) error {
			g, err := l.TryLock(ctx)
			if err != nil {
				return err
			}
			return g.Release(ctx)
		}
	},
	"leaselock": func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		l := newLeaseLock(b, db, lockName(b, "lease"))
		return func(ctx context.Context) error {
			g, err := l.TryLock(ctx)
			if err != nil {
				return err
			}
			return g.Release(ctx)
		}
	},
	// The floor of LeaseLock: its upsert and its release, bare, through
	// the pool, on a table of the same shape.
	"lease_raw": func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		table := tableName("mylease")
		mysqlExec(b, db, "CREATE TABLE "+table+" LIKE advisorylock_leases")
		b.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + table) })
		raw := lockName(b, "lease_raw")
		name := "X'" + fmt.Sprintf("%x", raw) + "'"
		hash := "X'" + fmt.Sprintf("%x", sha256.Sum256([]byte(raw))) + "'"
		owner := "X'6f776e6572'"
		now := "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))"
		acquire := "INSERT INTO " + table + ` (name_hash, name, owner, generation, acquired_at, expires_at)
VALUES (` + hash + `, ` + name + `, ` + owner + `, LAST_INSERT_ID(` + now + `), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 30000000 MICROSECOND)
ON DUPLICATE KEY UPDATE owner = IF(owner IS NULL OR expires_at <= UTC_TIMESTAMP(6), ` + owner + `, owner),
	generation = IF(owner = ` + owner + `, LAST_INSERT_ID(GREATEST(generation + 1, ` + now + `)), generation + LAST_INSERT_ID(0)),
	acquired_at = IF(owner = ` + owner + `, UTC_TIMESTAMP(6), acquired_at),
	expires_at = IF(owner = ` + owner + `, UTC_TIMESTAMP(6) + INTERVAL 30000000 MICROSECOND, expires_at)`
		return func(ctx context.Context) error {
			res, err := db.ExecContext(ctx, acquire)
			if err != nil {
				return err
			}
			gen, err := res.LastInsertId()
			if err != nil || gen == 0 {
				return fmt.Errorf("raw lease not granted: %v", err)
			}
			_, err = db.ExecContext(ctx, "UPDATE "+table+" SET owner = NULL, expires_at = LEAST(expires_at, UTC_TIMESTAMP(6)) WHERE name_hash = "+hash+
				" AND generation = "+strconv.FormatInt(gen, 10)+" AND owner IS NOT NULL")
			return err
		}
	},
}

// mysqlGrab is the statement of advisorylock's exclusive TryLock for
// lock, a quoted server-side name (grabExclusive in
// backend_mysql_shared.go), with readersIn, an SQL condition, as its look
// for shared holders: the CASE evaluates it only once GET_LOCK grants.
func mysqlGrab(lock, readersIn string) string {
	return "SELECT CASE GET_LOCK(" + lock + ", 0) WHEN 1 THEN IF(" + readersIn + ", 2, 1) WHEN 0 THEN 0 END, CONNECTION_ID(), @@read_only, @@session.wait_timeout"
}

// mysqlReadersIn is advisorylock's look for live shared holders of key
// (mysqlReadersIn in backend_mysql_shared.go), in table.
func mysqlReadersIn(table, lock string, key int64) string {
	return "EXISTS (SELECT 1 FROM " + table + " s WHERE s.lock_key = " + strconv.FormatInt(key, 10) +
		" AND IS_USED_LOCK(CONCAT(" + lock[:len(lock)-1] + ":s', s.conn_id)) = s.conn_id)"
}

// mustBeTheLibrarysGrab fails b unless mysqlGrab, with mysqlReadersIn,
// is the statement advisorylock's TryLock sends: a change to the library's
// grab must be made here too, or raw_shared_read measures something else.
func mustBeTheLibrarysGrab(b *testing.B) {
	cfg, err := mysql.ParseDSN(mysqlDSN())
	must(b, err, "parse the MySQL DSN")
	connector, err := mysql.NewConnector(cfg)
	must(b, err, "MySQL connector")
	var mu sync.Mutex
	var sent []string
	db := sql.OpenDB(recordingConnector{connector, func(q string) {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, q)
	}})
	b.Cleanup(func() { _ = db.Close() })
	name := lockName(b, "grab_text")
	l := newLock(b, db, name, advisorylock.WithBackend(advisorylock.MySQL()))
	g, err := l.TryLock(context.Background())
	must(b, err, "TryLock")
	must(b, g.Release(context.Background()), "Release")
	lock := mysqlServerName(name)
	want := mysqlGrab(lock, mysqlReadersIn("advisorylock_shared", lock, advisorylock.Key(name)))
	mu.Lock()
	defer mu.Unlock()
	for _, q := range sent {
		if strings.Contains(q, "GET_LOCK(") {
			if q != want {
				b.Fatalf("advisorylock's grab is now\n%s\nbut mysqlGrab writes\n%s", q, want)
			}
			return
		}
	}
	b.Fatalf("TryLock sent no GET_LOCK: %q", sent)
}

// recordingConnector hands every query and exec text its connections run
// to seen.
type recordingConnector struct {
	driver.Connector
	seen func(query string)
}

func (c recordingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	q, ok := conn.(queryingConn)
	if !ok {
		_ = conn.Close()
		return nil, fmt.Errorf("%T runs no queries without preparing them", conn)
	}
	return recordingConn{q, c.seen}, nil
}

type queryingConn interface {
	driver.Conn
	driver.QueryerContext
	driver.ExecerContext
}

type recordingConn struct {
	queryingConn
	seen func(query string)
}

func (c recordingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.seen(query)
	return c.queryingConn.QueryContext(ctx, query, args)
}

func (c recordingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.seen(query)
	return c.queryingConn.ExecContext(ctx, query, args)
}

// setupMySQLGrab runs mysqlGrab with the check readersIn returns, then
// the release advisorylock sends, on a pinned connection.
func setupMySQLGrab(readersIn func(b *testing.B, db *sql.DB, lock string, key int64) string) func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
	return func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		conn := pin(b, db)
		name := lockName(b, "grab")
		lock := mysqlServerName(name)
		grab := mysqlGrab(lock, readersIn(b, db, lock, advisorylock.Key(name)))
		return func(ctx context.Context) error {
			var got, id, waitTimeout int64
			if err := conn.QueryRowContext(ctx, grab).Scan(&got, &id, new(bool), &waitTimeout); err != nil || got != 1 {
				return fmt.Errorf("grab = %d, %v", got, err)
			}
			var released, holder sql.NullInt64
			return conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK("+lock+"), CONNECTION_ID(), IS_USED_LOCK("+lock+")").Scan(&released, &id, &holder)
		}
	}
}

func setupMySQLRawPool(bounded bool) func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
	return func(b *testing.B, db *sql.DB) func(ctx context.Context) error {
		lock := mysqlServerName(lockName(b, "raw_pool"))
		return func(ctx context.Context) error {
			conn, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			defer conn.Close()
			var got, id int64
			if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lock+", 0), CONNECTION_ID(), @@read_only").Scan(&got, &id, new(bool)); err != nil || got != 1 {
				return fmt.Errorf("GET_LOCK = %d, %v", got, err)
			}
			if bounded {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
			}
			var released, holder sql.NullInt64
			return conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK("+lock+"), CONNECTION_ID(), IS_USED_LOCK("+lock+")").Scan(&released, &id, &holder)
		}
	}
}

// mysqlPairs are compared side by side, as BenchmarkPaired does.
var mysqlPairs = []struct{ base, op string }{
	{"select1_pinned", "raw_literal"},
	{"raw_literal", "trylock_release"}, // the gate
	// Its decomposition: the grab with a named-lock check, with the read
	// of shared holders (the floor of a correct grab), the same on a
	// MEMORY table, and what advisorylock adds to its own statements.
	{"raw_literal", "raw_named_check"},
	{"raw_literal", "raw_shared_read"},
	{"raw_shared_read", "raw_shared_read_memory"},
	{"raw_shared_read", "trylock_release"},
	{"raw_pool", "raw_pool_bounded"}, // what a bounded release costs
	{"raw_pool_bounded", "trylock_release"},
	{"lease_raw", "leaselock"},
}

func mysqlExec(tb testing.TB, db *sql.DB, q string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if _, err := db.ExecContext(ctx, q); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
}

// mysqlReady opens a pool and runs advisorylock's first-use checks and
// table creation outside the timed loops.
func mysqlReady(b *testing.B) *sql.DB {
	db := openMySQL(b, 4)
	warm(b, db, 3)
	l := newLeaseLock(b, db, lockName(b, "ready"))
	g, err := l.TryLock(context.Background())
	must(b, err, "first lease")
	must(b, g.Release(context.Background()), "first release")
	return db
}

// BenchmarkMySQL measures each uncontended operation on MySQL.
func BenchmarkMySQL(b *testing.B) {
	for _, name := range []string{"select1_pinned", "raw_literal", "raw_pool", "trylock_release", "lease_raw", "leaselock"} {
		b.Run(name, func(b *testing.B) {
			runOp(b, mysqlOps[name](b, mysqlReady(b)))
		})
	}
}

// BenchmarkMySQLPaired alternates the pairs of mysqlPairs: TryLock+Release
// against its two bare statements on a pinned connection, LeaseLock
// against its bare upsert and release.
func BenchmarkMySQLPaired(b *testing.B) {
	for _, pair := range mysqlPairs {
		b.Run(pair.op+"_vs_"+pair.base, func(b *testing.B) {
			db := mysqlReady(b)
			runPaired(b, mysqlOps[pair.base](b, db), mysqlOps[pair.op](b, db))
		})
	}
}

// BenchmarkMySQLHandoff measures the handoff (see BenchmarkHandoff) of a
// blocked Lock against bare GET_LOCK/RELEASE_LOCK on pinned connections,
// and of a polling LeaseLock.
func BenchmarkMySQLHandoff(b *testing.B) {
	for _, lib := range []struct {
		name   string
		period time.Duration
		mk     func(b *testing.B, name string) func(i int) contender
	}{
		{"advisorylock", 0, mysqlLockContenders},
		{"raw_blocking", 0, mysqlRawContenders},
		{"leaselock", libraryPoll, func(b *testing.B, name string) func(i int) contender {
			return func(int) contender { return guardContender(newLeaseLock(b, openMySQL(b, 2), name).Lock) }
		}},
	} {
		b.Run(lib.name, func(b *testing.B) {
			name := lockName(b, "handoff")
			mysqlReady(b)
			var queued waitProbe
			if lib.period == 0 {
				queued = mysqlQueuedOn(b, name)
			}
			unit := pin(b, openMySQL(b, 1))
			runHandoff(b, lib.mk(b, name), queued, lib.period, 0, func(ctx context.Context) error {
				return unit.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
			})
		})
	}
}

// mysqlLockContenders contend with Lock, each on a pool of its own.
func mysqlLockContenders(b *testing.B, name string) func(i int) contender {
	return func(int) contender { return guardContender(newLock(b, openMySQL(b, 2), name).Lock) }
}

// mysqlRawContenders are the floor: GET_LOCK waiting on the server on a
// pinned connection, then RELEASE_LOCK.
func mysqlRawContenders(b *testing.B, name string) func(i int) contender {
	lock := mysqlServerName(name)
	return mysqlBareContenders(b, "SELECT GET_LOCK("+lock+", 3600)", lock)
}

// mysqlRawReadContenders are the floor of a correct exclusive handoff:
// the same wait, with advisorylock's look for shared holders once
// GET_LOCK grants (see mysqlGrab), written by hand as the TryLock gate's
// raw_shared_read writes it.
func mysqlRawReadContenders(b *testing.B, name string) func(i int) contender {
	mustBeTheLibrarysGrab(b) // and makes the table
	lock := mysqlServerName(name)
	grab := "SELECT CASE GET_LOCK(" + lock + ", 3600) WHEN 1 THEN IF(" +
		mysqlReadersIn("advisorylock_shared", lock, advisorylock.Key(name)) + ", 2, 1) WHEN 0 THEN 0 END"
	return mysqlBareContenders(b, grab, lock)
}

// mysqlRawReadBoundedContenders are mysqlRawReadContenders with each
// statement bounded by a context with a deadline, as advisorylock bounds
// its waits and releases: the driver then hands each statement's context
// to a goroutine of its connection that watches it, and waits for that
// goroutine when the statement ends.
func mysqlRawReadBoundedContenders(b *testing.B, name string) func(i int) contender {
	bare := mysqlRawReadContenders(b, name)
	bounded := func(op func(ctx context.Context) error) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, time.Hour)
			defer cancel()
			return op(ctx)
		}
	}
	return func(i int) contender {
		c := bare(i)
		return contender{acquire: bounded(c.acquire), release: bounded(c.release)}
	}
}

// mysqlBareContenders wait in grab, a SELECT of one value, on a pinned
// connection each, and release lock with RELEASE_LOCK.
func mysqlBareContenders(b *testing.B, grab, lock string) func(i int) contender {
	return func(int) contender {
		conn := pin(b, openMySQL(b, 2))
		return contender{
			acquire: func(ctx context.Context) error {
				var got int
				if err := conn.QueryRowContext(ctx, grab).Scan(&got); err != nil || got != 1 {
					return fmt.Errorf("bare grab = %d, %v", got, err)
				}
				return nil
			},
			release: func(ctx context.Context) error {
				return conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK("+lock+")").Scan(new(int))
			},
		}
	}
}

// mysqlHandoffPairs are alternated by BenchmarkMySQLHandoffPaired, op
// against base. The gate is Lock against the bare handoff with the read
// of shared holders that a correct exclusive grab makes (as the TryLock
// gate's base, raw_shared_read, makes it); the other pairs say what Lock
// costs over bare GET_LOCK, what the read costs, and what Lock costs over
// the same statements bounded by contexts, as it bounds them.
var mysqlHandoffPairs = []struct {
	name     string
	op, base func(b *testing.B, name string) func(i int) contender
}{
	{"advisorylock_vs_raw_blocking_shared_read", mysqlLockContenders, mysqlRawReadContenders}, // the gate
	{"advisorylock_vs_raw_blocking", mysqlLockContenders, mysqlRawContenders},
	{"raw_blocking_shared_read_vs_raw_blocking", mysqlRawReadContenders, mysqlRawContenders},
	{"advisorylock_vs_raw_blocking_shared_read_bounded", mysqlLockContenders, mysqlRawReadBoundedContenders},
}

// BenchmarkMySQLHandoffPaired alternates handoffs of mysqlHandoffPairs
// between two contenders each (see BenchmarkHandoffPaired) and reports
// their ratio (x-base).
func BenchmarkMySQLHandoffPaired(b *testing.B) {
	for _, pair := range mysqlHandoffPairs {
		b.Run(pair.name, func(b *testing.B) {
			mysqlReady(b)
			runHandoffPair(b, mysqlPingPong(b, pair.op, "handoff"), mysqlPingPong(b, pair.base, "handoff_base"))
		})
	}
}

// mysqlPingPong sets up two contenders of mk on a lock of b's own, the
// first holding it, for runHandoffPair.
func mysqlPingPong(b *testing.B, mk func(b *testing.B, name string) func(i int) contender, suffix string) *pingPong {
	name := lockName(b, suffix)
	return startPingPong(b, mk(b, name), mysqlQueuedOn(b, name))
}

// mysqlQueuedOn counts the sessions waiting in GET_LOCK for name's lock.
func mysqlQueuedOn(b *testing.B, name string) waitProbe {
	q := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' AND STATE = 'User lock' AND INFO LIKE '%" +
		mysqlServerName(name)[1:len(mysqlServerName(name))-1] + "%'"
	return countProbe(openMySQL(b, 1), q)
}
