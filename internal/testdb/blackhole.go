package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Blackhole makes one TCP connection on loopback vanish as a powered-off
// host would: iptables drops every packet between 127.0.0.1:clientPort and
// 127.0.0.1:serverPort, in both directions, without a reset or a close, so
// both ends keep the socket open and wait. Only that one connection is
// touched (other tests on this machine run at the same time): two rules in
// the INPUT chain, matched on both ports and the loopback interface, and
// removed at t.Cleanup (or by the returned function, whichever runs
// first).
//
// It needs root and a working iptables; without them the test is skipped,
// or fails when ADVISORYLOCK_REQUIRE_DB=1 (.ci/run installs iptables).
func Blackhole(t testing.TB, serverPort, clientPort int) (heal func()) {
	t.Helper()
	RequireIptables(t)
	removeStaleBlackholes()
	tag := blackholeTag(os.Getpid())
	rules := [][]string{
		blackholeRule(clientPort, serverPort, tag),
		blackholeRule(serverPort, clientPort, tag),
	}
	var added [][]string
	heal = func() {
		for _, r := range added {
			if out, err := iptables(append([]string{"-D"}, r...)...); err != nil {
				t.Errorf("testdb: removing blackhole rule %v: %v: %s", r, err, out)
			}
		}
		added = nil
	}
	t.Cleanup(heal)
	for _, r := range rules {
		if out, err := iptables(append([]string{"-I"}, r...)...); err != nil {
			t.Fatalf("testdb: iptables: %v: %s", err, out)
		}
		added = append(added, r)
	}
	return heal
}

// blackholeRule is the INPUT rule that drops loopback TCP packets from
// port from to port to.
func blackholeRule(from, to int, tag string) []string {
	return []string{"INPUT", "-i", "lo", "-p", "tcp", "-s", "127.0.0.1", "-d", "127.0.0.1",
		"--sport", strconv.Itoa(from), "--dport", strconv.Itoa(to),
		"-m", "comment", "--comment", tag, "-j", "DROP"}
}

// blackholeTag is the comment on the rules of test process pid.
func blackholeTag(pid int) string { return "advisorylock-test-" + strconv.Itoa(pid) }

// removeStaleBlackholes deletes the rules of test processes that died
// before their cleanup ran (a test binary killed at its timeout).
func removeStaleBlackholes() {
	out, err := iptables("-S", "INPUT")
	if err != nil {
		return
	}
	for _, line := range strings.Split(out, "\n") {
		_, after, ok := strings.Cut(line, "--comment advisorylock-test-")
		if !ok || !strings.HasPrefix(line, "-A INPUT ") {
			continue
		}
		pid, _, _ := strings.Cut(after, " ")
		if _, err := os.Stat("/proc/" + pid); err == nil {
			continue // its process still runs
		}
		_, _ = iptables(append([]string{"-D"}, strings.Fields(strings.TrimPrefix(line, "-A "))...)...)
	}
}

// RequireIptables skips the test (or fails it under
// ADVISORYLOCK_REQUIRE_DB=1) unless iptables can be used here.
func RequireIptables(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "testdb: iptables needs root")
		return
	}
	if out, err := iptables("-L", "INPUT", "-n"); err != nil {
		Unavailable(t, fmt.Sprintf("testdb: iptables is not usable: %v: %s", err, strings.TrimSpace(out)))
	}
}

// iptables runs iptables, waiting for the xtables lock (other tests may
// hold it).
func iptables(args ...string) (string, error) {
	out, err := exec.Command("iptables", append([]string{"-w", "10"}, args...)...).CombinedOutput()
	return string(out), err
}

// ClientPort returns the client-side TCP port of server session pid, as
// pg_stat_activity shows it, asking through db (any session on the same
// server).
func ClientPort(t testing.TB, db *sql.DB, pid int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), DefaultWait)
	defer cancel()
	var port sql.NullInt64
	err := db.QueryRowContext(ctx, "SELECT client_port FROM pg_stat_activity WHERE pid = $1", pid).Scan(&port)
	if err != nil || !port.Valid || port.Int64 <= 0 {
		t.Fatalf("testdb: client port of session %d: %v (got %v)", pid, err, port)
	}
	return int(port.Int64)
}

// Port returns the port of dsn's host:port as a number.
func Port(t testing.TB, dsn string) int {
	t.Helper()
	hp := HostPort(t, dsn)
	i := strings.LastIndexByte(hp, ':')
	p, err := strconv.Atoi(hp[i+1:])
	if err != nil {
		t.Fatalf("testdb: port of %s: %v", hp, err)
	}
	return p
}
