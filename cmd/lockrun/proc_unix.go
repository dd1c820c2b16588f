//go:build unix

package main

import (
	"errors"
	"os"
	"syscall"
)

// forwarded are the signals lockrun passes on to the command's process
// group (and that interrupt a wait for the lock).
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2}

const (
	terminate  = syscall.SIGTERM
	killSignal = syscall.SIGKILL
)

// childAttr puts the command in its own process group, so that a lost
// lock stops all of it (a shell and what it started), and signals from
// the terminal reach it once, through lockrun.
func childAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	setDeathSignal(a)
	return a
}

// signalGroup sends sig to p's process group; a group that is gone
// already is no error.
func signalGroup(p *os.Process, sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok {
		_ = syscall.Kill(-p.Pid, s)
	}
}

// exitStatus is the command's exit code, or 128+N if signal N killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitSignalOffset + int(ws.Signal())
	}
	return ps.ExitCode()
}

// signalNumber is sig's number, for the 128+N exit code.
func signalNumber(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return int(s)
	}
	return 0
}

// processRunning reports whether a process with this pid exists on this
// host (another user's too).
func processRunning(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
