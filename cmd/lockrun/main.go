// Command lockrun runs a command while holding a named lock in a shared
// database: flock(1) for a fleet of hosts.
//
//	lockrun [flags] NAME COMMAND [ARG...]
//	lockrun [flags] NAME -c 'COMMAND'
//	lockrun [flags] -l NAME [-l NAME...] -- COMMAND [ARG...]
//	lockrun [flags] status [NAME...]
//	lockrun [flags] completion bash|zsh
//
// Run lockrun --help for the flags, the exit codes and examples.
package main

import (
	"io"
	"os"
)

// Exit codes of lockrun's own outcomes (sysexits.h where one fits). The
// command's own status passes through unchanged.
const (
	exitConflict     = 1   // default of -E: held elsewhere, or the wait ran out
	exitUsage        = 64  // EX_USAGE: bad flags or arguments
	exitUnavailable  = 69  // EX_UNAVAILABLE: the database cannot be reached or used
	exitSoftware     = 70  // EX_SOFTWARE: internal error
	exitLost         = 75  // EX_TEMPFAIL: the lock was lost while the command ran, or as it was granted
	exitConfig       = 78  // EX_CONFIG: bad config file or DSN, unsupported database, pooler in the way
	exitNotRunnable  = 126 // the command exists but cannot be run
	exitNotFound     = 127 // the command was not found
	exitSignalOffset = 128 // 128+N: killed (or interrupted) by signal N
)

func main() {
	os.Exit(lockrun(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// lockrun runs the command line args and returns the exit code. A panic is
// reported as one line and exit code 70, never as a stack trace.
func lockrun(args []string, getenv func(string) string, stdout, stderr io.Writer) (code int) {
	say := &reporter{w: stderr}
	defer func() {
		if p := recover(); p != nil {
			say.errorf("internal error: %v", p)
			code = exitSoftware
		}
	}()
	o, err := parseArgs(args)
	if err != nil {
		say.errorf("%v (see lockrun --help)", err)
		return exitUsage
	}
	switch {
	case o.help:
		_, _ = io.WriteString(stdout, usage)
		return 0
	case o.version:
		_, _ = io.WriteString(stdout, "lockrun "+version()+"\n")
		return 0
	case o.subcommand == "completion":
		_, _ = io.WriteString(stdout, completion(o.shell))
		return 0
	}
	say.configure(o) // --log-format json applies to config errors too
	if err := configure(o, getenv); err != nil {
		say.errorf("%s", plain(err))
		return codeFor(err)
	}
	say.configure(o) // with the config files' defaults
	if o.subcommand == "status" {
		return status(o, stdout, say)
	}
	return run(o, say)
}

// configure completes o from the config files and the environment: the
// flags' defaults, and the DSN with where it comes from.
func configure(o *options, getenv func(string) string) error {
	settings, err := loadConfig(o.configFile, getenv)
	if err != nil {
		return err
	}
	if err := o.applyConfig(settings); err != nil {
		return err
	}
	o.dsn, o.dsnFrom, err = chooseDSN(o.dsn, getenv, settings)
	return err
}
