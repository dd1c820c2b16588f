package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	_ "github.com/glebarez/go-sqlite"  // driver "sqlite"
	_ "github.com/go-sql-driver/mysql" // driver "mysql"
	_ "github.com/lib/pq"              // driver "postgres"
)

// machine describes where a run happened.
type machine struct {
	CPUModel   string // with the count: "2 × AMD EPYC"
	OS         string
	GoVersion  string
	PGVersion  string
	PGSettings string // settings the figures depend on
	SQLite     string
	LoadBefore string
	LoadAfter  string
	Pinning    string   // where the server and the benchmarks ran (see pinning)
	Modules    []string // "path version" of the libraries measured
	Commit     string   // advisorylock's commit, "+dirty" if the tree has changes
	Started    time.Time
	Took       time.Duration
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// output runs a command and returns its trimmed output, or "unknown".
func output(dir, name string, args ...string) string {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// describeServer asks the PostgreSQL server at dsn for its version and the
// settings that commit-bound figures depend on, and an in-memory SQLite
// for its version.
func describeServer(m *machine, dsn string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m.PGVersion, m.PGSettings, m.SQLite = "unknown", "unknown", "unknown"
	if db, err := sql.Open("postgres", dsn); err == nil {
		defer db.Close()
		var v, sc, fsync, wal string
		if db.QueryRowContext(ctx, "SELECT version(), current_setting('synchronous_commit'), current_setting('fsync'), current_setting('wal_sync_method')").Scan(&v, &sc, &fsync, &wal) == nil {
			m.PGVersion = v
			m.PGSettings = "synchronous_commit=" + sc + ", fsync=" + fsync + ", wal_sync_method=" + wal
		}
	}
	if db, err := sql.Open("sqlite", ":memory:"); err == nil {
		defer db.Close()
		var v string
		if db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&v) == nil {
			m.SQLite = v
		}
	}
}

func describeMachine(dir, dsn string) machine {
	m := machine{
		CPUModel:   fmt.Sprintf("%d × %s", runtime.NumCPU(), cpuModel()),
		OS:         runtime.GOOS + "/" + runtime.GOARCH,
		GoVersion:  output(dir, "go", "env", "GOVERSION"),
		LoadBefore: loadAvg(),
		Started:    time.Now(),
	}
	describeServer(&m, dsn)
	mods := output(dir, "go", "list", "-m", "-f", "{{.Path}} {{if .Replace}}{{.Replace.Path}}{{else}}{{.Version}}{{end}}",
		"github.com/advisorylock/advisorylock", "github.com/lib/pq", "github.com/jackc/pgx/v5",
		"github.com/glebarez/go-sqlite", "modernc.org/sqlite", "github.com/pressly/goose/v3",
		"github.com/golang-migrate/migrate/v4", "golang.org/x/perf")
	m.Modules = strings.Split(mods, "\n")
	m.Commit = output(dir, "git", "rev-parse", "--short", "HEAD")
	if st := output(dir, "git", "status", "--porcelain", "--", ".."); st != "" && st != "unknown" {
		m.Commit += " + uncommitted changes"
	}
	return m
}
