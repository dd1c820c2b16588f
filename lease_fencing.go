package advisorylock

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"math"
	"strconv"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// FencingToken identifies a lease grant: it is at least 1 and strictly
// increases with every grant of one name, also when lease rows are
// deleted and, on PostgreSQL, across a failover to a standby that lacked
// the last grants (the server's WAL timeline is in its bits 40 to 62; the
// "How tokens are made" in docs/fencing.md gives the bounds). Tokens are not
// consecutive. A resource that remembers the highest token it accepted
// (see Fence) can refuse writes from a holder that has since lost its
// lease. It is stored as a BIGINT (the generation column): int64(t) is
// its BIGINT value, and fmt prints it in decimal.
type FencingToken uint64

// ParseFencingToken converts a stored BIGINT to a token; v <= 0 is an error.
func ParseFencingToken(v int64) (FencingToken, error) {
	t, err := dbutil.TermToken(v)
	return FencingToken(t), err
}

// Admits reports whether a resource that last accepted t may accept
// incoming: equal tokens are admitted (one holder writes many times).
func (t FencingToken) Admits(incoming FencingToken) bool { return incoming >= t }

// Value implements driver.Valuer: the token is sent as an int64. A token
// above math.MaxInt64, which no database grants, is an error.
func (t FencingToken) Value() (driver.Value, error) {
	if t > math.MaxInt64 {
		return nil, fmt.Errorf("advisorylock: fencing token %d does not fit a BIGINT", uint64(t))
	}
	return int64(t), nil
}

// Scan implements sql.Scanner for BIGINT columns; it refuses NULL and
// values <= 0.
func (t *FencingToken) Scan(src any) error {
	var v int64
	var err error
	switch s := src.(type) {
	case int64:
		v = s
	case []byte:
		v, err = strconv.ParseInt(string(s), 10, 64)
	case string:
		v, err = strconv.ParseInt(s, 10, 64)
	default:
		return fmt.Errorf("advisorylock: cannot scan %T into a FencingToken", src)
	}
	if err != nil {
		return fmt.Errorf("advisorylock: cannot scan fencing token: %w", err)
	}
	tok, err := ParseFencingToken(v)
	*t = tok
	return err
}

// Fence guards a resource against writes from holders that lost their
// lease: it keeps the highest token admitted per resource (in
// advisorylock_fences), and Admit refuses lower ones.
type Fence struct {
	db       DB
	resource string
	cfg      config
	setup    firstUse[backend.LeaseStore]
}

// NewFence returns a Fence for resource. It does no I/O (see New): it
// fails only for a nil db, an empty resource name or one the database
// cannot store, or an option other than WithBackend, WithServerChecks and
// WithLogger.
// The first Admit (or Check) picks the backend, which must keep leases,
// and creates the table if needed, on a connection of its own: Admit runs
// in the caller's transaction, where a missing table could not be created.
func NewFence(db DB, resource string, opts ...Option) (*Fence, error) {
	cfg, err := leaseConfig(db, resource, "a Fence", fenceOptions, opts)
	if err != nil {
		return nil, fmt.Errorf("advisorylock: fence %s: %w", quoteName(resource), err)
	}
	return &Fence{db: db, resource: resource, cfg: cfg, setup: newFirstUse[backend.LeaseStore]()}, nil
}

// fenceOptions are the options a Fence takes.
const fenceOptions = optBackend | optServerChecks | optLogger

// Check runs the first-use work now (see NewFence), which creates the
// tables if they are missing and proves the role may read and write the
// fence table, so that a hot standby or a missing grant is refused here
// rather than in the caller's transaction; later Admits skip it. Call it
// before the first Admit wherever every connection may be in a
// transaction at once: a pool of one connection (SetMaxOpenConns(1)), or
// as many first Admits at once as a transaction pooler has server
// sessions. Each Admit's transaction holds one, and the first-use work
// would wait for another (PgBouncer ends the wait at query_wait_timeout).
func (f *Fence) Check(ctx context.Context) error {
	_, err := f.store(ctx)
	return f.wrap(err)
}

// wrap names the fence's resource in err, nil for nil.
func (f *Fence) wrap(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("advisorylock: fence %s: %w", quoteName(f.resource), err)
}

// store returns f's backend, doing the first-use work once.
func (f *Fence) store(ctx context.Context) (backend.LeaseStore, error) {
	s, err := f.setup.get(ctx, func(ctx context.Context) (*backend.LeaseStore, error) {
		s, err := leaseStoreOf(ctx, f.db, &f.cfg)
		if err != nil {
			return nil, err
		}
		return s, checkTables(ctx, f.db, *s, "advisorylock_fences")
	})
	if err != nil {
		return nil, err
	}
	return *s, nil
}

// Admit records token as the resource's highest in tx if it is not lower
// than the highest admitted so far, and returns nil; a lower token gets an
// error matching ErrStaleToken that names the resource, the token and the
// highest admitted, and the caller must roll tx back. Because the check and the caller's write commit together, a stale
// holder's write can never land after a newer holder's.
func (f *Fence) Admit(ctx context.Context, tx *sql.Tx, token FencingToken) error {
	if token == 0 || token > math.MaxInt64 {
		return f.wrap(fmt.Errorf("invalid fencing token %d", uint64(token)))
	}
	store, err := f.store(ctx)
	if err != nil {
		return f.wrap(err)
	}
	admitter, ok := store.(backend.TokenAdmitter)
	if !ok {
		return f.wrap(fmt.Errorf("%w: backend %q keeps no fences", ErrUnsupported, store.Name()))
	}
	highest, err := admitter.AdmitToken(ctx, tx, f.resource, uint64(token))
	if err != nil {
		return f.wrap(err)
	}
	if highest > uint64(token) {
		return staleTokenErr(f.resource, token, FencingToken(highest))
	}
	return nil
}
