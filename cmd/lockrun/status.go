package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/jackc/pgx/v5/pgconn"
)

// statusTimeout bounds the whole of lockrun status.
const statusTimeout = 30 * time.Second

// holding is one row of the status table.
type holding struct {
	kind string // "lock", "shared" (a shared holder of a lock), "lease" or "free"
	h    advisorylock.Holder
}

// status prints which database it asks (a line like -v's), then, as a
// table, who holds the named locks (both kinds), or
// with no names every held lease and lock row, and on PostgreSQL every
// session advisory lock (by key: their names are stored nowhere).
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

// namedHolders looks up both kinds of lock for every name, and with
// slots > 0 the holders of a semaphore of that many slots (kind "slot N");
// a name held by none gets a "free" row.
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
		for _, kind := range []string{"lock", "lease"} {
			hs, err := holdersOf(ctx, db, kind, name, say)
			if err != nil {
				return nil, err
			}
			for _, h := range hs {
				rows = append(rows, holding{kind: holdingKind(kind, h), h: *h})
				found = true
			}
		}
		if !found {
			rows = append(rows, holding{kind: "free", h: advisorylock.Holder{Name: name, Key: advisorylock.Key(name)}})
		}
	}
	return rows, nil
}

// holdingKind is how status shows h, a holder of a name taken as kind.
func holdingKind(kind string, h *advisorylock.Holder) string {
	if h.Shared {
		return "shared"
	}
	return kind
}

// holderOf asks the library who holds name as a Lock or as a LeaseLock.
func holderOf(ctx context.Context, db *database, kind, name string, say *reporter) (*advisorylock.Holder, error) {
	opts := []advisorylock.Option{advisorylock.WithPoolerCheck(false), advisorylock.WithLogger(say.logger())}
	if kind == "lease" {
		l, err := advisorylock.NewLeaseLock(db, name, opts...)
		if err != nil {
			return nil, err
		}
		return l.Holder(ctx)
	}
	l, err := advisorylock.New(db, name, opts...)
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
		rows = append(rows, holding{kind: "slot " + strconv.Itoa(h.Slot), h: *h})
	}
	return rows, err
}

// holdersOf lists every holder of name as a Lock (shared ones too), or
// its holder as a LeaseLock.
func holdersOf(ctx context.Context, db *database, kind, name string, say *reporter) ([]*advisorylock.Holder, error) {
	if kind == "lease" {
		h, err := holderOf(ctx, db, kind, name, say)
		if h == nil || err != nil {
			return nil, err
		}
		return []*advisorylock.Holder{h}, nil
	}
	l, err := advisorylock.New(db, name, advisorylock.WithPoolerCheck(false), advisorylock.WithLogger(say.logger()))
	if err != nil {
		return nil, err
	}
	return l.Holders(ctx)
}

// allHolders lists the held lease rows by name (the tables of SPEC 4.4a;
// on SQLite a Lock's rows, shared holders' among them), then, on
// PostgreSQL, the session advisory locks by key.
func allHolders(ctx context.Context, db *database, say *reporter) ([]holding, error) {
	tables := map[string]string{"lease": "advisorylock_leases"}
	kinds := []string{"lease"}
	if db.kind == "sqlite" {
		tables["lock"] = "advisorylock_locks"
		kinds = []string{"lock", "lease"}
	}
	var rows []holding
	for _, kind := range kinds {
		names, err := heldNames(ctx, db, tables[kind])
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			hs, err := holdersOf(ctx, db, kind, name, say) // none: expired since
			if err != nil {
				return nil, err
			}
			for _, h := range hs {
				rows = append(rows, holding{kind: holdingKind(kind, h), h: *h})
			}
		}
	}
	if db.kind != "postgres" {
		return rows, nil
	}
	sessions, err := sessionLocks(ctx, db)
	return append(rows, sessions...), err
}

// heldNames reads the names of the rows with an owner; a table not
// created yet holds none.
func heldNames(ctx context.Context, db *database, table string) ([]string, error) {
	rs, err := db.QueryContext(ctx, "SELECT name FROM "+table+" WHERE owner IS NOT NULL ORDER BY name")
	if missingTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", table, err)
	}
	defer rs.Close()
	var names []string
	for rs.Next() {
		var name string
		if err := rs.Scan(&name); err != nil {
			return nil, fmt.Errorf("listing %s: %w", table, err)
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
// = low 32 bits, objsubid = 1), with who holds them. Since is the
// session's start: an earlier bound of when the lock was taken.
func sessionLocks(ctx context.Context, db *database) ([]holding, error) {
	rs, err := db.QueryContext(ctx, `SELECT l.classid::bigint, l.objid::bigint, l.pid,
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
		var since sql.NullTime
		h := advisorylock.Holder{Backend: "postgres"}
		if err := rs.Scan(&hi, &lo, &h.PID, &h.Application, &h.ClientAddr, &since); err != nil {
			return nil, fmt.Errorf("listing session locks: %w", err)
		}
		h.Key = int64(uint64(hi)<<32 | uint64(lo))
		h.Since = since.Time
		rows = append(rows, holding{kind: "lock", h: h})
	}
	return rows, rs.Err()
}

// printTable writes rows aligned in columns; "-" marks what is unknown.
func printTable(w io.Writer, rows []holding) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tKEY\tPID\tAPPLICATION\tCLIENT\tOWNER\tTOKEN\tSINCE\tEXPIRES")
	for _, r := range rows {
		h := r.h
		name := "-"
		if h.Name != "" {
			name = strconv.Quote(h.Name)
			if name == `"`+h.Name+`"` && !strings.ContainsAny(h.Name, " \t") {
				name = h.Name
			}
		}
		fields := []string{name, r.kind, strconv.FormatInt(h.Key, 10), orDash(holderPID(&h) != 0, strconv.Itoa(holderPID(&h))),
			orDash(h.Application != "", h.Application), orDash(h.ClientAddr != "", h.ClientAddr),
			orDash(h.Owner != "", h.Owner), orDash(h.Token != 0, h.Token.String()),
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

func orDash(ok bool, s string) string {
	if ok {
		return s
	}
	return "-"
}
