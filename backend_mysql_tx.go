package advisorylock

import (
	"context"
	"database/sql"
	"time"
)

// MySQL and MariaDB have no transaction-scoped named locks: GET_LOCK's
// lock belongs to the session, and outlives the transaction. So LockTx
// fails with ErrUnsupported before anything is sent, and tx is as it was.

// TryLockTx returns ErrUnsupported (see above).
func (m mysqlBackend) TryLockTx(context.Context, *sql.Tx, int64) (bool, error) {
	return false, errNoTxLocks(m)
}

// TxSettings returns ErrUnsupported (see above).
func (m mysqlBackend) TxSettings(context.Context, *sql.Tx) (map[string]string, error) {
	return nil, errNoTxLocks(m)
}

// WaitLockTx returns ErrUnsupported (see above).
func (m mysqlBackend) WaitLockTx(context.Context, *sql.Tx, int64, time.Duration, map[string]string) (bool, error) {
	return false, errNoTxLocks(m)
}
