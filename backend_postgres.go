package advisorylock

import (
	"github.com/advisorylock/advisorylock/backend"
	"github.com/advisorylock/advisorylock/internal/postgresbackend"
)

// Postgres returns the PostgreSQL backend: Lock is a session advisory lock
// on a pinned connection (with WithMinHold, its windows are rows of
// advisorylock_windows), LeaseLock a row in advisorylock_leases. It works
// with lib/pq, pgx's stdlib driver and any driver that speaks to
// PostgreSQL.
//
// Every lock step is one round trip, on lib/pq as on pgx: keys go as
// arguments where the driver sends them in one round trip (pgx), and
// otherwise into constant statements prepared once per connection, or
// written as integer literals.
func Postgres() backend.Backend { return postgresbackend.New() }
