package advisorylock

import (
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/sqlitebackend"
)

// SQLite returns the SQLite backend. A Lock is a lease row in
// advisorylock_locks and a LeaseLock a row in advisorylock_leases, both in
// the application's database file, renewed in the background; a Fence
// keeps its tokens in advisorylock_fences. The tables are created on first
// use (see Schema). It works with any SQLite driver (glebarez/go-sqlite,
// modernc.org/sqlite, mattn/go-sqlite3) without importing one.
//
// Locks exclude every process that opens the same database file, on one
// host. Lease times are Unix milliseconds from the lock's clock
// (WithClock), so every process sharing the file must share the host's
// clock. An
// in-memory database is refused with ErrUnsupported: database/sql gives
// each connection its own, so a lock there would exclude nothing.
//
// SQLITE_BUSY and SQLITE_LOCKED mean another connection is writing: every
// statement retries them, with a short jittered backoff, for as long as
// its context allows, and reports them only with the context's error.
func SQLite() backend.Backend { return sqlitebackend.New() }
