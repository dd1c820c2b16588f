package testdb

import "testing"

func TestWithHostPort(t *testing.T) {
	cases := []struct{ dsn, hostport, want string }{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "127.0.0.1:6000",
			"postgres://postgres@127.0.0.1:6000/test?sslmode=disable"},
		{"postgresql://u:p%40ss@db.example:5432/x?sslmode=disable&application_name=a", "127.0.0.1:1",
			"postgresql://u:p%40ss@127.0.0.1:1/x?sslmode=disable&application_name=a"},
		{"host=localhost port=5432 dbname=test user=postgres sslmode=disable", "127.0.0.1:7000",
			"dbname=test host=127.0.0.1 port=7000 sslmode=disable user=postgres"},
		{"dbname='my db' host=x", "127.0.0.1:7", "dbname='my db' host=127.0.0.1 port=7"},
	}
	for _, c := range cases {
		if got := WithHostPort(c.dsn, c.hostport); got != c.want {
			t.Errorf("WithHostPort(%q, %q)\n got %q\nwant %q", c.dsn, c.hostport, got, c.want)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	cases := []struct{ dsn, want string }{
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres@127.0.0.1:5432/other?sslmode=disable"},
		{"postgres://postgres@127.0.0.1:5432?sslmode=disable", "postgres://postgres@127.0.0.1:5432/other?sslmode=disable"},
		{"host=h dbname=test", "dbname=other host=h"},
	}
	for _, c := range cases {
		if got := WithDatabase(c.dsn, "other"); got != c.want {
			t.Errorf("WithDatabase(%q)\n got %q\nwant %q", c.dsn, got, c.want)
		}
	}
}

func TestParseConnParams(t *testing.T) {
	cases := []struct {
		dsn  string
		want connParams
	}{
		{"postgres://alice:secret@10.0.0.1:6543/app?sslmode=disable", connParams{"10.0.0.1", "6543", "app", "alice", "secret"}},
		{"postgres://localhost", connParams{"localhost", "5432", "postgres", "postgres", ""}},
		{"postgres:///db?host=/var/run/postgresql&port=5433", connParams{"/var/run/postgresql", "5433", "db", "postgres", ""}},
		{`host=h port=1 dbname='a b' user=u password='it\'s'`, connParams{"h", "1", "a b", "u", "it's"}},
		{"user=bob", connParams{"localhost", "5432", "bob", "bob", ""}},
	}
	for _, c := range cases {
		got, err := parseConnParams(c.dsn)
		if err != nil || got != c.want {
			t.Errorf("parseConnParams(%q) = %+v, %v; want %+v", c.dsn, got, err, c.want)
		}
	}
	for _, bad := range []string{"host", "host='unterminated", "=x"} {
		if _, err := parseConnParams(bad); err == nil {
			t.Errorf("parseConnParams(%q): no error", bad)
		}
	}
}

func TestHostPort(t *testing.T) {
	if got := HostPort(t, "postgres://u@127.0.0.1:5999/db"); got != "127.0.0.1:5999" {
		t.Fatalf("got %q", got)
	}
	if got := HostPort(t, "host=::1 port=7"); got != "[::1]:7" {
		t.Fatalf("got %q", got)
	}
}
