package advisorylock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// fenceAdmit runs Fence.Admit in a transaction of its own, commits if it
// admitted and rolls back otherwise.
func fenceAdmit(t testing.TB, db *sql.DB, f *advisorylock.Fence, token advisorylock.FencingToken) error {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if err := f.Admit(ctx, tx, token); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return nil
}

func TestParseFencingTokenRejectsNonPositive(t *testing.T) {
	for _, v := range []int64{0, -1, math.MinInt64} {
		if tok, err := advisorylock.ParseFencingToken(v); err == nil {
			t.Errorf("ParseFencingToken(%d) = %d, nil; want an error", v, tok)
		}
	}
	for _, v := range []int64{1, 2, math.MaxInt64} {
		tok, err := advisorylock.ParseFencingToken(v)
		if err != nil || int64(tok) != v {
			t.Errorf("ParseFencingToken(%d) = %d, %v", v, tok, err)
		}
	}
	if s := fmt.Sprint(advisorylock.FencingToken(42)); s != "42" {
		t.Errorf("fmt.Sprint = %q, want 42", s)
	}
	if _, err := advisorylock.FencingToken(math.MaxInt64 + 1).Value(); err == nil {
		t.Error("Value() of a token above MaxInt64 succeeded")
	}
}

func TestFencingTokenAdmitsEqualAndLarger(t *testing.T) {
	for _, c := range []struct {
		highest, incoming advisorylock.FencingToken
		want              bool
	}{{5, 5, true}, {5, 6, true}, {5, 4, false}, {1, math.MaxInt64, true}, {2, 1, false}} {
		if got := c.highest.Admits(c.incoming); got != c.want {
			t.Errorf("FencingToken(%d).Admits(%d) = %v, want %v", c.highest, c.incoming, got, c.want)
		}
	}
}

func TestFencingTokenRoundTripsThroughABigintColumn(t *testing.T) {
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		ctx := context.Background()
		conn, err := b.open(t).Conn(ctx) // one session: the table is temporary
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		temp := "CREATE TEMP TABLE tokens (id int, token bigint)"
		if b.mysql {
			temp = "CREATE TEMPORARY TABLE tokens (id int, token bigint)"
		}
		if _, err := conn.ExecContext(ctx, temp); err != nil {
			t.Fatal(err)
		}
		insert := "INSERT INTO tokens VALUES (1, $1)"
		read := "SELECT token FROM tokens WHERE id = $1"
		if b.bindVar == "?" {
			insert, read = "INSERT INTO tokens VALUES (1, ?)", "SELECT token FROM tokens WHERE id = ?"
		}
		const want = advisorylock.FencingToken(math.MaxInt64 - 7)
		if _, err := conn.ExecContext(ctx, insert, want); err != nil {
			t.Fatalf("token as an argument: %v", err)
		}
		var got advisorylock.FencingToken
		if err := conn.QueryRowContext(ctx, read, 1).Scan(&got); err != nil || got != want {
			t.Fatalf("scanned %d, %v; want %d", got, err, want)
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO tokens VALUES (2, NULL), (3, 0), (4, -5)"); err != nil {
			t.Fatal(err)
		}
		for id := 2; id <= 4; id++ {
			if err := conn.QueryRowContext(ctx, read, id).Scan(&got); err == nil {
				t.Errorf("row %d scanned as token %d, want an error", id, got)
			}
		}
	})
}

func TestFenceAdmitsEqualAndHigherAndRefusesLower(t *testing.T) {
	t.Parallel()
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		db := b.open(t)
		resource := testdb.UniqueName(t)
		f, err := advisorylock.NewFence(db, resource)
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range []advisorylock.FencingToken{5, 5, 7} {
			if err := fenceAdmit(t, db, f, tok); err != nil {
				t.Fatalf("Admit(%d): %v", tok, err)
			}
		}
		err = fenceAdmit(t, db, f, 6)
		if !isStale(err, resource, 6, 7) {
			t.Fatalf("Admit(6) after 7 = %v, want ErrStaleToken naming %q, 6 and 7", err, resource)
		}
		if err := fenceAdmit(t, db, f, 7); err != nil { // the refusal changed nothing
			t.Fatalf("Admit(7) after a refusal: %v", err)
		}
		other, err := advisorylock.NewFence(b.open(t), testdb.UniqueName(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := fenceAdmit(t, db, other, 1); err != nil {
			t.Fatalf("another resource refused token 1: %v", err)
		}
		for _, bad := range []advisorylock.FencingToken{0, math.MaxInt64 + 1} {
			if err := fenceAdmit(t, db, f, bad); err == nil || errors.Is(err, advisorylock.ErrStaleToken) {
				t.Fatalf("Admit(%d) = %v, want an invalid-token error", bad, err)
			}
		}
	})
}

func TestFenceAdmitRolledBackAdmitsNothing(t *testing.T) {
	t.Parallel()
	eachLeaseBackend(t, func(t *testing.T, b leaseBackend) {
		ctx := context.Background()
		db := b.open(t)
		f, err := advisorylock.NewFence(db, testdb.UniqueName(t))
		if err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Admit(ctx, tx, 9); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := fenceAdmit(t, db, f, 3); err != nil {
			t.Fatalf("Admit(3) after a rolled-back Admit(9): %v", err)
		}
	})
}

// TestFenceOrdersConcurrentWriters shows that the check and the write
// commit together on PostgreSQL: a second admit of the resource waits for
// the first transaction, and then judges its token against the committed
// one.
func TestFenceOrdersConcurrentWriters(t *testing.T) {
	t.Parallel()
	eachPostgresDriver(t, func(t *testing.T, drv string) {
		for _, c := range []struct {
			name          string
			first, second advisorylock.FencingToken
			stale         bool
		}{
			{"newer holder first", 2, 1, true},
			{"older holder first", 1, 2, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				ctx := context.Background()
				db := testdb.OpenPostgres(t, drv)
				f, err := advisorylock.NewFence(db, testdb.UniqueName(t))
				if err != nil {
					t.Fatal(err)
				}
				tx1, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx1.Rollback()
				if err := f.Admit(ctx, tx1, c.first); err != nil {
					t.Fatal(err)
				}
				tx2, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx2.Rollback()
				var pid int
				if err := tx2.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
					t.Fatal(err)
				}
				second := make(chan error, 1)
				go func() { second <- f.Admit(ctx, tx2, c.second) }()
				testdb.WaitFor(t, leaseWait, func() bool {
					var waiting bool
					err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)", pid).Scan(&waiting)
					return err == nil && waiting
				}, "the second admit never waited for the first transaction")
				if err := tx1.Commit(); err != nil {
					t.Fatal(err)
				}
				var err2 error
				select {
				case err2 = <-second:
				case <-time.After(leaseWait):
					t.Fatal("the second admit never returned")
				}
				highest, stale := staleHighest(err2)
				if c.stale != stale {
					t.Fatalf("second Admit(%d) after a committed Admit(%d) = %v, want stale %v", c.second, c.first, err2, c.stale)
				}
				if c.stale && highest != c.first {
					t.Fatalf("stale error reports highest %d, want %d", highest, c.first)
				}
			})
		}
	})
}
