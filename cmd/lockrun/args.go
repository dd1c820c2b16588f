package main

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock"
)

// options is a parsed command line (and, once loaded, the config file's
// defaults for the flags not given).
type options struct {
	dsn          string
	nonblock     bool
	wait         time.Duration // < 0: as long as it takes
	conflictCode int
	doneCode     int // --done-exit-code: --once's exit code when the command did not run
	lease        bool
	leaseRows    bool          // --lease-rows: a Lock, set or slots kept as lease rows
	ttl          time.Duration // 0: the library's default
	killAfter    time.Duration
	minHold      time.Duration
	once         string // --once: the run key; "" for none
	slots        int    // --slots: a semaphore of this many slots; 0: a lock
	shared       bool   // -s: take the lock shared
	quiet        bool
	verbose      bool
	logFormat    string // "text" or "json"
	configFile   string // --config: read only this file
	dsnFrom      string // where the DSN comes from, for -v and status
	help         bool
	version      bool

	subcommand string   // "", "status" or "completion"
	names      []string // status
	shell      string   // completion
	name       string   // NAME; for a set, its names joined by ","
	locks      []string // -l: the names given, in their order; nil for NAME
	command    []string
	given      map[string]bool // canonical long names of the flags given
}

// TTL bounds of the library (WithLeaseTTL clamps to them): lockrun refuses
// a value outside instead of clamping it silently.
const (
	minTTL = time.Second
	maxTTL = 24 * time.Hour
)

// flagSpec is one flag: its long names (the first is canonical, and is
// the config file's key when config is set), its short letter if any, and
// how it sets its value (bool for a flag without a value).
type flagSpec struct {
	long   []string
	short  byte
	config bool
	help   string // one line, for shell completions
	bool   func(o *options)
	value  func(o *options, v string) error
}

var flags = []flagSpec{
	{long: []string{"dsn"}, config: true, help: "the database to lock in",
		value: func(o *options, v string) error { o.dsn = v; return nil }},
	{long: []string{"config"}, help: "read this config file instead of the usual ones",
		value: func(o *options, v string) error { o.configFile = v; return nil }},
	{long: []string{"nonblock", "nb"}, short: 'n', help: "do not wait for the lock",
		bool: func(o *options) { o.nonblock, o.wait = true, 0 }},
	{long: []string{"wait", "timeout"}, short: 'w', config: true, help: "wait at most this long",
		value: func(o *options, v string) (err error) { o.wait, err = parseSeconds(v); return err }},
	{long: []string{"conflict-exit-code"}, short: 'E', config: true, help: "exit code when the lock is not acquired",
		value: setConflictCode},
	{long: []string{"done-exit-code"}, config: true, help: "with --once, exit code when the run is done or running elsewhere",
		value: func(o *options, v string) (err error) { o.doneCode, err = parseExitCode(v); return err }},
	{long: []string{"lease"}, config: true, help: "hold a lease with a fencing token",
		bool: func(o *options) { o.lease = true }},
	{long: []string{"lease-rows"}, config: true, help: "keep the lock, set or slots as lease rows (works behind a transaction pooler)",
		bool: func(o *options) { o.leaseRows = true }},
	{long: []string{"ttl"}, config: true, help: "how long a lease lives without renewal", value: setTTL},
	{long: []string{"kill-after"}, config: true, help: "grace between SIGTERM and SIGKILL after a lost lock",
		value: func(o *options, v string) (err error) { o.killAfter, err = parseSeconds(v); return err }},
	{long: []string{"min-hold"}, config: true, help: "keep the lock taken until this long after the grant",
		value: func(o *options, v string) (err error) { o.minHold, err = parseSeconds(v); return err }},
	{long: []string{"lock"}, short: 'l', help: "take this lock; repeat for a set held at once (COMMAND then follows --)",
		value: func(o *options, v string) error {
			if v == "" {
				return errors.New("the lock NAME is empty")
			}
			o.locks = append(o.locks, v)
			return nil
		}},
	{long: []string{"once"}, help: "run the command at most once for this run key",
		value: func(o *options, v string) error {
			if v == "" {
				return errors.New("want a run key, such as the crontab entry's minute")
			}
			o.once = v
			return nil
		}},
	{long: []string{"slots"}, config: true, help: "let at most N holders take NAME at once (a semaphore)", value: setSlots},
	{long: []string{"shared"}, short: 's', help: "take the lock shared: beside other shared holders",
		bool: func(o *options) { o.shared = true }},
	{long: []string{"log-format"}, config: true, help: "text or json", value: setLogFormat},
	{long: []string{"quiet", "silent"}, short: 'q', help: "print nothing but errors",
		bool: func(o *options) { o.quiet = true }},
	{long: []string{"verbose"}, short: 'v', help: "say what lockrun does",
		bool: func(o *options) { o.verbose = true }},
	{long: []string{"version"}, short: 'V', help: "print the version",
		bool: func(o *options) { o.version = true }},
	{long: []string{"help"}, short: 'h', help: "print the help",
		bool: func(o *options) { o.help = true }},
}

func setConflictCode(o *options, v string) (err error) {
	o.conflictCode, err = parseExitCode(v)
	return err
}

func parseExitCode(v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 255 {
		return 0, errors.New("want an exit code from 0 to 255")
	}
	return n, nil
}

func setTTL(o *options, v string) (err error) {
	o.ttl, err = parseSeconds(v)
	switch {
	case err != nil:
		return err
	case o.ttl < minTTL:
		return fmt.Errorf("a lease TTL must be at least %s", minTTL)
	case o.ttl > maxTTL:
		return fmt.Errorf("a lease TTL must be at most %s", maxTTL)
	}
	return nil
}

func setSlots(o *options, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxSlots {
		return fmt.Errorf("want a number of slots from 1 to %d", maxSlots)
	}
	o.slots = n
	return nil
}

func setLogFormat(o *options, v string) error {
	if v != "text" && v != "json" {
		return errors.New("want text or json")
	}
	o.logFormat = v
	return nil
}

// subcommands are the words that are subcommands as the first word after
// the flags, as git's are (lockrun -v status NAME). Such a word is a NAME
// after "--" (lockrun -- status COMMAND) or followed by "--" (lockrun
// status -- COMMAND).
var subcommands = []string{"status", "completion", "elect"}

// runOnly are the flags that apply only to taking a lock for a command:
// given with a subcommand, before or after its word, they are refused.
var runOnly = []string{"nonblock", "wait", "conflict-exit-code", "done-exit-code", "lease", "lease-rows", "ttl", "kill-after", "min-hold", "once", "shared", "lock"}

// parseArgs reads the command line:
//
//	[flags] [--] NAME [--] COMMAND [ARG...]
//	[flags] [--] NAME -c COMMAND
//	[flags] -l NAME [-l NAME...] -- COMMAND [ARG...]
//	[flags] -l NAME [-l NAME...] -c COMMAND
//	[flags] status [flags] [NAME...]
//	[flags] completion bash|zsh
//
// Flags come before NAME, short ones clustered as in -nq, values as -w5,
// -w 5, --wait=5 or --wait 5.
func parseArgs(args []string) (*options, error) {
	o := &options{wait: -1, conflictCode: exitConflict, killAfter: 10 * time.Second, logFormat: "text", given: map[string]bool{}}
	rest, dashdash, err := o.readFlags(args)
	if err != nil || o.help || o.version {
		return o, err
	}
	if !dashdash && startsSubcommand(rest) {
		return o, o.parseSubcommand(rest[0], rest[1:])
	}
	if len(o.locks) > 0 {
		return o, o.placeSet(rest, dashdash)
	}
	return o, o.placeCommand(rest)
}

// startsSubcommand reports whether the words after the flags are a
// subcommand's: its word, not followed by "--".
func startsSubcommand(rest []string) bool {
	return len(rest) > 0 && contains(subcommands, rest[0]) && (len(rest) == 1 || rest[1] != "--")
}

// readFlags reads the flags at the front of args and returns the rest,
// and whether "--" ended the flags (it is not part of the rest). Once -l
// has named a lock, -c (or --command) ends the flags too: it begins the
// command.
func (o *options) readFlags(args []string) (rest []string, dashdash bool, err error) {
	for len(args) > 0 {
		a := args[0]
		if a == "--" {
			return args[1:], true, nil
		}
		if len(a) < 2 || a[0] != '-' || len(o.locks) > 0 && (a == "-c" || a == "--command") {
			return args, false, nil
		}
		var n int
		if strings.HasPrefix(a, "--") {
			n, err = o.readLong(args)
		} else {
			n, err = o.readShort(args)
		}
		if err != nil {
			return nil, false, err
		}
		args = args[n:]
	}
	return nil, false, nil
}

// readLong reads the long flag args[0] (--name or --name=value) and
// returns how many arguments it used.
func (o *options) readLong(args []string) (int, error) {
	name, val, hasVal := strings.Cut(args[0][2:], "=")
	f := lookup(func(f *flagSpec) bool { return contains(f.long, name) })
	switch {
	case f == nil:
		return 0, fmt.Errorf("unknown flag --%s", name)
	case f.bool != nil && hasVal:
		return 0, fmt.Errorf("flag --%s takes no value", name)
	case f.bool != nil || hasVal:
		return 1, o.apply(f, "--"+name, val)
	case len(args) < 2:
		return 0, fmt.Errorf("flag --%s needs a value", name)
	}
	return 2, o.apply(f, "--"+name, args[1])
}

// readShort reads the cluster of short flags args[0] (-nq, -w5, -w 5)
// and returns how many arguments it used.
func (o *options) readShort(args []string) (int, error) {
	a := args[0]
	for j := 1; j < len(a); j++ {
		c := a[j]
		f := lookup(func(f *flagSpec) bool { return f.short == c })
		switch {
		case f == nil:
			return 0, fmt.Errorf("unknown flag -%c", c)
		case f.bool != nil:
			_ = o.apply(f, "", "")
		case j+1 < len(a):
			return 1, o.apply(f, "-"+string(c), a[j+1:])
		case len(args) < 2:
			return 0, fmt.Errorf("flag -%c needs a value", c)
		default:
			return 2, o.apply(f, "-"+string(c), args[1])
		}
	}
	return 1, nil
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
func (o *options) apply(f *flagSpec, as, val string) error {
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

// placeCommand reads NAME and the command from what follows the flags,
// in flock(1)'s forms: NAME COMMAND [ARG...], NAME -- COMMAND [ARG...],
// or NAME -c 'COMMAND' (run by sh -c).
func (o *options) placeCommand(rest []string) error {
	if len(rest) == 0 {
		return errors.New("missing NAME and COMMAND: lockrun [flags] NAME COMMAND [ARG...]")
	}
	o.name = rest[0]
	if o.name == "" {
		return errors.New("the lock NAME is empty")
	}
	command, err := commandOf(rest[1:])
	if err != nil {
		return err
	}
	o.command = command
	return o.checkFlags()
}

// placeSet reads the command that follows the -l flags: -- COMMAND
// [ARG...] or -c 'COMMAND'. With -l no word names a lock, so a word
// before -- is refused instead of being taken for a NAME or the command.
// With more than one -l the locks are a set (advisorylock.NewSet): held
// all at once, each an exclusive session lock.
func (o *options) placeSet(rest []string, dashdash bool) error {
	switch {
	case dashdash && (len(rest) == 0 || rest[0] == ""):
		return errors.New("missing COMMAND after --")
	case dashdash:
		o.command = rest
	case len(rest) > 0 && (rest[0] == "-c" || rest[0] == "--command"):
		command, err := commandOf(rest)
		if err != nil {
			return err
		}
		o.command = command
	case len(rest) == 0:
		return errors.New("missing COMMAND: with -l it follows --, as in lockrun -l NAME -l NAME -- COMMAND")
	default:
		return fmt.Errorf("%q after the -l flags: with -l every lock is named by -l and COMMAND follows -- (or -c), as in lockrun -l NAME -l NAME -- COMMAND", rest[0])
	}
	o.name = setName(o.locks)
	if o.isSet() {
		if err := o.checkSet(); err != nil {
			return err
		}
	}
	return o.checkFlags()
}

// setName is the name of the set of names, as NewSet names it (Lock.Name):
// the names in key order, joined by ",". lockrun says it from the start
// (the JSON lines' lock); newSetTarget then takes the set's own.
func setName(names []string) string {
	sorted := slices.Clone(names)
	slices.SortStableFunc(sorted, func(a, b string) int { return cmp.Compare(advisorylock.Key(a), advisorylock.Key(b)) })
	return strings.Join(sorted, ",")
}

// checkSet refuses what a set of locks cannot be: a name given twice, a
// name holding ",", which joins the set's names (in LOCKRUN_LOCK_NAME and
// the --once run's name), and the flags of locks a set is not.
func (o *options) checkSet() error {
	for i, n := range o.locks {
		if strings.Contains(n, ",") {
			return fmt.Errorf("lock %q: a name in a set of -l locks cannot hold a comma, which joins the set's names", n)
		}
		if contains(o.locks[:i], n) {
			return fmt.Errorf("lock %q is named twice by -l", n)
		}
	}
	return o.setExcludes()
}

// isSet reports whether the lock is a set: more than one -l.
func (o *options) isSet() bool { return len(o.locks) > 1 }

// setExcludes refuses, for a set, a lease, slots, a shared lock and a
// min-hold window: a set holds exclusive session locks (NewSet). Called
// on the command line, and again once the config file may have set them.
func (o *options) setExcludes() error {
	f := ""
	switch {
	case o.lease:
		f = "lease"
	case o.slots > 0:
		f = "slots"
	case o.minHold > 0:
		f = "min-hold"
	case o.shared:
		f = "shared"
	default:
		return nil
	}
	return fmt.Errorf("several -l locks and --%s exclude each other (a set holds exclusive session locks, with no lease, slots, shared mode or window)", f)
}

// checkFlags refuses the flags that exclude each other.
func (o *options) checkFlags() error {
	if o.nonblock && o.given["wait"] {
		return errors.New("-n and -w exclude each other")
	}
	if err := o.checkSlots(); err != nil {
		return err
	}
	if o.shared && (o.given["lease"] || o.given["min-hold"]) {
		return errors.New("-s takes a lock shared; a lease or a --min-hold window is exclusive")
	}
	if o.once != "" {
		for _, f := range []string{"wait", "lease", "min-hold", "slots", "shared"} {
			if o.given[f] {
				return fmt.Errorf("--once and --%s exclude each other (--once makes one try of an exclusive lock; its run key replaces a window)", f)
			}
		}
	}
	return nil
}

// checkSlots refuses --slots with the flags that do not apply to a
// semaphore.
func (o *options) checkSlots() error {
	switch {
	case o.slots == 0:
	case o.shared:
		return errors.New("--slots and -s exclude each other (a semaphore's slots are taken exclusively)")
	case o.lease:
		return errors.New("--slots and --lease exclude each other (a semaphore's slots are locks, not leases)")
	case o.minHold > 0:
		return errors.New("--slots and --min-hold exclude each other")
	}
	return nil
}

// commandOf reads the command that follows NAME.
func commandOf(rest []string) ([]string, error) {
	switch {
	case len(rest) == 0:
		return nil, errors.New("missing COMMAND after the lock NAME")
	case rest[0] == "--":
		rest = rest[1:]
	case rest[0] == "-c" || rest[0] == "--command":
		if len(rest) != 2 {
			return nil, fmt.Errorf("%s takes exactly one COMMAND, run by sh -c: quote it", rest[0])
		}
		if rest[1] == "" {
			return nil, errors.New("no COMMAND after " + rest[0])
		}
		return []string{"/bin/sh", "-c", rest[1]}, nil
	case strings.HasPrefix(rest[0], "-"):
		return nil, fmt.Errorf("flag %s after the lock NAME: flags go before NAME (a COMMAND starting with - goes after --)", rest[0])
	}
	if len(rest) == 0 || rest[0] == "" {
		return nil, errors.New("no COMMAND after the lock NAME")
	}
	return rest, nil
}

// parseSubcommand reads the arguments of status, completion or elect (the
// flags before its word are read already). A flag that applies only to
// taking a lock is refused, with the way to take a lock of that name.
func (o *options) parseSubcommand(word string, args []string) error {
	o.subcommand = word
	var err error
	switch word {
	case "completion":
		if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh") {
			err = errors.New("usage: lockrun completion bash|zsh")
		} else {
			o.shell = args[0]
		}
	case "elect":
		return errors.New("elect is reserved, not a subcommand: for a leader-elected command run lockrun NAME -- COMMAND under a service manager that restarts it (see --help); a lock named elect is taken with lockrun -- elect COMMAND")
	default:
		err = o.parseStatus(args)
	}
	if err == nil {
		err = o.refuseRunOnly()
	}
	if err != nil {
		return fmt.Errorf("%w (a lock named %s is taken with lockrun [flags] -- %s COMMAND)", err, word, word)
	}
	return nil
}

// refuseRunOnly refuses the runOnly flags given with a subcommand.
func (o *options) refuseRunOnly() error {
	for _, f := range runOnly {
		if o.given[f] {
			return fmt.Errorf("flag --%s does not apply to %s", f, o.subcommand)
		}
	}
	return nil
}

// parseStatus reads status's flags and names, in any order (a name never
// starts with "-"; after "--" every word is a name).
func (o *options) parseStatus(args []string) error {
	for len(args) > 0 {
		rest, dashdash, err := o.readFlags(args)
		if err != nil {
			return err
		}
		if dashdash {
			o.names = append(o.names, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		o.names, args = append(o.names, rest[0]), rest[1:]
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
