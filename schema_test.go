package advisorylock_test

// Schema versions, least privilege and look-alike servers.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// roundOnePostgres is the first PostgreSQL schema, which releases before
// schema versions created: what a database upgraded in place holds.
var roundOnePostgres = []string{
	`CREATE TABLE advisorylock_leases (name text PRIMARY KEY, owner text, generation bigint NOT NULL, acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL)`,
	`CREATE TABLE advisorylock_fences (resource text PRIMARY KEY, token bigint NOT NULL)`,
	`INSERT INTO advisorylock_leases VALUES ('report', NULL, 41, now(), now()), ('held', 'old-host:1/0123456789abcdef', 7, now(), now() + interval '1 hour')`,
	`INSERT INTO advisorylock_fences VALUES ('report-file', 41)`,
}

// roundOneAcquire is the first schema's acquire statement, as an older
// release still running beside this one sends it during a rolling upgrade.
const roundOneAcquire = `INSERT INTO advisorylock_leases AS l (name, owner, generation, acquired_at, expires_at)
VALUES ('report', 'old-host:1/fedcba9876543210', 1, now(), now() + interval '30 seconds')
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, generation = l.generation + 1,
	acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at
WHERE l.owner IS NULL OR l.expires_at <= now()
RETURNING generation`

func TestSchemaUpgradesARoundOneDatabaseLive(t *testing.T) {
	testdb.Slow(t, "creates a fresh database")
	t.Parallel() // a database of its own
	admin := testdb.OpenPostgres(t, "postgres")
	dsn := testdb.WithDatabase(testdb.PostgresDSN(t), freshDatabase(t, admin))
	old := testdb.OpenPostgresDSN(t, "postgres", dsn)
	ctx := context.Background()
	for _, s := range roundOnePostgres {
		if _, err := old.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// Several processes running the new code start at once.
	var wg sync.WaitGroup
	tokens := make(chan advisorylock.FencingToken, 4)
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db := testdb.OpenPostgresDSN(t, testdb.Drivers[i%2], dsn)
			g, err := newLeaseLock(t, db, fmt.Sprintf("new-%d", i)).TryLock(ctx)
			if err != nil {
				errs <- err
				return
			}
			tokens <- g.Lease().Token()
			errs <- g.Release(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	close(tokens)
	for err := range errs {
		if err != nil {
			t.Fatalf("first use on a round-one database: %v", err)
		}
	}
	var version int
	if err := old.QueryRowContext(ctx, "SELECT max(version) FROM advisorylock_schema").Scan(&version); err != nil || version < 2 {
		t.Fatalf("schema version after the upgrade: %d, %v; want at least 2", version, err)
	}

	db := testdb.OpenPostgresDSN(t, "pgx", dsn)
	assertHeldElsewhere(t, newLeaseLock(t, db, "held")) // the old holder's row survived the upgrade
	report := newLeaseLock(t, db, "report")
	g := tryLease(t, report)
	if g.Lease().Token() <= 41 {
		t.Fatalf("first new-code token %d, not above the older release's 41", g.Lease().Token())
	}
	releaseLease(t, g)
	fence, err := advisorylock.NewFence(db, "report-file")
	if err != nil {
		t.Fatal(err)
	}
	if err := fenceAdmit(t, db, fence, g.Lease().Token()); err != nil {
		t.Fatalf("the fence that admitted the older release's 41 refuses the new token %d: %v", g.Lease().Token(), err)
	}
	// A process still on the old code keeps tokens increasing, and so
	// does the new code after it.
	var oldToken int64
	if err := old.QueryRowContext(ctx, roundOneAcquire).Scan(&oldToken); err != nil {
		t.Fatal(err)
	}
	if _, err := old.ExecContext(ctx, "UPDATE advisorylock_leases SET owner = NULL WHERE name = 'report'"); err != nil {
		t.Fatal(err)
	}
	if oldToken <= int64(g.Lease().Token()) {
		t.Fatalf("old code granted %d after the new code's %d", oldToken, g.Lease().Token())
	}
	if next := tryLease(t, report); int64(next.Lease().Token()) <= oldToken {
		t.Fatalf("new code granted %d after the old code's %d", next.Lease().Token(), oldToken)
	} else {
		releaseLease(t, next)
	}
}

func TestSQLiteSchemaUpgradesARoundOneFile(t *testing.T) {
	t.Parallel()
	_, db := sqliteFile(t, "_pragma=busy_timeout(5000)")
	ctx := context.Background()
	for _, s := range []string{
		`CREATE TABLE advisorylock_leases (name TEXT PRIMARY KEY, owner TEXT, generation INTEGER NOT NULL, acquired_at INTEGER NOT NULL, expires_at INTEGER NOT NULL)`,
		`CREATE TABLE advisorylock_fences (resource TEXT PRIMARY KEY, token INTEGER NOT NULL)`,
		`INSERT INTO advisorylock_leases VALUES ('report', NULL, 41, 0, 0)`,
	} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	l := newLeaseLock(t, db, "other")
	g := tryLease(t, l)
	releaseLease(t, g)
	if g.Lease().Token() <= 41 {
		t.Fatalf("first token after the upgrade %d, not above the older release's 41 (for any name: the counter starts at the highest)", g.Lease().Token())
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM advisorylock_leases"); err != nil {
		t.Fatal(err)
	}
	if again := tryLease(t, l); again.Lease().Token() <= g.Lease().Token() {
		t.Fatalf("token %d after deleting every row, not above %d", again.Lease().Token(), g.Lease().Token())
	} else {
		releaseLease(t, again)
	}
}

// withUser returns the URL dsn with its user replaced.
func withUser(t *testing.T, dsn, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}

// ordinaryRole creates a LOGIN role with no other right, dropped when
// the test ends, and returns its name.
func ordinaryRole(t *testing.T, admin *sql.DB) string {
	t.Helper()
	role := "advisorylock_app_" + strings.ReplaceAll(testdb.UniqueName(t)[len(t.Name())+1:], "-", "")
	if _, err := admin.ExecContext(context.Background(), "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.ExecContext(context.Background(), "DROP ROLE IF EXISTS "+role) })
	return role
}

func TestOrdinaryRoleWorksWithTablesAnAdministratorCreated(t *testing.T) {
	testdb.Slow(t, "creates a fresh database")
	t.Parallel() // a role and databases of its own
	admin := testdb.OpenPostgres(t, "postgres")
	ctx := context.Background()
	role := ordinaryRole(t, admin)
	base := testdb.PostgresDSN(t)
	if !strings.HasPrefix(base, "postgres://") {
		testdb.Unavailable(t, "needs a postgres:// URL DSN to name another database")
	}

	// An administrator creates the tables from Schema and grants what it lists.
	withTables := testdb.WithDatabase(base, freshDatabase(t, admin))
	owner := testdb.OpenPostgresDSN(t, "postgres", withTables)
	grants := []string{advisorylock.Schema(advisorylock.Postgres()),
		"GRANT SELECT, INSERT, UPDATE ON advisorylock_leases, advisorylock_fences, advisorylock_elections TO " + role,
		"GRANT USAGE ON SEQUENCE advisorylock_token_seq TO " + role,
		"GRANT SELECT ON advisorylock_schema TO " + role}
	for _, s := range grants {
		if _, err := owner.ExecContext(ctx, s); err != nil {
			t.Fatalf("%.60s: %v", s, err)
		}
	}
	for _, drv := range testdb.Drivers {
		app := testdb.OpenPostgresDSN(t, drv, withUser(t, withTables, role))
		name := testdb.UniqueName(t)
		g := tryLease(t, newLeaseLock(t, app, name))
		fence, err := advisorylock.NewFence(app, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := fenceAdmit(t, app, fence, g.Lease().Token()); err != nil {
			t.Fatalf("%s: Admit as an ordinary role: %v", drv, err)
		}
		releaseLease(t, g)
		sg, err := newLock(t, app, name).TryLock(ctx)
		if err != nil {
			t.Fatalf("%s: a session lock as an ordinary role: %v", drv, err)
		}
		if err := sg.Release(ctx); err != nil {
			t.Fatal(err)
		}
		runOneTerm(t, app, name)
	}

	// A missing grant is one clear error naming it.
	if _, err := owner.ExecContext(ctx, "REVOKE USAGE ON SEQUENCE advisorylock_token_seq FROM "+role); err != nil {
		t.Fatal(err)
	}
	app := testdb.OpenPostgresDSN(t, "pgx", withUser(t, withTables, role))
	if err := newLeaseLock(t, app, testdb.UniqueName(t)).Check(ctx); err == nil || !strings.Contains(err.Error(), "advisorylock_token_seq") {
		t.Fatalf("Check without USAGE on the sequence = %v, want the error naming it that TryLock would return", err)
	}
	_, err := newLeaseLock(t, app, testdb.UniqueName(t)).TryLock(ctx)
	if err == nil || !strings.Contains(err.Error(), "advisorylock_token_seq") || !strings.Contains(err.Error(), "privilege") {
		t.Fatalf("TryLock without USAGE on the sequence = %v, want one error naming the missing privilege", err)
	}

	// Without tables, and no right to create them, the error says who
	// must create them from what.
	bare := testdb.WithDatabase(base, freshDatabase(t, admin))
	app = testdb.OpenPostgresDSN(t, "postgres", withUser(t, bare, role))
	_, err = newLeaseLock(t, app, testdb.UniqueName(t)).TryLock(ctx)
	if err == nil || !strings.Contains(err.Error(), "Schema(Postgres())") {
		t.Fatalf("TryLock without tables or CREATE = %v, want an error saying an administrator creates them from Schema(Postgres())", err)
	}
}

// checkers returns, for each kind of lock whose Check proves the role's
// grants, a Check on db: a LeaseLock, a Fence, an Election and a Lock
// with WithMinHold, each on a new name.
func checkers(t *testing.T, db *sql.DB) map[string]func(context.Context) error {
	t.Helper()
	fence, err := advisorylock.NewFence(db, testdb.UniqueName(t))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]func(context.Context) error{
		"LeaseLock":          newLeaseLock(t, db, testdb.UniqueName(t)).Check,
		"Fence":              fence.Check,
		"Election":           newElection(t, db, testdb.UniqueName(t)).Check,
		"Lock (WithMinHold)": newLock(t, db, testdb.UniqueName(t), advisorylock.WithMinHold(time.Second)).Check,
	}
}

// roleAndDatabase makes an ordinary role (see ordinaryRole) and a fresh
// database, both dropped when the test ends, and returns the role, the
// database's DSN and a superuser's handle on it.
func roleAndDatabase(t *testing.T) (role, dsn string, owner *sql.DB) {
	t.Helper()
	admin := testdb.OpenPostgres(t, "postgres")
	role = ordinaryRole(t, admin)
	dsn = testdb.WithDatabase(testdb.PostgresDSN(t), freshDatabase(t, admin))
	return role, dsn, testdb.OpenPostgresDSN(t, "postgres", dsn)
}

// TestCheckRefusesAMissingGrant: where an administrator created the
// tables but granted the role nothing on them, Check returns the server's
// 42501 (what the first operation would get) for a LeaseLock, a Fence,
// an Election and a min-hold Lock, with both drivers; once the grants of
// Schema's comment are given, each Check passes.
func TestCheckRefusesAMissingGrant(t *testing.T) {
	testdb.Slow(t, "creates fresh databases and roles")
	t.Parallel() // a role and a database of its own
	ctx := context.Background()
	role, withTables, owner := roleAndDatabase(t)
	checkAs := func(grants []string, want func(err error) bool, wanted string) {
		t.Helper()
		for _, s := range grants {
			if _, err := owner.ExecContext(ctx, s); err != nil {
				t.Fatalf("%.60s: %v", s, err)
			}
		}
		for _, drv := range testdb.Drivers {
			app := testdb.OpenPostgresDSN(t, drv, withUser(t, withTables, role))
			for what, check := range checkers(t, app) {
				if err := check(ctx); !want(err) {
					t.Errorf("%s: %s.Check = %v, want %s", drv, what, err, wanted)
				}
			}
		}
	}
	checkAs([]string{advisorylock.Schema(advisorylock.Postgres()), "GRANT SELECT ON advisorylock_schema TO " + role},
		func(err error) bool {
			var coded interface{ SQLState() string }
			return errors.As(err, &coded) && coded.SQLState() == "42501"
		}, "the server's 42501 without grants")
	checkAs([]string{
		"GRANT SELECT, INSERT, UPDATE ON advisorylock_leases, advisorylock_fences, advisorylock_windows, advisorylock_elections TO " + role,
		"GRANT USAGE ON SEQUENCE advisorylock_token_seq TO " + role},
		func(err error) bool { return err == nil }, "nil with the documented grants")
}

// TestCheckRefusesAPartialGrant: a role missing one of the grants Schema
// lists (UPDATE, INSERT, or USAGE on the token sequence) is refused by
// Check with the server's 42501 naming what it may not use, with both
// drivers: the LeaseLock, Fence, Election and min-hold Lock each prove
// every grant their operations need, and only those (a Fence and a
// min-hold Lock draw no tokens).
func TestCheckRefusesAPartialGrant(t *testing.T) {
	t.Parallel() // a role and a database of its own
	ctx := context.Background()
	role, withTables, owner := roleAndDatabase(t)
	const tables = "advisorylock_leases, advisorylock_fences, advisorylock_windows, advisorylock_elections"
	tableOf := map[string]string{
		"LeaseLock":          "advisorylock_leases",
		"Fence":              "advisorylock_fences",
		"Election":           "advisorylock_elections",
		"Lock (WithMinHold)": "advisorylock_windows",
	}
	for _, s := range []string{advisorylock.Schema(advisorylock.Postgres()), "GRANT SELECT ON advisorylock_schema TO " + role} {
		if _, err := owner.ExecContext(ctx, s); err != nil {
			t.Fatalf("%.60s: %v", s, err)
		}
	}
	for _, c := range []struct {
		what   string
		grants []string
		lacks  func(checker string) string // what the checker's error must name, "" for a pass
	}{
		{"SELECT and INSERT, not UPDATE",
			[]string{"GRANT SELECT, INSERT ON " + tables + " TO " + role, "GRANT USAGE ON SEQUENCE advisorylock_token_seq TO " + role},
			func(c string) string { return tableOf[c] }},
		{"SELECT and UPDATE, not INSERT",
			[]string{"GRANT SELECT, UPDATE ON " + tables + " TO " + role, "GRANT USAGE ON SEQUENCE advisorylock_token_seq TO " + role},
			func(c string) string { return tableOf[c] }},
		{"the tables, not the token sequence",
			[]string{"GRANT SELECT, INSERT, UPDATE ON " + tables + " TO " + role},
			func(c string) string {
				if c == "LeaseLock" || c == "Election" {
					return "advisorylock_token_seq"
				}
				return ""
			}},
	} {
		for _, s := range append([]string{"REVOKE ALL ON " + tables + " FROM " + role, "REVOKE ALL ON SEQUENCE advisorylock_token_seq FROM " + role}, c.grants...) {
			if _, err := owner.ExecContext(ctx, s); err != nil {
				t.Fatalf("%.60s: %v", s, err)
			}
		}
		for _, drv := range testdb.Drivers {
			app := testdb.OpenPostgresDSN(t, drv, withUser(t, withTables, role))
			for what, check := range checkers(t, app) {
				err := check(ctx)
				var coded interface{ SQLState() string }
				switch lacks := c.lacks(what); {
				case lacks == "" && err != nil:
					t.Errorf("%s, %s: %s.Check = %v, want nil", c.what, drv, what, err)
				case lacks != "" && (!errors.As(err, &coded) || coded.SQLState() != "42501" || !strings.Contains(err.Error(), lacks)):
					t.Errorf("%s, %s: %s.Check = %v, want the server's 42501 naming %s", c.what, drv, what, err, lacks)
				}
			}
		}
	}
}

// runOneTerm runs one term of an election on name, in which Leader must
// name the term.
func runOneTerm(t *testing.T, db *sql.DB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	e := newElection(t, db, name)
	stop := errors.New("stop")
	err := e.Run(ctx, func(ctx context.Context, term advisorylock.FencingToken) error {
		if h, err := e.Leader(ctx); err != nil || h == nil || h.Token != term {
			return fmt.Errorf("Leader during term %v: %+v, %w", term, h, err)
		}
		return stop
	})
	if !errors.Is(err, stop) {
		t.Fatalf("an election as an ordinary role: %v", err)
	}
}

// PostgreSQL look-alikes whose advisory locks exclude nothing or fail are
// refused at the first operation, by what version() says. Neither
// CockroachDB nor YugabyteDB can run here: a fake driver answers version()
// as they do, and fails anything else.
func TestPostgreSQLLookAlikesAreRefused(t *testing.T) {
	for _, c := range []struct{ name, version string }{
		{"CockroachDB", "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.13)"},
		{"YugabyteDB", "PostgreSQL 11.2-YB-2.20.1.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 16.0.6, 64-bit"},
		{"YugabyteDB", "PostgreSQL 15.12-YB-2025.1.0.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 17.0.6, 64-bit"},
	} {
		db := sql.OpenDB(lookAlikeConnector{c.version})
		defer db.Close()
		for what, op := range map[string]func() error{
			"Lock.TryLock": func() error {
				l, err := advisorylock.New(db, "job", advisorylock.WithBackend(advisorylock.Postgres()))
				if err != nil {
					return err
				}
				_, err = l.TryLock(context.Background())
				return err
			},
			"LeaseLock.Check": func() error {
				l, err := advisorylock.NewLeaseLock(db, "job", advisorylock.WithBackend(advisorylock.Postgres()))
				if err != nil {
					return err
				}
				return l.Check(context.Background())
			},
		} {
			err := op()
			if !errors.Is(err, advisorylock.ErrUnsupported) || !strings.Contains(err.Error(), c.name) {
				t.Fatalf("%s on %s = %v, want ErrUnsupported naming %s", what, c.version, err, c.name)
			}
		}
	}
}

// lookAlikeConnector opens connections that answer version() with its
// version, pg_is_in_recovery() with false (as CockroachDB always does),
// and fail every other statement.
type lookAlikeConnector struct{ version string }

func (c lookAlikeConnector) Connect(context.Context) (driver.Conn, error) {
	return lookAlikeConn(c), nil
}
func (c lookAlikeConnector) Driver() driver.Driver { return lookAlikeDriver(c) }

type lookAlikeDriver struct{ version string }

func (d lookAlikeDriver) Open(string) (driver.Conn, error) { return lookAlikeConn(d), nil }

type lookAlikeConn struct{ version string }

func (lookAlikeConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("fake: no prepare") }
func (lookAlikeConn) Close() error                        { return nil }
func (lookAlikeConn) Begin() (driver.Tx, error)           { return nil, errors.New("fake: no transactions") }

func (c lookAlikeConn) QueryContext(_ context.Context, query string, _ []driver.NamedValue) (driver.Rows, error) {
	if strings.Contains(query, "version()") {
		return &versionRows{version: c.version}, nil
	}
	return nil, fmt.Errorf("fake %s: unexpected statement %q", c.version, query)
}

type versionRows struct {
	version string
	done    bool
}

func (*versionRows) Columns() []string { return []string{"version", "pg_is_in_recovery"} }
func (*versionRows) Close() error      { return nil }
func (r *versionRows) Next(dest []driver.Value) error {
	if r.done {
		return io.EOF
	}
	r.done = true
	dest[0] = r.version
	dest[1] = false
	return nil
}

// TestAReleaseByARoleThatMayNotCancelTheSleeperStillHandsOver: a LeaseLock
// waiter sleeps in line (plain lib/pq) as a superuser, whose statements
// an ordinary role may not cancel (pg_cancel_backend would fail the
// release with an error). The ordinary role's release hands it the lease
// without signalling it, and the waiter finds the lease its own at its
// next poll.
func TestAReleaseByARoleThatMayNotCancelTheSleeperStillHandsOver(t *testing.T) {
	testdb.Slow(t, "creates a role and waits for a handover")
	ctx := context.Background()
	role, withTables, owner := roleAndDatabase(t)
	for _, s := range []string{advisorylock.Schema(advisorylock.Postgres()),
		"GRANT SELECT, INSERT, UPDATE ON advisorylock_leases TO " + role,
		"GRANT USAGE ON SEQUENCE advisorylock_token_seq TO " + role,
		"GRANT SELECT ON advisorylock_schema TO " + role} {
		if _, err := owner.ExecContext(ctx, s); err != nil {
			t.Fatalf("%.60s: %v", s, err)
		}
	}
	name := testdb.UniqueName(t)
	g := tryLease(t, newLeaseLock(t, testdb.OpenPostgresDSN(t, "pgx", withUser(t, withTables, role)), name))

	app := "alsleeper" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
	waiterDB := testdb.OpenPostgresDSN(t, "postgres", withTables+"&application_name="+app)
	got := make(chan *advisorylock.LeaseGuard, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, testdb.HandoffWait)
		defer cancel()
		wg, err := newLeaseLock(t, waiterDB, name, advisorylock.WithPollInterval(50*time.Millisecond)).Lock(wctx)
		if err != nil {
			t.Errorf("the superuser's waiter: %v", err)
		}
		got <- wg
	}()
	testdb.WaitFor(t, testdb.HandoffWait, func() bool {
		var n int
		err := owner.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'
	AND wait_event = 'PgSleep'`, app).Scan(&n)
		return err == nil && n > 0
	}, "the superuser's waiter never slept in line")

	releaseLease(t, g)
	wg := <-got
	if wg == nil {
		t.FailNow()
	}
	if wg.Lease().Token() <= g.Lease().Token() {
		t.Fatalf("the waiter's token %d is not above the released grant's %d", wg.Lease().Token(), g.Lease().Token())
	}
	releaseLease(t, wg)
}
