package advisorylock

import "context"

// PoolerMode is what DetectPooler saw.
type PoolerMode int

const (
	// PoolerNotSeen means no multiplexing was seen: a direct connection,
	// or a session-mode pooler.
	PoolerNotSeen PoolerMode = iota
	// PoolerTransaction means sessions are multiplexed, as by a
	// transaction- or statement-mode pooler.
	PoolerTransaction
)

// PoolerHint reads a DSN for signs of a well-known pooler. (stub)
func PoolerHint(dsn string) (pooler string, ok bool) { return "", false }

// DetectPooler probes db for session multiplexing. (stub)
func DetectPooler(ctx context.Context, db DB) (PoolerMode, error) {
	return PoolerNotSeen, nil
}

// checkPooler refuses session locks behind a transaction-mode pooler. (stub)
func checkPooler(ctx context.Context, db DB, s SessionLocker) error { return nil }
