package advisorylocktest

import (
	"crypto/sha256"
	"database/sql/driver"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
)

// This file alone knows the library's statements. Each pattern matches
// the distinctive part of one statement (its function or its table and
// verb) and, for a Mock made by For, the lock's key or name as the
// library writes it; this module's tests keep them in step with the
// library.

// rowCount is the result of an Exec whose row count is the answer.
func rowCount(ok bool) driver.Result {
	if ok {
		return sqlmock.NewResult(0, 1)
	}
	return sqlmock.NewResult(0, 0)
}

// postgresStatements are the PostgreSQL backend's. With a driver it does
// not know (sqlmock's) the library writes keys and names into the text as
// literals, so a statement has no arguments. The try and the unlock are
// Execs whose row count is the answer.
type postgresStatements struct{}

func (postgresStatements) backend() backend.Backend { return advisorylock.Postgres() }

// pgCall matches a call of fn on m's key: a decimal literal, which the
// library writes in parentheses when negative, and casts to bigint in
// some statements.
func pgCall(m *Mock, fn string) string {
	call := regexp.QuoteMeta(fn + "(")
	if m.name == "" {
		return call
	}
	return call + `\(?` + regexp.QuoteMeta(strconv.FormatInt(advisorylock.Key(m.name), 10)) + `\)?(::bigint)?\)`
}

// pgText matches m's name as the library writes a text literal (an escape
// string with quotes and backslashes doubled), after prefix; "" for any.
func pgText(m *Mock, prefix string) string {
	if m.name == "" {
		return ""
	}
	quoted := "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(m.name) + "'::text"
	return ".*" + regexp.QuoteMeta(prefix+quoted)
}

func (postgresStatements) try(m *Mock, won bool) {
	m.mock.ExpectExec(pgCall(m, "pg_try_advisory_lock")).WillReturnResult(rowCount(won))
}

// waitGranted: with the server checks off a missed try asks nothing more;
// the wait is one Exec of a few statements, pg_advisory_lock the last.
func (p postgresStatements) waitGranted(m *Mock) {
	p.try(m, false)
	m.mock.ExpectExec(pgCall(m, "pg_advisory_lock")).WillReturnResult(rowCount(true))
}

// release: an unlock that frees nothing asks pg_locks whether this or
// another session holds the key (a transaction-mode pooler); neither
// does here.
func (postgresStatements) release(m *Mock, held bool) {
	m.mock.ExpectExec(pgCall(m, "pg_advisory_unlock")).WillReturnResult(rowCount(held))
	if held {
		return
	}
	where := "FROM pg_locks"
	if m.name != "" {
		k := uint64(advisorylock.Key(m.name))
		where += fmt.Sprintf(".*l\\.classid = %d AND l\\.objid = %d", uint32(k>>32), uint32(k))
	}
	m.mock.ExpectQuery(where).WillReturnRows(sqlmock.NewRows([]string{"here", "anywhere", "pid"}).AddRow(false, false, int64(1)))
}

func (postgresStatements) acquireLease(m *Mock, token advisorylock.FencingToken) {
	rows := sqlmock.NewRows([]string{"generation"})
	if token != 0 {
		rows.AddRow(int64(token))
	}
	m.mock.ExpectQuery(regexp.QuoteMeta("INSERT INTO advisorylock_leases AS l") + pgText(m, "SELECT ")).WillReturnRows(rows)
}

func (postgresStatements) releaseLease(m *Mock) {
	m.mock.ExpectExec(regexp.QuoteMeta("UPDATE advisorylock_leases SET owner = CASE WHEN") + pgText(m, "WHERE name = ")).WillReturnResult(rowCount(true))
}

// mysqlStatements are the MySQL backend's. Every statement is text with
// its values written in. A lock statement is a query of one row: the
// answer, then the session's CONNECTION_ID() (a grant and its release
// must report the same one), @@read_only and @@session.wait_timeout.
type mysqlStatements struct{}

// mysqlSession is the connection id the expectations report.
const mysqlSession = int64(1)

// mysqlWaitTimeout is the wait_timeout the lock statements report: the
// shortest MySQL allows, so that no WithDeadHolderTimeout asks to shorten
// it (which would be one more statement).
const mysqlWaitTimeout = int64(1)

func (mysqlStatements) backend() backend.Backend { return advisorylock.MySQL() }

// mysqlLockName matches the server-side name of m's lock: the key in hex.
func mysqlLockName(m *Mock) string {
	if m.name == "" {
		return `'advisorylock:v1:[0-9a-f]{16}'`
	}
	return regexp.QuoteMeta(fmt.Sprintf("'advisorylock:v1:%016x'", uint64(advisorylock.Key(m.name))))
}

// mysqlNameHash matches the lease row's key, the SHA-256 of m's name,
// after prefix; "" for any.
func mysqlNameHash(m *Mock, prefix string) string {
	if m.name == "" {
		return ""
	}
	return ".*" + regexp.QuoteMeta(prefix+fmt.Sprintf("X'%x'", sha256.Sum256([]byte(m.name))))
}

// mysqlLockRow is a lock statement's row with answer got.
func mysqlLockRow(got int64) *sqlmock.Rows {
	return sqlmock.NewRows([]string{"got", "connection_id", "read_only", "wait_timeout"}).AddRow(got, mysqlSession, false, mysqlWaitTimeout)
}

// try: GET_LOCK with no wait; the statement also looks for shared holders
// once granted (none here): 1 granted, 0 held elsewhere.
func (mysqlStatements) try(m *Mock, won bool) {
	got := int64(0)
	if won {
		got = 1
	}
	m.mock.ExpectQuery(`GET_LOCK\(` + mysqlLockName(m) + `, 0\)`).WillReturnRows(mysqlLockRow(got))
}

// waitGranted: the wait is GET_LOCK for the slice, in seconds with a
// fraction, where the try waits 0.
func (s mysqlStatements) waitGranted(m *Mock) {
	s.try(m, false)
	m.mock.ExpectQuery(`GET_LOCK\(` + mysqlLockName(m) + `, [0-9]+\.[0-9]+\)`).WillReturnRows(mysqlLockRow(1))
}

// release: RELEASE_LOCK answers 1 (released) or NULL (nobody held it),
// with the session and IS_USED_LOCK (NULL: free now).
func (mysqlStatements) release(m *Mock, held bool) {
	var released any
	if held {
		released = int64(1)
	}
	m.mock.ExpectQuery(`SELECT RELEASE_LOCK\(` + mysqlLockName(m) + `\)`).
		WillReturnRows(sqlmock.NewRows([]string{"released", "connection_id", "holder"}).AddRow(released, mysqlSession, nil))
}

// acquireLease: an Exec whose last insert id is the token, 0 when held.
func (mysqlStatements) acquireLease(m *Mock, token advisorylock.FencingToken) {
	res := sqlmock.NewResult(0, 0)
	if token != 0 {
		res = sqlmock.NewResult(int64(token), 1)
	}
	m.mock.ExpectExec(regexp.QuoteMeta("INSERT INTO advisorylock_leases (name_hash,") + mysqlNameHash(m, "VALUES (")).WillReturnResult(res)
}

func (mysqlStatements) releaseLease(m *Mock) {
	m.mock.ExpectExec(regexp.QuoteMeta("UPDATE advisorylock_leases SET owner = NULL") + mysqlNameHash(m, "WHERE name_hash = ")).WillReturnResult(rowCount(true))
}

// sqliteStatements are the SQLite backend's: constant texts with bound
// arguments, so a Mock made by For matches the key or the name among
// them (and any owner label and time). A Lock's try and release are Execs
// whose row count is the answer.
type sqliteStatements struct{}

func (sqliteStatements) backend() backend.Backend { return advisorylock.SQLite() }

// sqliteArgs are the arguments of a statement whose first is m's key (or
// name, for a lease) and whose others are any; nil (no check) for any lock.
func sqliteArgs(m *Mock, first func(name string) any, n int) []driver.Value {
	if m.name == "" {
		return nil
	}
	args := []driver.Value{first(m.name)}
	for range n - 1 {
		args = append(args, sqlmock.AnyArg())
	}
	return args
}

func sqliteKey(name string) any  { return advisorylock.Key(name) }
func sqliteName(name string) any { return name }

// sqliteExec expects an Exec of the statement that starts with text.
func sqliteExec(m *Mock, text string, args []driver.Value, res driver.Result) {
	e := m.mock.ExpectExec(regexp.QuoteMeta(text))
	if args != nil {
		e.WithArgs(args...)
	}
	e.WillReturnResult(res)
}

// sqliteQuery expects a query of the statement that starts with text.
func sqliteQuery(m *Mock, text string, args []driver.Value, rows *sqlmock.Rows) {
	e := m.mock.ExpectQuery(regexp.QuoteMeta(text))
	if args != nil {
		e.WithArgs(args...)
	}
	e.WillReturnRows(rows)
}

// try: the upsert of the lock row (key, name, owner, now, expiry).
func (sqliteStatements) try(m *Mock, won bool) {
	args := sqliteArgs(m, sqliteKey, 5)
	if args != nil {
		args[1] = m.name // then the owner label and the times
	}
	sqliteExec(m, "INSERT INTO advisorylock_locks (key, name, owner, acquired_at, expires_at) VALUES", args, rowCount(won))
}

// waitGranted: a waiting Lock that misses claims the key (so that no new
// shared holder enters), reads the holders (none: the lock came free),
// tries again after a poll interval, and once granted withdraws its
// claim.
func (s sqliteStatements) waitGranted(m *Mock) {
	s.try(m, false)
	sqliteExec(m, "INSERT INTO advisorylock_writers (key, owner, expires_at)", sqliteArgs(m, sqliteKey, 3), rowCount(true))
	sqliteQuery(m, "SELECT name, owner, acquired_at, expires_at, 0 FROM advisorylock_locks", sqliteArgs(m, sqliteKey, 2),
		sqlmock.NewRows([]string{"name", "owner", "acquired_at", "expires_at", "shared"}))
	s.try(m, true)
	sqliteExec(m, "DELETE FROM advisorylock_writers WHERE key = ?1 AND owner = ?2", sqliteArgs(m, sqliteKey, 2), rowCount(true))
}

// release deletes the row by key and owner; no row deleted is no error.
func (sqliteStatements) release(m *Mock, held bool) {
	sqliteExec(m, "DELETE FROM advisorylock_locks WHERE key = ?1 AND owner = ?2", sqliteArgs(m, sqliteKey, 2), rowCount(held))
}

// acquireLease: the upsert returns the new generation, no row when held.
func (sqliteStatements) acquireLease(m *Mock, token advisorylock.FencingToken) {
	rows := sqlmock.NewRows([]string{"generation"})
	if token != 0 {
		rows.AddRow(int64(token))
	}
	sqliteQuery(m, "INSERT INTO advisorylock_leases (name, owner, generation, acquired_at, expires_at)", sqliteArgs(m, sqliteName, 4), rows)
}

func (sqliteStatements) releaseLease(m *Mock) {
	sqliteExec(m, "UPDATE advisorylock_leases SET owner = NULL", sqliteArgs(m, sqliteName, 3), rowCount(true))
}
