package main

import (
	"flag"
	"os"
	"os/exec"
	"strings"
	"testing"
)

var updateMan = flag.Bool("update-man", false, "rewrite lockrun.1 from the help text (go generate does)")

// lockrun.1 is what lockrun --help prints, as a man
// page, and roff reads it without a warning.
func TestManPageIsTheHelp(t *testing.T) {
	t.Parallel()
	code, help, stderr := runLockrun(t, nil, "--help")
	if code != 0 || stderr != "" {
		t.Fatalf("--help: exit %d, stderr %q", code, stderr)
	}
	want := manPage(help)
	if *updateMan {
		if err := os.WriteFile("lockrun.1", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("lockrun.1")
	if err != nil || string(got) != want {
		t.Fatalf("lockrun.1 is not the help text (%v): run go generate ./cmd/lockrun", err)
	}
	groff, err := exec.LookPath("groff")
	if err != nil {
		return // the comparison above is the contract; groff only adds a lint
	}
	cmd := exec.Command(groff, "-man", "-Tascii", "-ww", "-P-cbou", "lockrun.1")
	var warnings strings.Builder
	cmd.Stderr = &warnings
	out, err := cmd.Output()
	if err != nil || warnings.Len() > 0 {
		t.Fatalf("groff: %v: %s", err, warnings.String())
	}
	for _, line := range strings.Split(help, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.Contains(string(out), line) {
			t.Errorf("the rendered man page lacks the help's line %q", line)
		}
	}
}
