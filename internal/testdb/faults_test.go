package testdb

import (
	"context"
	"strings"
	"testing"
)

func TestWithParamSetsOneParameterInEitherForm(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u@h:5432/db?sslmode=disable", "postgres://u@h:5432/db?application_name=app%20x&sslmode=disable"},
		{"host=h port=5432 dbname=db", "application_name='app x' dbname=db host=h port=5432"},
		{"host='unterminated", "host='unterminated"},
	} {
		if got := WithParam(tc.dsn, "application_name", "app x"); got != tc.want {
			t.Errorf("WithParam(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
	}
}

func TestCounterCountsBumpsOverlapsAndStaleWrites(t *testing.T) {
	ctx := context.Background()
	db := OpenSQLite(t, SQLitePath(t), "")
	c := NewCounter(t, db, true)
	if !strings.HasPrefix(c.Table, "fault_counter_") {
		t.Fatalf("table %q", c.Table)
	}
	for _, want := range []int64{1, 2} { // the second Enter overlaps the first
		if inside, err := c.Enter(ctx, db); err != nil || inside != want {
			t.Fatalf("Enter = %d, %v; want %d", inside, err, want)
		}
	}
	for range 2 {
		if err := c.Bump(ctx, db); err != nil {
			t.Fatal(err)
		}
		if err := c.Exit(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	for _, token := range []int64{3, 5, 4} { // 4 after 5: one regression
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Record(ctx, tx, token); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.State(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	want := CounterState{N: 2, Holders: 0, Violations: 1, Writes: 3, MaxToken: 5, Regressions: 1}
	if s != want {
		t.Fatalf("State = %+v, want %+v", s, want)
	}
}
