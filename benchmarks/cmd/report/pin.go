package main

import (
	"context"
	"database/sql"
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

// pinning keeps the PostgreSQL server's processes on CPU 0 and the
// benchmarks on the other CPUs, as if the database ran on another host: a
// round trip then always crosses CPUs. Unpinned, the scheduler sometimes
// runs client and server on one CPU (a SELECT 1 round trip takes about
// 14 µs here) and sometimes on two (about 85 µs, most of it waking an idle
// virtual CPU), so ratios swing from run to run with where things landed.
type pinning struct {
	desc       string       // what the report says about it
	client     *unix.CPUSet // nil: not pinned
	postmaster int
	saved      unix.CPUSet // the server's affinity before
	server     unix.CPUSet // the server's CPU while pinned
}

// pinServer pins the server at dsn, when it runs on this machine and this
// process may move it; otherwise it says why not and pins nothing.
func pinServer(dsn string) *pinning {
	p := &pinning{}
	if runtime.NumCPU() < 2 {
		p.desc = "not pinned (one CPU)"
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		p.desc = "not pinned: " + err.Error()
		return p
	}
	defer db.Close()
	var dataDir string
	if err := db.QueryRowContext(ctx, "SELECT current_setting('data_directory')").Scan(&dataDir); err != nil {
		p.desc = "not pinned (cannot read data_directory: " + err.Error() + ")"
		return p
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		p.desc = "not pinned (the server is not on this machine, or its postmaster.pid is unreadable)"
		return p
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		p.desc = "not pinned (postmaster.pid unreadable)"
		return p
	}
	if err := unix.SchedGetaffinity(pm, &p.saved); err != nil {
		p.desc = "not pinned: " + err.Error()
		return p
	}
	p.server.Set(0)
	if err := setTree(pm, &p.server); err != nil {
		p.desc = "not pinned: " + err.Error()
		return p
	}
	p.postmaster = pm
	atInterrupt(func() { // an interrupted run must not leave the server on one CPU
		p.restore()
		fmt.Fprintln(os.Stderr, "report: gave the server back its CPUs")
	})
	p.client = &unix.CPUSet{}
	for c := 1; c < runtime.NumCPU(); c++ {
		p.client.Set(c)
	}
	others := "CPU 1"
	if n := runtime.NumCPU(); n > 2 {
		others = fmt.Sprintf("CPUs 1–%d", n-1)
	}
	p.desc = "PostgreSQL's processes on CPU 0, the benchmarks on " + others + " (as if the database ran on another host; unpinned, client and server sometimes share a CPU and round trips take a sixth of the time); the uncontended operations and the gating pairs run again unpinned"
	return p
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

// setTree sets the affinity of process pid and of its children (a
// PostgreSQL backend is one thread, and forks inherit the postmaster's).
func setTree(pid int, set *unix.CPUSet) error {
	if err := unix.SchedSetaffinity(pid, set); err != nil {
		return err
	}
	for _, child := range children(pid) {
		_ = unix.SchedSetaffinity(child, set) // it may have ended meanwhile
	}
	return nil
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

// pin puts the server back on its own CPU after restore.
func (p *pinning) pin() {
	if p.postmaster != 0 {
		_ = setTree(p.postmaster, &p.server)
	}
}

// restore gives the server back its affinity.
func (p *pinning) restore() {
	if p.postmaster != 0 {
		_ = setTree(p.postmaster, &p.saved)
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
