package dsnhint

import (
	"fmt"
	"maps"
	"strings"
	"testing"
)

// FuzzPoolerHint: PoolerHint never panics on any input, reports ok exactly
// when it names a pooler, and reads a host and port the same in URL and
// key=value form.
func FuzzPooler(f *testing.F) {
	for _, s := range []string{
		"postgres://app@db.internal:6432/app",
		"postgresql://u:p@ep-x-1-pooler.us-east-2.aws.neon.tech/db?sslmode=require",
		"postgres://u@h1:5432,[::1]:6543/db?pgbouncer=true&host=%2Ftmp",
		"host=myproxy.proxy-abc.us-east-1.rds.amazonaws.com port=5432",
		"host='it\\'s pgbouncer' port = 6543 pgbouncer=true",
		"host=aws-0-eu-central-1.pooler.supabase.com port=6543",
		"app:pw@tcp(p.endpoint.proxy-x.us-east-1.rds.amazonaws.com:3306)/db", "u@tcp([::1]:6033)/x",
		"postgres://[::1", "host='", "=", "postgres://%zz@/?&=&%", "\x00\xff'\\",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		name, ok := Pooler(dsn)
		if ok != (name != "") {
			t.Fatalf("Pooler(%q) = %q, %v", dsn, name, ok)
		}
		p := parseDSN(dsn)
		if p.mysql || len(p.hosts) != 1 || len(p.ports) > 1 {
			return
		}
		host, port := p.hosts[0], ""
		if len(p.ports) == 1 {
			port = p.ports[0]
		}
		if strings.ContainsAny(host, ",") || strings.ContainsAny(port, ",") {
			return
		}
		kv := "host=" + quoteKeyValue(host) + " port=" + quoteKeyValue(port)
		if isTrue(p.params["pgbouncer"]) {
			kv += " pgbouncer=true"
		}
		if name2, _ := Pooler(kv); name2 != name {
			t.Fatalf("Pooler(%q) = %q but Pooler(%q) = %q", dsn, name, kv, name2)
		}
	})
}

// FuzzParseKeyValueDSN: the key=value reader never panics, and what it
// reads, written back with every value quoted, reads back the same.
func FuzzParseKeyValueDSN(f *testing.F) {
	for _, s := range []string{
		"host=db port=6432 dbname=app",
		"host = 'a b' password='it\\'s' sslmode=disable",
		"a='\\\\' b=\\x c=", "host='unterminated", "=x", "k=v k=w", "x y=z", "\t\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dsn string) {
		kv := parseKeyValueDSN(dsn)
		var b strings.Builder
		for k, v := range kv {
			if strings.ContainsAny(k, " \t\r\n=") || k == "" {
				t.Fatalf("parseKeyValueDSN(%q) read key %q", dsn, k)
			}
			fmt.Fprintf(&b, "%s=%s ", k, quoteKeyValue(v))
		}
		again := parseKeyValueDSN(b.String())
		if !maps.Equal(kv, again) {
			t.Fatalf("parseKeyValueDSN(%q) = %q; written back as %q it reads %q", dsn, kv, b.String(), again)
		}
	})
}

// quoteKeyValue quotes v for libpq's key=value form.
func quoteKeyValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
