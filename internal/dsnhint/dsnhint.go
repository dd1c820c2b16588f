// Package dsnhint reads a PostgreSQL or MySQL DSN (URL or key=value, or
// go-sql-driver/mysql's form) for the signs of a pooler in its hosts,
// ports and parameters: advisorylock.PoolerHint.
package dsnhint

import (
	"net/url"
	"strings"
	"unicode/utf8"
)

// Pooler is advisorylock.PoolerHint: the pooler that dsn's hosts, ports
// and parameters suggest, and whether it names one. It reads the text
// alone, never fails and never panics.
func Pooler(dsn string) (pooler string, ok bool) {
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
