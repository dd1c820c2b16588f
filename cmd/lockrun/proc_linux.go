package main

import "syscall"

// setDeathSignal makes the kernel send the command SIGTERM if lockrun
// dies (killed with SIGKILL, say): the lock dies with lockrun, so the
// command should not go on without it.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }
