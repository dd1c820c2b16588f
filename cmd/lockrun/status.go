package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/dbutil"
	"github.com/jackc/pgx/v5/pgconn"
)

// statusTimeout bounds the whole of lockrun status.
const statusTimeout = 30 * time.Second

// holding is one row of the status table.
type holding struct {
	// kind is "lock", "shared" (a shared holder of a lock), "lease",
	// "slot N", "window" (an open min-hold window: the name is taken until
	// ExpiresAt, and the rest is its last grant's holder), "free", "run
	// KEY" (a run TryDoOnce or --once recorded done, at Since) or "N older
	// runs" (the name's runs before those listed, the oldest at Since)
	kind   string
	key    int64 // the lock's key (a slot's key for a semaphore's slot)
	sqlite bool  // a holder on SQLite, whose PID is read from its owner label (see holderPID)
	h      advisorylock.Holder
}

// row makes a status row, of a holder of key on db.
func (db *database) row(kind string, key int64, h advisorylock.Holder) holding {
	return holding{kind: kind, key: key, sqlite: db.kind == "sqlite", h: h}
}

// status prints which database it asks (a line like -v's), then, as a
// table, who holds the named locks (both kinds), or with no names what
// allHolders finds.
func status(o *options, stdout io.Writer, say *reporter) int {
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	db, err := connect(ctx, o, say)
	if err != nil {
		say.errorf("%s", plain(err))
		return codeFor(err)
	}
	defer db.Close()
	var rows []holding
	if len(o.names) > 0 {
		rows, err = namedHolders(ctx, db, o.names, o.slots, say)
	} else {
		rows, err = allHolders(ctx, db, say)
	}
	if err != nil {
		say.errorf("%s", plain(err))
		return codeFor(err)
	}
	fmt.Fprintln(stdout, db.describe(o.dsnFrom))
	printTable(stdout, rows)
	return 0
}

// namedHolders looks up both kinds of lock for every name, its open
// min-hold window, and with slots > 0 the holders of a semaphore of that
// many slots (kind "slot N"); a name held by none gets a "free" row.
func namedHolders(ctx context.Context, db *database, names []string, slots int, say *reporter) ([]holding, error) {
	var rows []holding
	for _, name := range names {
		found := false
		if slots > 0 {
			hs, err := slotHolders(ctx, db, name, slots, say)
			if err != nil {
				return nil, err
			}
			rows, found = append(rows, hs...), len(hs) > 0
		}
		kinds := []string{"lock", "lease"}
		if db.kind != "sqlite" { // SQLite's locks are rows already, listed as locks
			kinds = append(kinds, "lock row")
		}
		for _, kind := range kinds {
			hs, err := holdersOf(ctx, db, kind, name, say)
			if err != nil {
				return nil, err
			}
			for _, h := range hs {
				k := kind
				if kind == "lock" {
					k = lockKind(db, h)
				}
				rows = append(rows, db.row(k, advisorylock.Key(name), *h))
				found = true
			}
		}
		if db.kind != "sqlite" { // SQLite's window is the lock row, listed above
			w, err := openWindow(ctx, db, name)
			if err != nil {
				return nil, err
			}
			if w != nil {
				rows, found = append(rows, *windowHolding(db, w)), true
			}
		}
		if !found {
			rows = append(rows, db.row("free", advisorylock.Key(name), advisorylock.Holder{Name: name}))
		}
		runs, err := doneRuns(ctx, db, name)
		if err != nil {
			return nil, err
		}
		rows = append(rows, runs...)
	}
	return rows, nil
}

// doneRuns lists the newest five runs of name recorded done in
// advisorylock_runs (by TryDoOnce, or lockrun --once), each as kind "run
// KEY" at the time it was recorded, and one row for the older ones. The
// table is read without creating it: where it is missing, no run was
// recorded.
func doneRuns(ctx context.Context, db *database, name string) ([]holding, error) {
	var rs *sql.Rows
	var err error
	switch db.kind {
	case "postgres":
		rs, err = db.QueryContext(ctx, pgRuns, name)
	case "mysql":
		sum := sha256.Sum256([]byte(name))
		rs, err = db.QueryContext(ctx, fmt.Sprintf(mysqlRuns, hex.EncodeToString(sum[:])))
	case "sqlite":
		rs, err = db.QueryContext(ctx, sqliteRuns, name)
	default:
		return nil, nil
	}
	if missingTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the runs of lock %q: %w", name, err)
	}
	defer rs.Close()
	var rows []holding
	var total int
	var oldest int64
	for rs.Next() {
		var run string
		var doneAt int64
		if err := rs.Scan(&run, &doneAt, &total, &oldest); err != nil {
			return nil, fmt.Errorf("listing the runs of lock %q: %w", name, err)
		}
		h := advisorylock.Holder{Name: name, Since: time.UnixMilli(doneAt)}
		rows = append(rows, db.row("run "+shown(run), advisorylock.Key(name), h))
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("listing the runs of lock %q: %w", name, err)
	}
	if older := total - len(rows); older > 0 {
		h := advisorylock.Holder{Name: name, Since: time.UnixMilli(oldest)}
		rows = append(rows, db.row(strconv.Itoa(older)+" older runs", advisorylock.Key(name), h))
	}
	return rows, nil
}

// The newest five runs of a name, with the name's count of runs and its
// oldest's time; times in Unix milliseconds.
const (
	pgRuns = `SELECT run, (extract(epoch FROM done_at) * 1000)::bigint, count(*) OVER (),
  (extract(epoch FROM min(done_at) OVER ()) * 1000)::bigint
FROM advisorylock_runs WHERE name = $1 ORDER BY done_at DESC, run DESC LIMIT 5`
	mysqlRuns = `SELECT CONVERT(run USING utf8mb4), TIMESTAMPDIFF(MICROSECOND, '1970-01-01', done_at) DIV 1000, COUNT(*) OVER (),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01', MIN(done_at) OVER ()) DIV 1000
FROM advisorylock_runs WHERE name_hash = X'%s' ORDER BY done_at DESC, run DESC LIMIT 5`
	sqliteRuns = `SELECT run, done_at, count(*) OVER (), min(done_at) OVER ()
FROM advisorylock_runs WHERE name = ? ORDER BY done_at DESC, run DESC LIMIT 5`
)

// holderOf asks the library who holds name as a Lock or as a LeaseLock.
func holderOf(ctx context.Context, db *database, kind, name string, say *reporter) (*advisorylock.Holder, error) {
	if kind == "lease" { // a LeaseLock takes no pooler check
		l, err := advisorylock.NewLeaseLock(db, name, advisorylock.WithLogger(say.logger()))
		if err != nil {
			return nil, err
		}
		return l.Holder(ctx)
	}
	l, err := advisorylock.New(db, name, advisorylock.WithPoolerCheck(false), advisorylock.WithLogger(say.logger()))
	if err != nil {
		return nil, err
	}
	return l.Holder(ctx)
}

// slotHolders lists the holders of name as a semaphore of slots slots.
func slotHolders(ctx context.Context, db *database, name string, slots int, say *reporter) ([]holding, error) {
	s, err := advisorylock.NewSemaphore(db, name, slots, advisorylock.WithPoolerCheck(false), advisorylock.WithLogger(say.logger()))
	if err != nil {
		return nil, err
	}
	hs, err := s.Holders(ctx)
	var rows []holding
	for _, h := range hs {
		rows = append(rows, db.row("slot "+strconv.Itoa(h.Slot), slotKey(name, h.Slot), *h))
	}
	return rows, err
}

// holdersOf lists every holder of name as a Lock (shared ones too), as
// a Lock kept as lease rows ("lock row": lockrun --lease-rows), or its
// holder as a LeaseLock.
func holdersOf(ctx context.Context, db *database, kind, name string, say *reporter) ([]*advisorylock.Holder, error) {
	if kind == "lease" {
		h, err := holderOf(ctx, db, kind, name, say)
		if h == nil || err != nil {
			return nil, err
		}
		return []*advisorylock.Holder{h}, nil
	}
	opts := []advisorylock.Option{advisorylock.WithPoolerCheck(false), advisorylock.WithLogger(say.logger())}
	if kind == "lock row" {
		opts = append(opts, advisorylock.WithLeaseRows())
	}
	l, err := advisorylock.New(db, name, opts...)
	if err != nil {
		return nil, err
	}
	return l.Holders(ctx)
}

// allHolders lists, with no names given, what the database can tell:
// the held lease rows by name (the lease tables operators may query); on SQLite the
// lock rows by name (exclusive and shared holders, semaphore slots, and
// windows); on PostgreSQL and MySQL the open min-hold windows by name;
// on PostgreSQL the session advisory locks by key, shared ones marked; on
// MySQL the live shared holders by key (GET_LOCK's locks and slots are
// listed by no table MariaDB always has).
func allHolders(ctx context.Context, db *database, say *reporter) ([]holding, error) {
	var rows []holding
	if db.kind == "sqlite" {
		rs, err := sqliteLockRows(ctx, db, say)
		if err != nil {
			return nil, err
		}
		rows = rs
	}
	names, err := heldNames(ctx, db, "SELECT name FROM advisorylock_leases WHERE owner IS NOT NULL ORDER BY name")
	if err != nil {
		return nil, err
	}
	for _, name := range names {
		h, err := holderOf(ctx, db, "lease", name, say)
		if err != nil {
			return nil, err
		}
		if h != nil { // nil: expired since
			rows = append(rows, db.row("lease", advisorylock.Key(name), *h))
		}
	}
	if query, ok := windowNames[db.kind]; ok {
		names, err := heldNames(ctx, db, query)
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			w, err := openWindow(ctx, db, name)
			if err != nil {
				return nil, err
			}
			if w != nil { // nil: ended since
				rows = append(rows, *windowHolding(db, w))
			}
		}
	}
	var more []holding
	switch db.kind {
	case "postgres":
		more, err = sessionLocks(ctx, db)
	case "mysql":
		more, err = mysqlSharedHolders(ctx, db)
	}
	return append(rows, more...), err
}

// windowNames selects the names of the open min-hold windows of Locks on
// PostgreSQL and MySQL, by the database's clock. SQLite keeps a Lock's
// window in its lock row (see sqliteLockRows).
var windowNames = map[string]string{
	"postgres": "SELECT name FROM advisorylock_windows WHERE taken_until > now() ORDER BY name",
	"mysql":    "SELECT name FROM advisorylock_windows WHERE taken_until > UTC_TIMESTAMP(6) ORDER BY name",
}

// sqliteLockRows lists the holders of every name with a row in the lock
// tables of a SQLite file: as a lock (exclusive and shared holders) where
// a row has the name's key, as a semaphore (kind "slot N") where it has
// a slot's key, up to the highest slot with a row.
func sqliteLockRows(ctx context.Context, db *database, say *reporter) ([]holding, error) {
	var names []string
	for _, table := range []string{"advisorylock_locks", "advisorylock_shared"} {
		ns, err := heldNames(ctx, db, "SELECT DISTINCT name FROM "+table)
		if err != nil {
			return nil, err
		}
		names = append(names, ns...)
	}
	slices.Sort(names)
	var rows []holding
	for _, name := range slices.Compact(names) {
		hs, err := holdersOf(ctx, db, "lock", name, say)
		if err != nil {
			return nil, err
		}
		for _, h := range hs {
			rows = append(rows, db.row(lockKind(db, h), advisorylock.Key(name), *h))
		}
		slots, err := sqliteSlots(ctx, db, name)
		if err != nil {
			return nil, err
		}
		if slots > 0 {
			hs, err := slotHolders(ctx, db, name, slots, say)
			if err != nil {
				return nil, err
			}
			rows = append(rows, hs...)
		}
	}
	return rows, nil
}

// sqliteSlots returns one more than the highest semaphore slot of name
// with a row (held or expired), 0 for none.
func sqliteSlots(ctx context.Context, db *database, name string) (int, error) {
	rs, err := db.QueryContext(ctx, "SELECT key FROM advisorylock_locks WHERE name = ? AND key != ?", name, advisorylock.Key(name))
	if err != nil {
		return 0, fmt.Errorf("listing advisorylock_locks: %w", err)
	}
	defer rs.Close()
	slots := 0
	for rs.Next() {
		var key int64
		if err := rs.Scan(&key); err != nil {
			return 0, fmt.Errorf("listing advisorylock_locks: %w", err)
		}
		for i := slots; i < maxSlots; i++ {
			if slotKey(name, i) == key {
				slots = i + 1
				break
			}
		}
	}
	return slots, rs.Err()
}

// maxSlots is the most slots advisorylock.NewSemaphore takes.
const maxSlots = 1000

// slotKey is the key of slot i of the semaphore name, derived as the
// library documents it (see advisorylock.Semaphore): the first 8 bytes,
// big-endian and signed, of SHA-256 over "advisorylock:v1:slot", a zero
// byte, the name, a zero byte and i in decimal.
func slotKey(name string, i int) int64 {
	h := sha256.New()
	h.Write([]byte("advisorylock:v1:slot\x00" + name + "\x00" + strconv.Itoa(i)))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}

// kindOf is the KIND of a lock's holder: "lock", or "shared".
func kindOf(h *advisorylock.Holder) string {
	if h.Shared {
		return "shared"
	}
	return "lock"
}

// heldNames reads the names that query selects; a table not created yet
// holds none.
func heldNames(ctx context.Context, db *database, query string) ([]string, error) {
	rs, err := db.QueryContext(ctx, query)
	if missingTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing names: %w", err)
	}
	defer rs.Close()
	var names []string
	for rs.Next() {
		var name string
		if err := rs.Scan(&name); err != nil {
			return nil, fmt.Errorf("listing names: %w", err)
		}
		names = append(names, name)
	}
	return names, rs.Err()
}

func missingTable(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "42P01"
	}
	return err != nil && strings.Contains(err.Error(), "no such table") || mysqlMissingTable(err)
}

// sessionLocks lists the granted advisory locks on bigint keys in the
// current database (pg_locks shows a key as classid = high 32 bits, objid
// = low 32 bits, objsubid = 1), with who holds them, shared ones (mode
// ShareLock) as kind "shared". A semaphore's slot is a lock on its
// slotKey. Since is the session's start: an earlier bound of when the
// lock was taken.
func sessionLocks(ctx context.Context, db *database) ([]holding, error) {
	rs, err := db.QueryContext(ctx, `SELECT l.classid::bigint, l.objid::bigint, l.mode = 'ShareLock', l.pid,
  coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), a.backend_start
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY l.pid, l.classid, l.objid`)
	if err != nil {
		return nil, fmt.Errorf("listing session locks: %w", err)
	}
	defer rs.Close()
	var rows []holding
	for rs.Next() {
		var hi, lo int64
		var application, addr string
		var since sql.NullTime
		var h advisorylock.Holder
		if err := rs.Scan(&hi, &lo, &h.Shared, &h.PID, &application, &addr, &since); err != nil {
			return nil, fmt.Errorf("listing session locks: %w", err)
		}
		h.Client, h.Since = dbutil.Client(application, "", addr), since.Time
		rows = append(rows, db.row(kindOf(&h), int64(uint64(hi)<<32|uint64(lo)), h))
	}
	return rows, rs.Err()
}

// mysqlSharedHolders lists, by key, the live shared holders of locks on
// MySQL: the rows of advisorylock_shared whose holder still has the
// holder lock the row names (see backend_mysql_shared.go).
func mysqlSharedHolders(ctx context.Context, db *database) ([]holding, error) {
	rs, err := db.QueryContext(ctx, `SELECT s.lock_key, s.conn_id, COALESCE(p.USER, ''), COALESCE(p.HOST, ''),
  TIMESTAMPDIFF(MICROSECOND, '1970-01-01', s.acquired_at)
FROM advisorylock_shared s LEFT JOIN information_schema.PROCESSLIST p ON p.ID = s.conn_id
WHERE IS_USED_LOCK(CONCAT('advisorylock:v1:', LOWER(LPAD(HEX(s.lock_key), 16, '0')), ':s', s.conn_id)) = s.conn_id
ORDER BY s.lock_key, s.conn_id`)
	if missingTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing shared holders: %w", err)
	}
	defer rs.Close()
	var rows []holding
	for rs.Next() {
		var key, since int64
		var user, addr string
		h := advisorylock.Holder{Shared: true}
		if err := rs.Scan(&key, &h.PID, &user, &addr, &since); err != nil {
			return nil, fmt.Errorf("listing shared holders: %w", err)
		}
		h.Client, h.Since = dbutil.Client("", user, addr), time.UnixMicro(since)
		rows = append(rows, db.row("shared", key, h))
	}
	return rows, rs.Err()
}

// printTable writes rows aligned in columns; "-" marks what is unknown.
func printTable(w io.Writer, rows []holding) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tKEY\tPID\tCLIENT\tOWNER\tTOKEN\tSINCE\tEXPIRES")
	for _, r := range rows {
		h := r.h
		name := "-"
		if h.Name != "" {
			name = shown(h.Name)
		}
		pid := holderPID(&r)
		fields := []string{name, r.kind, strconv.FormatInt(r.key, 10), orDash(pid != 0, strconv.Itoa(pid)),
			orDash(h.Client != "", shown(h.Client)),
			orDash(h.Owner != "", h.Owner), orDash(h.Token != 0, strconv.FormatUint(uint64(h.Token), 10)),
			orDash(!h.Since.IsZero(), h.Since.Local().Format(time.DateTime)),
			orDash(!h.ExpiresAt.IsZero(), h.ExpiresAt.Local().Format(time.DateTime))}
		for i, f := range fields {
			fields[i] = strings.Map(func(r rune) rune {
				if r == '\t' || r == '\n' || r == '\r' {
					return ' '
				}
				return r
			}, f)
		}
		fmt.Fprintln(tw, strings.Join(fields, "\t"))
	}
	_ = tw.Flush()
}

// shown is s as the table shows a name: quoted where it has a space or
// a character that needs escaping.
func shown(s string) string {
	if q := strconv.Quote(s); q != `"`+s+`"` || strings.ContainsAny(s, " \t") || s == "" {
		return q
	}
	return s
}

func orDash(ok bool, s string) string {
	if ok {
		return s
	}
	return "-"
}
