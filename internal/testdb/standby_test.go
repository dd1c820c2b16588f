package testdb

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

func TestStandbyFollowsThenLagsThenPromotesOnANewTimeline(t *testing.T) {
	Slow(t, "standby: a private cluster, its standby and a failover")
	primary := OwnCluster(t)
	standby := StandbyOf(t, primary)
	primary.Exec(t, "CREATE TABLE grants (n int)", "INSERT INTO grants VALUES (1)")
	standby.CatchUp(t, primary)
	if n := count(t, standby); n != 1 {
		t.Fatalf("standby sees %d rows after catching up, want 1", n)
	}
	standby.StopReceiving(t)
	primary.Exec(t, "INSERT INTO grants VALUES (2), (3)")
	before := primary.Timeline(t)
	primary.Crash(t)
	if err := pingDSN(primary.DSN); err == nil {
		t.Fatal("the crashed primary still answers")
	}
	standby.Promote(t)
	if n := count(t, standby); n != 1 {
		t.Fatalf("the promoted standby sees %d rows, want 1 (it stopped receiving before 2 and 3)", n)
	}
	if after := standby.Timeline(t); after <= before {
		t.Fatalf("timeline after promotion %d, want more than the primary's %d", after, before)
	}
	standby.Exec(t, "INSERT INTO grants VALUES (4)") // accepts writes
}

func count(t *testing.T, c *Cluster) int {
	t.Helper()
	var n int
	c.admin(t, func(ctx context.Context, db *sql.DB) error {
		return db.QueryRowContext(ctx, "SELECT count(*) FROM grants").Scan(&n)
	})
	return n
}

func TestBlackholeSilencesOneConnectionOnly(t *testing.T) {
	Slow(t, "iptables: blackholes a connection")
	RequireIptables(t)
	dsn := PostgresDSN(t)
	// pgx: it ends a statement when its context ends, even on a dead network.
	victim, bystander := OpenPostgresDSN(t, "pgx", dsn), OpenPostgresDSN(t, "postgres", dsn)
	victim.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	var pid int
	if err := victim.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	heal := Blackhole(t, Port(t, dsn), ClientPort(t, bystander, pid))
	short, cancelShort := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancelShort()
	err := victim.QueryRowContext(short, "SELECT 1").Scan(new(int))
	var netErr net.Error
	if err == nil {
		t.Fatal("a blackholed connection answered")
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.As(err, &netErr) && !errors.Is(err, sql.ErrConnDone) {
		t.Logf("blackholed statement ended with %v", err)
	}
	if err := bystander.QueryRowContext(ctx, "SELECT 1").Scan(new(int)); err != nil {
		t.Fatalf("another connection to the same server is affected: %v", err)
	}
	heal()
	if out, _ := iptables("-S", "INPUT"); strings.Contains(out, blackholeTag(os.Getpid())+" ") {
		t.Fatalf("rules left after heal:\n%s", out)
	}
}
