//go:build !unix

package main

import (
	"os"
	"syscall"
)

// forwarded are the signals lockrun passes on to the command.
var forwarded = []os.Signal{os.Interrupt}

var (
	terminate  os.Signal = os.Kill
	killSignal os.Signal = os.Kill
)

// childAttr adds nothing where there are no process groups.
func childAttr() *syscall.SysProcAttr { return nil }

// signalGroup stops the command: without Unix signals, any signal kills it.
func signalGroup(p *os.Process, sig os.Signal) { _ = p.Kill() }

// exitStatus is the command's exit code.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }

// signalNumber is 2 for an interrupt (128+2, as on Unix).
func signalNumber(os.Signal) int { return 2 }

// processRunning cannot tell here: every holder is taken to be alive.
func processRunning(int) bool { return true }
