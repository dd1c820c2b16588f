package main

// usage is the help text (lockrun --help) and the man page's source: after
// changing it, run go generate to rewrite lockrun.1 (a test checks it).
// Headings are lines in capitals at the margin; everything else is
// indented by four spaces.
const usage = `NAME
    lockrun - run a command while holding a cluster-wide named lock

SYNOPSIS
    lockrun [flags] NAME COMMAND [ARG...]
    lockrun [flags] NAME -c 'COMMAND'
    lockrun [flags] NAME -- COMMAND [ARG...]
    lockrun [flags] -l NAME [-l NAME...] -- COMMAND [ARG...]
    lockrun [flags] -l NAME [-l NAME...] -c 'COMMAND'
    lockrun [flags] status [NAME...]
    lockrun [flags] completion bash|zsh

DESCRIPTION
    lockrun takes the lock NAME in a database shared by every host that runs
    it, runs COMMAND, and releases the lock when COMMAND ends: flock(1) for a
    fleet, with flock's forms. Without -n or -w it waits for the lock as long
    as it takes. Like flock it prints nothing of its own unless -v is given
    or something fails.

    On PostgreSQL the lock is a session advisory lock held on lockrun's own
    connection; with --lease it is a lease row renewed every TTL/3, which
    also works through a transaction-mode pooler (PgBouncer) and gives
    COMMAND a fencing token. On SQLite (the default) the lock is a lease row
    in a file, so it only excludes processes on the same host. Every process
    sharing a NAME must agree on --lease: a session lock and a lease of the
    same name do not exclude each other.

    COMMAND runs in its own process group, with lockrun's stdin, stdout and
    stderr; with -c it is run by /bin/sh -c. SIGINT, SIGTERM, SIGHUP,
    SIGQUIT, SIGUSR1 and SIGUSR2 sent to lockrun are passed on to that group;
    the lock is released once COMMAND has exited. If the lock is lost while
    COMMAND runs (the database session died, the lease expired or was taken
    over), lockrun says so in one line, the group gets SIGTERM, then SIGKILL
    after --kill-after, and lockrun exits 75. On Linux, COMMAND gets SIGTERM
    if lockrun itself dies. Being its own process group, COMMAND is not in
    the terminal's foreground: it may write to the terminal but is stopped if
    it reads from it. lockrun is meant for batch work.

    With -l NAME, once or more, lockrun takes every NAME given, a set held
    at once, and runs COMMAND while it holds them all: -n gives the
    conflict code if any one of them is held, -w bounds the wait for all,
    and a wait takes them one after another in a fixed order (their keys'),
    so lockruns whose sets share names, given in any order, never
    deadlock, as nested lockruns (or flocks) taking them in different
    orders can. Losing any one of them is losing the set. -l is a flag,
    not more words before the command, because the words after NAME are
    already the command (lockrun NAME echo a -- b runs echo a -- b): with
    -l no word names a lock, so COMMAND follows -- (or -c) and any other
    word there is a usage error. A set is exclusive session locks: several
    -l are not taken with --lease, --slots, --min-hold or -s (one -l is
    NAME, with every flag). With --once the run is the set's: its names in
    key order joined by ",", which is also LOCKRUN_LOCK_NAME, so a name in
    a set cannot hold a comma.

    Flags go before NAME; what follows NAME is the command. status,
    completion and elect are subcommands as the first word after the
    flags, as git's are (lockrun -v status NAME; status also takes flags
    among its NAMEs); a flag that applies only to taking a lock is a usage
    error there. A lock with such a name is taken with -- before the word
    (lockrun -n -- status COMMAND) or right after it (lockrun -n status --
    COMMAND). elect is reserved: leader election for a command is lockrun
    NAME -- COMMAND on every host, each run by a service manager that
    restarts it (systemd Restart=always). lockrun waits until it leads,
    runs COMMAND while it does, stops it (exit 75) when leadership is lost,
    and the restart campaigns again.

    lockrun status prints which database it asks, then who holds the named
    locks, as a table (a lock taken with --lease-rows on PostgreSQL or MySQL
    as KIND lock row). Without names it lists every held lease; on SQLite
    every lock holder, shared ones and semaphore slots too, by name; on
    PostgreSQL every session advisory lock by key (their names are stored
    nowhere; a slot is a lock on its own key); on MySQL the shared holders
    by key (the server lists no named locks: name them to see those). For
    a SQLite holder PID is the holding lockrun's pid. A name inside a
    min-hold window shows a row of KIND window: the name is taken until
    EXPIRES, and the rest of the row is its last holder, which may have
    exited. A named lock's runs recorded done (--once, TryDoOnce) follow
    its holders, the newest five as KIND "run RUNKEY" with SINCE when each
    was recorded, then a row counting the older ones.

FLAGS
    --dsn DSN       the database to lock in (see CONFIGURATION)
    --config FILE   read only FILE as the config file
    -n, --nonblock  do not wait: if NAME is held, exit with the conflict code
    -w, --wait, --timeout SECONDS
                    wait at most SECONDS (fractions allowed, or a Go duration
                    such as 1m30s), then exit with the conflict code
    -E, --conflict-exit-code N
                    the exit code when the lock is not acquired [1]
    --lease         hold a lease with a fencing token instead of a session
                    lock; COMMAND gets LOCKRUN_FENCING_TOKEN
    --lease-rows    keep the lock, the -l set or the --slots as lease rows
                    renewed every TTL/3 instead of session locks: works
                    behind a transaction-mode pooler (PgBouncer
                    pool_mode=transaction, Supavisor, Neon's -pooler host,
                    RDS Proxy); a dead holder's row is free after --ttl.
                    Every process sharing NAME must agree on it. Not with
                    -s on PostgreSQL or MySQL (no shared rows there)
    --ttl DURATION  how long a lease lives without renewal, from 1s to 24h
                    [30s]; also the lease of a SQLite lock
    --kill-after DURATION
                    after a lost lock, how long COMMAND has between SIGTERM
                    and SIGKILL [10s]
    --min-hold DURATION
                    keep NAME taken until DURATION after the grant, also
                    after COMMAND ends or lockrun dies: a cron job on every
                    host runs once per tick even if the hosts' clocks or
                    start times differ by less than DURATION [0: off].
                    Every process sharing NAME must give it: inside a
                    window, a run without it gets what a held lock gives
                    (-n: the conflict code; a wait: until the window ends)
    -l, --lock NAME take the lock NAME; given more than once, take them all
                    as one set (see DESCRIPTION). With -l, COMMAND follows
                    -- (or -c), and no other word names a lock
    --once RUNKEY   run COMMAND at most once for NAME and RUNKEY, across
                    every host and over time: the first lockrun to find
                    NAME free runs it, and once COMMAND exits 0 records the
                    run done before it lets NAME go; every later --once
                    with the same RUNKEY (say, the minute of the crontab
                    entry, from date) exits with the done code without
                    running it, as does one that finds NAME held. A failed
                    COMMAND leaves the run to the next. One try: not with
                    -w, --lease, --min-hold, --slots or -s
    --done-exit-code N
                    with --once, the exit code when COMMAND did not run
                    because its run is done or another lockrun runs it
                    [0, so that cron sees success]; give one COMMAND never
                    exits with for a script to tell
    --slots N       let up to N holders take NAME at once, each on its own
                    slot from 0 to N-1 (a semaphore, at most 1000 slots);
                    COMMAND gets LOCKRUN_SLOT. Every process sharing NAME
                    must give the same N. Not with --lease or --min-hold;
                    with status, also list NAME's slot holders
    -s, --shared    take the lock shared, as flock -s: beside other shared
                    holders of NAME, never beside an exclusive one (the
                    default); not with --lease or --min-hold
    --log-format text|json
                    how lockrun writes its own lines on stderr [text]; json
                    is one object per line (time, level, msg, lock), for
                    all but usage errors
    -q, --quiet     print nothing but errors
    -v, --verbose   also say which database is used (and whether its DSN
                    looks like a pooler's), when the lock is taken and
                    released, who holds it while lockrun waits, and why -n
                    or -w gave up
    -V, --version   print lockrun's version
    -h, --help      print this help

CONFIGURATION
    The DSN is the first of: --dsn; $LOCKRUN_DSN; $DATABASE_URL; dsn in the
    user's config file, $XDG_CONFIG_HOME/lockrun/lockrun.conf
    (~/.config/lockrun/lockrun.conf); dsn in /etc/lockrun.conf; else a
    SQLite file at $XDG_STATE_HOME/lockrun/locks.db (~/.local/state/...).
    cron gives jobs almost no environment: put the DSN in a config file.

    A config file has key = value lines; # starts a comment line. Keys: dsn,
    wait, conflict-exit-code, done-exit-code, lease (true or false), ttl,
    kill-after, min-hold, slots (1 to 1000) and log-format, as the flags of
    the same names, which override them; the user's file overrides the
    system's.
    --config FILE reads FILE instead of both. A config file that cannot be
    read, an unknown key or a bad value is an error (exit 78), never
    skipped:
        # /etc/lockrun.conf
        dsn = postgres://lockrun@db.internal:5432/ops?sslmode=require
        ttl = 1m

DSN
    postgres://USER:PASSWORD@HOST:5432/DB?sslmode=require
    postgresql://...                  the same
    host=HOST user=USER dbname=DB     PostgreSQL key=value form
    mysql://USER:PASSWORD@HOST:3306/DB  MySQL or MariaDB (also mariadb://)
    USER:PASSWORD@tcp(HOST:3306)/DB   go-sql-driver's own MySQL form
    sqlite:PATH, file:PATH[?QUERY]    a SQLite file (WAL, busy_timeout set)
    PostgreSQL connections are made with pgx; PG* variables and ~/.pgpass
    apply, application_name is lockrun unless the DSN sets one, and the
    connect timeout is 15s unless the DSN sets connect_timeout.

ENVIRONMENT
    LOCKRUN_DSN, DATABASE_URL   the DSN, if --dsn is not given
    XDG_CONFIG_HOME, HOME       where the user's config file is
    XDG_STATE_HOME, HOME        where the default SQLite file lives
    Set for COMMAND: LOCKRUN_LOCK_NAME (the lock's name; for a set of -l
    locks, their names in key order joined by ",") and, with --lease,
    LOCKRUN_FENCING_TOKEN (the lease's token, larger with every grant);
    with --slots, LOCKRUN_SLOT (the slot held, from 0).

EXIT STATUS
    COMMAND's exit status, or 128+N if COMMAND was killed by signal N.
    Otherwise:
    0      with --once, COMMAND did not run: its run is done, or another
           lockrun runs it; see --done-exit-code
    1      the lock is held elsewhere (-n), or the wait ran out (-w); see -E
    64     usage error: unknown flag, no NAME or COMMAND, bad value,
           flags that exclude each other (such as several -l with --lease)
    69     the database cannot be reached or used
    70     internal error
    75     the lock was lost while COMMAND ran (COMMAND was stopped), or
           as it was granted (COMMAND did not run)
    78     configuration error: unreadable config file or unknown key,
           unknown DSN scheme, unparsable DSN, wrong credentials or
           database name, SQLite file in a missing directory, in-memory
           SQLite, a transaction-mode pooler without --lease, or lease,
           slots or min-hold in the config file where they cannot apply
           (with --once, or several -l)
    126    COMMAND cannot be executed
    127    COMMAND was not found
    128+N  lockrun was interrupted by signal N while waiting for the lock
    Errors are one line on stderr, starting with "lockrun: "; passwords in
    a DSN are never printed.

EXAMPLES
    Run the nightly report once, on whichever host's cron starts first
    (the DSN comes from /etc/lockrun.conf):
        0 3 * * * lockrun -n nightly-report /usr/local/bin/report

    Deploy hook: migrate one host at a time, give up after five minutes:
        lockrun -w 5m -E 75 migrate ./bin/migrate up

    A lease whose token the job hands to the storage it writes to:
        lockrun --lease --ttl 1m export -c 'export-to-s3 --fence "$LOCKRUN_FENCING_TOKEN"'

    A job that writes both the orders and the invoices tables, beside jobs
    that take either one, waiting at most a minute for both:
        lockrun -w 60 -l orders -l invoices -- ./bin/reconcile

    At most four hosts rebuild the cache at once:
        lockrun --slots 4 cache-rebuild ./bin/rebuild-cache

    Try it with no server at all (SQLite in ~/.local/state/lockrun):
        lockrun nightly-report echo hello

    Who holds what, in the database of a given DSN:
        lockrun --dsn "$OPS_DSN" status nightly-report migrate

    In a script, the report once a minute across the fleet, telling a run
    done (or running) elsewhere, exit 3, from its own:
        lockrun --once "$(date -u +%Y-%m-%dT%H:%M)" --done-exit-code 3 report ./bin/report

    Completions, for bash and zsh:
        source <(lockrun completion bash)

SEE ALSO
    flock(1), cron(8)
`
