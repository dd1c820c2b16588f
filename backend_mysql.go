package advisorylock

import (
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/mysqlbackend"
)

// MySQL returns the MySQL and MariaDB backend (MariaDB 10.3+, MySQL 8.0+;
// MySQL 8 is not tested here). It works with github.com/go-sql-driver/mysql
// and any driver that speaks to these servers.
//
// A Lock is a named lock taken with GET_LOCK on a pinned connection; it
// lasts exactly as long as the server session. Its name on the server is
// derived from the key ("advisorylock:v1:" and the key in hex, 32
// characters), because the server compares lock names case-insensitively
// and allows at most 64 characters. Holder reads the holder's connection
// id from IS_USED_LOCK and its user and host from the process list: a
// user without the PROCESS privilege sees only its own connections, so
// Holder then reports the connection id alone.
//
// A LeaseLock is a row in advisorylock_leases and a Fence a row in
// advisorylock_fences (InnoDB, keyed by the SHA-256 of the name, so a name
// of any length is kept byte for byte), with every lease time taken from
// the database clock in UTC (UTC_TIMESTAMP(6)), so sessions with
// different time zones agree. A grant's token is the larger of the name's
// previous token plus one and the database clock in microseconds since
// 1970: it strictly increases per name, and stays larger than every
// earlier token after an operator deletes the row, as long as the
// database clock does not step back by more than the time since the
// name's last grant.
//
// Each step is one round trip whatever the DSN says (interpolateParams
// need not be set).
//
// Refused with ErrUnsupported: servers that cannot hold several named
// locks per session (MySQL before 5.7, MariaDB before 10.0.2, where a
// second GET_LOCK silently frees the first), Galera or Percona XtraDB
// clusters (wsrep_on: GET_LOCK is local to one node there), members of a
// multi-primary Group Replication group (likewise), TiDB and Vitess
// (their GET_LOCK is not MySQL's), and read-only servers (replicas).
//
// ProxySQL: a connection that called GET_LOCK is pinned to its server
// connection by ProxySQL (multiplexing is disabled for it), so Lock works
// through it; LeaseLock works through any proxy. A proxy's own timeouts
// must exceed the keep-alive interval. On the server, a Lock sets its
// session's wait_timeout to the dead-holder timeout, rounded up to whole
// seconds (WithDeadHolderTimeout), which exceeds the keep-alive interval:
// an idle lock holder is not idle, the keep-alive is its only traffic.
//
// WithMinHold: a Lock's windows are rows of advisorylock_windows, written
// by the statement that calls GET_LOCK; a LeaseLock keeps its window in
// its row's expires_at.
func MySQL() backend.Backend { return mysqlbackend.New() }
