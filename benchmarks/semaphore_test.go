package benchmarks

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock"
)

// A semaphore's try names every slot in one statement (a CASE that stops
// at the first slot granted): semaphore_tryacquire measures TryAcquire +
// Release on a free semaphore of semaphoreSlots slots, semaphore_raw the
// same two statements written by hand, keys as literals, on a pinned
// connection (the floor). BenchmarkPaired pairs them, and the semaphore
// with a Lock's TryLock + Release.
const semaphoreSlots = 3

func init() {
	pgOps = append(pgOps,
		pgOp{"semaphore_tryacquire", pgDrivers, setupSemaphore},
		pgOp{"semaphore_raw", pgDrivers, setupSemaphoreRaw},
	)
	pgPairs = append(pgPairs,
		struct{ base, op string }{"semaphore_raw", "semaphore_tryacquire"},
		struct{ base, op string }{"trylock_release", "semaphore_tryacquire"},
		struct{ base, op string }{"raw_literal", "semaphore_raw"},
	)
}

func setupSemaphore(b *testing.B, e pgEnv) func(ctx context.Context) error {
	s, err := advisorylock.NewSemaphore(e.db, lockName(b, "semaphore"), semaphoreSlots)
	must(b, err, "advisorylock.NewSemaphore")
	must(b, s.Check(context.Background()), "Check")
	return func(ctx context.Context) error {
		g, err := s.TryAcquire(ctx)
		if err != nil {
			return err
		}
		return g.Release(ctx)
	}
}

// setupSemaphoreRaw is the floor: the slots tried in one CASE statement,
// then the granted slot unlocked with a notification for its waiters, as
// the library's release sends one, literals, on a pinned connection (its
// keys are keys of their own, one per slot, as the library's are).
func setupSemaphoreRaw(b *testing.B, e pgEnv) func(ctx context.Context) error {
	conn := pin(b, e.db)
	name := lockName(b, "semaphore")
	var try strings.Builder
	try.WriteString("SELECT CASE")
	unlock := make([]string, semaphoreSlots)
	for i := range semaphoreSlots {
		key := strconv.FormatInt(advisorylock.Key(name+"/slot/"+strconv.Itoa(i)), 10)
		try.WriteString(" WHEN pg_try_advisory_lock(" + key + ") THEN " + strconv.Itoa(i))
		unlock[i] = "SELECT CASE WHEN pg_advisory_unlock(" + key + ") THEN (SELECT true FROM pg_notify('" + tableName("slot_wake") + "', '1')) ELSE false END"
	}
	try.WriteString(" ELSE -1 END")
	return func(ctx context.Context) error {
		var slot int
		if err := conn.QueryRowContext(ctx, try.String()).Scan(&slot); err != nil {
			return err
		}
		if slot < 0 {
			return errNotGranted
		}
		var ok bool
		return conn.QueryRowContext(ctx, unlock[slot]).Scan(&ok)
	}
}
