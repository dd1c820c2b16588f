package testdb

import (
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"
	"testing"
)

// WithHostPort returns dsn with its host and port replaced by hostport
// ("host:port"), for pointing a DSN at a proxy or PgBouncer. URL DSNs keep
// everything else; key=value DSNs get their host and port keys set. A dsn
// that cannot be parsed is returned unchanged.
func WithHostPort(dsn, hostport string) string {
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return dsn
		}
		u.Host = hostport
		return u.String()
	}
	kv, err := parseKeyValue(dsn)
	if err != nil {
		return dsn
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		host, port = hostport, ""
	}
	kv["host"] = host
	delete(kv, "port")
	if port != "" {
		kv["port"] = port
	}
	return formatKeyValue(kv)
}

// HostPort returns the "host:port" a DSN (URL or key=value) connects to,
// with libpq's defaults for what it leaves out: the target for NewProxy.
func HostPort(t testing.TB, dsn string) string {
	t.Helper()
	p, err := parseConnParams(dsn)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	return net.JoinHostPort(p.host, p.port)
}

func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// connParams are the parts of a DSN the harness needs to reach the same
// server another way (PgBouncer's upstream).
type connParams struct {
	host, port, dbname, user, password string
}

// parseConnParams reads a URL or key=value DSN, filling in libpq's defaults
// for what is missing.
func parseConnParams(dsn string) (connParams, error) {
	p := connParams{}
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return p, err
		}
		p.host, p.port = u.Hostname(), u.Port()
		p.dbname = strings.TrimPrefix(u.Path, "/")
		if u.User != nil {
			p.user = u.User.Username()
			p.password, _ = u.User.Password()
		}
		q := u.Query()
		for key, dst := range map[string]*string{"host": &p.host, "port": &p.port, "dbname": &p.dbname, "user": &p.user, "password": &p.password} {
			if v := q.Get(key); v != "" {
				*dst = v
			}
		}
	} else {
		kv, err := parseKeyValue(dsn)
		if err != nil {
			return p, err
		}
		p = connParams{host: kv["host"], port: kv["port"], dbname: kv["dbname"], user: kv["user"], password: kv["password"]}
	}
	if p.host == "" {
		p.host = "localhost"
	}
	if p.port == "" {
		p.port = "5432"
	}
	if p.user == "" {
		p.user = "postgres"
	}
	if p.dbname == "" {
		p.dbname = p.user
	}
	return p, nil
}

// parseKeyValue parses libpq's key=value form: values may be single-quoted,
// with backslash escaping a quote or a backslash.
func parseKeyValue(dsn string) (map[string]string, error) {
	kv := map[string]string{}
	s := strings.TrimSpace(dsn)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, fmt.Errorf("testdb: bad key=value DSN near %q", s)
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t")
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			s = s[1:]
			closed := false
			for len(s) > 0 {
				c := s[0]
				s = s[1:]
				if c == '\\' && len(s) > 0 {
					val.WriteByte(s[0])
					s = s[1:]
					continue
				}
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return nil, fmt.Errorf("testdb: unterminated quote in DSN")
			}
		} else {
			end := strings.IndexAny(s, " \t")
			if end < 0 {
				end = len(s)
			}
			val.WriteString(s[:end])
			s = s[end:]
		}
		kv[key] = val.String()
		s = strings.TrimLeft(s, " \t")
	}
	return kv, nil
}

// formatKeyValue writes kv back in key=value form, keys sorted, values
// quoted when needed.
func formatKeyValue(kv map[string]string) string {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		v := kv[k]
		if v == "" || strings.ContainsAny(v, " \t'\\") {
			v = "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
		}
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, " ")
}

// urlDSN builds the URL form the harness hands out.
func urlDSN(user, hostport, dbname string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     hostport,
		Path:     "/" + dbname,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}
