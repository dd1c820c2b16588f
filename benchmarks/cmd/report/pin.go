package main

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pinning keeps the database servers' processes on CPU 0 (PostgreSQL's,
// and MariaDB's or MySQL's where one runs on this machine) and the
// benchmarks on the other CPUs, as if the database ran on another host: a
// round trip then always crosses CPUs. Unpinned, the scheduler sometimes
// runs client and server on one CPU (a SELECT 1 round trip takes about
// 14 µs here) and sometimes on two (about 85 µs, most of it waking an idle
// virtual CPU), so ratios swing from run to run with where things landed.
type pinning struct {
	desc    string       // what the report says about it
	client  *unix.CPUSet // nil: not pinned
	servers []server     // the pinned servers
	cpu     unix.CPUSet  // the servers' CPU while pinned
}

// server is a database server process that pinning moves: PostgreSQL's
// postmaster, whose backends are processes of their own (its children),
// or mysqld, whose sessions are threads (its tasks).
type server struct {
	pid     int
	threads bool        // the sessions are pid's threads, not its children
	saved   unix.CPUSet // the affinity before
}

// set gives s, and every process or thread it runs sessions in, set.
func (s server) set(set *unix.CPUSet) error {
	if err := unix.SchedSetaffinity(s.pid, set); err != nil {
		return err
	}
	more := children(s.pid)
	if s.threads {
		more = threads(s.pid)
	}
	for _, p := range more {
		_ = unix.SchedSetaffinity(p, set) // it may have ended meanwhile
	}
	return nil
}

// pinServer pins the PostgreSQL server at dsn, when it runs on this
// machine and this process may move it, and the MySQL server of the
// benchmarks (see mysqlPID) if it runs here too; otherwise it says why not
// and pins nothing. A MySQL server that cannot be pinned is said and
// left.
func pinServer(dsn string) *pinning {
	p := &pinning{}
	if runtime.NumCPU() < 2 {
		p.desc = "not pinned (one CPU)"
		return p
	}
	pm, err := postmasterPID(dsn)
	if err != nil {
		p.desc = "not pinned (" + err.Error() + ")"
		return p
	}
	p.cpu.Set(0)
	if err := p.add(server{pid: pm}); err != nil {
		p.desc = "not pinned: " + err.Error()
		return p
	}
	atInterrupt(func() { // an interrupted run must not leave a server on one CPU
		p.restore()
		fmt.Fprintln(os.Stderr, "report: gave the servers back their CPUs")
	})
	servers := "PostgreSQL's processes"
	mysqlNote := ""
	if pid, err := mysqlPID(); err != nil {
		mysqlNote = "; MySQL/MariaDB not pinned (" + err.Error() + ")"
	} else if err := p.add(server{pid: pid, threads: true}); err != nil {
		mysqlNote = "; MySQL/MariaDB not pinned: " + err.Error()
	} else {
		servers = "PostgreSQL's processes and MariaDB's threads"
	}
	p.client = &unix.CPUSet{}
	for c := 1; c < runtime.NumCPU(); c++ {
		p.client.Set(c)
	}
	others := "CPU 1"
	if n := runtime.NumCPU(); n > 2 {
		others = fmt.Sprintf("CPUs 1–%d", n-1)
	}
	p.desc = servers + " on CPU 0, the benchmarks on " + others + " (as if the database ran on another host; unpinned, client and server sometimes share a CPU and round trips take a sixth of the time); the uncontended operations and the gating pairs run again unpinned" + mysqlNote
	return p
}

// add pins s, remembering its affinity for restore.
func (p *pinning) add(s server) error {
	if err := unix.SchedGetaffinity(s.pid, &s.saved); err != nil {
		return err
	}
	if err := s.set(&p.cpu); err != nil {
		return err
	}
	p.servers = append(p.servers, s)
	return nil
}

// postmasterPID returns the process id of the PostgreSQL server at dsn,
// from the postmaster.pid of its data directory, or why it cannot.
func postmasterPID(dsn string) (int, error) {
	return serverPID("postgres", dsn, "SELECT current_setting('data_directory') || '/postmaster.pid'")
}

// mysqlPID returns the process id of the MySQL server the benchmarks use
// (ADVISORYLOCK_TEST_MYSQL, else root on 127.0.0.1:3306), from its
// pid_file, or why it cannot.
func mysqlPID() (int, error) {
	return serverPID("mysql", cmp.Or(os.Getenv("ADVISORYLOCK_TEST_MYSQL"), "root@tcp(127.0.0.1:3306)/test"), "SELECT @@pid_file")
}

// serverPID asks the server at dsn for the path of its pid file (query)
// and reads the process id there, or says why it cannot.
func serverPID(driverName, dsn, query string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sql.Open(driverName, dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var path string
	if err := db.QueryRowContext(ctx, query).Scan(&path); err != nil {
		return 0, fmt.Errorf("cannot ask for its pid file: %w", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, errors.New("the server is not on this machine, or its pid file is unreadable")
	}
	return pidFrom(b)
}

// pidFrom reads the process id on the first line of a pid file.
func pidFrom(b []byte) (int, error) {
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0, errors.New("pid file unreadable")
	}
	return pid, nil
}

// interrupted holds what must be undone if the report is interrupted
// (SIGINT, SIGTERM), where os.Exit would skip deferred calls.
var interrupted struct {
	sync.Mutex
	undo []func()
}

// atInterrupt registers f to run, last registered first, if the report is
// interrupted; the first registration starts listening for the signals.
func atInterrupt(f func()) {
	interrupted.Lock()
	defer interrupted.Unlock()
	if interrupted.undo == nil {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() {
			s := <-sig
			interrupted.Lock()
			for i := len(interrupted.undo) - 1; i >= 0; i-- {
				interrupted.undo[i]()
			}
			fmt.Fprintf(os.Stderr, "report: %v: stopped\n", s)
			os.Exit(130)
		}()
	}
	interrupted.undo = append(interrupted.undo, f)
}

// threads lists the threads of process pid.
func threads(pid int) []int {
	dirs, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/[0-9]*")
	var out []int
	for _, d := range dirs {
		if t, err := strconv.Atoi(filepath.Base(d)); err == nil {
			out = append(out, t)
		}
	}
	return out
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so cut after ')'.
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			if c, err := strconv.Atoi(filepath.Base(filepath.Dir(d))); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// pin puts the servers back on their own CPU after restore.
func (p *pinning) pin() {
	for _, s := range p.servers {
		_ = s.set(&p.cpu)
	}
}

// restore gives the servers back their affinity.
func (p *pinning) restore() {
	for _, s := range p.servers {
		_ = s.set(&s.saved)
	}
}

// phases returns the phases g runs in: pinned, and unpinned when g asks
// for it; only unpinned when nothing could be pinned.
func (p *pinning) phases(g group) []string {
	switch {
	case p.client == nil:
		return []string{phaseUnpinned}
	case g.unpinned:
		return []string{phasePinned, phaseUnpinned}
	}
	return []string{phasePinned}
}

// run runs cmd in phase: pinned, on the client CPUs with the server on
// its own (a child inherits the affinity of the thread that starts it);
// unpinned, with the server given back its CPUs for the while.
func (p *pinning) run(cmd *exec.Cmd, phase string) error {
	if p.client == nil {
		return cmd.Run()
	}
	if phase == phaseUnpinned {
		p.restore()
		defer p.pin()
		return cmd.Run()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		return err
	}
	if err := unix.SchedSetaffinity(0, p.client); err != nil {
		return err
	}
	err := cmd.Start()
	_ = unix.SchedSetaffinity(0, &before)
	if err != nil {
		return err
	}
	return cmd.Wait()
}
