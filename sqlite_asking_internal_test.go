package advisorylock

import (
	"context"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
)

func TestBackendByAskingFindsSQLite(t *testing.T) {
	db := testdb.OpenSQLite(t, testdb.SQLitePath(t), "")
	if b := backendByAsking(context.Background(), db); b == nil || b.Name() != "sqlite" {
		t.Fatalf("backendByAsking on SQLite: %v, want sqlite", b)
	}
}
