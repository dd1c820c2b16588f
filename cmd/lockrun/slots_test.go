package main

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestSlotsLetNHoldersInAtOnce starts five lockrun -n --slots 2 on one
// name: exactly two run their command, on slots 0 and 1 (LOCKRUN_SLOT),
// the others exit with the conflict code, and status --slots lists the
// two holders.
func TestSlotsLetNHoldersInAtOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		name, d := lockName(t), newDir(t)
		hold := []string{"sh", "-c", `echo "$LOCKRUN_SLOT" >> "$1"; ` + waitAt(`"$2"`), "sh", d.path("slots"), d.gate(t, "go")}
		var procs []*proc
		for range 2 {
			procs = append(procs, startLockrun(t, env, append([]string{"--slots", "2", name, "--"}, hold...)...))
		}
		testdb.WaitFor(t, 0, func() bool { return len(strings.Fields(d.read("slots"))) == 2 }, "two lockruns did not take the two slots")
		for range 3 {
			if code, stdout, stderr := runLockrun(t, env, append([]string{"-n", "--slots", "2", name, "--"}, hold...)...); code != 1 {
				t.Errorf("a third holder exited %d, want the conflict code 1; %q %q", code, stdout, stderr)
			}
		}
		code, stdout, stderr := runLockrun(t, env, "status", "--slots", "2", name)
		if code != 0 || strings.Count(stdout, "slot 0") != 1 || strings.Count(stdout, "slot 1") != 1 {
			t.Errorf("status --slots 2 = %d, %q, %q; want a row for each slot", code, stdout, stderr)
		}
		d.touch(t, "go")
		for _, p := range procs {
			if code := p.wait(t); code != 0 {
				t.Errorf("a holder exited %d; stderr: %q", code, p.stderr)
			}
		}
		slots := strings.Fields(d.read("slots"))
		slices.Sort(slots)
		if !slices.Equal(slots, []string{"0", "1"}) {
			t.Fatalf("LOCKRUN_SLOT of the holders = %v, want 0 and 1", slots)
		}
	})
}

func TestSlotsRefusesWhatDoesNotApply(t *testing.T) {
	for _, args := range [][]string{
		{"--slots", "0", "job", "true"},
		{"--slots", "1001", "job", "true"},
		{"--slots", "x", "job", "true"},
		{"--slots", "2", "--lease", "job", "true"},
		{"--slots", "2", "--min-hold", "1m", "job", "true"},
	} {
		if _, err := parseArgs(args); err == nil {
			t.Errorf("parseArgs(%q): no error", args)
		}
	}
	o, err := parseArgs([]string{"--slots", "3", "job", "true"})
	if err != nil || o.slots != 3 {
		t.Fatalf("parseArgs(--slots 3) = %+v, %v", o, err)
	}
}

// slots is a config file key, with the flag's bounds, that the flag
// overrides; the command learns its slot from it as from the flag, and
// a config slots with -s is a configuration error that says where the
// slots came from.
func TestSlotsFromTheConfigFile(t *testing.T) {
	for _, bad := range []string{"0", "1001", "x", "-1"} {
		o, _ := parseArgs([]string{"job", "true"})
		err := o.applyConfig(map[string]setting{"slots": {bad, "/c:3"}})
		if codeFor(err) != exitConfig || !strings.Contains(err.Error(), "/c:3: slots: bad value") {
			t.Errorf("slots = %s: %v; want a configuration error naming the line", bad, err)
		}
	}
	o, _ := parseArgs([]string{"--slots", "5", "job", "true"})
	if err := o.applyConfig(map[string]setting{"slots": {"3", "/c:1"}}); err != nil || o.slots != 5 {
		t.Errorf("--slots 5 over a config slots = 3: %d, %v; want the flag's 5", o.slots, err)
	}

	env := []string{"XDG_STATE_HOME=" + t.TempDir()}
	d := newDir(t)
	conf := d.path("lockrun.conf")
	writeFile(t, conf, "slots = 2\n")
	name := lockName(t)
	code, stdout, stderr := runLockrun(t, env, "--config", conf, name, "sh", "-c", `echo "slot=$LOCKRUN_SLOT"`)
	if got := strings.TrimSpace(stdout); code != 0 || (got != "slot=0" && got != "slot=1") {
		t.Errorf("lockrun with slots = 2 in its config file: %d, %q, %q; want the command run on slot 0 or 1", code, stdout, stderr)
	}
	code, _, stderr = runLockrun(t, env, "--config", conf, "-s", name, "true")
	if code != exitConfig || !strings.Contains(stderr, "--slots and -s exclude each other") || !strings.Contains(stderr, "config file") {
		t.Errorf("-s with slots in the config file: %d, %q; want exit %d saying the slots come from the config file", code, stderr, exitConfig)
	}
}

// status with no names lists a name held shared and a semaphore's slot
// wherever the database can tell: on SQLite by name (kinds "shared" and
// "slot N"), on PostgreSQL by key (the slot as a lock on its slotKey),
// on MySQL the shared holder by key (GET_LOCK's locks are listed nowhere).
func TestStatusWithoutNamesListsSharedHoldersAndSlots(t *testing.T) {
	eachBackend(t, func(t *testing.T, env []string) {
		d := newDir(t)
		shared, sem := lockName(t), lockName(t)+"-sem"
		startLockrun(t, env, append([]string{"-s", shared, "--"}, d.holdUntil(t, "go")...)...)
		startLockrun(t, env, append([]string{"--slots", "2", sem, "--"}, d.holdUntil(t, "go")...)...)
		testdb.WaitFor(t, 0, func() bool { return len(strings.Fields(d.read("ran"))) == 2 }, "the holders did not start")
		defer d.touch(t, "go")

		code, stdout, stderr := runLockrun(t, env, "status")
		if code != 0 {
			t.Fatalf("status exited %d: %q", code, stderr)
		}
		_, table, _ := strings.Cut(stdout, "\n")
		rows := checkAligned(t, table)
		has := func(name, kind string, keys ...int64) bool {
			for _, r := range rows[1:] {
				for _, k := range keys {
					if (name == "" && r[0] == "-" || r[0] == name) && strings.HasPrefix(r[1], kind) && r[2] == strconv.FormatInt(k, 10) {
						return true
					}
				}
			}
			return false
		}
		slotKeys := []int64{slotKey(sem, 0), slotKey(sem, 1)}
		switch dsn := envValue(env, "LOCKRUN_DSN"); {
		case strings.HasPrefix(dsn, "postgres"):
			if !has("", "shared", advisorylock.Key(shared)) || !has("", "lock", slotKeys...) {
				t.Errorf("status on PostgreSQL lacks the shared holder (kind shared) or the slot (a lock on its slotKey):\n%s", stdout)
			}
		case strings.HasPrefix(dsn, "mysql"):
			if !has("", "shared", advisorylock.Key(shared)) {
				t.Errorf("status on MySQL lacks the shared holder by key:\n%s", stdout)
			}
		default:
			if !has(shared, "shared", advisorylock.Key(shared)) || !has(sem, "slot ", slotKeys...) {
				t.Errorf("status on SQLite lacks the shared holder or the slot by name:\n%s", stdout)
			}
		}
	})
}

// slotKey and maxSlots are the library's: every held slot's key (the
// Guard's, and the key of the row of each slot Semaphore.Holders
// reports) is slotKey of its slot, and NewSemaphore takes maxSlots slots
// but not one more.
func TestSlotKeyAndMaxSlotsAreTheLibrarys(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "locks.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	name := "slot-keys"
	s, err := advisorylock.NewSemaphore(db, name, 3, advisorylock.WithPoolerCheck(false))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		g, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Release(ctx)
	}
	hs, err := s.Holders(ctx)
	if err != nil || len(hs) != 3 {
		t.Fatalf("Holders = %v, %v; want three", hs, err)
	}
	for _, h := range hs { // the key of the slot's row, as the library wrote it
		var n int
		if err := db.QueryRowContext(ctx, "SELECT count(*) FROM advisorylock_locks WHERE name = ? AND key = ?", name, slotKey(name, h.Slot)).Scan(&n); err != nil || n != 1 {
			t.Errorf("Holders: slot %d has %d rows under slotKey's key %d (%v); want its one row", h.Slot, n, slotKey(name, h.Slot), err)
		}
	}
	if _, err := advisorylock.NewSemaphore(db, name, maxSlots); err != nil {
		t.Errorf("NewSemaphore with maxSlots: %v", err)
	}
	if _, err := advisorylock.NewSemaphore(db, name, maxSlots+1); err == nil {
		t.Errorf("NewSemaphore with maxSlots+1 slots succeeded")
	}
}
