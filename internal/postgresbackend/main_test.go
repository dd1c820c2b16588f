package postgresbackend

import (
	"hash/fnv"
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }

// keyOf is a lock key for a test's unique name. Any key unique to the
// name serves these tests; the library's own is advisorylock.Key.
func keyOf(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}
