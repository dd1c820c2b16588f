package mysqlbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/DATA-DOG/go-sqlmock"
	"github.com/go-sql-driver/mysql"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// TestMySQLServersAreCheckedByWhatTheyReport: what Validate reads of a
// server (versions, comment, read_only, the Galera and Group Replication
// variables where present) refuses those whose named locks exclude
// nothing or differ from MySQL's, naming why; TiDB and Vitess cannot run
// here, so their version strings stand in for them.
func TestMySQLServersAreCheckedByWhatTheyReport(t *testing.T) {
	galera := map[string]string{"wsrep_on": "ON"}
	for _, tc := range []struct {
		s      mysqlServer
		refuse string // "" when supported, else a word the refusal names
	}{
		{mysqlServer{version: "5.6.51-log"}, "one named lock per session"},
		{mysqlServer{version: "5.7.44"}, ""},
		{mysqlServer{version: "8.0.36", comment: "MySQL Community Server - GPL"}, ""},
		{mysqlServer{version: "8.4.0"}, ""},
		{mysqlServer{version: "8.0.36", readOnly: true}, "read-only"},
		{mysqlServer{version: "10.0.1-MariaDB"}, "one named lock per session"},
		{mysqlServer{version: "10.0.2-MariaDB"}, ""},
		{mysqlServer{version: "10.3.39-MariaDB-0+deb10u1", vars: map[string]string{"wsrep_on": "OFF"}}, ""},
		{mysqlServer{version: "10.11.6-MariaDB-0+deb12u1", comment: "Debian 12", vars: map[string]string{"wsrep_on": "OFF"}}, ""},
		{mysqlServer{version: "10.11.6-MariaDB-0+deb12u1", vars: galera}, "Galera"},
		{mysqlServer{version: "8.0.35-27.1", vars: galera}, "Galera"}, // Percona XtraDB Cluster
		{mysqlServer{version: "8.0.36", vars: map[string]string{"group_replication_single_primary_mode": "OFF"}}, "multi-primary"},
		{mysqlServer{version: "8.0.36", vars: map[string]string{"group_replication_single_primary_mode": "ON"}}, ""},
		{mysqlServer{version: "8.0.11-TiDB-v7.5.0"}, "TiDB"},
		{mysqlServer{version: "5.7.25-TiDB-v5.0.0"}, "TiDB"},
		{mysqlServer{version: "8.0.30-Vitess"}, "Vitess"}, // vtgate's default
		// vtgate's mysql_server_version set to a plain version; its
		// @@version_comment still names Vitess (vitessio/vitess#7337).
		{mysqlServer{version: "8.0.36", comment: "a comment naming Vitess"}, "Vitess"},
		{mysqlServer{version: "garbage"}, "one named lock per session"},
	} {
		err := mysqlServerSupported(tc.s)
		switch {
		case tc.refuse == "" && err != nil:
			t.Errorf("%+v: %v, want it supported", tc.s, err)
		case tc.refuse != "" && (!errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), tc.refuse)):
			t.Errorf("%+v: %v, want ErrUnsupported naming %q", tc.s, err, tc.refuse)
		}
	}
}

func TestMySQLLockNamesAreShortLowercaseAndDistinct(t *testing.T) {
	const keyOfLowerA, keyOfUpperA = -5802717410584021883, 3511630902572796430 // advisorylock.Key("a"), Key("A")
	seen := map[string]int64{}
	for _, key := range []int64{0, 1, -1, 1 << 62, -1 << 63, keyOfLowerA, keyOfUpperA} {
		n := mysqlLockName(key)
		if len(n)-2 > 64 || n != strings.ToLower(n) {
			t.Fatalf("lock name %s for key %d: longer than 64 or not lowercase", n, key)
		}
		if k, dup := seen[n]; dup {
			t.Fatalf("keys %d and %d share lock name %s", k, key, n)
		}
		seen[n] = key
	}
}

func TestMySQLErrnoIsReadThroughWrapping(t *testing.T) {
	err := fmt.Errorf("lease: %w", &mysql.MySQLError{Number: 1146, Message: "no such table"})
	if n := dbutil.MySQLErrno(err); n != mysqlNoSuchTable {
		t.Fatalf("dbutil.MySQLErrno = %d, want %d", n, mysqlNoSuchTable)
	}
	if n := dbutil.MySQLErrno(errors.New("other")); n != 0 {
		t.Fatalf("dbutil.MySQLErrno of a plain error = %d, want 0", n)
	}
}

func TestMySQLHexLiteralsCarryAnyBytes(t *testing.T) {
	for s, want := range map[string]string{"": "''", "a'b": "X'612762'", `\`: "X'5c'", "\x00": "X'00'"} {
		if got := mysqlHex(s); got != want {
			t.Errorf("mysqlHex(%q) = %s, want %s", s, got, want)
		}
	}
}

// TestMySQLWindowedTryRetriesAFirstInsertAndADeadlock: the try of a Lock
// with WithMinHold runs its upsert again after the key's first insert (it
// wrote an ended window and tried no lock) and after a deadlock (rolled
// back, but not its GET_LOCK: that lock is let go first); a refusal is one
// statement. go-sqlmock: the server cannot deadlock this on demand.
func TestMySQLWindowedTryRetriesAFirstInsertAndADeadlock(t *testing.T) {
	db, mock, err := sqlmock.New(sqlmock.QueryMatcherOption(sqlmock.QueryMatcherFunc(func(want, got string) error {
		if !strings.HasPrefix(got, want) {
			return fmt.Errorf("statement %q, want one starting %q", got, want)
		}
		return nil
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	const key = 42
	upsert, release := "INSERT INTO advisorylock_windows", "DO RELEASE_LOCK("+mysqlLockName(key)+")"
	mock.ExpectExec(upsert).WillReturnResult(sqlmock.NewResult(1, 1)) // the first insert
	mock.ExpectExec(upsert).WillReturnError(&mysql.MySQLError{Number: mysqlDeadlock, Message: "deadlock"})
	mock.ExpectExec(release).WillReturnResult(sqlmock.NewResult(0, 0))
	mock.ExpectExec(upsert).WillReturnResult(sqlmock.NewResult(14, 2)) // granted to connection 7
	mock.ExpectExec(upsert).WillReturnResult(sqlmock.NewResult(0, 0))  // refused: a window is open
	b := mysqlBackend{}
	if r, err := b.TryLockSessionFor(ctx, conn, key, "n", time.Second); err != nil || r != (backend.SessionResult{OK: true, Session: 7}) {
		t.Fatalf("TryLockSessionFor = %+v, %v; want granted to session 7", r, err)
	}
	if r, err := b.TryLockSessionFor(ctx, conn, key, "n", time.Second); err != nil || r.OK {
		t.Fatalf("TryLockSessionFor in a window = %+v, %v; want refused", r, err)
	}
	if err := mock.ExpectationsWereMet(); err != nil {
		t.Fatal(err)
	}
}
