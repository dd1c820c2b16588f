package advisorylock

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock/internal/testdb"

	"github.com/advisorylock/advisorylock/backend"
)

// TestProbeRoundRate measures how often ONE round of the pooler probe sees
// multiplexing, with two connections (the normal probe) and with one (the
// SetMaxOpenConns(1) fallback), on an idle PgBouncer transaction pool and
// on one kept busy by other clients; directly and through the session pool
// it must never see any. The figures are logged (docs/production.md quotes
// them); only the absence of false positives and a non-zero rate where a
// pooler multiplexes are asserted.
func TestProbeRoundRate(t *testing.T) {
	testdb.Slow(t, "measures 200 probe rounds per pool and driver")
	txDSN, sessionDSN := testdb.PgBouncer(t)
	const rounds = 200
	for _, drv := range testdb.Drivers {
		t.Run(drv, func(t *testing.T) {
			direct := testdb.OpenPostgres(t, drv)
			session := testdb.OpenPostgresDSN(t, drv, bouncerDSN(drv, sessionDSN))
			tx := testdb.OpenPostgresDSN(t, drv, bouncerDSN(drv, txDSN))
			for _, c := range []struct {
				name string
				db   *sql.DB
			}{{"direct", direct}, {"session pool", session}} {
				for _, paired := range []bool{true, false} {
					if n := roundsSeeing(t, c.db, drv, paired, rounds); n != 0 {
						t.Errorf("%s, paired=%v: %d/%d rounds saw multiplexing, want 0", c.name, paired, n, rounds)
					}
				}
			}
			for _, busy := range []int{0, 2, 4} {
				stop := testdb.KeepBusy(t, drv, bouncerDSN(drv, txDSN), busy)
				paired := roundsSeeing(t, tx, drv, true, rounds)
				single := roundsSeeing(t, tx, drv, false, rounds)
				stop()
				t.Logf("%s, transaction pool (pool size %d), %d other clients busy: one round saw multiplexing %d/%d times with two connections, %d/%d with one",
					drv, testdb.PgBouncerPoolSize, busy, paired, rounds, single, rounds)
				if paired == 0 {
					t.Errorf("%d other clients busy: the two-connection round never saw the transaction pool multiplex", busy)
				}
			}
		})
	}
}

// bouncerDSN configures a PgBouncer DSN for drv as its documentation asks
// for a transaction pool without prepared statements: pgx in exec mode;
// lib/pq needs nothing.
func bouncerDSN(drv, dsn string) string {
	if drv == "pgx" {
		return dsn + "&default_query_exec_mode=exec"
	}
	return dsn
}

// roundsSeeing runs n probe rounds on db and counts those that saw
// multiplexing.
func roundsSeeing(t *testing.T, db *sql.DB, drv string, paired bool, n int) int {
	t.Helper()
	s := backend.SessionIdentifier(Postgres().(*postgres).forDB(db))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seen := 0
	for range n {
		why, _, err := probeRound(ctx, db, s, paired)
		if err != nil {
			t.Fatalf("%s probe round: %v", drv, err)
		}
		if why != "" {
			seen++
		}
	}
	return seen
}

// FuzzPoolerHint: PoolerHint never panics on any input, reports ok exactly
// when it names a pooler, and reads a host and port the same in URL and
// key=value form.
func FuzzPoolerHint(f *testing.F) {
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
		name, ok := PoolerHint(dsn)
		if ok != (name != "") {
			t.Fatalf("PoolerHint(%q) = %q, %v", dsn, name, ok)
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
		if name2, _ := PoolerHint(kv); name2 != name {
			t.Fatalf("PoolerHint(%q) = %q but PoolerHint(%q) = %q", dsn, name, kv, name2)
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
