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
		"lockrun -v st":                   "status",
		"lockrun -w 5 --dsn x comp":       "completion",
		"lockrun -q --dsn x completion z": "zsh",
		"lockrun -v status job --ds":      "--dsn",
		"lockrun -- status ech":           "echo",
		"lockrun -v status -- ech":        "echo",
	} {
		cmd := exec.Command("bash", "-c", `source "$1"; COMP_WORDS=($2); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _lockrun; printf '%s\n' "${COMPREPLY[@]}"`, "bash", file, words)
		out, err := cmd.CombinedOutput()
		if err != nil || !contains(strings.Split(string(out), "\n"), want) {
			t.Errorf("completing %q: %v, got %q; want %q among them", words, err, out, want)
		}
	}
	for _, words := range []string{"lockrun status ech", "lockrun -v --dsn x status ech"} {
		out, err := exec.Command("bash", "-c", `source "$1"; COMP_WORDS=($2); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _lockrun; echo "${#COMPREPLY[@]}"`, "bash", file, words).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "0" {
			t.Errorf("%q: status's lock names were completed as commands: %v, %q", words, err, out)
		}
	}
	// With -l the word after -- is the command, not a NAME: the next word
	// is its argument, a file here.
	writeFile(t, filepath.Join(dir, "echo-arg"), "")
	out, err := exec.Command("bash", "-c", `source "$1"; cd "$2"; COMP_WORDS=(lockrun -l a -- echo echo-a); COMP_CWORD=5; _lockrun; printf '%s\n' "${COMPREPLY[@]}"`, "bash", file, dir).CombinedOutput()
	if err != nil || !contains(strings.Split(string(out), "\n"), "echo-arg") {
		t.Errorf("after -l a -- echo, bash completed %q (%v); want the file echo-arg", out, err)
	}
}

// The zsh completion finds NAME or a subcommand after the flags, as
// lockrun reads them: run with zsh's completion functions stubbed to
// print what they are asked.
func TestZshCompletionFindsTheSubcommandAfterFlags(t *testing.T) {
	t.Parallel()
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Fatalf("zsh is not installed (.ci/run installs it): %v", err)
	}
	_, script, _ := runLockrun(t, nil, "completion", "zsh")
	file := filepath.Join(t.TempDir(), "lockrun.zsh")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	const stubs = `_arguments() { print -r -- _arguments "$@" }
_alternative() { print -r -- _alternative "$@" }
_values() { print -r -- _values "$@" }
_normal() { print -r -- _normal }
compdef() { }
source "$1"; shift; words=("$@"); CURRENT=$#words; _lockrun`
	for words, want := range map[string]string{
		"lockrun st":                    "_alternative subcommands:subcommand:(status completion)",
		"lockrun -v -w 5 st":            "_alternative subcommands:subcommand:(status completion)",
		"lockrun --dsn x completion z":  "_values shell bash zsh",
		"lockrun -q status a -":         "*:lock name:",
		"lockrun -v --dsn x status a -": "*:lock name:",
		"lockrun -- status ech":         "1:lock name:",
		"lockrun -v status -- ech":      "1:lock name:",
		"lockrun -n job ech":            "1:lock name:",
	} {
		out, err := exec.Command(zsh, append([]string{"-c", stubs, "zsh", file}, strings.Fields(words)...)...).CombinedOutput()
		if got := strings.TrimSpace(string(out)); err != nil || !strings.Contains(got, want) {
			t.Errorf("completing %q in zsh: %v, asked %q; want %q", words, err, got, want)
		}
	}
}
