package postgresbackend_test

import (
	"fmt"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/postgresbackend"
)

// TestSchemaLockIsTheKeyOfItsName: the lock that serializes schema
// upgrades is the two halves of advisorylock.Key("advisorylock:schema"),
// the lock every earlier release takes, so that releases old and new
// upgrading one database at once still take turns.
func TestSchemaLockIsTheKeyOfItsName(t *testing.T) {
	k := uint64(advisorylock.Key("advisorylock:schema"))
	want := fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, %d)", int32(k>>32), int32(k))
	if postgresbackend.SchemaLock != want {
		t.Fatalf("the schema lock is %q, want %q", postgresbackend.SchemaLock, want)
	}
}
