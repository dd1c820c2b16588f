package main

import (
	"database/sql"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
)

func TestParseArgsReadsFlockStyleFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want options
	}{
		{[]string{"job", "--", "echo", "hi"}, options{name: "job", command: []string{"echo", "hi"}, wait: -1, conflictCode: 1}},
		{[]string{"job", "echo", "hi"}, options{name: "job", command: []string{"echo", "hi"}, wait: -1, conflictCode: 1}},
		{[]string{"job", "ls", "-l", "--", "x"}, options{name: "job", command: []string{"ls", "-l", "--", "x"}, wait: -1, conflictCode: 1}},
		{[]string{"-n", "job", "-c", "echo $HOME | wc"}, options{name: "job", command: []string{"/bin/sh", "-c", "echo $HOME | wc"}, nonblock: true, wait: 0, conflictCode: 1}},
		{[]string{"job", "--command", "true"}, options{name: "job", command: []string{"/bin/sh", "-c", "true"}, wait: -1, conflictCode: 1}},
		{[]string{"-n", "job", "--", "true"}, options{name: "job", command: []string{"true"}, nonblock: true, wait: 0, conflictCode: 1}},
		{[]string{"-nqE", "9", "job", "true"}, options{name: "job", command: []string{"true"}, nonblock: true, quiet: true, wait: 0, conflictCode: 9}},
		{[]string{"-w0.25", "job", "true"}, options{name: "job", command: []string{"true"}, wait: 250 * time.Millisecond, conflictCode: 1}},
		{[]string{"--wait=1m30s", "job", "--", "true"}, options{name: "job", command: []string{"true"}, wait: 90 * time.Second, conflictCode: 1}},
		{[]string{"--timeout", "2", "job", "--", "true"}, options{name: "job", command: []string{"true"}, wait: 2 * time.Second, conflictCode: 1}},
		{[]string{"-v", "--lease", "--ttl", "1m", "--kill-after=2.5", "--log-format", "json", "job", "sh", "-c", "x -- y"},
			options{name: "job", command: []string{"sh", "-c", "x -- y"}, verbose: true, lease: true, ttl: time.Minute, killAfter: 2500 * time.Millisecond, logFormat: "json", wait: -1, conflictCode: 1}},
		{[]string{"--dsn", "sqlite:x.db", "--config", "/x.conf", "job", "true"}, options{dsn: "sqlite:x.db", configFile: "/x.conf", name: "job", command: []string{"true"}, wait: -1, conflictCode: 1}},
		{[]string{"status", "--dsn", "sqlite:x.db", "a", "-v", "b"}, options{dsn: "sqlite:x.db", subcommand: "status", verbose: true, names: []string{"a", "b"}, wait: -1, conflictCode: 1}},
		{[]string{"status", "a", "--", "-b"}, options{subcommand: "status", names: []string{"a", "-b"}, wait: -1, conflictCode: 1}},
		{[]string{"status"}, options{subcommand: "status", wait: -1, conflictCode: 1}},
		{[]string{"completion", "zsh"}, options{subcommand: "completion", shell: "zsh", wait: -1, conflictCode: 1}},
		// Subcommand words are NAMEs anywhere but first, or before --.
		{[]string{"status", "--", "true"}, options{name: "status", command: []string{"true"}, wait: -1, conflictCode: 1}},
		{[]string{"--", "status", "true"}, options{name: "status", command: []string{"true"}, wait: -1, conflictCode: 1}},
		{[]string{"-n", "--", "completion", "true"}, options{name: "completion", command: []string{"true"}, nonblock: true, wait: 0, conflictCode: 1}},
		{[]string{"-n", "status", "--", "true"}, options{name: "status", command: []string{"true"}, nonblock: true, wait: 0, conflictCode: 1}},
		{[]string{"-v", "--dsn", "sqlite:x.db", "status", "a", "-q"}, options{dsn: "sqlite:x.db", subcommand: "status", verbose: true, quiet: true, names: []string{"a"}, wait: -1, conflictCode: 1}},
		{[]string{"--slots=2", "status", "-v", "--", "-a"}, options{subcommand: "status", slots: 2, verbose: true, names: []string{"-a"}, wait: -1, conflictCode: 1}},
		{[]string{"-q", "completion", "bash"}, options{subcommand: "completion", shell: "bash", quiet: true, wait: -1, conflictCode: 1}},
		{[]string{"--done-exit-code", "3", "--once", "k", "job", "true"}, options{name: "job", command: []string{"true"}, once: "k", doneCode: 3, wait: -1, conflictCode: 1}},
		{[]string{"--", "elect", "true"}, options{name: "elect", command: []string{"true"}, wait: -1, conflictCode: 1}},
		{[]string{"--nb", "-E0", "job", "--", "-x"}, options{name: "job", command: []string{"-x"}, nonblock: true, wait: 0, conflictCode: 0}},
		{[]string{"-V"}, options{version: true, wait: -1, conflictCode: 1}},
		// -l names the locks; COMMAND follows -- or -c.
		{[]string{"-n", "-l", "b", "--lock=a", "--", "echo", "x", "--", "y"}, options{name: setName([]string{"b", "a"}), locks: []string{"b", "a"}, command: []string{"echo", "x", "--", "y"}, nonblock: true, wait: 0, conflictCode: 1}},
		{[]string{"-lb", "-l", "a", "-c", "echo x"}, options{name: setName([]string{"a", "b"}), locks: []string{"b", "a"}, command: []string{"/bin/sh", "-c", "echo x"}, wait: -1, conflictCode: 1}},
		{[]string{"--lease", "-l", "job", "--", "status"}, options{name: "job", locks: []string{"job"}, command: []string{"status"}, lease: true, wait: -1, conflictCode: 1}},
		{[]string{"--once", "k", "-l", "a", "-l", "b", "--", "true"}, options{name: setName([]string{"b", "a"}), locks: []string{"a", "b"}, once: "k", command: []string{"true"}, wait: -1, conflictCode: 1}},
		{[]string{"--", "-l", "true"}, options{name: "-l", command: []string{"true"}, wait: -1, conflictCode: 1}},
	} {
		got, err := parseArgs(c.args)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if c.want.killAfter == 0 {
			c.want.killAfter = 10 * time.Second
		}
		if c.want.logFormat == "" {
			c.want.logFormat = "text"
		}
		got.given, c.want.given = nil, nil
		if !reflect.DeepEqual(*got, c.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", c.args, *got, c.want)
		}
	}
}

func TestParseArgsRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		say  string
	}{
		{nil, "missing NAME and COMMAND"},
		{[]string{"job"}, "missing COMMAND"},
		{[]string{"--", "echo"}, "missing COMMAND"},
		{[]string{"", "echo"}, "NAME is empty"},
		{[]string{"--", "", "echo"}, "NAME is empty"},
		{[]string{"job", "--"}, "no COMMAND"},
		{[]string{"job", "--", ""}, "no COMMAND"},
		{[]string{"job", ""}, "no COMMAND"},
		{[]string{"job", "-c"}, "exactly one COMMAND"},
		{[]string{"job", "-c", "echo", "hi"}, "exactly one COMMAND"},
		{[]string{"job", "-c", ""}, "no COMMAND"},
		{[]string{"job", "-n", "true"}, "flags go before NAME"},
		{[]string{"job", "--lease", "--", "true"}, "flags go before NAME"},
		{[]string{"--what", "job", "--", "x"}, "unknown flag --what"},
		{[]string{"-x", "job", "--", "x"}, "unknown flag -x"},
		{[]string{"-w", "job", "--", "x"}, `bad value "job"`},
		{[]string{"--wait"}, "needs a value"},
		{[]string{"-w"}, "needs a value"},
		{[]string{"-w", "NaN", "job", "--", "x"}, "bad value"},
		{[]string{"-w", "1e300", "job", "--", "x"}, "bad value"},
		{[]string{"-w", "-2s", "job", "--", "x"}, "bad value"},
		{[]string{"-E", "-1", "job", "--", "x"}, "0 to 255"},
		{[]string{"-E", "x", "job", "--", "x"}, "0 to 255"},
		{[]string{"--ttl=0", "job", "--", "x"}, "at least 1s"},
		{[]string{"--ttl=999ms", "job", "--", "x"}, "at least 1s"},
		{[]string{"--ttl=25h", "job", "--", "x"}, "at most 24h"},
		{[]string{"--log-format=xml", "job", "--", "x"}, "text or json"},
		{[]string{"--quiet=1", "job", "--", "x"}, "takes no value"},
		{[]string{"-n", "--wait", "1", "job", "--", "x"}, "exclude each other"},
		{[]string{"status", "--lease"}, "does not apply to status"},
		{[]string{"status", "-n", "job"}, "does not apply to status"},
		{[]string{"-n", "status", "job"}, "does not apply to status (a lock named status is taken with lockrun [flags] -- status COMMAND)"},
		{[]string{"status", "--once", "k"}, "does not apply to status"},
		{[]string{"--done-exit-code", "3", "status"}, "does not apply to status"},
		{[]string{"-w", "1", "completion", "bash"}, "does not apply to completion"},
		{[]string{"-v", "elect", "x", "true"}, "elect is reserved"},
		{[]string{"--done-exit-code", "256", "--once", "k", "job", "true"}, "0 to 255"},
		{[]string{"completion"}, "lockrun completion bash|zsh"},
		{[]string{"completion", "fish"}, "lockrun completion bash|zsh"},
		{[]string{"elect", "leader", "true"}, "elect is reserved"},
		{[]string{"-l", "a", "b", "--", "true"}, `"b" after the -l flags`},
		{[]string{"-l", "a", "true"}, `"true" after the -l flags`},
		{[]string{"-l", "a", "-l", "b"}, "missing COMMAND"},
		{[]string{"-l", "a", "--"}, "missing COMMAND after --"},
		{[]string{"-l", "a", "-c"}, "exactly one COMMAND"},
		{[]string{"-l", "", "--", "true"}, "NAME is empty"},
		{[]string{"-l", "a", "-l", "a", "--", "true"}, `lock "a" is named twice`},
		{[]string{"-l", "a", "-l", "b,c", "--", "true"}, "cannot hold a comma"},
		{[]string{"-l", "a", "-l", "b", "--lease", "--", "true"}, "several -l locks and --lease exclude each other"},
		{[]string{"-l", "a", "-l", "b", "--slots", "2", "--", "true"}, "several -l locks and --slots exclude each other"},
		{[]string{"--min-hold", "1m", "-l", "a", "-l", "b", "--", "true"}, "several -l locks and --min-hold exclude each other"},
		{[]string{"-s", "-l", "a", "-l", "b", "--", "true"}, "several -l locks and --shared exclude each other"},
		{[]string{"-n", "-w", "1", "-l", "a", "-l", "b", "--", "true"}, "-n and -w exclude each other"},
		{[]string{"--once", "k", "-w", "1", "-l", "a", "-l", "b", "--", "true"}, "--once and --wait exclude each other"},
		{[]string{"status", "-l", "a"}, "does not apply to status"},
	} {
		_, err := parseArgs(c.args)
		if err == nil || !strings.Contains(err.Error(), c.say) {
			t.Errorf("%q: error %v, want one saying %q", c.args, err, c.say)
		}
	}
}

func TestParseSecondsTakesFractionsAndDurations(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"0": 0, "1": time.Second, "0.3": 300 * time.Millisecond, ".5": 500 * time.Millisecond,
		"90s": 90 * time.Second, "1m30s": 90 * time.Second, "250ms": 250 * time.Millisecond, "1h": time.Hour,
	} {
		if got, err := parseSeconds(in); err != nil || got != want {
			t.Errorf("parseSeconds(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "soon", "-1", "-1s", "Inf", "NaN", "1e20", "3 s"} {
		if _, err := parseSeconds(in); err == nil {
			t.Errorf("parseSeconds(%q) accepted it", in)
		}
	}
}

func TestLockrunTurnsAPanicIntoOneLine(t *testing.T) {
	var out, errOut strings.Builder
	getenv := func(string) string { panic("boom") }
	code := lockrun([]string{"status"}, getenv, &out, &errOut)
	if code != exitSoftware || errOut.String() != "lockrun: internal error: boom\n" {
		t.Errorf("exit %d, stderr %q; want %d and one line", code, errOut.String(), exitSoftware)
	}
}

// setName names a set as NewSet does (Lock.Name), whatever the order of
// the -l flags.
func TestSetNameIsNewSets(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "locks.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	names := []string{"orders", "invoices", "b", "a", "nightly-report"}
	l, err := advisorylock.NewSet(db, names, advisorylock.WithPoolerCheck(false))
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(names)
	if got := setName(names); got != l.Name() || !strings.Contains(got, ",") {
		t.Errorf("setName(%q) = %q, NewSet's Name is %q", names, got, l.Name())
	}
}
