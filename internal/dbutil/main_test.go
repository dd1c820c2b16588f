package dbutil_test

import (
	"testing"

	"github.com/advisorylock/advisorylock/internal/testdb"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(testdb.Main(m)) }
