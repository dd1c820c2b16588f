package dbutil

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/advisorylock/advisorylock/backend"
)

// Prepared keeps the statements of lib/pq's lock steps (the try
// on a checked session, the unlock) prepared on the server session of each
// connection of one *sql.DB, and knows which sessions have a lease's steps
// prepared by name (see pgSteps). lib/pq sends a statement's text each time,
// which the server parses and plans anew; a prepared one goes as Bind and
// Execute, still one round trip, and skips the parse and plan. Preparing
// costs one round trip, once per connection and statement, as pgx's
// statement cache does.
//
// What it buys: client time within SPEC 11.3's 1.25x. Uncontended
// TryLock+Release against the bare statements (benchmarks,
// BenchmarkPaired/trylock_release_vs_raw_literal/pq, median of 5 paired
// runs, unpinned, 2026-12-06) is 1.09x with the try and the unlock
// prepared and 1.34x with them as text; on MariaDB (MySQL's forDB keeps
// its try and unlock here too, see queryRow;
// BenchmarkMySQLPaired/trylock_release_vs_raw_shared_read) 1.12x against
// 1.41x. The round trips are the same either way.
//
// The driver's statement references its connection, so the cache keeps
// the connections it holds from being collected. It holds at most as many
// as the pool has open: when it holds more, some of its connections have
// been closed, and it drops the least recently used. Should that be one
// still open, its next step prepares again, and the first statement stays
// on the session, unused, until the session ends.
//
// A session can lose its statements (DEALLOCATE ALL or DISCARD ALL run on
// it by the application): the step then runs as text, and its next step
// prepares again (a lease's steps stay text: see pgSteps).
type Prepared struct {
	pool weak.Pointer[sql.DB] // for its count of open connections; weak, so that the cache keeps no pool alive

	Refused     atomic.Bool // the server refused to prepare: statements go as text (MySQL; see queryRow)
	StepsAsText atomic.Bool // a session lost a lease step's statement: steps go as text (see pgSteps)

	mu    sync.Mutex
	conns map[any]*connStatements // by driver connection
	clock uint64                  // counts uses, for least recently used
}

// connStatements are one connection's prepared statements: the driver's,
// by text, and the names prepared by SQL (see pgSteps).
type connStatements struct {
	byText map[string]driver.Stmt
	named  map[string]bool
	used   uint64
}

// ErrNotPrepared says a statement could not run prepared, before anything
// was sent for it: the caller sends it as text.
var ErrNotPrepared = errors.New("advisorylock: statement not prepared")

// PreparedOf returns db's cache, one per *sql.DB; nil for a
// handle that is neither a *sql.DB nor embeds one, whose open connections
// cannot be counted (its statements go as text).
func PreparedOf(db backend.DB) *Prepared {
	pool := SQLDBOf(db)
	if pool == nil {
		return nil
	}
	ps, _ := CachedVerdict(context.Background(), db, "prepared statements", func(context.Context) (*Prepared, error) {
		return &Prepared{pool: weak.Make(pool), conns: map[any]*connStatements{}}, nil
	})
	return ps
}

// stmt returns text prepared on dc's session, preparing it if needed
// (added true when the cache held no statement of dc's before). A
// statement of the driver's name for it already on the session (SQLSTATE
// 42P05) is an error matching ErrTransactionPooler.
func (ps *Prepared) Stmt(ctx context.Context, dc any, text string) (st driver.Stmt, added bool, err error) {
	if !PreparesOn(dc) { // a wrapper's statements stay where it sees them (and it may not be a map key)
		return nil, false, ErrNotPrepared
	}
	ps.mu.Lock()
	if cs := ps.touch(dc); cs != nil {
		st = cs.byText[text]
	}
	ps.mu.Unlock()
	if st != nil {
		return st, false, nil
	}
	pc, ok := dc.(driver.ConnPrepareContext)
	if !ok {
		return nil, false, ErrNotPrepared
	}
	if st, err = pc.PrepareContext(ctx, text); err != nil {
		if SQLState(err) == "42P05" {
			// The driver names its statements per connection (lib/pq:
			// "1", "2", ...): one of that name on this session is
			// another connection's, so the connection's statements reach
			// sessions not its own.
			err = fmt.Errorf("%w: %s: %w", ErrTransactionPooler, PoolerSign(err), err)
		}
		return nil, false, err
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	cs, added := ps.entry(dc)
	cs.byText[text] = st
	return st, added, nil
}

// touch returns dc's statements, marked as used now; nil when the cache
// holds none of dc's. ps.mu must be held.
func (ps *Prepared) touch(dc any) *connStatements {
	ps.clock++
	cs := ps.conns[dc]
	if cs != nil {
		cs.used = ps.clock
	}
	return cs
}

// entry returns dc's statements, made (added) if the cache held none, as
// used last; the caller trims an added one once ps.mu is free. ps.mu must
// be held.
func (ps *Prepared) entry(dc any) (cs *connStatements, added bool) {
	if cs = ps.conns[dc]; cs == nil {
		cs = &connStatements{byText: map[string]driver.Stmt{}, named: map[string]bool{}}
		ps.conns[dc] = cs
		added = true
	}
	cs.used = ps.clock
	return cs, added
}

// PreparesOn reports whether dc is a connection of a driver the cache
// prepares on (lib/pq's, or go-sql-driver/mysql's, whose statements
// MySQL's forDB prepares), and not a wrapper's.
func PreparesOn(dc any) bool {
	t := reflect.TypeOf(dc)
	return IsLibPQConn(dc) || t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "github.com/go-sql-driver/mysql"
}

// hasNamed reports whether the cache knows name is prepared on dc's
// session.
func (ps *Prepared) HasNamed(dc any, name string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	cs := ps.touch(dc)
	return cs != nil && cs.named[name]
}

// addNamed records that name is prepared on dc's session.
func (ps *Prepared) AddNamed(dc any, name string) {
	ps.mu.Lock()
	cs, added := ps.entry(dc)
	cs.named[name] = true
	ps.mu.Unlock()
	if added {
		ps.Trim()
	}
}

// forget drops dc's statements: its session has lost them.
func (ps *Prepared) Forget(dc any) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.conns, dc)
}

// trim drops the least recently used connections while the cache holds
// more than the pool has open.
func (ps *Prepared) Trim() {
	pool := ps.pool.Value()
	if pool == nil {
		return
	}
	open := max(pool.Stats().OpenConnections, 1)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for len(ps.conns) > open {
		var oldest any
		var cs *connStatements
		for dc, c := range ps.conns {
			if cs == nil || c.used < cs.used {
				oldest, cs = dc, c
			}
		}
		delete(ps.conns, oldest)
	}
}

// size is how many connections the cache holds.
func (ps *Prepared) Size() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.conns)
}

// Cached returns a copy of the driver statements the cache holds for dc,
// by text; nil when it holds none of dc's (for tests that make a session
// lose them).
func (ps *Prepared) Cached(dc any) map[string]driver.Stmt {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	cs := ps.conns[dc]
	if cs == nil {
		return nil
	}
	return maps.Clone(cs.byText)
}

// QueryRow runs text with args, prepared on conn's session first if it is
// not yet, and returns the driver values of its one row (sql.ErrNoRows
// for none). It returns ErrNotPrepared where nothing ran: the connection
// is not the driver's own, notPrepared says the server would not prepare
// the text (nil: every error is returned as it is), or lost says the
// session lost the statement (it is forgotten, and prepared again next
// time).
func (ps *Prepared) QueryRow(ctx context.Context, conn *sql.Conn, text string, args []any, notPrepared, lost func(error) bool) ([]driver.Value, error) {
	var vals []driver.Value
	var added bool
	err := conn.Raw(func(dc any) error {
		st, a, err := ps.Stmt(ctx, dc, text)
		added = a
		if err != nil && notPrepared != nil && notPrepared(err) {
			return ErrNotPrepared
		}
		if err != nil {
			return err
		}
		sq, ok := st.(driver.StmtQueryContext)
		if !ok {
			return ErrNotPrepared
		}
		nv := make([]driver.NamedValue, len(args))
		for i, a := range args {
			nv[i] = driver.NamedValue{Ordinal: i + 1, Value: a}
		}
		rows, err := sq.QueryContext(ctx, nv)
		if err != nil && lost(err) {
			ps.Forget(dc)
			return ErrNotPrepared
		}
		if err != nil {
			return err
		}
		defer rows.Close()
		vals = make([]driver.Value, len(rows.Columns()))
		if err := rows.Next(vals); err != nil {
			if errors.Is(err, io.EOF) {
				return sql.ErrNoRows
			}
			return err
		}
		return nil
	})
	if added {
		ps.Trim()
	}
	return vals, err
}
