package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
)

func TestPostgresDSNIsCached(t *testing.T) {
	a := PostgresDSN(t)
	if b := PostgresDSN(t); a != b {
		t.Fatalf("PostgresDSN changed: %q then %q", a, b)
	}
}

func TestOpenPostgresWithEachDriver(t *testing.T) {
	for _, driver := range Drivers {
		t.Run(driver, func(t *testing.T) {
			db := OpenPostgres(t, driver)
			var v int
			if err := db.QueryRow("SELECT 40 + 2").Scan(&v); err != nil || v != 42 {
				t.Fatalf("got %d, %v", v, err)
			}
		})
	}
}

func TestAdvisoryLocksCountsByKey(t *testing.T) {
	holder := OpenPostgres(t, "postgres")
	observer := OpenPostgres(t, "pgx")
	ctx := context.Background()
	conn, err := holder.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// Keys whose halves catch sign and order mistakes in classid/objid,
	// unlikely to be used by other packages' tests on the same server.
	keys := []int64{0x7E57_0000_0000_0001, -0x7E57_0000_0000_0002, -1<<63 | 0x7E57, 0x7E57_7E57, 0x7E57_7E57_FFFF_FFFF}
	for _, k := range keys {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			if got := AdvisoryLocks(t, observer, &k); got != 0 {
				t.Fatalf("key %d counted %d before locking", k, got)
			}
			mustExec(t, conn, fmt.Sprintf("SELECT pg_advisory_lock(%d)", k))
			if got := AdvisoryLocks(t, observer, &k); got != 1 {
				t.Fatalf("key %d held: counted %d, want 1", k, got)
			}
			other := k ^ 1
			if got := AdvisoryLocks(t, observer, &other); got != 0 {
				t.Fatalf("key %d held: key %d counted %d, want 0", k, other, got)
			}
			if got := AdvisoryLocks(t, observer, nil); got < 1 {
				t.Fatalf("all locks: %d, want at least 1", got)
			}
			mustExec(t, conn, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", k))
			if got := AdvisoryLocks(t, observer, &k); got != 0 {
				t.Fatalf("key %d released: counted %d", k, got)
			}
		})
	}
}

func TestAdvisoryLocksExcludesTheQueryingSession(t *testing.T) {
	db := OpenPostgres(t, "postgres")
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	key := int64(0x7E57_1234_5678)
	mustExec(t, conn, fmt.Sprintf("SELECT pg_advisory_lock(%d)", key))
	_ = conn.Close() // back to the pool, still holding the lock
	if got := AdvisoryLocks(t, db, &key); got != 0 {
		t.Fatalf("the querying session's own lock was counted: %d", got)
	}
	other := OpenPostgres(t, "postgres")
	if got := AdvisoryLocks(t, other, &key); got != 1 {
		t.Fatalf("from another session: %d, want 1", got)
	}
}

func mustExec(t *testing.T, conn *sql.Conn, q string) {
	t.Helper()
	if _, err := conn.ExecContext(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func TestFindPostgresFallsBackToThrowawayCluster(t *testing.T) {
	Slow(t, "starts a throwaway PostgreSQL cluster")
	if _, err := findPGBin(); err != nil {
		Unavailable(t, err.Error()) // .ci/run installs the server binaries
	}
	sharedDSN := PostgresDSN(t) // resolved before the default server is hidden
	dead, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	saved := defaultHostPort
	defaultHostPort = fmt.Sprintf("127.0.0.1:%d", dead)
	t.Cleanup(func() { defaultHostPort = saved })
	t.Setenv(EnvPostgres, "")

	dsn, reason := findPostgres(t) // the cluster is stopped by Main's teardown
	if dsn == "" {
		t.Fatalf("no throwaway cluster: %s", reason)
	}
	if dsn == sharedDSN {
		t.Fatalf("got the shared server %s", dsn)
	}
	db := OpenPostgresDSN(t, "pgx", dsn)
	var v string
	if err := db.QueryRow("SHOW listen_addresses").Scan(&v); err != nil || v != "127.0.0.1" {
		t.Fatalf("listen_addresses = %q, %v", v, err)
	}
}

func TestFindPostgresPrefersTheEnvironment(t *testing.T) {
	const dsn = "host=/nonexistent dbname=x"
	t.Setenv(EnvPostgres, dsn)
	if got, _ := findPostgres(t); got != dsn {
		t.Fatalf("got %q, want the environment's DSN as given", got)
	}
}

func TestStartDockerWithoutDaemonSaysSo(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
	_, _, err := startDocker(t)
	if err == nil {
		t.Fatal("a Docker container started with no daemon")
	}
	if !strings.Contains(err.Error(), "no Docker daemon") {
		t.Fatalf("unclear reason: %v", err)
	}
}
