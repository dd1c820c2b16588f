// Package dbutil holds what the advisorylock package and its built-in
// backends share about a database handle: where a statement runs
// (StatementsOn, TakeConn, a try's pool wait), what a failed checkout
// means (ErrPoolUnavailable), and the per-*sql.DB cache of what first
// uses learned (CachedVerdict). One copy, imported by both, so that a
// backend in a package of its own decides these as the root does.
package dbutil

import (
	"context"
	"database/sql"
	"reflect"
	"runtime"
	"sync"
	"weak"

	"github.com/advisorylock/advisorylock/backend"
)

// verdicts caches, per *sql.DB, what first uses learn about it (the
// backend a wrapped driver talks to, Validate's verdict, the pooler
// probe's), and lib/pq's prepared statements (Prepared),
// guarded by mu. Entries are keyed by weak pointers and removed when
// their *sql.DB is garbage collected, so the cache keeps no pool alive. A verdict in
// flight is shared: callers that arrive meanwhile wait for it. A failed
// one is not kept: the next caller decides again.
//
// What it buys: round trips at first use. Lock values are cheap and made
// per entity or per request; without it each new one would run again the
// statements its handle already answered (which backend, Validate's
// version, standby and pooler checks, whether the tables exist) before
// its first step: a new Lock's TryLock+Release on a warm PostgreSQL
// handle takes 2 round trips with it and 20 to 27 without (lib/pq and
// pgx, counted through testdb's proxy, 2026-12-06; see
// TestNewLockOnAWarmHandleTakesTwoRoundTrips), a new LeaseLock's 2 and 3.
var verdicts = struct {
	mu sync.Mutex
	m  map[weak.Pointer[sql.DB]]map[string]*verdict
}{m: map[weak.Pointer[sql.DB]]map[string]*verdict{}}

type verdict struct {
	done chan struct{} // closed when val and err are set
	val  any
	err  error
}

// CachedVerdict returns what decide says about db, deciding once per
// *sql.DB and per what. A handle that is not a *sql.DB and embeds none is
// decided on every call. A failed decision is not kept: the next caller
// decides again. A caller that finds a decision in flight waits for it as
// long as ctx allows, and returns ctx's cause when ctx ends first.
func CachedVerdict[T any](ctx context.Context, db backend.DB, what string, decide func(ctx context.Context) (T, error)) (T, error) {
	pool := SQLDBOf(db)
	if pool == nil {
		return decide(ctx)
	}
	key := weak.Make(pool)
	for {
		v, mine := verdictFor(pool, key, what)
		if !mine {
			select {
			case <-v.done:
			case <-ctx.Done():
				var zero T
				return zero, context.Cause(ctx)
			}
			if v.err != nil {
				continue // decided under someone else's context: decide again
			}
			return v.val.(T), nil
		}
		val, err := decide(ctx)
		v.val, v.err = val, err
		if err != nil {
			forgetVerdict(key, what, v)
		}
		close(v.done)
		return val, err
	}
}

// Decided returns the verdict of what for pool, waiting for one in
// flight; ok is false when none was made or it failed. It is for tests
// that look at what a first use left behind.
func Decided(pool *sql.DB, what string) (val any, ok bool) {
	verdicts.mu.Lock()
	v := verdicts.m[weak.Make(pool)][what]
	verdicts.mu.Unlock()
	if v == nil {
		return nil, false
	}
	<-v.done
	return v.val, v.err == nil
}

// verdictFor returns the verdict of what for pool, and mine true when the
// caller made it and must decide it.
func verdictFor(pool *sql.DB, key weak.Pointer[sql.DB], what string) (v *verdict, mine bool) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	byWhat := verdicts.m[key]
	if byWhat == nil {
		byWhat = map[string]*verdict{}
		verdicts.m[key] = byWhat
		runtime.AddCleanup(pool, forgetPool, key)
	}
	if v := byWhat[what]; v != nil {
		return v, false
	}
	v = &verdict{done: make(chan struct{})}
	byWhat[what] = v
	return v, true
}

func forgetVerdict(key weak.Pointer[sql.DB], what string, v *verdict) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	if byWhat := verdicts.m[key]; byWhat[what] == v {
		delete(byWhat, what)
	}
}

func forgetPool(key weak.Pointer[sql.DB]) {
	verdicts.mu.Lock()
	defer verdicts.mu.Unlock()
	delete(verdicts.m, key)
}

// SQLDBOf returns the *sql.DB behind db: db itself, or the exported
// *sql.DB that a struct such as sqlx.DB embeds; nil if there is none.
func SQLDBOf(db backend.DB) *sql.DB {
	if p, ok := db.(*sql.DB); ok {
		return p
	}
	v := reflect.ValueOf(db)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	v = v.Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Anonymous && f.IsExported() && f.Type == reflect.TypeFor[*sql.DB]() {
			p, _ := v.Field(i).Interface().(*sql.DB)
			return p
		}
	}
	return nil
}
