// Command lockrun runs a command while holding a named lock in a shared
// database: flock(1) for a fleet of hosts.
//
//	lockrun [flags] NAME -- COMMAND [ARG...]
//	lockrun status [--dsn DSN] [NAME...]
//
// Run lockrun --help for the flags, the exit codes and examples.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Exit codes of lockrun's own outcomes (sysexits.h where one fits). The
// command's own status passes through unchanged.
const (
	exitConflict     = 1   // default of -E: held elsewhere, or the wait ran out
	exitUsage        = 64  // EX_USAGE: bad flags or arguments
	exitUnavailable  = 69  // EX_UNAVAILABLE: the database cannot be reached or used
	exitSoftware     = 70  // EX_SOFTWARE: internal error
	exitLost         = 75  // EX_TEMPFAIL: the lock was lost while the command ran
	exitConfig       = 78  // EX_CONFIG: bad DSN, unsupported database, pooler in the way
	exitNotRunnable  = 126 // the command exists but cannot be run
	exitNotFound     = 127 // the command was not found
	exitSignalOffset = 128 // 128+N: killed (or interrupted) by signal N
)

const usage = `NAME
    lockrun - run a command while holding a cluster-wide named lock

SYNOPSIS
    lockrun [flags] NAME -- COMMAND [ARG...]
    lockrun status [--dsn DSN] [NAME...]

DESCRIPTION
    lockrun takes the lock NAME in a database shared by every host that runs
    it, runs COMMAND, and releases the lock when COMMAND ends: flock(1) for a
    fleet. Without -n or -w it waits for the lock as long as it takes.

    On PostgreSQL the lock is a session advisory lock held on lockrun's own
    connection; with --lease it is a lease row renewed every TTL/3, which
    also works through a transaction-mode pooler (PgBouncer) and gives
    COMMAND a fencing token. On SQLite (the default) the lock is a lease row
    in a file, so it only excludes processes on the same host. Every process
    sharing a NAME must agree on --lease: a session lock and a lease of the
    same name do not exclude each other.

    COMMAND runs in its own process group, with lockrun's stdin, stdout and
    stderr. SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to
    lockrun are passed on to that group; the lock is released once COMMAND
    has exited. If the lock is lost while COMMAND runs (the database session
    died, the lease expired or was taken over), the group gets SIGTERM, then
    SIGKILL after --kill-after, and lockrun exits 75. On Linux, COMMAND gets
    SIGTERM if lockrun itself dies. Being its own process group, COMMAND is
    not in the terminal's foreground: it may write to the terminal but is
    stopped if it reads from it. lockrun is meant for batch work.

    lockrun status prints who holds the named locks, as a table; without
    names it lists every held lease (and, on PostgreSQL, every session
    advisory lock, by key: their names are not stored anywhere).

FLAGS
    --dsn DSN       the database to lock in; default $LOCKRUN_DSN, else
                    $DATABASE_URL, else a SQLite file at
                    $XDG_STATE_HOME/lockrun/locks.db (~/.local/state/...)
    -n, --nonblock  do not wait: if NAME is held, exit with the conflict code
    -w, --wait, --timeout SECONDS
                    wait at most SECONDS (fractions allowed, or a Go duration
                    such as 1m30s), then exit with the conflict code
    -E, --conflict-exit-code N
                    the exit code when the lock is not acquired [1]
    --lease         hold a lease with a fencing token instead of a session
                    lock; COMMAND gets LOCKRUN_FENCING_TOKEN
    --ttl DURATION  how long a lease lives without renewal [30s]; also the
                    lease of a SQLite lock
    --kill-after DURATION
                    after a lost lock, how long COMMAND has between SIGTERM
                    and SIGKILL [10s]
    -q, --quiet     print nothing but errors
    -v, --verbose   also say when the lock is taken and released, and who
                    holds it when -n gives up
    -h, --help      print this help

    Flags go before --; a NAME cannot start with "-". A lock named "status"
    is taken with lockrun status -- COMMAND.

DSN
    postgres://USER:PASSWORD@HOST:5432/DB?sslmode=require
    postgresql://...                  the same
    host=HOST user=USER dbname=DB     PostgreSQL key=value form
    sqlite:PATH, file:PATH[?QUERY]    a SQLite file (WAL, busy_timeout set)
    PostgreSQL connections are made with pgx; PG* variables and ~/.pgpass
    apply, application_name is lockrun unless the DSN sets one, and the
    connect timeout is 15s unless the DSN sets connect_timeout.

ENVIRONMENT
    LOCKRUN_DSN, DATABASE_URL   the DSN, if --dsn is not given
    XDG_STATE_HOME, HOME        where the default SQLite file lives
    Set for COMMAND: LOCKRUN_LOCK_NAME (the lock's name) and, with --lease,
    LOCKRUN_FENCING_TOKEN (the lease's token, larger with every grant).

EXIT STATUS
    COMMAND's exit status, or 128+N if COMMAND was killed by signal N.
    Otherwise:
    1      the lock is held elsewhere (-n), or the wait ran out (-w); see -E
    64     usage error: unknown flag, missing --, no COMMAND, bad value
    69     the database cannot be reached or used
    70     internal error
    75     the lock was lost while COMMAND ran; COMMAND was stopped
    78     configuration error: unknown DSN scheme, unparsable DSN, in-memory
           SQLite, or a transaction-mode pooler without --lease
    126    COMMAND cannot be executed
    127    COMMAND was not found
    128+N  lockrun was interrupted by signal N while waiting for the lock
    Errors are one line on stderr, starting with "lockrun: "; passwords in
    a DSN are never printed.

EXAMPLES
    Run the nightly report once, on whichever host's cron starts first:
        0 3 * * * lockrun -n --dsn "$REPORTS_DB" nightly-report -- /usr/local/bin/report

    Deploy hook: migrate one host at a time, give up after five minutes:
        lockrun -w 5m -E 75 migrate -- ./bin/migrate up

    A lease whose token the job hands to the storage it writes to:
        lockrun --lease --ttl 1m export -- sh -c 'export-to-s3 --fence "$LOCKRUN_FENCING_TOKEN"'

    Try it with no server at all (SQLite in ~/.local/state/lockrun):
        lockrun nightly-report -- echo hello

    Who holds what:
        lockrun status nightly-report migrate
`

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
	if o.help {
		_, _ = io.WriteString(stdout, usage)
		return 0
	}
	say.quiet, say.verbose = o.quiet, o.verbose
	if o.status {
		return status(o, getenv, stdout, say)
	}
	return run(o, getenv, say)
}

// options is a parsed command line.
type options struct {
	dsn          string
	nonblock     bool
	wait         time.Duration // < 0: as long as it takes
	conflictCode int
	lease        bool
	ttl          time.Duration // 0: the library's default
	killAfter    time.Duration
	quiet        bool
	verbose      bool
	help         bool

	status  bool
	names   []string // status
	name    string
	command []string
	given   map[string]bool // long names of the flags given
}

// flagSpec is one flag: its long names (the first is canonical), its short
// letter if any, and how it sets its value (nil for a boolean flag).
type flagSpec struct {
	long  []string
	short byte
	bool  func(o *options)
	value func(o *options, v string) error
}

var flags = []flagSpec{
	{long: []string{"dsn"}, value: func(o *options, v string) error { o.dsn = v; return nil }},
	{long: []string{"nonblock", "nb"}, short: 'n', bool: func(o *options) { o.nonblock = true }},
	{long: []string{"wait", "timeout"}, short: 'w', value: func(o *options, v string) (err error) {
		o.wait, err = parseSeconds(v)
		return err
	}},
	{long: []string{"conflict-exit-code"}, short: 'E', value: func(o *options, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 255 {
			return errors.New("want an exit code from 0 to 255")
		}
		o.conflictCode = n
		return nil
	}},
	{long: []string{"lease"}, bool: func(o *options) { o.lease = true }},
	{long: []string{"ttl"}, value: func(o *options, v string) (err error) {
		o.ttl, err = parseSeconds(v)
		if err == nil && o.ttl == 0 {
			err = errors.New("a lease needs a TTL above zero")
		}
		return err
	}},
	{long: []string{"kill-after"}, value: func(o *options, v string) (err error) {
		o.killAfter, err = parseSeconds(v)
		return err
	}},
	{long: []string{"quiet", "silent"}, short: 'q', bool: func(o *options) { o.quiet = true }},
	{long: []string{"verbose"}, short: 'v', bool: func(o *options) { o.verbose = true }},
	{long: []string{"help"}, short: 'h', bool: func(o *options) { o.help = true }},
}

// parseArgs reads the command line: flags (short ones clustered as in
// -nq, values as -w5, -w 5, --wait=5 or --wait 5) and positional
// arguments up to "--", then the command.
func parseArgs(args []string) (*options, error) {
	o := &options{wait: -1, conflictCode: exitConflict, killAfter: 10 * time.Second, given: map[string]bool{}}
	var positional, command []string
	dashdash := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		next := func(flag string) (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("flag %s needs a value", flag)
			}
			i++
			return args[i], nil
		}
		switch {
		case a == "--":
			dashdash, command = true, args[i+1:]
			i = len(args)
		case strings.HasPrefix(a, "--"):
			name, val, hasVal := strings.Cut(a[2:], "=")
			f := lookup(func(f *flagSpec) bool { return contains(f.long, name) })
			if f == nil {
				return nil, fmt.Errorf("unknown flag --%s", name)
			}
			var err error
			switch {
			case f.bool != nil && hasVal:
				return nil, fmt.Errorf("flag --%s takes no value", name)
			case f.value != nil && !hasVal:
				val, err = next("--" + name)
			}
			if err == nil {
				err = apply(o, f, "--"+name, val)
			}
			if err != nil {
				return nil, err
			}
		case len(a) > 1 && a[0] == '-':
			for j := 1; j < len(a); j++ {
				c := a[j]
				f := lookup(func(f *flagSpec) bool { return f.short == c })
				if f == nil {
					return nil, fmt.Errorf("unknown flag -%c", c)
				}
				if f.bool != nil {
					_ = apply(o, f, "", "")
					continue
				}
				val, err := a[j+1:], error(nil)
				if val == "" {
					val, err = next("-" + string(c))
				}
				if err == nil {
					err = apply(o, f, "-"+string(c), val)
				}
				if err != nil {
					return nil, err
				}
				break
			}
		default:
			positional = append(positional, a)
		}
	}
	return o, o.place(positional, command, dashdash)
}

func lookup(match func(*flagSpec) bool) *flagSpec {
	for i := range flags {
		if match(&flags[i]) {
			return &flags[i]
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// apply sets flag f; as names the flag in an error about its value.
func apply(o *options, f *flagSpec, as, val string) error {
	o.given[f.long[0]] = true
	if f.bool != nil {
		f.bool(o)
		return nil
	}
	if err := f.value(o, val); err != nil {
		return fmt.Errorf("flag %s: bad value %q: %w", as, val, err)
	}
	return nil
}

// place checks the positional arguments and the command, and the flags
// that only make sense together.
func (o *options) place(positional, command []string, dashdash bool) error {
	if o.help {
		return nil
	}
	if !dashdash && len(positional) > 0 && positional[0] == "status" {
		o.status, o.names = true, positional[1:]
		for _, f := range []string{"nonblock", "wait", "conflict-exit-code", "lease", "ttl", "kill-after"} {
			if o.given[f] {
				return fmt.Errorf("flag --%s does not apply to status", f)
			}
		}
		return nil
	}
	switch {
	case len(positional) == 0 && !dashdash:
		return errors.New("missing NAME and COMMAND: lockrun [flags] NAME -- COMMAND [ARG...]")
	case !dashdash:
		return fmt.Errorf("missing -- before the command: lockrun [flags] %s -- COMMAND [ARG...]", positional[0])
	case len(positional) == 0:
		return errors.New("missing the lock NAME before --")
	case len(positional) > 1:
		return fmt.Errorf("one lock NAME before --, got %d: %s", len(positional), strings.Join(positional, " "))
	case len(command) == 0 || command[0] == "":
		return errors.New("no COMMAND after --")
	case o.nonblock && o.given["wait"]:
		return errors.New("-n and -w exclude each other")
	}
	o.name, o.command = positional[0], command
	if o.nonblock {
		o.wait = 0
	}
	return nil
}

// parseSeconds reads a duration as flock does (seconds, fractions allowed)
// or as Go does ("1m30s").
func parseSeconds(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f != f || f < 0 || f > float64(1<<62)/float64(time.Second) {
			return 0, errors.New("want a number of seconds from 0, or a duration such as 1m30s")
		}
		return time.Duration(f * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, errors.New("want a number of seconds from 0, or a duration such as 1m30s")
	}
	return d, nil
}

// reporter writes lockrun's own messages to stderr, one line each,
// prefixed "lockrun: ", with any secret scrubbed out.
type reporter struct {
	w       io.Writer
	quiet   bool
	verbose bool
	secrets []string
}

// errorf reports an error; -q does not silence it.
func (r *reporter) errorf(format string, args ...any) { r.line(format, args...) }

// infof reports progress (waiting, giving up, a lost lock), unless -q.
func (r *reporter) infof(format string, args ...any) {
	if !r.quiet {
		r.line(format, args...)
	}
}

// debugf reports details only with -v.
func (r *reporter) debugf(format string, args ...any) {
	if r.verbose && !r.quiet {
		r.line(format, args...)
	}
}

func (r *reporter) line(format string, args ...any) {
	msg := scrub(fmt.Sprintf(format, args...), r.secrets)
	_, _ = io.WriteString(r.w, "lockrun: "+msg+"\n")
}
