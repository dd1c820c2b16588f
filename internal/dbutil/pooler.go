package dbutil

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/advisorylock/advisorylock/backend"
)

// The pooler probe (see advisorylock.DetectPooler, which documents what
// it proves and what it cannot): in each round it checks out two
// connections A and B, reads the server session's identity on A, then on
// B, then on A again, and reports multiplexing when A and B shared a
// session or A's session changed between its two statements.

// probeRounds is how many rounds the probe runs before it reports that it
// saw no multiplexing.
const probeRounds = 8

// secondConnWait bounds the checkout of a round's second connection; past
// it, the probe reads one connection only, so a full pool never blocks it.
const secondConnWait = time.Second

// CheckPooler refuses session locks on db when the probe sees a
// transaction-mode pooler, probing once per *sql.DB (see CachedVerdict):
// the refusal wraps ErrTransactionPooler and says what was seen.
func CheckPooler(ctx context.Context, db backend.DB, s backend.SessionIdentifier) error {
	why, err := CachedVerdict(ctx, db, "pooler", func(ctx context.Context) (string, error) {
		_, why, err := ProbePooler(ctx, db, s)
		return why, err
	})
	if err != nil {
		return err
	}
	if why != "" {
		return fmt.Errorf("%w: %s", ErrTransactionPooler, why)
	}
	return nil
}

// ProbePooler runs the probe and returns whether it saw sessions
// multiplexed, as by a transaction- or statement-mode pooler, and why,
// for messages. Its errors are PoolerProbeError's.
func ProbePooler(ctx context.Context, db backend.DB, s backend.SessionIdentifier) (transaction bool, why string, err error) {
	paired := MaxOpenConns(db) != 1
	for range probeRounds {
		why, stillPaired, err := probeRound(ctx, db, s, paired)
		if err != nil {
			return false, "", PoolerProbeError(err)
		}
		if why != "" {
			return true, why, nil
		}
		paired = stillPaired
	}
	return false, "", nil
}

// probeRound runs one round of the probe. why is non-empty when it saw
// multiplexing. paired reports whether later rounds should still try two
// connections.
func probeRound(ctx context.Context, db backend.DB, s backend.SessionIdentifier, paired bool) (why string, stillPaired bool, err error) {
	a, err := Checkout(ctx, db, !s.Traits().CancelsPromptly, PoolWaitOf(ctx))
	if err != nil {
		return "", paired, err
	}
	defer func() { GiveBack(a, err == nil && ctx.Err() == nil) }()
	a1, why, err := sessionOf(ctx, s, a)
	if why != "" || err != nil {
		return why, paired, err
	}
	var b *sql.Conn
	var b1 string
	if paired {
		b, b1, why, err = secondSession(ctx, db, s)
		if why != "" || err != nil {
			return why, paired, err
		}
		if b == nil {
			paired = false // the pool or the pooler has no second session for us: read A alone
		} else {
			defer func() { GiveBack(b, err == nil && ctx.Err() == nil) }()
		}
	}
	a2, why, err := sessionOf(ctx, s, a)
	switch {
	case why != "" || err != nil:
		return why, paired, err
	case b != nil && (a1 == b1 || a2 == b1):
		return "two connections open at once shared server session " + b1, paired, nil
	case a1 != a2:
		return "one connection moved from server session " + a1 + " to " + a2, paired, nil
	}
	return "", paired, nil
}

// secondSession checks out a second connection and reads its session
// identity within secondConnWait. It returns a nil conn, and no error,
// when that takes longer: a pool at its SetMaxOpenConns limit, or a
// pooler with no free server session, must not hold the probe up.
func secondSession(ctx context.Context, db backend.DB, s backend.SessionIdentifier) (conn *sql.Conn, id, why string, err error) {
	bctx, cancel := context.WithTimeout(ctx, secondConnWait)
	defer cancel()
	conn, err = db.Conn(bctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, "", "", context.Cause(ctx)
		}
		return nil, "", "", nil
	}
	if ctx.Err() != nil { // ended as the connection arrived: nothing ran on it
		GiveBack(conn, true)
		return nil, "", "", context.Cause(ctx)
	}
	id, why, err = sessionOf(bctx, s, conn)
	switch {
	case ctx.Err() != nil:
		GiveBack(conn, false)
		return nil, "", "", context.Cause(ctx)
	case bctx.Err() != nil:
		GiveBack(conn, false) // its statement was cut short
		return nil, "", "", nil
	case why != "" || err != nil:
		GiveBack(conn, true)
		return nil, "", why, err
	}
	return conn, id, "", nil
}

// sessionOf reads conn's server session identity. A prepared statement
// that vanished or already exists is a sign of multiplexing, returned as
// why (see PoolerSign).
func sessionOf(ctx context.Context, s backend.SessionIdentifier, conn *sql.Conn) (id, why string, err error) {
	id, err = s.SessionIdentity(ctx, conn)
	if why := PoolerSign(err); why != "" {
		return "", why, nil
	}
	if err != nil && ctx.Err() != nil {
		return "", "", context.Cause(ctx)
	}
	return id, "", err
}

// PoolerSign says why err is a sign of multiplexing, or "" if it is not:
// a prepared statement that vanished or already exists (SQLSTATE 26000
// or 42P05) means the driver's statements landed on different sessions.
func PoolerSign(err error) string {
	switch code := SQLState(err); code {
	case "26000", "42P05":
		return "a prepared statement was not on the session it was prepared on (SQLSTATE " + code + ")"
	}
	return ""
}

// MaxOpenConns returns db's SetMaxOpenConns limit when db reports pool
// statistics (*sql.DB, *sqlx.DB), and 0 (unlimited or unknown) otherwise.
func MaxOpenConns(db backend.DB) int {
	if st, ok := db.(interface{ Stats() sql.DBStats }); ok {
		return st.Stats().MaxOpenConnections
	}
	return 0
}

// PoolerProbeError wraps an error of the probe, keeping it reachable.
func PoolerProbeError(err error) error {
	if err == nil {
		return nil
	}
	return &poolerError{err: err}
}

type poolerError struct{ err error }

func (e *poolerError) Error() string {
	return "advisorylock: pooler probe: " + strings.TrimPrefix(e.err.Error(), "advisorylock: ")
}

func (e *poolerError) Unwrap() error { return e.err }
