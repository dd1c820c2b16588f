package advisorylock

import (
	"context"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// PoolerMode is what DetectPooler saw.
type PoolerMode int

const (
	// PoolerNotSeen means no multiplexing was seen: a direct connection,
	// or a session-mode pooler.
	PoolerNotSeen PoolerMode = iota
	// PoolerTransaction means sessions are multiplexed, as by a
	// transaction- or statement-mode pooler.
	PoolerTransaction
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
func PoolerHint(dsn string) (pooler string, ok bool) {
	p := parseDSN(dsn)
	if isTrue(p.params["pgbouncer"]) {
		return "pgbouncer", true
	}
	hosts := p.hosts
	if len(hosts) == 0 {
		hosts = []string{""} // libpq's default host, on the ports given
	}
	for i, host := range hosts {
		port := ""
		switch {
		case i < len(p.ports):
			port = p.ports[i]
		case len(p.ports) == 1:
			port = p.ports[0] // libpq: one port serves every host
		}
		host = strings.ToLower(strings.TrimSuffix(host, "."))
		name := hostHint(host, port)
		if p.mysql {
			name = mysqlHostHint(host, port)
		}
		if name != "" {
			return name, true
		}
	}
	return "", false
}

// hostHint names the pooler that a PostgreSQL DSN's host and port
// suggest, or "".
func hostHint(host, port string) string {
	first, rest, _ := strings.Cut(host, ".")
	switch {
	case isRDSProxy(rest):
		return "rds-proxy"
	case strings.HasSuffix(host, ".pooler.supabase.com"):
		return "supabase"
	case strings.HasSuffix(first, "-pooler") && (strings.HasSuffix(host, ".neon.tech") || strings.HasSuffix(host, ".neon.build")):
		return "neon"
	case strings.Contains(host, "pgdog"):
		return "pgdog"
	case strings.Contains(host, "proxysql"), port == "6133":
		return "proxysql"
	case strings.Contains(host, "pgbouncer"), port == "6432":
		return "pgbouncer"
	case port == "6543" && (strings.HasSuffix(host, ".supabase.co") || strings.HasSuffix(host, ".supabase.com")):
		return "supabase"
	case strings.HasSuffix(first, "-pooler"), port == "6543":
		return "pooler"
	}
	return ""
}

// mysqlHostHint names the pooler that a MySQL DSN's host and port
// suggest, or "".
func mysqlHostHint(host, port string) string {
	_, rest, _ := strings.Cut(host, ".")
	switch {
	case isRDSProxy(rest):
		return "rds-proxy"
	case strings.Contains(host, "proxysql"), port == "6033":
		return "proxysql"
	}
	return ""
}

// isRDSProxy reports whether domain (a host without its first label) is
// an RDS Proxy endpoint's: proxy-<id>.<region>.rds.amazonaws.com[.cn], or
// endpoint.proxy-<id>.… for an endpoint added to a proxy.
func isRDSProxy(domain string) bool {
	domain = strings.TrimPrefix(domain, "endpoint.")
	if !strings.HasPrefix(domain, "proxy-") {
		return false
	}
	return strings.HasSuffix(domain, ".rds.amazonaws.com") || strings.HasSuffix(domain, ".rds.amazonaws.com.cn")
}

func isTrue(v string) bool {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "1", "yes", "on":
		return true
	}
	return false
}

// dsnParts is what PoolerHint reads from a DSN.
type dsnParts struct {
	hosts, ports []string
	params       map[string]string // keys lower-cased; host and port included
	mysql        bool              // a go-sql-driver/mysql DSN
}

// parseDSN reads a URL, key=value or go-sql-driver/mysql DSN leniently:
// what it cannot read it leaves out. It never panics.
func parseDSN(dsn string) dsnParts {
	var p dsnParts
	if rest, ok := cutScheme(dsn); ok {
		p = parseURLDSN(rest)
	} else if addr, ok := mysqlAddress(dsn); ok {
		host, port := splitHostPort(addr)
		return dsnParts{hosts: []string{host}, ports: []string{port}, mysql: true}
	} else {
		p.params = parseKeyValueDSN(dsn)
	}
	if v, ok := p.params["host"]; ok {
		p.hosts = splitList(v)
	}
	if v, ok := p.params["port"]; ok {
		p.ports = splitList(v)
	}
	return p
}

// mysqlAddress returns the address of a go-sql-driver/mysql DSN,
// [user[:password]@]tcp(host:port)/db[?params]: what is inside tcp(…).
// A password may hold "@" or "(": the last "@tcp(" is the one. Text with
// a space or "=" before it is key=value, not this form.
func mysqlAddress(dsn string) (addr string, ok bool) {
	start := 0
	if i := strings.LastIndex(dsn, "@tcp("); i >= 0 {
		start = i + len("@tcp(")
	} else if strings.HasPrefix(dsn, "tcp(") {
		start = len("tcp(")
	} else {
		return "", false
	}
	if strings.ContainsAny(dsn[:start], " \t\r\n=") {
		return "", false
	}
	addr, _, ok = strings.Cut(dsn[start:], ")")
	return addr, ok
}

// cutScheme strips postgres:// or postgresql:// (any case).
func cutScheme(dsn string) (rest string, ok bool) {
	s := strings.TrimSpace(dsn)
	for _, scheme := range []string{"postgres://", "postgresql://"} {
		if len(s) >= len(scheme) && strings.EqualFold(s[:len(scheme)], scheme) {
			return s[len(scheme):], true
		}
	}
	return "", false
}

// parseURLDSN reads user@host1:port1,host2:port2/db?key=value&… (the part
// after the scheme). Query parameters override the authority, as in libpq.
func parseURLDSN(rest string) dsnParts {
	p := dsnParts{params: map[string]string{}}
	rest, _, _ = strings.Cut(rest, "#")
	rest, query, _ := strings.Cut(rest, "?")
	authority, _, _ := strings.Cut(rest, "/")
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		authority = authority[at+1:]
	}
	for hp := range strings.SplitSeq(authority, ",") {
		host, port := splitHostPort(hp)
		p.hosts = append(p.hosts, unescape(host))
		p.ports = append(p.ports, port)
	}
	for kv := range strings.SplitSeq(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k = strings.ToLower(unescape(k)); k != "" {
			p.params[k] = unescape(v)
		}
	}
	return p
}

// splitHostPort splits host:port, [v6]:port, or a bare host.
func splitHostPort(hp string) (host, port string) {
	if strings.HasPrefix(hp, "[") {
		if end := strings.IndexByte(hp, ']'); end > 0 {
			host, rest := hp[1:end], hp[end+1:]
			return host, strings.TrimPrefix(rest, ":")
		}
		return hp, ""
	}
	if i := strings.LastIndexByte(hp, ':'); i >= 0 {
		return hp[:i], hp[i+1:]
	}
	return hp, ""
}

func unescape(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}

// parseKeyValueDSN reads libpq's key=value form: spaces around '=' are
// allowed, and a value may be single-quoted, with a backslash escaping the
// next character. Keys are lower-cased. Unreadable input yields what was
// read before it.
func parseKeyValueDSN(dsn string) map[string]string {
	kv := map[string]string{}
	s := dsn
	for {
		s = strings.TrimLeft(s, " \t\r\n")
		if s == "" {
			return kv
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return kv
		}
		key := strings.ToLower(strings.TrimSpace(s[:eq]))
		if key == "" || strings.ContainsAny(key, " \t\r\n") {
			return kv
		}
		var val string
		val, s = readValue(strings.TrimLeft(s[eq+1:], " \t\r\n"))
		kv[key] = val
	}
}

// readValue reads one value at the start of s and returns it and the rest.
func readValue(s string) (val, rest string) {
	var b strings.Builder
	if strings.HasPrefix(s, "'") {
		s = s[1:]
		for s != "" {
			c := s[0]
			s = s[1:]
			switch {
			case c == '\\' && s != "":
				_, n := utf8.DecodeRuneInString(s)
				b.WriteString(s[:n])
				s = s[n:]
			case c == '\'':
				return b.String(), s
			default:
				b.WriteByte(c)
			}
		}
		return b.String(), ""
	}
	end := strings.IndexAny(s, " \t\r\n")
	if end < 0 {
		end = len(s)
	}
	for i := 0; i < end; i++ {
		if s[i] == '\\' && i+1 < end {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String(), s[end:]
}

func splitList(v string) []string {
	var out []string
	for part := range strings.SplitSeq(v, ",") {
		out = append(out, strings.TrimSpace(part))
	}
	return out
}

// DetectPooler probes db for a pooler that multiplexes sessions, as
// PgBouncer does in transaction or statement mode, and returns
// PoolerTransaction if it sees one.
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
// What it proves: PoolerTransaction is never a guess; the connections
// were seen sharing or switching sessions. What it cannot prove:
// PoolerNotSeen means only that no round caught it. A pooler that happens
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
// backend without session locks, such as SQLite, it returns PoolerNotSeen.
// It holds at most two connections of db, only while it runs, and sends
// at most 24 short statements. It returns the pool's or the database's
// errors wrapped, and ctx's error when ctx ends first. Its result is not
// cached; New caches its own check per *sql.DB.
func DetectPooler(ctx context.Context, db DB) (PoolerMode, error) {
	cfg := newConfig(nil)
	b, err := resolveBackend(ctx, db, &cfg)
	switch {
	case dbutil.PoolerSign(err) != "":
		// The first-use check's statement met another client's prepared
		// statement, or lost its own: a sign, as in the probe.
		return PoolerTransaction, nil
	case err != nil:
		return PoolerNotSeen, dbutil.PoolerProbeError(err)
	}
	s, ok := b.(backend.SessionIdentifier)
	if !ok {
		return PoolerNotSeen, nil
	}
	transaction, _, err := dbutil.ProbePooler(ctx, db, s)
	if transaction {
		return PoolerTransaction, nil
	}
	return PoolerNotSeen, err
}

// checkPooler refuses session locks on db, with ErrTransactionPooler,
// when the probe sees a transaction-mode pooler (see dbutil.CheckPooler).
// A backend that cannot name sessions (no SessionIdentifier) is not
// probed.
func checkPooler(ctx context.Context, db DB, b backend.SessionLocker) error {
	s, ok := b.(backend.SessionIdentifier)
	if !ok {
		return nil
	}
	return dbutil.CheckPooler(ctx, db, s)
}
