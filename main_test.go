package advisorylock_test

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
	"go.uber.org/goleak"
)

// TestMain checks, once every test has run, that none left a goroutine
// behind, but pgx's own background close of a connection (asyncClose):
// it sends a cancel request and drains the socket for up to 15 s, so a
// test whose last statement met a blackholed network (the vanished-holder
// tests, run alone) ends before it does. pgx bounds it, not the library.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(testdb.Main(m), goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgconn.(*PgConn).asyncClose.func1"))
}

// isLost reports, without blocking, whether lease's Lost channel is
// closed: the check a holder makes right before an action that must not
// run without the lease.
func isLost(lease advisorylock.Lease) bool {
	select {
	case <-lease.Lost():
		return true
	default:
		return false
	}
}

// isTimeout reports whether err is a bounded acquire's timeout: it
// matches ErrTimeout and names the lock.
func isTimeout(err error, name string) bool {
	return errors.Is(err, advisorylock.ErrTimeout) && strings.Contains(err.Error(), strconv.Quote(name))
}

// isStale reports whether err is a Fence's refusal of token: it matches
// ErrStaleToken and names the resource, the token and the highest
// admitted.
func isStale(err error, resource string, token, highest advisorylock.FencingToken) bool {
	return errors.Is(err, advisorylock.ErrStaleToken) &&
		strings.Contains(err.Error(), fmt.Sprintf("resource %q refused token %d (highest admitted %d)", resource, token, highest))
}

// isLeaseLoss reports whether err is the loss of the lease name's grant
// token: it matches ErrLockLost and names the lease and the token.
func isLeaseLoss(err error, name string, token advisorylock.FencingToken) bool {
	return errors.Is(err, advisorylock.ErrLockLost) &&
		strings.Contains(err.Error(), fmt.Sprintf("lease %q (token %d)", name, token))
}

// staleHighest returns the highest admitted token a Fence's refusal
// names, and whether err is a refusal (matches ErrStaleToken) at all.
func staleHighest(err error) (advisorylock.FencingToken, bool) {
	if !errors.Is(err, advisorylock.ErrStaleToken) {
		return 0, false
	}
	m := highestAdmitted.FindStringSubmatch(err.Error())
	if m == nil {
		return 0, false
	}
	highest, perr := strconv.ParseUint(m[1], 10, 64)
	return advisorylock.FencingToken(highest), perr == nil
}

// highestAdmitted finds the highest admitted token in a refusal's message.
var highestAdmitted = regexp.MustCompile(`\(highest admitted (\d+)\)`)
