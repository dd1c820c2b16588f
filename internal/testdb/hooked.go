package testdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
)

// Hooks change what the statements of a database opened with OpenHooked
// do, to produce on a real server what it will not produce on demand.
// Either may be nil. Both are called from the goroutine running the
// statement, so they must be safe for concurrent use.
type Hooks struct {
	// Before runs just before each statement is sent, after the caller
	// took its timestamps (a clock moved here moves during the call), with
	// the statement's arguments.
	Before func(query string, args []any)
	// After runs once each statement has run (a query's rows drained and
	// closed), with its error; what it returns replaces that error. The
	// statement's effects on the server stay.
	After func(query string, err error) error
	// Cancellable, if set, is told of each statement whether the context
	// the driver got for it can end (its Done channel is not nil).
	Cancellable func(query string, canEnd bool)
}

// SQLStateError is a driver error carrying a SQLSTATE, as lib/pq's and
// pgx's errors do (both have a SQLState method).
type SQLStateError string

func (e SQLStateError) Error() string    { return "testdb: injected SQLSTATE " + string(e) }
func (e SQLStateError) SQLState() string { return string(e) }

// OpenHooked opens dsn with the driver registered as driverName, wrapped so
// that h sees every statement, pings it and closes it at t.Cleanup. The
// wrapped driver is of a type the library does not know: give it
// WithBackend.
func OpenHooked(t testing.TB, driverName, dsn string, h Hooks) *sql.DB {
	t.Helper()
	probe, err := sql.Open(driverName, dsn)
	if err != nil {
		t.Fatalf("testdb: open %s: %v", driverName, err)
	}
	d := probe.Driver()
	_ = probe.Close()
	db := sql.OpenDB(hookedConnector{d: d, dsn: dsn, h: h})
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("testdb: ping hooked %s: %v", driverName, err)
	}
	return db
}

// OpenRecording is OpenHooked recording the statements that contain
// part; last returns the latest of them, failing t when none was seen.
func OpenRecording(t testing.TB, driverName, dsn, part string) (db *sql.DB, last func() string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	db = OpenHooked(t, driverName, dsn, Hooks{Before: func(q string, _ []any) {
		if strings.Contains(q, part) {
			mu.Lock()
			seen = append(seen, q)
			mu.Unlock()
		}
	}})
	return db, func() string {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			t.Fatalf("testdb: no statement containing %q was seen", part)
		}
		return seen[len(seen)-1]
	}
}

type hookedConnector struct {
	d   driver.Driver
	dsn string
	h   Hooks
}

func (c hookedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	var conn driver.Conn
	var err error
	if dc, ok := c.d.(driver.DriverContext); ok {
		var inner driver.Connector
		if inner, err = dc.OpenConnector(c.dsn); err == nil {
			conn, err = inner.Connect(ctx)
		}
	} else {
		conn, err = c.d.Open(c.dsn)
	}
	if err != nil {
		return nil, err
	}
	return &hookedConn{Conn: conn, h: c.h}, nil
}

func (c hookedConnector) Driver() driver.Driver { return c.d }

// hookedConn passes every call to the wrapped connection; only the
// context-taking statement methods are hooked, and database/sql uses
// those whenever the wrapped connection has them (both PostgreSQL drivers
// and glebarez/go-sqlite do).
type hookedConn struct {
	driver.Conn
	h Hooks
}

func (c *hookedConn) before(ctx context.Context, q string, named []driver.NamedValue) {
	if c.h.Cancellable != nil {
		c.h.Cancellable(q, ctx.Done() != nil)
	}
	if c.h.Before == nil {
		return
	}
	args := make([]any, len(named))
	for i, nv := range named {
		args[i] = nv.Value
	}
	c.h.Before(q, args)
}

func (c *hookedConn) after(q string, err error) error {
	if c.h.After != nil {
		return c.h.After(q, err)
	}
	return err
}

func (c *hookedConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.before(ctx, q, args)
	res, err := e.ExecContext(ctx, q, args)
	if err = c.after(q, err); err != nil {
		return nil, err
	}
	return res, nil
}

// QueryContext drains and closes the rows before calling After, so the
// statement has finished on the server, and hands back a copy.
func (c *hookedConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	qc, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	c.before(ctx, q, args)
	rows, err := qc.QueryContext(ctx, q, args)
	var copied *copiedRows
	if err == nil {
		copied, err = drain(rows)
	}
	if err = c.after(q, err); err != nil {
		return nil, err
	}
	return copied, nil
}

func (c *hookedConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, q)
	}
	return c.Conn.Prepare(q)
}

func (c *hookedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	return c.Conn.Begin() //lint:ignore SA1019 the fallback database/sql itself uses
}

func (c *hookedConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *hookedConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *hookedConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *hookedConn) CheckNamedValue(nv *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// copiedRows are rows read into memory.
type copiedRows struct {
	cols []string
	data [][]driver.Value
}

func drain(rows driver.Rows) (*copiedRows, error) {
	c := &copiedRows{cols: rows.Columns()}
	for {
		row := make([]driver.Value, len(c.cols))
		err := rows.Next(row)
		if err != nil {
			cerr := rows.Close()
			if errors.Is(err, io.EOF) {
				return c, cerr
			}
			return nil, err
		}
		for i, v := range row { // a driver may reuse its buffers
			if b, ok := v.([]byte); ok {
				row[i] = append([]byte(nil), b...)
			}
		}
		c.data = append(c.data, row)
	}
}

func (r *copiedRows) Columns() []string { return r.cols }
func (r *copiedRows) Close() error      { return nil }

func (r *copiedRows) Next(dest []driver.Value) error {
	if len(r.data) == 0 {
		return io.EOF
	}
	copy(dest, r.data[0])
	r.data = r.data[1:]
	return nil
}
