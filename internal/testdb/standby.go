package testdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// StandbyOf starts a streaming hot standby of primary, a throwaway cluster
// of this test: pg_basebackup -R copies it into a new temporary directory
// and the copy starts on another free port, in recovery, following the
// primary. It returns once the standby answers and its WAL receiver
// streams; the standby is destroyed at t.Cleanup. The standby's DSN
// points at its own port; queries on it see the primary's data as of the
// WAL it replayed.
func StandbyOf(t testing.TB, primary *Cluster) *Cluster {
	t.Helper()
	dir, err := ownedTempDir("advisorylock-standby-", primary.cred)
	if err != nil {
		t.Fatalf("testdb: standby directory: %v", err)
	}
	s := &Cluster{dir: dir, binDir: primary.binDir, cred: primary.cred}
	t.Cleanup(s.destroy)
	backup := exec.Command(filepath.Join(primary.binDir, "pg_basebackup"),
		"-D", s.dataDir(), "-R", "-X", "stream", "-c", "fast", "--no-sync",
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres")
	backup.Dir = dir
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: primary.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		t.Fatalf("testdb: pg_basebackup: %v: %s", err, lastLines(string(out), 5))
	}
	for attempt := 0; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			break
		}
		s.DSN = urlDSN("postgres", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)), "postgres")
		if err = s.start(); err == nil || attempt == 2 {
			break
		}
	}
	if err != nil {
		t.Fatalf("testdb: starting the standby: %v", err)
	}
	WaitFor(t, 0, func() bool { return s.receiving(t) }, "the standby on port %d never started streaming: %s", s.port, s.logTail())
	return s
}

// Port returns the cluster's TCP port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// admin runs f on a fresh lib/pq connection to the cluster's postgres
// database as the superuser, failing the test on error.
func (c *Cluster) admin(t testing.TB, f func(ctx context.Context, db *sql.DB) error) {
	t.Helper()
	db, err := sql.Open("postgres", c.DSN)
	if err != nil {
		t.Fatalf("testdb: open %s: %v", c.DSN, err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	if err := f(ctx, db); err != nil {
		t.Fatalf("testdb: cluster on port %d: %v", c.port, err)
	}
}

// receiving reports whether the cluster's WAL receiver is streaming.
func (c *Cluster) receiving(t testing.TB) bool {
	var n int
	c.admin(t, func(ctx context.Context, db *sql.DB) error {
		return db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_wal_receiver WHERE status = 'streaming'").Scan(&n)
	})
	return n > 0
}

// CatchUp waits until standby has replayed everything primary has
// inserted into its WAL so far (the primary runs with
// synchronous_commit=off: its WAL writer flushes within a fraction of a
// second, and only flushed WAL is sent).
func (c *Cluster) CatchUp(t testing.TB, primary *Cluster) {
	t.Helper()
	var lsn string
	primary.admin(t, func(ctx context.Context, db *sql.DB) error {
		return db.QueryRowContext(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn)
	})
	WaitFor(t, 0, func() bool {
		var done bool
		c.admin(t, func(ctx context.Context, db *sql.DB) error {
			return db.QueryRowContext(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&done)
		})
		return done
	}, "the standby on port %d did not replay up to %s", c.port, lsn)
}

// StopReceiving makes a standby lag for good: it empties its
// primary_conninfo and reloads, which stops the WAL receiver, and returns
// once no receiver runs. Whatever the primary commits afterwards never
// reaches this standby (the failover-with-lag of an asynchronous standby).
func (c *Cluster) StopReceiving(t testing.TB) {
	t.Helper()
	c.admin(t, func(ctx context.Context, db *sql.DB) error {
		if _, err := db.ExecContext(ctx, "ALTER SYSTEM SET primary_conninfo = ''"); err != nil {
			return err
		}
		_, err := db.ExecContext(ctx, "SELECT pg_reload_conf()")
		return err
	})
	WaitFor(t, 0, func() bool {
		var n int
		c.admin(t, func(ctx context.Context, db *sql.DB) error {
			return db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_wal_receiver").Scan(&n)
		})
		return n == 0
	}, "the WAL receiver of the standby on port %d did not stop", c.port)
}

// Promote promotes a standby to primary (pg_promote, waiting for it) and
// returns once it accepts writes on a new timeline.
func (c *Cluster) Promote(t testing.TB) {
	t.Helper()
	c.admin(t, func(ctx context.Context, db *sql.DB) error {
		var ok bool
		if err := db.QueryRowContext(ctx, "SELECT pg_promote(true, 60)").Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return errors.New("pg_promote returned false")
		}
		return nil
	})
	WaitFor(t, 0, func() bool {
		var recovering bool
		c.admin(t, func(ctx context.Context, db *sql.DB) error {
			return db.QueryRowContext(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering)
		})
		return !recovering
	}, "the standby on port %d is still in recovery after pg_promote", c.port)
}

// Timeline returns the cluster's current WAL timeline, as an ordinary
// role can read it.
func (c *Cluster) Timeline(t testing.TB) int64 {
	t.Helper()
	var tl int64
	c.admin(t, func(ctx context.Context, db *sql.DB) error {
		return db.QueryRowContext(ctx, "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint").Scan(&tl)
	})
	return tl
}

// Crash kills the cluster's server as a power cut would (SIGQUIT: an
// immediate shutdown, no checkpoint, sessions dropped) and waits for it to
// exit. Restart starts it again, running crash recovery.
func (c *Cluster) Crash(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return
	}
	cmd, exited := c.cmd, c.exited
	c.cmd = nil
	_ = cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-exited:
	case <-time.After(DefaultWait):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Exec runs statements on the cluster's postgres database as the
// superuser, failing the test on the first error.
func (c *Cluster) Exec(t testing.TB, stmts ...string) {
	t.Helper()
	c.admin(t, func(ctx context.Context, db *sql.DB) error {
		for _, s := range stmts {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
		return nil
	})
}
