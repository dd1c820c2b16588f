package main

import (
	"database/sql"
	"errors"
	"net"
	"net/url"
	"regexp"
	"strings"

	"github.com/advisorylock/advisorylock"
	"github.com/go-sql-driver/mysql"
)

// MySQL and MariaDB DSNs: a URL, mysql://user:pass@host:3306/db?param=v
// (the port defaults to 3306; the query carries go-sql-driver's
// parameters), or go-sql-driver's own form, user:pass@tcp(host:3306)/db.

// mysqlDriverFormRE matches go-sql-driver's DSN form: an optional
// user[:password]@, then a protocol and address in parentheses, then /.
var mysqlDriverFormRE = regexp.MustCompile(`^(?:[^@/]*@)?(?:tcp[46]?|unix)\([^)]*\)/`)

// openMySQL opens dsn if it is a MySQL DSN in either form; ok is false
// when it is not one (the other forms are tried then).
func openMySQL(dsn string) (d *database, ok bool, err error) {
	var cfg *mysql.Config
	shown := redactDSN(dsn)
	scheme, _, _ := strings.Cut(dsn, "://")
	switch {
	case strings.EqualFold(scheme, "mysql"), strings.EqualFold(scheme, "mariadb"):
		cfg, err = mysqlURLConfig(dsn)
	case mysqlDriverFormRE.MatchString(dsn):
		cfg, err = mysql.ParseDSN(dsn)
		shown = "(a go-sql-driver DSN)"
		if err == nil {
			hidden := *cfg
			if hidden.Passwd != "" {
				hidden.Passwd = redacted
			}
			shown = hidden.FormatDSN()
		}
	default:
		return nil, false, nil
	}
	secrets := dsnSecrets(dsn)
	if err != nil {
		return nil, true, configErrorf("bad MySQL DSN: %s", scrub(err.Error(), secrets))
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = connectTimeout
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, true, configErrorf("bad MySQL DSN: %s", scrub(err.Error(), secrets))
	}
	d = &database{DB: sql.OpenDB(connector), kind: "mysql", shown: shown, where: "mysql " + cfg.Addr + "/" + cfg.DBName,
		secrets: append(secrets, cfg.Passwd)}
	d.pooler, _ = advisorylock.PoolerHint(cfg.FormatDSN()) // RDS Proxy's and ProxySQL's signs, either form
	return d, true, nil
}

// mysqlURLConfig reads mysql://user:pass@host[:port]/db?params.
func mysqlURLConfig(dsn string) (*mysql.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, err
	}
	if u.Host == "" {
		return nil, errors.New("no host (mysql://user:pass@host:3306/db)")
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "3306"
	}
	cfg, err := mysql.ParseDSN("tcp(" + net.JoinHostPort(host, port) + ")/" + strings.TrimPrefix(u.Path, "/") + queryPart(u))
	if err != nil {
		return nil, err
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	return cfg, nil
}

func queryPart(u *url.URL) string {
	if u.RawQuery == "" {
		return ""
	}
	return "?" + u.RawQuery
}

// mysqlMissingTable reports the server's "table does not exist" error.
func mysqlMissingTable(err error) bool {
	var e *mysql.MySQLError
	return errors.As(err, &e) && e.Number == 1146
}

// mysqlRefusesLogin reports the server's refusals of a connection that
// the DSN must fix, as PostgreSQL's classes 28 and 3D: wrong credentials
// (ER_ACCESS_DENIED_ERROR 1045, and 1698, MariaDB's for a user that
// authenticates another way, such as unix_socket), a database the user
// may not use (ER_DBACCESS_DENIED_ERROR 1044) or that does not exist
// (ER_BAD_DB_ERROR 1049).
func mysqlRefusesLogin(err error) bool {
	var e *mysql.MySQLError
	if !errors.As(err, &e) {
		return false
	}
	switch e.Number {
	case 1044, 1045, 1049, 1698:
		return true
	}
	return false
}
