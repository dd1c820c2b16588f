package postgresbackend

import (
	"context"
	"database/sql"
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

// quoteSeeds are strings that have broken SQL quoting somewhere: quotes,
// backslashes in every order, escape sequences a server could expand,
// other quoting syntaxes, comments, placeholders and multibyte text.
var quoteSeeds = []string{
	"",
	"plain",
	"it's",
	"''",
	`back\slash`,
	`\`,
	`\\`,
	`\'`,
	`'\`,
	`\\'`,
	`\''\`,
	`x'; DROP TABLE advisorylock_leases; --`,
	`'); DELETE FROM advisorylock_fences; --`,
	`E'\x41'`,
	`\x41\101\u0041\U00000041\b\f\n\r\t`,
	`U&'\0041'`,
	"$$dollar$$ $tag$ $1 $2::text ? ?1 :name @p1 %s %d %[1]s",
	"-- comment /* block */ */ /*",
	`"double" ""quoted""`,
	"tab\tnewline\nreturn\r",
	"\x01\x7f control",
	"snowman ☃, emoji 🎉, combining é, RTL \u202e, BOM \ufeff",
	"日本語のテキスト \\ 표 ソ", // multibyte characters whose bytes end in 0x5c in other encodings
	strings.Repeat(`\'`, 500),
	strings.Repeat("n", 10240),
}

// quoteConns returns one lib/pq or pgx connection per value of
// standard_conforming_strings, which changes how the server reads
// ordinary string constants but must not change how it reads ours.
func quoteConns(t testing.TB, driverName string) map[string]*sql.Conn {
	t.Helper()
	db := testdb.OpenPostgres(t, driverName)
	conns := map[string]*sql.Conn{}
	for _, scs := range []string{"on", "off"} {
		conn, err := db.Conn(context.Background())
		if err != nil {
			t.Fatalf("conn: %v", err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		if _, err := conn.ExecContext(context.Background(), "SET standard_conforming_strings = "+scs); err != nil {
			t.Fatalf("SET standard_conforming_strings = %s: %v", scs, err)
		}
		conns[scs] = conn
	}
	return conns
}

// checkQuoted asserts that the server reads quoteLiteral(s) back as s, or
// that quoteLiteral refused a string no text value can hold.
func checkQuoted(t testing.TB, conns map[string]*sql.Conn, s string) {
	t.Helper()
	lit, err := quoteLiteral(s)
	storable := utf8.ValidString(s) && !strings.ContainsRune(s, 0)
	if !storable {
		if err == nil {
			t.Fatalf("quoteLiteral(%q) = %s, want an error", s, lit)
		}
		return
	}
	if err != nil {
		t.Fatalf("quoteLiteral(%q): %v", s, err)
	}
	for scs, conn := range conns {
		var got string
		if err := conn.QueryRowContext(context.Background(), "SELECT"+lit).Scan(&got); err != nil {
			t.Fatalf("standard_conforming_strings=%s: SELECT%s: %v", scs, lit, err)
		}
		if got != s {
			t.Fatalf("standard_conforming_strings=%s: SELECT%s = %q, want %q", scs, lit, got, s)
		}
	}
}

func TestQuoteLiteralReadsBackExactly(t *testing.T) {
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			conns := quoteConns(t, drv)
			for _, s := range quoteSeeds {
				checkQuoted(t, conns, s)
			}
		})
	}
}

func TestQuoteLiteralRefusesWhatTextCannotHold(t *testing.T) {
	for _, s := range []string{"a\x00b", "\x00", "bad \xff utf-8", "\xc3"} {
		if lit, err := quoteLiteral(s); err == nil {
			t.Errorf("quoteLiteral(%q) = %s, want an error", s, lit)
		} else if !strings.HasPrefix(err.Error(), "advisorylock: ") {
			t.Errorf("quoteLiteral(%q) error %q lacks the package prefix", s, err)
		}
	}
}

// FuzzQuoteLiteral checks, against the real server through lib/pq, that
// SELECT <quoteLiteral(s)> returns exactly s under both settings of
// standard_conforming_strings, for any s a text value can hold.
func FuzzQuoteLiteral(f *testing.F) {
	for _, s := range quoteSeeds {
		f.Add(s)
	}
	conns := quoteConns(f, "postgres")
	f.Fuzz(func(t *testing.T, s string) {
		checkQuoted(t, conns, s)
	})
}

// inline must write a statement's arguments as literals that PostgreSQL
// reads back as the same values: checked on the real server for every
// lease statement's placeholders, for strings that hold SQL and
// placeholders themselves and for the extreme keys.
func TestInlineWritesArgumentsTheServerReadsBack(t *testing.T) {
	conns := quoteConns(t, "postgres")
	ctx := context.Background()
	for _, s := range append(quoteSeeds, "$1", "$2::text", "100%") {
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			continue // no text value holds it: TestQuoteLiteralRefusesWhatTextCannotHold
		}
		for _, n := range []int64{0, 1, -1, math.MaxInt64, math.MinInt64} {
			q, err := inline("SELECT $1::text, $2::bigint, $1::text = $1::text", []any{s, n})
			if err != nil {
				t.Fatal(err)
			}
			for _, conn := range conns {
				var gotS string
				var gotN int64
				var same bool
				if err := conn.QueryRowContext(ctx, q).Scan(&gotS, &gotN, &same); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
				if gotS != s || gotN != n || !same {
					t.Fatalf("%s read back (%q, %d), want (%q, %d)", q, gotS, gotN, s, n)
				}
			}
		}
	}
}

func TestInlineRefusesAPlaceholderWithoutAnArgument(t *testing.T) {
	for _, text := range []string{"SELECT $2", "SELECT $", "SELECT $0"} {
		if q, err := inline(text, []any{int64(1)}); err == nil {
			t.Errorf("inline(%q) = %q, want an error", text, q)
		}
	}
	if q, err := inline("SELECT $1", []any{1.5}); err == nil {
		t.Errorf("inline of a float = %q, want an error", q)
	}
}
