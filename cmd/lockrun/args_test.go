package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseArgsReadsFlockStyleFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want options
	}{
		{[]string{"job", "--", "echo", "hi"}, options{name: "job", command: []string{"echo", "hi"}, wait: -1, conflictCode: 1}},
		{[]string{"-n", "job", "--", "true"}, options{name: "job", command: []string{"true"}, nonblock: true, wait: 0, conflictCode: 1}},
		{[]string{"-nqE", "9", "job", "--", "true"}, options{name: "job", command: []string{"true"}, nonblock: true, quiet: true, wait: 0, conflictCode: 9}},
		{[]string{"-w0.25", "job", "--", "true"}, options{name: "job", command: []string{"true"}, wait: 250 * time.Millisecond, conflictCode: 1}},
		{[]string{"--wait=1m30s", "job", "--", "true"}, options{name: "job", command: []string{"true"}, wait: 90 * time.Second, conflictCode: 1}},
		{[]string{"--timeout", "2", "job", "--", "true"}, options{name: "job", command: []string{"true"}, wait: 2 * time.Second, conflictCode: 1}},
		{[]string{"job", "-v", "--lease", "--ttl", "1m", "--kill-after=2.5", "--", "sh", "-c", "x -- y"},
			options{name: "job", command: []string{"sh", "-c", "x -- y"}, verbose: true, lease: true, ttl: time.Minute, killAfter: 2500 * time.Millisecond, wait: -1, conflictCode: 1}},
		{[]string{"--dsn", "sqlite:x.db", "status", "a", "b"}, options{dsn: "sqlite:x.db", status: true, names: []string{"a", "b"}, wait: -1, conflictCode: 1}},
		{[]string{"status"}, options{status: true, wait: -1, conflictCode: 1}},
		{[]string{"status", "--", "true"}, options{name: "status", command: []string{"true"}, wait: -1, conflictCode: 1}},
		{[]string{"--nb", "-E0", "job", "--", "-x"}, options{name: "job", command: []string{"-x"}, nonblock: true, wait: 0, conflictCode: 0}},
	} {
		got, err := parseArgs(c.args)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if c.want.killAfter == 0 {
			c.want.killAfter = 10 * time.Second
		}
		if got.name != c.want.name || !slices.Equal(got.command, c.want.command) || got.nonblock != c.want.nonblock ||
			got.wait != c.want.wait || got.conflictCode != c.want.conflictCode || got.quiet != c.want.quiet ||
			got.verbose != c.want.verbose || got.lease != c.want.lease || got.ttl != c.want.ttl ||
			got.killAfter != c.want.killAfter || got.dsn != c.want.dsn || got.status != c.want.status ||
			!slices.Equal(got.names, c.want.names) {
			t.Errorf("%q: got %+v, want %+v", c.args, *got, c.want)
		}
	}
}

func TestParseArgsRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		args []string
		say  string
	}{
		{nil, "missing NAME and COMMAND"},
		{[]string{"job", "echo"}, "missing --"},
		{[]string{"--", "echo"}, "missing the lock NAME"},
		{[]string{"a", "b", "--", "echo"}, "one lock NAME"},
		{[]string{"job", "--"}, "no COMMAND"},
		{[]string{"job", "--", ""}, "no COMMAND"},
		{[]string{"--what", "job", "--", "x"}, "unknown flag --what"},
		{[]string{"-x", "job", "--", "x"}, "unknown flag -x"},
		{[]string{"-w", "job", "--", "x"}, `bad value "job"`},
		{[]string{"job", "--wait"}, "needs a value"},
		{[]string{"-w", "NaN", "job", "--", "x"}, "bad value"},
		{[]string{"-w", "1e300", "job", "--", "x"}, "bad value"},
		{[]string{"-w", "-2s", "job", "--", "x"}, "bad value"},
		{[]string{"-E", "-1", "job", "--", "x"}, "0 to 255"},
		{[]string{"-E", "x", "job", "--", "x"}, "0 to 255"},
		{[]string{"--ttl=0", "job", "--", "x"}, "above zero"},
		{[]string{"--quiet=1", "job", "--", "x"}, "takes no value"},
		{[]string{"-n", "--wait", "1", "job", "--", "x"}, "exclude each other"},
		{[]string{"status", "--lease"}, "does not apply to status"},
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
