//go:build unix && !linux

package main

import "syscall"

// setDeathSignal does nothing here: only Linux offers a parent-death
// signal to a process started from Go.
func setDeathSignal(*syscall.SysProcAttr) {}
