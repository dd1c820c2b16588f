package advisorylock

import "context"

// SQLite returns the SQLite backend. (stub)
func SQLite() Backend { return sqliteStub{} }

type sqliteStub struct{}

func (sqliteStub) Name() string                       { return "sqlite" }
func (sqliteStub) Validate(context.Context, DB) error { return ErrUnsupported }
