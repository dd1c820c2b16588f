package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/extra/advisorylockpq"
	"github.com/jackc/pgx/v5"
)

// leaseHold is how long a holder holds, once the waiter has entered its
// acquire, before it releases, in the lease handoff pairs. A LeaseLock
// waiter leaves no trace in pg_locks to wait for, so both sides of a pair
// hold this long instead: the same idle time before each release, so
// that the wake-ups each handoff needs start equally cold.
const leaseHold = 5 * time.Millisecond

// leaseHandoffPairs are measured side by side by BenchmarkLeaseHandoffPaired:
// advisorylock's LeaseLock against its session Lock (the gate), and the
// bare statements of each (the floor of the design: a release that hands
// the lease to the waiter's place and notifies it, against
// pg_advisory_unlock waking a pg_advisory_lock).
var leaseHandoffPairs = []struct {
	op, base         string
	drivers          []string
	opSetup, baseSet func(b *testing.B, drv string) (func(i int) contender, waitProbe)
}{
	{"leaselock", "advisorylock", pgDrivers, handoffLeaseLock, handoffAdvisoryLock},
	{"leaselock_pqlistener", "advisorylock", []string{"pq"}, handoffLeaseLockPQListener, handoffAdvisoryLock},
	{"raw_lease", "raw_literal", []string{"pgx"}, handoffRawLease, handoffRawLiteral},
	{"semaphore", "advisorylock", pgDrivers, handoffSemaphore, handoffAdvisoryLock},
}

// BenchmarkLeaseHandoffPaired alternates, as BenchmarkHandoffPaired does,
// a LeaseLock handoff with a session Lock handoff, each holder releasing
// leaseHold after the waiter entered its acquire, and reports their
// medians and ratio (x-base).
func BenchmarkLeaseHandoffPaired(b *testing.B) {
	for _, pair := range leaseHandoffPairs {
		for _, drv := range pair.drivers {
			b.Run(pair.op+"_vs_"+pair.base+"/"+drv, func(b *testing.B) {
				op, base := newPingPong(b, drv, pair.opSetup), newPingPong(b, drv, pair.baseSet)
				op.hold, base.hold = leaseHold, leaseHold
				runHandoffPair(b, op, base)
			})
		}
	}
}

// handoffSemaphore is a Semaphore of two slots, one held throughout by a
// third holder, so that every handoff is of the other slot: where slot
// releases are heard (pgx) the waiter is woken by the release, and
// elsewhere (lib/pq) it waits server-side on a slot chosen at random, in
// slices, and sees a release of the other slot at its slice's end.
func handoffSemaphore(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	name := lockName(b, "handoff_semaphore")
	third, err := advisorylock.NewSemaphore(openPG(b, drv, postgresDSN(), 4), name, 2)
	must(b, err, "advisorylock.NewSemaphore")
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	g, err := third.TryAcquire(ctx)
	must(b, err, "the third holder's TryAcquire")
	b.Cleanup(func() { _ = g.Release(context.Background()) })
	return func(int) contender {
		s, err := advisorylock.NewSemaphore(openPG(b, drv, postgresDSN(), 4), name, 2)
		must(b, err, "advisorylock.NewSemaphore")
		return guardContender(s.Acquire)
	}, nil
}

// handoffLeaseLockPQListener is handoffLeaseLock on lib/pq handles wrapped
// by extra/advisorylockpq, whose waiters a pq.Listener wakes.
func handoffLeaseLockPQListener(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	name := lockName(b, "handoff")
	forgetLease(b, name)
	return func(int) contender {
		db := advisorylockpq.Wrap(openPG(b, drv, postgresDSN(), 4), postgresDSN())
		return guardContender(newLeaseLock(b, db, name).Lock)
	}, placedIn(b, name)
}

// handoffRawLease is the bare form of a woken LeaseLock handoff, with
// pgx's own connections and the library's table: a waiter tries the
// upsert and, while it misses, takes the place next in line (a durable
// write, made while the holder holds) and waits for a notification on a
// connection of its own that LISTENs; the holder's release hands the
// lease to the place (asynchronous commit, NOTIFY on commit, the new
// owner in the payload), and the waiter named returns without a
// statement of its own.
func handoffRawLease(b *testing.B, drv string) (func(i int) contender, waitProbe) {
	if drv != "pgx" {
		b.Fatalf("the bare lease handoff needs pgx's notifications, not %s", drv)
	}
	name := lockName(b, "handoff_raw_lease")
	forgetLease(b, name)
	channel := tableName("lease_wake")
	const acquire = `INSERT INTO advisorylock_leases AS l (name, owner, generation, acquired_at, expires_at)
VALUES ($1::text, $2::text, nextval('advisorylock_token_seq'), now(), now() + interval '30 seconds')
ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, generation = greatest(l.generation + 1, EXCLUDED.generation),
	acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, next_owner = NULL, next_generation = NULL, next_expires_at = NULL
WHERE (l.owner IS NULL OR l.expires_at <= now()) AND (l.next_owner IS NULL OR l.next_expires_at <= now() OR l.next_owner = EXCLUDED.owner)
RETURNING generation`
	const queue = `UPDATE advisorylock_leases SET next_owner = $2::text, next_generation = nextval('advisorylock_token_seq'), next_expires_at = now() + interval '30 seconds'
WHERE name = $1::text AND owner IS NOT NULL AND expires_at > now() AND (next_owner IS NULL OR next_expires_at <= now())
RETURNING next_generation`
	release := `UPDATE advisorylock_leases SET owner = next_owner, generation = coalesce(next_generation, generation), acquired_at = now(),
	expires_at = CASE WHEN next_owner IS NULL THEN least(expires_at, now()) ELSE next_expires_at END,
	next_owner = NULL, next_generation = NULL, next_expires_at = NULL
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS relaxed
WHERE name = $1::text AND generation = $2::bigint AND owner IS NOT NULL
RETURNING pg_notify('` + channel + `', coalesce(owner, ''))`
	n := 0
	return func(i int) contender {
		conn, listener := pgxConn(b), pgxConn(b)
		ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
		defer cancel()
		if _, err := listener.Exec(ctx, "LISTEN "+channel); err != nil {
			b.Fatalf("LISTEN: %v", err)
		}
		var gen int64
		return contender{
			acquire: func(ctx context.Context) error {
				n++
				owner := fmt.Sprintf("raw-%d-%d", i, n)
				for {
					err := conn.QueryRow(ctx, acquire, name, owner).Scan(&gen)
					if !errors.Is(err, pgx.ErrNoRows) {
						return err
					}
					err = conn.QueryRow(ctx, queue, name, owner).Scan(&gen)
					if errors.Is(err, pgx.ErrNoRows) {
						continue // freed since the try: no release will name us
					}
					if err != nil {
						return err
					}
					// Placed: the release hands the lease to us and names us.
					// Other notes are of other rounds (the listener hears
					// every release, its own contender's too): skip them.
					for {
						note, err := listener.WaitForNotification(ctx)
						if err != nil {
							return err
						}
						if note.Payload == owner {
							return nil
						}
					}
				}
			},
			release: func(ctx context.Context) error {
				_, err := conn.Exec(ctx, release, name, gen)
				return err
			},
		}
	}, nil
}

// pgxConn opens a pgx connection of its own, closed at cleanup.
func pgxConn(b *testing.B) *pgx.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, postgresDSN())
	if err != nil {
		b.Fatalf("pgx connect: %v", err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
