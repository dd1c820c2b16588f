package testdb

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelperProcess is the child side of TestHelperCommand.
func TestHelperProcess(t *testing.T) {
	role := HelperRole()
	if role == "" {
		t.Skip("helper process")
	}
	switch role {
	case "report":
		got := strings.Join([]string{role, os.Getenv("TESTDB_EXTRA"), os.Getenv(EnvPostgres)}, "\n")
		if err := os.WriteFile(os.Getenv("TESTDB_OUT"), []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Log("child says hello")
	case "fail":
		t.Fatal("failing on purpose")
	case "hang":
		select {}
	}
}

func TestHelperCommandRunsOneTestWithRoleAndEnv(t *testing.T) {
	if HelperRole() != "" {
		t.Skip("helper process")
	}
	dsn := ""
	if os.Getenv(EnvPostgres) != "" || resolvedDSN() != "" {
		dsn = PostgresDSN(t)
	}
	out := filepath.Join(t.TempDir(), "out")
	cmd := HelperCommand(t, "TestHelperProcess", "report", "TESTDB_EXTRA=x1", "TESTDB_OUT="+out)
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{"report", "x1", dsn}, "\n")
	if string(b) != want {
		t.Fatalf("child reported %q, want %q", b, want)
	}
}

func TestHelperCommandReportsFailure(t *testing.T) {
	if HelperRole() != "" {
		t.Skip("helper process")
	}
	cmd := HelperCommand(t, "TestHelperProcess", "fail")
	var exitErr *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &exitErr) {
		t.Fatalf("failing helper: got %v, want an exit error", err)
	}
}

func TestHelperCommandKillsHelperAtCleanup(t *testing.T) {
	if HelperRole() != "" {
		t.Skip("helper process")
	}
	var cmd *exec.Cmd
	t.Run("start", func(t *testing.T) {
		cmd = HelperCommand(t, "TestHelperProcess", "hang")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
	})
	// The subtest's cleanup killed the child: Wait returns.
	if err := cmd.Wait(); err == nil {
		t.Fatal("hanging helper exited cleanly")
	}
}

func TestHelperRoleEmptyInParent(t *testing.T) {
	if HelperRole() != "" {
		t.Skip("helper process")
	}
	if os.Getenv(EnvHelper) != "" {
		t.Fatal("parent has a helper role")
	}
}
