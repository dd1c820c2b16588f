package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// setBackend is a backend sets are tested on, with the options of its
// sets (with and without multiplexing).
type setBackend struct {
	name string
	open func(t *testing.T) *sql.DB
	opts []advisorylock.Option
}

// setBackends are PostgreSQL through both drivers and MariaDB, each with
// and without WithMultiplexing, and SQLite (rows).
func setBackends(t *testing.T) []setBackend {
	var out []setBackend
	for _, srv := range muxServers() {
		out = append(out,
			setBackend{srv.name + "/pinned", srv.open, []advisorylock.Option{quiet}},
			setBackend{srv.name + "/multiplexed", srv.open, []advisorylock.Option{quiet, advisorylock.WithMultiplexing(2)}})
	}
	var once sync.Once
	var path string
	out = append(out, setBackend{"sqlite", func(t *testing.T) *sql.DB {
		once.Do(func() { path = testdb.SQLitePath(t) })
		return testdb.OpenSQLite(t, path, sqliteWAL)
	}, []advisorylock.Option{quiet, advisorylock.WithPollInterval(5 * time.Millisecond)}})
	return out
}

func newSet(t testing.TB, db advisorylock.DB, names []string, opts ...advisorylock.Option) *advisorylock.Lock {
	t.Helper()
	l, err := advisorylock.NewSet(db, names, opts...)
	if err != nil {
		t.Fatalf("NewSet(%q): %v", names, err)
	}
	return l
}

// TestSetTakesAllOrNone: a set's try misses while any one of its names is
// held elsewhere, and then holds none of the others; once all are free it
// takes all, which keeps each name from everyone else until Release frees
// them all.
func TestSetTakesAllOrNone(t *testing.T) {
	testdb.Slow(t, "sets contending, per backend")
	for _, sb := range setBackends(t) {
		t.Run(sb.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			db, rivalDB := sb.open(t), sb.open(t)
			names, _ := muxNames(t, 3)
			set := newSet(t, db, []string{names[2], names[0], names[1]}, sb.opts...)
			rival := make([]*advisorylock.Lock, len(names))
			for i, n := range names {
				rival[i] = newLock(t, rivalDB, n, quiet)
			}

			middle, err := rival[1].TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := set.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("set TryLock with one name held elsewhere: %v, want ErrNotAcquired", err)
			}
			if h, err := set.Holder(ctx); err != nil || h == nil || h.Name != names[1] {
				t.Fatalf("set Holder = %+v, %v; want the holder of %s", h, err, names[1])
			}
			if hs, err := set.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Name != names[1] {
				t.Fatalf("set Holders = %v, %v; want the one holder of %s", hs, err, names[1])
			}
			for _, i := range []int{0, 2} {
				g, err := rival[i].TryLock(ctx)
				if err != nil {
					t.Fatalf("%s is held after the set's try missed: %v", names[i], err)
				}
				if err := g.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := middle.Release(ctx); err != nil {
				t.Fatal(err)
			}

			g, err := set.TryLock(ctx)
			if err != nil {
				t.Fatalf("set TryLock with all names free: %v", err)
			}
			for i := range names {
				if _, err := rival[i].TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
					t.Fatalf("%s while the set holds it: %v, want ErrNotAcquired", names[i], err)
				}
			}
			if err := g.Release(ctx); err != nil {
				t.Fatal(err)
			}
			for i := range names {
				g, err := rival[i].TryLock(ctx)
				if err != nil {
					t.Fatalf("%s after the set's release: %v", names[i], err)
				}
				if err := g.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestSetsInOppositeOrdersNeverDeadlock runs sets over overlapping names,
// given in opposite and shuffled orders, waiting (Do) against each other
// and against single Locks: every section runs, no name ever has two
// holders at once, and all of it ends well within the deadline.
func TestSetsInOppositeOrdersNeverDeadlock(t *testing.T) {
	testdb.Slow(t, "sets contending for seconds, per backend")
	for _, sb := range setBackends(t) {
		t.Run(sb.name, func(t *testing.T) {
			db := sb.open(t)
			db.SetMaxOpenConns(20)
			names, _ := muxNames(t, 4)
			inside := make([]atomic.Int32, len(names))
			var ran atomic.Int32
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			const workers, rounds = 6, 8
			for w := range workers {
				wg.Go(func() {
					for r := range rounds {
						idx := []int{0, 1, 2, 3}
						switch (w + r) % 3 {
						case 0:
						case 1:
							slices.Reverse(idx)
						default:
							rand.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
							idx = idx[:1+rand.IntN(3)]
						}
						var set []string
						for _, i := range idx {
							set = append(set, names[i])
						}
						l := newSet(t, db, set, sb.opts...)
						err := l.Do(ctx, func(context.Context) error {
							for _, i := range idx {
								if n := inside[i].Add(1); n != 1 {
									return fmt.Errorf("%s has %d holders", names[i], n)
								}
							}
							time.Sleep(time.Millisecond)
							for _, i := range idx {
								inside[i].Add(-1)
							}
							ran.Add(1)
							return nil
						})
						if err != nil {
							t.Errorf("set %v: %v", set, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if ctx.Err() != nil {
				t.Fatal("the sets did not finish within 90s: a deadlock")
			}
			if got := ran.Load(); got != workers*rounds {
				t.Fatalf("%d sections ran, want %d", got, workers*rounds)
			}
		})
	}
}

// TestSetLostWithAnyName: a set whose session is killed reports lost,
// pinned or multiplexed.
func TestSetLostWithAnyName(t *testing.T) {
	testdb.Slow(t, "waits for keep-alives to report losses, per backend")
	for _, srv := range muxServers() {
		for _, mux := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/multiplexed=%v", srv.name, mux), func(t *testing.T) {
				db, admin := srv.open(t), srv.open(t)
				names, keys := muxNames(t, 3)
				opts := []advisorylock.Option{quiet, advisorylock.WithKeepAlive(200 * time.Millisecond), advisorylock.WithReleaseTimeout(time.Second)}
				if mux {
					opts = append(opts, advisorylock.WithMultiplexing(2))
				}
				g, err := newSet(t, db, names, opts...).TryLock(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				held := srv.sessions(t, admin, keys)
				if s := distinct(held); len(held) != 3 || len(s) != 1 {
					t.Fatalf("the set's names are held by sessions %v, want all on one", held)
				}
				srv.kill(t, admin, held[keys[1]])
				select {
				case <-g.Lost():
				case <-time.After(wait):
					t.Fatal("the set was not reported lost when its session was killed")
				}
				if err := g.Release(context.Background()); err != nil {
					t.Fatalf("Release of a lost set: %v", err)
				}
			})
		}
	}
}

// TestNewSetRefuses what cannot be a set.
func TestNewSetRefuses(t *testing.T) {
	db := testdb.OpenPostgres(t, "pgx")
	for _, bad := range [][]string{nil, {}, {"a", ""}, {"a", "b", "a"}} {
		if _, err := advisorylock.NewSet(db, bad); err == nil {
			t.Errorf("NewSet(%q): no error", bad)
		}
	}
	if _, err := advisorylock.NewSet(db, []string{"a", "b"}, advisorylock.WithMinHold(time.Second)); err == nil {
		t.Error("NewSet took WithMinHold")
	}
	l := newSet(t, db, []string{"b-" + testdb.UniqueName(t), "a-" + testdb.UniqueName(t)})
	if _, err := l.RLock(context.Background()); !errors.Is(err, advisorylock.ErrUnsupported) {
		t.Errorf("RLock of a set: %v, want ErrUnsupported", err)
	}
	one := newSet(t, db, []string{"only"})
	if one.Name() != "only" || one.Key() != advisorylock.Key("only") {
		t.Errorf("a set of one: Name %q Key %d, want a Lock's", one.Name(), one.Key())
	}
}
