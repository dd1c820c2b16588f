package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// lockrun completion bash|zsh prints a script the shell
// accepts (zsh is checked where it is installed).
func TestCompletionScriptsParse(t *testing.T) {
	t.Parallel()
	for _, shell := range []string{"bash", "zsh"} {
		code, script, stderr := runLockrun(t, nil, "completion", shell)
		if code != 0 || stderr != "" || !strings.Contains(script, "lockrun") {
			t.Fatalf("completion %s: exit %d, stderr %q", shell, code, stderr)
		}
		path, err := exec.LookPath(shell)
		if err != nil {
			if shell == "bash" {
				t.Fatalf("bash is not installed: %v", err)
			}
			continue
		}
		file := filepath.Join(t.TempDir(), "lockrun."+shell)
		if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(path, "-n", file).CombinedOutput(); err != nil {
			t.Errorf("%s -n rejects the completion script: %v\n%s", shell, err, out)
		}
	}
}

// The bash completion completes flags, subcommands, a config file and,
// after NAME, a command.
func TestBashCompletionCompletes(t *testing.T) {
	t.Parallel()
	_, script, _ := runLockrun(t, nil, "completion", "bash")
	dir := t.TempDir()
	file := filepath.Join(dir, "lockrun.bash")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "fleet.conf"), "")
	for words, want := range map[string]string{
		"lockrun --non":                   "--nonblock",
		"lockrun st":                      "status",
		"lockrun completion z":            "zsh",
		"lockrun --log-format j":          "json",
		"lockrun --config " + dir + "/fl": filepath.Join(dir, "fleet.conf"),
		"lockrun -n -w 5 job ech":         "echo",
		"lockrun -n job -- ech":           "echo",
		"lockrun -w 5 --kil":              "--kill-after",
		"lockrun status job --ds":         "--dsn",
		"lockrun -l a -l b -- ech":        "echo",
		"lockrun -n --lock a -- ech":      "echo",
		"lockrun -l a --no":               "--nonblock",
	} {
		cmd := exec.Command("bash", "-c", `source "$1"; COMP_WORDS=($2); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _lockrun; printf '%s\n' "${COMPREPLY[@]}"`, "bash", file, words)
		out, err := cmd.CombinedOutput()
		if err != nil || !contains(strings.Split(string(out), "\n"), want) {
			t.Errorf("completing %q: %v, got %q; want %q among them", words, err, out, want)
		}
	}
	out, err := exec.Command("bash", "-c", `source "$1"; COMP_WORDS=(lockrun status ech); COMP_CWORD=2; _lockrun; echo "${#COMPREPLY[@]}"`, "bash", file).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("status's lock names were completed as commands: %v, %q", err, out)
	}
	// With -l the word after -- is the command, not a NAME: the next word
	// is its argument, a file here.
	writeFile(t, filepath.Join(dir, "echo-arg"), "")
	out, err = exec.Command("bash", "-c", `source "$1"; cd "$2"; COMP_WORDS=(lockrun -l a -- echo echo-a); COMP_CWORD=5; _lockrun; printf '%s\n' "${COMPREPLY[@]}"`, "bash", file, dir).CombinedOutput()
	if err != nil || !contains(strings.Split(string(out), "\n"), "echo-arg") {
		t.Errorf("after -l a -- echo, bash completed %q (%v); want the file echo-arg", out, err)
	}
}
