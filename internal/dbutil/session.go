package dbutil

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/advisorylock/advisorylock/backend"
)

// GiveBack ends a borrowed connection: back to the pool when its last
// statement ended cleanly (its session holds no lock of ours), discarded
// when one was cut short (the connection may be mid-statement).
func GiveBack(conn *sql.Conn, clean bool) {
	if clean {
		Recycle(conn)
	} else {
		Discard(conn)
	}
}

// Recycle returns a connection whose session holds none of our locks.
func Recycle(conn *sql.Conn) { _ = conn.Close() }

// Discard closes the physical connection instead of pooling it, which ends
// the server session and with it every session lock it held.
func Discard(conn *sql.Conn) {
	_ = conn.Raw(func(dc any) error {
		CloseSession(dc)
		return driver.ErrBadConn
	})
	_ = conn.Close() // sql.ErrConnDone: Raw has closed it already
}

// CloseSession closes dc's server connection where closing dc would not:
// pgx's database/sql connection made by stdlib.OpenDBFromPool hands its
// pgx connection back to the pgxpool when closed, session and session
// locks included, for the pool's next Acquire to reuse (a forgotten
// guard's lock would stay held, by a connection nobody knows holds it).
// Closing the pgx connection first makes the pgxpool destroy it. On any
// other pgx connection it does what closing dc does anyway. The close is
// bounded: on a dead network its goodbye is given up on and the socket
// closed all the same.
func CloseSession(dc any) {
	t := reflect.TypeOf(dc)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().PkgPath() != "github.com/jackc/pgx/v5/stdlib" {
		return
	}
	m := reflect.ValueOf(dc).MethodByName("Conn")
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 {
		return
	}
	if c, ok := m.Call(nil)[0].Interface().(interface{ Close(context.Context) error }); ok {
		ctx, cancel := context.WithTimeout(context.Background(), closeSessionTimeout)
		defer cancel()
		_ = c.Close(ctx)
	}
}

// closeSessionTimeout bounds CloseSession's goodbye to the server.
const closeSessionTimeout = time.Second

// IsLibPQConn reports whether dc, a driver connection, is lib/pq's own,
// not a wrapper's around it.
func IsLibPQConn(dc any) bool {
	t := reflect.TypeOf(dc)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "github.com/lib/pq"
}

// AnswerGrace is how long ask still waits, once ctx ended, for a
// driver that honours ctx to return (pgx closes its socket, lib/pq gets
// its cancel request through): on a live network that takes about one
// round trip.
const AnswerGrace = 250 * time.Millisecond

// Within runs f, which talks to the database, and waits for it until ctx
// ends (and AnswerGrace more). Some drivers do not give up a read (or a
// connection's startup) on a dead network when ctx ends: lib/pq sends a
// cancel request over a new connection, which cannot get through either,
// and keeps reading (lib/pq#620). A network cut would then hold the caller
// until the network heals or TCP gives up, many minutes later. When f has
// not returned by then, Within calls abandon, returns ctx's cause, and
// leaves f to finish on its own, calling late (if not nil) with its value
// once it has.
func Within[T any](ctx context.Context, f func() (T, error), abandon func(), late func(T)) (T, error) {
	if ctx.Done() == nil { // ctx never ends: nothing to bound
		return f()
	}
	type answer struct {
		v   T
		err error
	}
	out := make(chan answer, 1)
	go func() {
		v, err := f()
		out <- answer{v, err}
	}()
	select {
	case a := <-out:
		return a.v, a.err
	case <-ctx.Done():
	}
	grace := time.NewTimer(AnswerGrace)
	defer grace.Stop()
	select {
	case a := <-out:
		return a.v, a.err
	case <-grace.C:
	}
	if abandon != nil {
		abandon()
	}
	go func() {
		a := <-out
		if late != nil {
			late(a.v)
		}
	}()
	var zero T
	return zero, fmt.Errorf("no answer from the database: %w", context.Cause(ctx))
}

// A server session can carry facts that stay true while it lives: a
// session of a primary never enters recovery (a server becomes a standby
// only by restarting, which ends its sessions), and settings it was given
// stay until someone changes them. Remembering such a fact per session
// lets a backend leave its check out of the hot statement.
//
// A session is known by its driver connection, which database/sql keeps
// for the session's life and hands to one *sql.Conn at a time. The memo
// holds it weakly: a closed connection, once collected, drops its facts
// (a cleanup deletes them), and a new connection at the same address is a
// different key.
//
// What it buys: a round trip per miss, and client time. PostgreSQL's try
// on a remembered session is the bare pg_try_advisory_lock; without the
// memo every miss asks why (a second round trip, see TryLockSession and
// TestMissedTryReadsNoLockTable) and every grant sends the checks with the
// try: uncontended TryLock+Release against the bare statements on lib/pq
// (benchmarks, BenchmarkPaired/trylock_release_vs_raw_literal/pq, median
// of 5 paired runs, unpinned, 2026-12-06) is 1.09x with it, 1.38x without.
type sessionFact struct {
	conn weak.Pointer[byte] // the driver connection
	fact string
}

var sessionFacts sync.Map // sessionFact → struct{}

// driverConnOf returns the weak identity of conn's driver connection, and
// false when the driver's connection is not a pointer (nothing to key on:
// facts are then never remembered).
func driverConnOf(conn *sql.Conn) (weak.Pointer[byte], *byte, bool) {
	var p *byte
	_ = conn.Raw(func(dc any) error {
		if v := reflect.ValueOf(dc); v.Kind() == reflect.Pointer && !v.IsNil() {
			p = (*byte)(v.UnsafePointer())
		}
		return nil
	})
	if p == nil {
		return weak.Pointer[byte]{}, nil, false
	}
	return weak.Make(p), p, true
}

// SessionKnows reports whether fact was remembered for conn's session.
func SessionKnows(conn *sql.Conn, fact string) bool {
	w, _, ok := driverConnOf(conn)
	if !ok {
		return false
	}
	_, known := sessionFacts.Load(sessionFact{w, fact})
	return known
}

// RememberSession records fact for conn's session, until the session's
// driver connection is collected.
func RememberSession(conn *sql.Conn, fact string) {
	w, p, ok := driverConnOf(conn)
	if !ok {
		return
	}
	key := sessionFact{w, fact}
	if _, loaded := sessionFacts.LoadOrStore(key, struct{}{}); !loaded {
		runtime.AddCleanup(p, func(k sessionFact) { sessionFacts.Delete(k) }, key)
	}
}

// ForgetSession drops every fact remembered for conn's session: code of
// the user's ran on it (WithConn), and a RESET ALL there would have
// undone settings the facts say it has. Its next try checks it again.
func ForgetSession(conn *sql.Conn) {
	w, _, ok := driverConnOf(conn)
	if !ok {
		return
	}
	sessionFacts.Range(func(k, _ any) bool {
		if k.(sessionFact).conn == w {
			sessionFacts.Delete(k)
		}
		return true
	})
}

// DriverPkg returns the import path of the package that defines db's
// driver type, or "".
func DriverPkg(db backend.DB) string {
	t := reflect.TypeOf(db.Driver())
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return ""
	}
	return t.PkgPath()
}

// Client is how advisorylock.Holder.Client shows the session that holds
// a lock, from what the server tells of it: "application user@address",
// each part left out when unknown.
func Client(application, user, addr string) string {
	who := user
	switch {
	case user != "" && addr != "":
		who = user + "@" + addr
	case addr != "":
		who = addr
	}
	switch {
	case application == "":
		return who
	case who == "":
		return application
	}
	return application + " " + who
}
