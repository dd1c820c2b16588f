package advisorylock

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync/atomic"

	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/dbutil"
)

// localBackend returns the backend that needs no I/O to pick: the
// configured one, else the one the driver's type names; nil when neither
// tells (a wrapped driver: firstUse asks the database).
func localBackend(db DB, c *config) backend.Backend {
	b := c.backend
	if b == nil {
		b = backendForDriver(db)
	}
	return configured(b, db, c)
}

// configured returns b adjusted to db (see backend.Configurer), or b itself.
func configured(b backend.Backend, db DB, c *config) backend.Backend {
	if cf, ok := b.(backend.Configurer); ok {
		return cf.Configure(db, 0, c.serverChecks)
	}
	return b
}

// isNil reports a nil db, also a typed nil pointer in the interface.
func isNil(db DB) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// errNilDB is what the constructors return for a nil db.
var errNilDB = fmt.Errorf("%w: nil DB", ErrUnsupported)

// resolveBackend picks the backend: the local one, else the one the
// database says it is; then, with the server checks, its Validate. Each
// is asked once per *sql.DB.
func resolveBackend(ctx context.Context, db DB, c *config) (backend.Backend, error) {
	if isNil(db) {
		return nil, errNilDB
	}
	b := localBackend(db, c)
	if b == nil {
		var err error
		b, err = dbutil.CachedVerdict(ctx, db, "backend", func(ctx context.Context) (backend.Backend, error) {
			if b := backendByAsking(ctx, db); b != nil {
				return b, nil
			}
			return nil, fmt.Errorf("%w: cannot tell which database driver %T talks to; pass WithBackend(Postgres()), WithBackend(SQLite()) or WithBackend(MySQL())", ErrUnsupported, db.Driver())
		})
		if err != nil {
			return nil, err
		}
		b = configured(b, db, c)
	}
	if !c.serverChecks {
		return b, nil
	}
	v, ok := b.(backend.Validator)
	if !ok {
		return b, nil
	}
	_, err := dbutil.CachedVerdict(ctx, db, "validate "+b.Name(), func(ctx context.Context) (struct{}, error) {
		return struct{}{}, v.Validate(ctx, db)
	})
	return b, err
}

// firstUse runs a lock's first-use work once, under the context of the
// first operation that needs it; a failure is not kept. Operations that
// arrive while it runs wait for it, as long as their context allows.
type firstUse[T any] struct {
	turn chan struct{} // a token: whoever holds it runs the work
	v    atomic.Pointer[T]
}

func newFirstUse[T any]() firstUse[T] { return firstUse[T]{turn: make(chan struct{}, 1)} }

// get returns the work's result, running it first if no run succeeded yet.
func (f *firstUse[T]) get(ctx context.Context, work func(ctx context.Context) (*T, error)) (*T, error) {
	if v := f.v.Load(); v != nil {
		return v, nil
	}
	select {
	case f.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-f.turn }()
	if v := f.v.Load(); v != nil {
		return v, nil
	}
	v, err := work(ctx)
	if err != nil {
		return nil, err
	}
	f.v.Store(v)
	return v, nil
}

// backendForDriver detects the backend from the driver's package path.
func backendForDriver(db DB) backend.Backend {
	switch pkg := dbutil.DriverPkg(db); {
	case pkg == "github.com/lib/pq", strings.HasPrefix(pkg, "github.com/jackc/pgx/"):
		return Postgres()
	case pkg == "github.com/glebarez/go-sqlite", pkg == "modernc.org/sqlite", pkg == "github.com/mattn/go-sqlite3", pkg == "github.com/ncruces/go-sqlite3/driver":
		return SQLite()
	case pkg == "github.com/go-sql-driver/mysql":
		return MySQL()
	}
	return nil
}

// backendByAsking asks the database of a wrapped driver what it is.
func backendByAsking(ctx context.Context, db DB) backend.Backend {
	for _, b := range []backend.Backend{Postgres(), SQLite(), MySQL()} {
		if identifies(ctx, db, b) {
			return b
		}
	}
	return nil
}

// identifies asks db whether it is what b serves (see backend.Recognizer).
func identifies(ctx context.Context, db DB, b backend.Backend) bool {
	probe, ok := b.(backend.Recognizer)
	if !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, defaultReleaseTimeout)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		return false
	}
	defer conn.Close()
	return probe.Recognizes(ctx, conn)
}
