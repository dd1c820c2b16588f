package testdb

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// Counter is the shared row of the load and fault tests: a critical
// section bumps it with a deliberately non-atomic read-modify-write (a
// SELECT, then an UPDATE in a separate statement), so any two holders at
// once can lose an update, and it marks entry and exit so that two
// holders at once are counted as a violation. Fenced writes are logged in
// a second table, in commit order, with their fencing token.
//
// The tables live in PostgreSQL or in a SQLite file; every value is an
// integer written into the SQL text, so one statement form serves both.
type Counter struct {
	Table  string // the counter table; the write log is Table+"_writes"
	SQLite bool
	MySQL  bool // MySQL/MariaDB: no UPDATE ... RETURNING (see NewMySQLCounter)
}

// Querier is what *sql.DB, *sql.Conn and *sql.Tx share.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// NewCounter creates a counter (its two tables, under a name unique to
// this run) in db, and drops it at t.Cleanup.
func NewCounter(t testing.TB, db *sql.DB, sqlite bool) *Counter {
	t.Helper()
	return newCounter(t, db, &Counter{SQLite: sqlite})
}

func newCounter(t testing.TB, db *sql.DB, c *Counter) *Counter {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	c.Table = "fault_counter_" + hex.EncodeToString(b[:])
	seq := "seq bigserial PRIMARY KEY"
	switch {
	case c.SQLite:
		seq = "seq INTEGER PRIMARY KEY AUTOINCREMENT"
	case c.MySQL:
		seq = "seq bigint AUTO_INCREMENT PRIMARY KEY"
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	for _, ddl := range []string{
		"CREATE TABLE " + c.Table + " (id int PRIMARY KEY, n bigint NOT NULL, holders bigint NOT NULL, violations bigint NOT NULL)",
		"INSERT INTO " + c.Table + " VALUES (1, 0, 0, 0)",
		"CREATE TABLE " + c.writes() + " (" + seq + ", token bigint NOT NULL)",
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			t.Fatalf("testdb: counter: %v", err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
		defer cancel()
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+c.Table)
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+c.writes())
	})
	return c
}

func (c *Counter) writes() string { return c.Table + "_writes" }

// Enter marks a holder entering its critical section and returns how
// many holders are inside now, itself included: 1 unless exclusion
// failed, in which case the violation is also counted in the row.
func (c *Counter) Enter(ctx context.Context, q Querier) (int64, error) {
	inside, err := c.enter(ctx, q)
	if err != nil {
		return 0, fmt.Errorf("counter enter: %w", err)
	}
	if inside != 1 {
		if _, err := q.ExecContext(ctx, "UPDATE "+c.Table+" SET violations = violations + 1 WHERE id = 1"); err != nil {
			return inside, fmt.Errorf("counter violation: %w", err)
		}
	}
	return inside, nil
}

func (c *Counter) enter(ctx context.Context, q Querier) (int64, error) {
	if c.MySQL { // the server reports the value passed to LAST_INSERT_ID
		res, err := q.ExecContext(ctx, "UPDATE "+c.Table+" SET holders = LAST_INSERT_ID(holders + 1) WHERE id = 1")
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	var inside int64
	err := q.QueryRowContext(ctx, "UPDATE "+c.Table+" SET holders = holders + 1 WHERE id = 1 RETURNING holders").Scan(&inside)
	return inside, err
}

// Exit marks a holder leaving its critical section.
func (c *Counter) Exit(ctx context.Context, q Querier) error {
	if _, err := q.ExecContext(ctx, "UPDATE "+c.Table+" SET holders = holders - 1 WHERE id = 1"); err != nil {
		return fmt.Errorf("counter exit: %w", err)
	}
	return nil
}

// Bump adds one to the counter the unsafe way: it reads the value, then
// writes the value read plus one in a second statement. Only mutual
// exclusion (or a transaction that serializes it) keeps the count exact.
func (c *Counter) Bump(ctx context.Context, q Querier) error {
	var n int64
	if err := q.QueryRowContext(ctx, "SELECT n FROM "+c.Table+" WHERE id = 1").Scan(&n); err != nil {
		return fmt.Errorf("counter read: %w", err)
	}
	if _, err := q.ExecContext(ctx, fmt.Sprintf("UPDATE %s SET n = %d WHERE id = 1", c.Table, n+1)); err != nil {
		return fmt.Errorf("counter write: %w", err)
	}
	return nil
}

// Record logs a fenced write of token, in the caller's transaction (after
// Fence.Admit, whose row lock orders the log by commit).
func (c *Counter) Record(ctx context.Context, tx *sql.Tx, token int64) error {
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (token) VALUES (%d)", c.writes(), token)); err != nil {
		return fmt.Errorf("counter record: %w", err)
	}
	return nil
}

// CounterState is a counter's row and write log, read at the end of a
// test.
type CounterState struct {
	N, Holders, Violations int64
	Writes                 int64 // fenced writes committed
	MaxToken               int64 // the highest token among them
	Regressions            int64 // writes whose token is lower than the write before: stale writes admitted
}

// State reads the counter.
func (c *Counter) State(ctx context.Context, q Querier) (CounterState, error) {
	var s CounterState
	err := q.QueryRowContext(ctx, "SELECT n, holders, violations FROM "+c.Table+" WHERE id = 1").Scan(&s.N, &s.Holders, &s.Violations)
	if err != nil {
		return s, fmt.Errorf("counter state: %w", err)
	}
	err = q.QueryRowContext(ctx, "SELECT count(*), coalesce(max(token), 0) FROM "+c.writes()).Scan(&s.Writes, &s.MaxToken)
	if err != nil {
		return s, fmt.Errorf("counter writes: %w", err)
	}
	err = q.QueryRowContext(ctx, "SELECT count(*) FROM (SELECT token, lag(token) OVER (ORDER BY seq) AS prev FROM "+
		c.writes()+") w WHERE token < prev").Scan(&s.Regressions)
	if err != nil {
		return s, fmt.Errorf("counter regressions: %w", err)
	}
	return s, nil
}

// WithParam returns dsn (URL or key=value) with one connection parameter
// set, such as application_name, so that a test can find its own
// sessions in pg_stat_activity. A dsn that cannot be parsed is returned
// unchanged.
func WithParam(dsn, key, value string) string {
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return dsn
		}
		q := u.Query()
		q.Set(key, value)
		// %20, not +, for a space: pgx reads a + in a URL as a plus sign.
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
		return u.String()
	}
	kv, err := parseKeyValue(dsn)
	if err != nil {
		return dsn
	}
	kv[key] = value
	return formatKeyValue(kv)
}
