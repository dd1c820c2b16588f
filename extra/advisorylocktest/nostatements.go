package advisorylocktest

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
)

// ErrNoStatements is what every statement on a handle from Memory.OpenDB
// fails with (wrapped, naming the statement): the locks that use the
// handle were meant to keep their rows in a Memory, and something sent a
// statement instead, such as a lock constructed without the Memory's
// Options.
var ErrNoStatements = errors.New("advisorylocktest: this handle runs no statements (construct the lock with the Memory's Options)")

// noStatements is the driver behind Memory.OpenDB: its connections run no
// statement, and their transactions begin and end with nothing in them.
type noStatements struct{}

func (noStatements) Connect(context.Context) (driver.Conn, error) { return noConn{}, nil }
func (n noStatements) Driver() driver.Driver                      { return n }
func (noStatements) Open(string) (driver.Conn, error)             { return noConn{}, nil }

type noConn struct{}

func (noConn) Prepare(query string) (driver.Stmt, error) {
	return nil, fmt.Errorf("%w: %q", ErrNoStatements, query)
}

func (noConn) Close() error { return nil }

func (noConn) Begin() (driver.Tx, error) { return noTx{}, nil }

func (noConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) { return noTx{}, nil }

type noTx struct{}

func (noTx) Commit() error   { return nil }
func (noTx) Rollback() error { return nil }
