package advisorylock

import (
	"context"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
	"github.com/advisorylock/advisorylock/internal/dsnhint"
)

// PoolerHint reads a DSN for signs of a well-known connection pooler and
// returns its short name. It reads a PostgreSQL DSN in URL form
// (postgres://user@host:port/db?opts) or key=value form (host=… port=…),
// and a github.com/go-sql-driver/mysql DSN (user@tcp(host:port)/db):
//
//	"rds-proxy"  a host like name.proxy-id.region.rds.amazonaws.com, or an
//	             added endpoint's name.endpoint.proxy-id.region…
//	"supabase"   a *.pooler.supabase.com host (Supavisor: transaction mode
//	             on port 6543, session mode on 5432), or a Supabase host on
//	             port 6543 (its dedicated PgBouncer)
//	"neon"       a Neon host whose first label ends in "-pooler"
//	"pgdog"      a host containing "pgdog"
//	"proxysql"   a host containing "proxysql", or ProxySQL's default port
//	             (6133 for PostgreSQL, 6033 for MySQL)
//	"pgbouncer"  pgbouncer=true, a host containing "pgbouncer", or port 6432
//	             (PgBouncer's default, and PgDog's)
//	"pooler"     another host whose first label ends in "-pooler", or port 6543
//
// A MySQL DSN is read for the signs that apply to MySQL: RDS Proxy's
// hosts and ProxySQL's. Every host and port of a multi-host DSN is read.
// PoolerHint looks at the text alone: it does no I/O, never fails and
// never panics, and returns ("", false) for a DSN without signs or one it
// cannot read. A sign is a hint, not a verdict: the pooler may run in
// session mode (where Lock works), and a pooler on an ordinary port shows
// no sign. DetectPooler tells by probing; docs/production.md says what
// works behind each of these poolers.
func PoolerHint(dsn string) (pooler string, ok bool) { return dsnhint.Pooler(dsn) }

// DetectPooler probes db for a pooler that multiplexes sessions, as
// PgBouncer does in transaction or statement mode, and returns
// transaction true if it sees one (a transaction- or statement-mode
// pooler), false if it saw none (a direct connection, or a session-mode
// pooler, or one the probe missed).
//
// The probe rests on one fact: two connections open at the same time
// each have their own server session, unless something between client
// and server multiplexes them. In each round it checks out two
// connections A and B, reads the server session's identity (backend pid,
// server address and port, postmaster start time) on A, then on B, then
// on A again, and reports multiplexing when A and B shared a session or
// A's session changed between its two statements. It runs a few rounds
// and stops at the first sign. A statement failing because a prepared
// statement vanished or already exists (SQLSTATE 26000 or 42P05) is also
// taken as a sign: it means the driver's statements landed on different
// sessions.
//
// What it proves: true is never a guess; the connections were seen
// sharing or switching sessions. What it cannot prove: false means only
// that no round caught it. A pooler that happens
// to give A and B different sessions and A the same one twice in every
// round goes unseen. On PgBouncer 1.18 in transaction mode one round
// caught it every time on an idle pool and about four times in five with
// more busy clients than server connections; the probe runs 8 rounds.
// When db cannot give two connections at once (SetMaxOpenConns(1), or
// the second connection and its first statement take longer than a
// second, as behind a session pooler with no free server connection) a
// round reads A's identity twice instead, which catches a pooler only
// when other clients move A to another session in between: on an idle
// pooler it sees nothing. Whatever the probe saw, Release still compares
// the sessions of acquire and release (see ErrTransactionPooler).
//
// DetectPooler needs a PostgreSQL backend (detected as New does); for a
// backend without session locks, such as SQLite, it returns false.
// It holds at most two connections of db, only while it runs, and sends
// at most 24 short statements. It returns the pool's or the database's
// errors wrapped, and ctx's error when ctx ends first. Its result is not
// cached; New caches its own check per *sql.DB.
func DetectPooler(ctx context.Context, db DB) (transaction bool, err error) {
	cfg := newConfig(nil)
	b, err := resolveBackend(ctx, db, &cfg)
	switch {
	case dbutil.PoolerSign(err) != "":
		// The first-use check's statement met another client's prepared
		// statement, or lost its own: a sign, as in the probe.
		return true, nil
	case err != nil:
		return false, dbutil.PoolerProbeError(err)
	}
	s, ok := b.(backend.SessionIdentifier)
	if !ok {
		return false, nil
	}
	transaction, _, err = dbutil.ProbePooler(ctx, db, s)
	if transaction {
		return true, nil
	}
	return false, err
}
