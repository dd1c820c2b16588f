package advisorylock_test

// LeaseLock and Fence on MySQL/MariaDB: InnoDB rows, database time in UTC,
// tokens from LAST_INSERT_ID(expr).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"github.com/go-sql-driver/mysql"
)

// mysqlExpire ends the named lease's row now, as if its holder had
// stopped renewing long ago.
func mysqlExpire(t testing.TB, db *sql.DB, name string) {
	t.Helper()
	res, err := db.Exec("UPDATE advisorylock_leases SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", name)
	if err != nil {
		t.Fatalf("expiring %q: %v", name, err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("expiring %q changed %d rows, want 1", name, n)
	}
}

// Tokens strictly increase per name, also across an expiry takeover and
// after an operator deletes the row (they come from the database clock
// as much as from the row).
func TestMySQLLeaseTokensGrowAndSurviveRowDeletion(t *testing.T) {
	dbA, dbB := testdb.OpenMySQL(t), testdb.OpenMySQL(t)
	name := testdb.UniqueName(t)
	a, b := newLeaseLock(t, dbA, name), newLeaseLock(t, dbB, name)
	var last advisorylock.FencingToken
	next := func(l *advisorylock.LeaseLock, how string) *advisorylock.LeaseGuard {
		t.Helper()
		g := tryLease(t, l)
		if g.Lease().Token() <= last {
			t.Fatalf("%s: token %d is not above the previous %d", how, g.Lease().Token(), last)
		}
		last = g.Lease().Token()
		return g
	}
	for i, l := range []*advisorylock.LeaseLock{a, b, a, b} {
		g := next(l, "grant after a release")
		if i == 0 {
			assertHeldElsewhere(t, b)
		}
		releaseLease(t, g)
	}
	g := next(a, "grant")
	var owner string
	if err := dbA.QueryRow("SELECT owner FROM advisorylock_leases WHERE name = ?", name).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	if err := renewOnce(dbA, name, owner, g.Lease().Token()); err != nil {
		t.Fatalf("renewing the live grant: %v", err)
	}
	mysqlExpire(t, dbA, name)
	if err := renewOnce(dbA, name, owner, g.Lease().Token()); !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("renewing the expired grant = %v, want backend.ErrLeaseLost", err)
	}
	taken := next(b, "takeover after expiry")
	releaseLease(t, g) // a stale release leaves the successor alone
	assertHeldElsewhere(t, a)
	releaseLease(t, taken)
	for range 3 {
		if _, err := dbA.Exec("DELETE FROM advisorylock_leases WHERE name = ?", name); err != nil {
			t.Fatal(err)
		}
		releaseLease(t, next(a, "grant after the row was deleted"))
	}
}

// renewOnce runs one renew of a grant through the backend, as the keeper
// would.
func renewOnce(db *sql.DB, name, owner string, token advisorylock.FencingToken) error {
	store := advisorylock.MySQL().(backend.LeaseStore)
	_, err := store.RenewLease(context.Background(), db, backend.LeaseRequest{
		Kind: "lease", Name: name, Owner: owner, Token: uint64(token), TTL: time.Minute})
	return err
}

// TestMySQLLeaseRenewalOutlivesTheTTLAndHolderShowsIt holds a lease for
// two and a half TTLs. The TTL is long enough that renewals delayed by a
// loaded CI machine still make the local deadline (a 1s TTL was lost once
// in CI, as the library must when it cannot renew in time).
func TestMySQLLeaseRenewalOutlivesTheTTLAndHolderShowsIt(t *testing.T) {
	testdb.Slow(t, "holds a lease across several TTLs")
	const ttl = 3 * time.Second
	t.Parallel()
	ctx := context.Background()
	db := testdb.OpenMySQL(t)
	name := testdb.UniqueName(t)
	l := newLeaseLock(t, db, name, advisorylock.WithLeaseTTL(ttl), advisorylock.WithOwner("worker-7"))
	before := time.Now()
	g := tryLease(t, l)
	other := newLeaseLock(t, testdb.OpenMySQL(t), name)
	deadline := time.Now().Add(5 * ttl / 2)
	for time.Now().Before(deadline) {
		assertHeldElsewhere(t, other)
		if isLost(g.Lease()) {
			t.Fatal("the lease was lost while renewed")
		}
		time.Sleep(100 * time.Millisecond) // pacing the checks; nothing waits on it
	}
	h, err := other.Holder(ctx)
	if err != nil || h == nil {
		t.Fatalf("Holder = %+v, %v", h, err)
	}
	if h.Token != g.Lease().Token() || !strings.HasPrefix(h.Owner, "worker-7/") || h.Name != name {
		t.Fatalf("Holder = %+v; want token %d and owner worker-7/…", h, g.Lease().Token())
	}
	if h.Since.Before(before.Add(-time.Minute)) || h.Since.After(time.Now().Add(time.Minute)) || !h.ExpiresAt.After(h.Since) {
		t.Fatalf("Holder times %v .. %v are not around now (UTC database clock)", h.Since, h.ExpiresAt)
	}
	releaseLease(t, g)
	if h, err := other.Holder(ctx); h != nil || err != nil {
		t.Fatalf("Holder after release = %+v, %v; want nil", h, err)
	}
}

// Lease names are compared byte for byte (MySQL's default collations
// would make the first three one name), at any length.
func TestMySQLLeaseNamesAreBytes(t *testing.T) {
	db := testdb.OpenMySQL(t)
	base := testdb.UniqueName(t)
	var guards []*advisorylock.LeaseGuard
	for _, n := range []string{base + "job", base + "JOB", base + "job ", base + "jöb", base + "x'; DROP TABLE advisorylock_leases; --", base + `\'`} {
		guards = append(guards, tryLease(t, newLeaseLock(t, db, n)))
	}
	for _, g := range guards {
		releaseLease(t, g)
	}
	long := newLeaseLock(t, db, base+strings.Repeat("n", 100_000)) // longer than any InnoDB key
	g := tryLease(t, long)
	assertHeldElsewhere(t, newLeaseLock(t, db, base+strings.Repeat("n", 100_000)))
	if h, err := long.Holder(context.Background()); err != nil || h == nil || h.Token != g.Lease().Token() {
		t.Fatalf("Holder of a long name = %+v, %v", h, err)
	}
	releaseLease(t, g)
}

// A stale holder's write is refused by the fence once the successor has
// written; equal tokens are admitted.
func TestMySQLFenceRefusesStaleTokens(t *testing.T) {
	ctx := context.Background()
	db := testdb.OpenMySQL(t)
	name := testdb.UniqueName(t)
	l := newLeaseLock(t, db, name)
	f, err := advisorylock.NewFence(db, name)
	if err != nil {
		t.Fatal(err)
	}
	old := tryLease(t, l)
	for range 2 {
		if err := fencedWrite(ctx, db, f, nil, old.Lease().Token()); err != nil {
			t.Fatalf("write with the current token: %v", err)
		}
	}
	mysqlExpire(t, db, name)
	successor := tryLease(t, newLeaseLock(t, testdb.OpenMySQL(t), name))
	if err := fencedWrite(ctx, db, f, nil, successor.Lease().Token()); err != nil {
		t.Fatalf("successor's write: %v", err)
	}
	err = fencedWrite(ctx, db, f, nil, old.Lease().Token())
	if !isStale(err, name, old.Lease().Token(), successor.Lease().Token()) {
		t.Fatalf("stale write = %v, want ErrStaleToken with highest %d", err, successor.Lease().Token())
	}
	releaseLease(t, old)
	releaseLease(t, successor)
	var top int64
	if err := db.QueryRow("SELECT token FROM advisorylock_fences WHERE resource = ?", name).Scan(&top); err != nil || top != int64(successor.Lease().Token()) {
		t.Fatalf("fence keeps %d (%v), want %d", top, err, successor.Lease().Token())
	}
}

// The tables are created on first use, also when many first uses race
// on an empty database; Schema exports the same DDL.
func TestMySQLSchemaIsCreatedOnFirstUseAndExported(t *testing.T) {
	testdb.Slow(t, "creates fresh MySQL databases")
	ctx := context.Background()
	db := testdb.OpenMySQLDSN(t, testdb.NewMySQLDatabase(t))
	db.SetMaxOpenConns(20)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			name := testdb.UniqueName(t)
			if i%2 == 0 {
				f, err := advisorylock.NewFence(db, name)
				if err == nil {
					err = fencedWrite(ctx, db, f, nil, 1)
				}
				errs <- err
				return
			}
			ll, err := advisorylock.NewLeaseLock(db, name)
			if err == nil {
				var g *advisorylock.LeaseGuard
				if g, err = ll.TryLock(ctx); err == nil {
					err = g.Release(ctx)
				}
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a concurrent first use failed: %v", err)
		}
	}
	// The exported DDL runs as is on an empty database, and the package
	// then uses those tables.
	fresh := testdb.OpenMySQLDSN(t, testdb.NewMySQLDatabase(t))
	runMySQLSchema(t, fresh)
	runMySQLSchema(t, fresh) // idempotent
	if n := countRows(t, fresh, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'advisorylock\\_%'"); n != 9 {
		t.Fatalf("Schema created %d tables, want 9", n)
	}
	if n := countRows(t, fresh, "SELECT COUNT(*) FROM advisorylock_schema"); n != 7 {
		t.Fatalf("Schema recorded %d versions, want 7", n)
	}
	releaseLease(t, tryLease(t, newLeaseLock(t, fresh, testdb.UniqueName(t))))
}

// Lease times come from the database clock in UTC: a session with
// another time zone agrees on who holds the lease.
func TestMySQLLeaseTimesIgnoreTheSessionTimeZone(t *testing.T) {
	ctx := context.Background()
	name := testdb.UniqueName(t)
	g := tryLease(t, newLeaseLock(t, testdb.OpenMySQL(t), name))
	defer releaseLease(t, g)
	for _, tz := range []string{"'+09:00'", "'-11:00'"} {
		dsn := testdb.MySQLDSN(t)
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		other := newLeaseLock(t, testdb.OpenMySQLDSN(t, dsn+sep+"time_zone="+strings.ReplaceAll(strings.ReplaceAll(tz, "+", "%2B"), ":", "%3A")), name)
		if _, err := other.TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
			t.Fatalf("TryLock from a session in time zone %s = %v, want ErrNotAcquired", tz, err)
		}
	}
}

// An ordinary user (no PROCESS, no CREATE) works on tables an
// administrator created from Schema(); its Holder of someone else's Lock
// gives the connection id alone, since the process list shows it only its
// own connections.
// mysqlOrdinaryUser makes a user of dsn's database with SELECT, INSERT
// and UPDATE on it (no CREATE), dropped at t.Cleanup, and opens it.
func mysqlOrdinaryUser(t *testing.T, admin *sql.DB, dsn string) (*sql.DB, string) {
	t.Helper()
	return mysqlUserWith(t, admin, dsn, "SELECT, INSERT, UPDATE")
}

// mysqlUserWith makes a user of dsn's database with privs on it, dropped
// at t.Cleanup, and opens it.
func mysqlUserWith(t *testing.T, admin *sql.DB, dsn, privs string) (*sql.DB, string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	user := fmt.Sprintf("al_%d", time.Now().UnixNano()%1e9)
	for _, stmt := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw-" + user + "'",
		"CREATE USER '" + user + "'@'localhost' IDENTIFIED BY 'pw-" + user + "'",
		"GRANT " + privs + " ON " + cfg.DBName + ".* TO '" + user + "'@'%'",
		"GRANT " + privs + " ON " + cfg.DBName + ".* TO '" + user + "'@'localhost'",
	} {
		if _, err := admin.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_, _ = admin.Exec("DROP USER IF EXISTS '" + user + "'@'%'")
		_, _ = admin.Exec("DROP USER IF EXISTS '" + user + "'@'localhost'")
	})
	cfg.User, cfg.Passwd = user, "pw-"+user
	return testdb.OpenMySQLDSN(t, cfg.FormatDSN()), user
}

func TestMySQLLeastPrivilegeUser(t *testing.T) {
	testdb.Slow(t, "creates a MySQL user and database")
	ctx := context.Background()
	dsn := testdb.NewMySQLDatabase(t)
	admin := testdb.OpenMySQLDSN(t, dsn)
	runMySQLSchema(t, admin)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	db, user := mysqlOrdinaryUser(t, admin, dsn)

	name := testdb.UniqueName(t)
	g, err := newLock(t, admin, name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h, err := newLock(t, db, name).Holder(ctx)
	if err != nil || h == nil || int64(h.PID) != mysqlHolder(t, admin, name) || h.Client != "" {
		t.Fatalf("Holder without PROCESS = %+v, %v; want the connection id alone", h, err)
	}
	mustRelease(t, g)
	mine, err := newLock(t, db, name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := newLock(t, db, name).Holder(ctx); err != nil || h == nil || h.Client != user && !strings.HasPrefix(h.Client, user+"@") {
		t.Fatalf("Holder of its own lock = %+v, %v; want user %s", h, err, user)
	}
	mustRelease(t, mine)

	lease := newLeaseLock(t, db, name)
	lg := tryLease(t, lease)
	f, err := advisorylock.NewFence(db, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := fencedWrite(ctx, db, f, nil, lg.Lease().Token()); err != nil {
		t.Fatalf("fenced write as an ordinary user: %v", err)
	}
	releaseLease(t, lg)
	win := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Minute))
	for i, want := range []bool{true, false} { // run, then refused in the window
		if ran, err := win.TryDo(ctx, func(context.Context) error { return nil }); err != nil || ran != want {
			t.Fatalf("TryDo %d with WithMinHold as an ordinary user = %v, %v; want %v", i, ran, err, want)
		}
	}

	// Shared holds, with the grant Schema lists for advisorylock_shared.
	if _, err := admin.Exec("GRANT DELETE ON " + cfg.DBName + ".advisorylock_shared TO '" + user + "'@'%'"); err != nil {
		t.Fatal(err)
	}
	shared := newLock(t, db, name)
	r1, err := shared.TryRLock(ctx)
	if err != nil {
		t.Fatalf("TryRLock as an ordinary user: %v", err)
	}
	r2, err := newLock(t, db, name).TryRLock(ctx)
	if err != nil {
		t.Fatalf("second TryRLock as an ordinary user: %v", err)
	}
	if hs, err := shared.Holders(ctx); err != nil || len(hs) != 2 || !hs[0].Shared {
		t.Fatalf("Holders of two shared holds as an ordinary user = %v, %v", hs, err)
	}
	if _, err := newLock(t, admin, name).TryLock(ctx); !errors.Is(err, advisorylock.ErrNotAcquired) {
		t.Fatalf("administrator's TryLock beside an ordinary user's shared holds = %v, want ErrNotAcquired", err)
	}
	mustRelease(t, r1)
	mustRelease(t, r2)

	// Without the tables, the error names what the user may not do.
	bare := testdb.NewMySQLDatabase(t)
	bcfg, _ := mysql.ParseDSN(bare)
	if _, err := admin.Exec("GRANT SELECT, INSERT, UPDATE ON " + bcfg.DBName + ".* TO '" + user + "'@'%'"); err != nil {
		t.Fatal(err)
	}
	bcfg.User, bcfg.Passwd = user, "pw-"+user
	_, err = newLeaseLock(t, testdb.OpenMySQLDSN(t, bcfg.FormatDSN()), name).TryLock(ctx)
	if err == nil || !strings.Contains(err.Error(), "CREATE command denied") || !strings.Contains(err.Error(), "Schema(MySQL())") {
		t.Fatalf("first use without CREATE = %v; want the server's refusal naming CREATE", err)
	}
}

// runMySQLSchema runs the statements of Schema(MySQL()) on db, as an
// administrator would.
func runMySQLSchema(t *testing.T, db *sql.DB) {
	t.Helper()
	for _, stmt := range strings.Split(advisorylock.Schema(advisorylock.MySQL()), ";\n") {
		code := false // a chunk of comments alone is not a statement
		for _, line := range strings.Split(stmt, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "--") {
				code = true
			}
		}
		if !code {
			continue
		}
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("Schema statement %q: %v", stmt, err)
		}
	}
}

// TestMySQLSchemaUpgradeAddsTheWindowsTable: a database at schema version
// 1 (leases and fences only) gets advisorylock_windows and the later
// steps, recorded up to the current version, at the first use of a Lock
// with WithMinHold.
func TestMySQLSchemaUpgradeAddsTheWindowsTable(t *testing.T) {
	testdb.Slow(t, "creates fresh MySQL databases")
	ctx := context.Background()
	db := testdb.OpenMySQLDSN(t, testdb.NewMySQLDatabase(t))
	runMySQLSchema(t, db)
	for _, stmt := range []string{"DROP TABLE advisorylock_windows", "DROP TABLE advisorylock_elections", "DROP TABLE advisorylock_shared", "DELETE FROM advisorylock_schema WHERE version >= 2"} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	l := newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Minute))
	if ran, err := l.TryDo(ctx, func(context.Context) error { return nil }); err != nil || !ran {
		t.Fatalf("TryDo on a version 1 database = %v, %v", ran, err)
	}
	if n := countRows(t, db, "SELECT COUNT(*) FROM advisorylock_windows"); n != 1 {
		t.Fatalf("advisorylock_windows has %d rows after a grant, want 1", n)
	}
	if n := countRows(t, db, "SELECT MAX(version) FROM advisorylock_schema"); n != 7 {
		t.Fatalf("schema version after the upgrade = %d, want 7", n)
	}
}

// TestMySQLElectionRunReturnsAMissingPrivilege: Run returns, naming the
// election and keeping the server's error, when the user may not create
// the missing tables (1142 on CREATE) or may not write the term row (1142
// on INSERT), instead of campaigning forever.
func TestMySQLElectionRunReturnsAMissingPrivilege(t *testing.T) {
	bare := testdb.NewMySQLDatabase(t)
	noCreate, _ := mysqlOrdinaryUser(t, testdb.OpenMySQLDSN(t, bare), bare)
	withTables := testdb.NewMySQLDatabase(t)
	admin := testdb.OpenMySQLDSN(t, withTables)
	runMySQLSchema(t, admin)
	readOnly, _ := mysqlUserWith(t, admin, withTables, "SELECT")
	for what, db := range map[string]*sql.DB{"no tables, no CREATE": noCreate, "tables, SELECT only": readOnly} {
		name := testdb.UniqueName(t)
		var myErr *mysql.MySQLError
		if err := newElection(t, db, name).Check(context.Background()); !errors.As(err, &myErr) || myErr.Number != 1142 {
			t.Errorf("%s: Check = %v; want the server's 1142 that Run gets", what, err)
		}
		err := runRefused(t, db, name)
		if !errors.As(err, &myErr) || myErr.Number != 1142 || !strings.Contains(err.Error(), "election "+strconv.Quote(name)) {
			t.Errorf("%s: Run = %v; want at once an error naming the election, wrapping the server's 1142", what, err)
		}
		t.Logf("%s: %v", what, err)
	}
	// Every Check that proves grants gets the same refusal (see
	// TestCheckRefusesAMissingGrant).
	for what, check := range checkers(t, readOnly) {
		var myErr *mysql.MySQLError
		if err := check(context.Background()); !errors.As(err, &myErr) || myErr.Number != 1142 {
			t.Errorf("tables, SELECT only: %s.Check = %v, want the server's 1142", what, err)
		}
	}
}

// TestMySQLCheckRefusesAPartialGrant: a user with SELECT and INSERT but
// not UPDATE, or SELECT and UPDATE but not INSERT, on the tables an
// administrator created is refused by every Check that proves grants,
// with the server's 1142 naming the command and the table.
func TestMySQLCheckRefusesAPartialGrant(t *testing.T) {
	withTables := testdb.NewMySQLDatabase(t)
	admin := testdb.OpenMySQLDSN(t, withTables)
	runMySQLSchema(t, admin)
	tableOf := map[string]string{
		"LeaseLock":          "advisorylock_leases",
		"Fence":              "advisorylock_fences",
		"Election":           "advisorylock_elections",
		"Lock (WithMinHold)": "advisorylock_windows",
	}
	for privs, lacks := range map[string]string{"SELECT, INSERT": "UPDATE", "SELECT, UPDATE": "INSERT"} {
		db, _ := mysqlUserWith(t, admin, withTables, privs)
		for what, check := range checkers(t, db) {
			var myErr *mysql.MySQLError
			err := check(context.Background())
			if !errors.As(err, &myErr) || myErr.Number != 1142 || !strings.Contains(err.Error(), lacks+" command denied") || !strings.Contains(err.Error(), tableOf[what]) {
				t.Errorf("%s only: %s.Check = %v, want the server's 1142 naming %s on %s", privs, what, err, lacks, tableOf[what])
			}
		}
	}
}
