package advisorylock_test

import (
	"cmp"
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
	"github.com/advisorylock/advisorylock/internal/observetest"
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
			setBackend{srv.name + "/pinned", srv.open, []advisorylock.Option{quiet, pinned}},
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
// held elsewhere, and then holds none of the others (Holder and Holders
// name the held one, with its own key); once all are free it takes all,
// which keeps each name from everyone else until Release frees them all.
func TestSetTakesAllOrNone(t *testing.T) {
	testdb.Slow(t, "sets contending, per backend")
	t.Parallel() // names and pools of its own
	for _, sb := range setBackends(t) {
		t.Run(sb.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			db, rivalDB := sb.open(t), sb.open(t)
			// In key order: the name held elsewhere is the last, so that
			// a Holder of the set's first key would not name it.
			names, _ := byKey(func() []string { n, _ := muxNames(t, 3); return n }())
			set := newSet(t, db, []string{names[2], names[0], names[1]}, sb.opts...)
			rival := make([]*advisorylock.Lock, len(names))
			for i, n := range names {
				rival[i] = newLock(t, rivalDB, n, quiet)
			}

			last, err := rival[2].TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := set.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
				t.Fatalf("set TryLock with one name held elsewhere: %v, want ErrNotAcquired", err)
			}
			if h, err := set.Holder(ctx); err != nil || h == nil || h.Name != names[2] {
				t.Fatalf("set Holder = %+v, %v; want the holder of %s", h, err, names[2])
			}
			if hs, err := set.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Name != names[2] {
				t.Fatalf("set Holders = %v, %v; want the one holder of %s", hs, err, names[2])
			}
			for _, i := range []int{0, 1} {
				g, err := rival[i].TryLock(ctx)
				if err != nil {
					t.Fatalf("%s is held after the set's try missed: %v", names[i], err)
				}
				if err := g.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := last.Release(ctx); err != nil {
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
			t.Parallel() // names of its own on each backend
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
	t.Parallel() // names and pools of its own; it kills only its own session
	for _, srv := range muxServers() {
		for _, mux := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/multiplexed=%v", srv.name, mux), func(t *testing.T) {
				t.Parallel() // names and pools of its own; it kills only its own session
				db, admin := srv.open(t), srv.open(t)
				names, keys := muxNames(t, 3)
				opts := []advisorylock.Option{quiet, advisorylock.WithKeepAlive(200 * time.Millisecond), advisorylock.WithReleaseTimeout(time.Second)}
				if mux {
					opts = append(opts, advisorylock.WithMultiplexing(2))
				} else {
					opts = append(opts, pinned)
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
	if one.Name() != "only" || advisorylock.Key(one.Name()) != advisorylock.Key("only") {
		t.Errorf("a set of one: Name %q Key %d, want a Lock's", one.Name(), advisorylock.Key(one.Name()))
	}
}

// setLoss is a backend on which one name of a held set is let go of
// alone, while the set's session (or its other rows) lives on.
type setLoss struct {
	name  string
	open  func(t *testing.T, path string) *sql.DB
	opts  []advisorylock.Option
	cause string // the loss's Observer cause
	// letGo lets go of key alone while Do's fn holds the set (fctx is
	// fn's context); with taken, another holder then takes it, before the
	// set's keep-alive can look.
	letGo func(t *testing.T, fctx context.Context, admin *sql.DB, name string, key int64, taken bool)
}

// setLosses are the pinned sets of PostgreSQL (both drivers) and MariaDB,
// whose name is unlocked on the set's own session in a transaction in
// WithConn (during which the keep-alive steps aside; the other holder
// is a Lock of another pool), and SQLite's sets of rows, whose row is
// deleted, or handed to another owner.
func setLosses() []setLoss {
	sessionOpts := []advisorylock.Option{quiet, advisorylock.WithKeepAlive(50 * time.Millisecond), advisorylock.WithMultiplexing(0)}
	onOwnSession := func(unlock string, arg func(key int64) any, open func(t *testing.T) *sql.DB) func(*testing.T, context.Context, *sql.DB, string, int64, bool) {
		return func(t *testing.T, fctx context.Context, _ *sql.DB, name string, key int64, taken bool) {
			t.Helper()
			err := advisorylock.GuardFromContext(fctx).WithConn(fctx, func(c advisorylock.Conn) error {
				tx, err := c.BeginTx(fctx, nil)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(fctx, unlock, arg(key)); err != nil {
					return fmt.Errorf("letting go of %s on the set's own session: %w", name, err)
				}
				if taken {
					g, err := newLock(t, open(t), name, quiet).TryLock(fctx)
					if err != nil {
						return fmt.Errorf("another session's TryLock of %s, let go of by the set's session: %w", name, err)
					}
					t.Cleanup(func() { _ = g.Release(context.Background()) })
				}
				return tx.Commit()
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	var out []setLoss
	for _, drv := range testdb.Drivers {
		open := func(t *testing.T) *sql.DB { return testdb.OpenPostgres(t, drv) }
		out = append(out, setLoss{"postgres/" + drv + "/pinned", func(t *testing.T, _ string) *sql.DB { return open(t) }, sessionOpts, "not_held",
			onOwnSession("SELECT pg_advisory_unlock($1)", func(k int64) any { return k }, open)})
	}
	openMySQL := func(t *testing.T) *sql.DB { return testdb.OpenMySQL(t) }
	out = append(out, setLoss{"mysql/pinned", func(t *testing.T, _ string) *sql.DB { return openMySQL(t) }, sessionOpts, "not_held",
		onOwnSession("DO RELEASE_LOCK(?)", func(k int64) any { return fmt.Sprintf("advisorylock:v1:%016x", uint64(k)) }, openMySQL)})
	out = append(out, setLoss{"sqlite", func(t *testing.T, path string) *sql.DB { return testdb.OpenSQLite(t, path, sqliteWAL) },
		[]advisorylock.Option{quiet, advisorylock.WithLeaseTTL(time.Second), advisorylock.WithPollInterval(5 * time.Millisecond)}, "taken_over",
		func(t *testing.T, _ context.Context, admin *sql.DB, name string, key int64, taken bool) {
			t.Helper()
			stmt := "DELETE FROM advisorylock_locks WHERE key = ?"
			if taken { // another holder's row, unexpired
				stmt = "UPDATE advisorylock_locks SET owner = 'another holder', expires_at = expires_at + 3600000 WHERE key = ?"
			}
			if res, err := admin.Exec(stmt, key); err != nil {
				t.Fatalf("letting go of %s's row: %v", name, err)
			} else if n, _ := res.RowsAffected(); n != 1 {
				t.Fatalf("letting go of %s's row: %d rows, want 1", name, n)
			}
		}})
	return out
}

// byKey returns names in key order (a set's order), with their keys.
func byKey(names []string) ([]string, []int64) {
	sorted := slices.Clone(names)
	slices.SortFunc(sorted, func(a, b string) int { return cmp.Compare(advisorylock.Key(a), advisorylock.Key(b)) })
	keys := make([]int64, len(sorted))
	for i, n := range sorted {
		keys[i] = advisorylock.Key(n)
	}
	return sorted, keys
}

// TestSetLosesOneNameAlone: a set one of whose names, neither its first
// nor its last in key order, is let go of alone while its session lives
// on (or, on SQLite, while its other rows do) is lost: fn's context is
// cancelled with ErrLockLost, the Observer is told once, for the set,
// with the loss's cause, and Do returns the loss. Then the set's other
// names are free at once (a lost pinned set's session is not pooled with
// them held). It is so whether nobody holds the name now, or another
// holder took it (whose lock the keep-alive must not count as the set's;
// it keeps it through the set's release). A neighbour set on the same
// handle is told nothing and stays held. The cases run side by side, on
// names and handles of their own; the goroutine check covers them together.
func TestSetLosesOneNameAlone(t *testing.T) {
	t.Parallel()
	testdb.CheckGoroutines(t)
	for _, sl := range setLosses() {
		for _, taken := range []bool{false, true} {
			sub := sl.name + "/freed"
			if taken {
				sub = sl.name + "/taken"
			}
			t.Run(sub, func(t *testing.T) {
				t.Parallel()
				path := testdb.SQLitePath(t)
				db, admin, rivalDB := sl.open(t, path), sl.open(t, path), sl.open(t, path)
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				all, _ := muxNames(t, 5)
				names, keys := byKey(all[:3])
				rec := &observetest.Recorder{}
				opts := append(slices.Clip(sl.opts), advisorylock.WithObserver(rec))
				set := newSet(t, db, all[:3], opts...)
				neighbour, err := newSet(t, db, all[3:], opts...).TryLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				defer mustRelease(t, neighbour)

				var cause error
				err = set.Do(ctx, func(fctx context.Context) error {
					sl.letGo(t, fctx, admin, names[1], keys[1], taken)
					select {
					case <-fctx.Done():
						cause = context.Cause(fctx)
						return cause
					case <-time.After(10 * time.Second): // 200 keep-alives, 30 renewals
						return fmt.Errorf("fn's context still live 10s after %s alone was let go of", names[1])
					}
				})
				if !errors.Is(cause, advisorylock.ErrLockLost) || !errors.Is(err, advisorylock.ErrLockLost) {
					t.Fatalf("fn's context ended with %v, Do returned %v; want both ErrLockLost", cause, err)
				}
				losses := rec.Events("loss")
				if len(losses) != 1 || losses[0].Name != set.Name() || losses[0].Value != sl.cause {
					t.Fatalf("loss events %+v, want one, for the set, cause %s", losses, sl.cause)
				}
				for i, n := range names {
					g, err := newLock(t, rivalDB, n, quiet).TryLock(ctx)
					switch {
					case i == 1 && taken:
						if !errors.Is(err, advisorylock.ErrNotAcquired) {
							t.Fatalf("TryLock of %s, taken by another holder, after the lost set's release: %v, want ErrNotAcquired", n, err)
						}
					case err != nil:
						t.Fatalf("TryLock of %s after the set, lost with %s, returned: %v", n, names[1], err)
					default:
						mustRelease(t, g)
					}
				}
				select {
				case <-neighbour.Lost():
					t.Fatal("the neighbour set was lost with the other set's name")
				default:
				}
				for _, n := range all[3:] {
					if _, err := newLock(t, rivalDB, n, quiet).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
						t.Fatalf("TryLock of the neighbour's %s: %v, want ErrNotAcquired", n, err)
					}
				}
			})
		}
	}
}
