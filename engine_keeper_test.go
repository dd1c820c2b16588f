package advisorylock_test

// The keep-alive keeps checking for as long as the lock is held: a loss
// that comes after several checks passed is told as surely as one that
// comes before the first (engine_test.go's losses come at once).

import (
	"context"
	"testing"

	"github.com/advisorylock/advisorylock"
)

// awaitChecks waits until op has run n more times than it had when called.
func awaitChecks(t *testing.T, s *fakeServer, op string, n int) {
	t.Helper()
	s.mu.Lock()
	from := s.stmts[op]
	s.mu.Unlock()
	s.await(t, "more keep-alive checks", func() bool { return s.stmts[op] >= from+n })
}

func TestEngineKeepAliveChecksUntilTheRelease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind  string
		check string // the keep-alive's statement on the fake
		lock  func(t *testing.T, s *fakeServer, db advisorylock.DB) (*advisorylock.Lock, int64)
	}{
		{"pinned", "holds", func(t *testing.T, s *fakeServer, db advisorylock.DB) (*advisorylock.Lock, int64) {
			l := fakeLock(t, s, db, "h-mut-keeper")
			return l, advisorylock.Key(l.Name())
		}},
		{"set", "held keys", func(t *testing.T, s *fakeServer, db advisorylock.DB) (*advisorylock.Lock, int64) {
			set, err := advisorylock.NewSet(db, []string{"h-mut-a", "h-mut-b"}, fakeOptions(s)...)
			if err != nil {
				t.Fatal(err)
			}
			return set, advisorylock.Key("h-mut-b")
		}},
		{"multiplexed", "held keys", func(t *testing.T, s *fakeServer, db advisorylock.DB) (*advisorylock.Lock, int64) {
			l := fakeLock(t, s, db, "h-mut-keeper", advisorylock.WithMultiplexing(1))
			return l, advisorylock.Key(l.Name())
		}},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			s, db := openFake(t)
			l, key := tc.lock(t, s, db)
			g, err := l.TryLock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = g.Release(context.Background()) }()
			awaitChecks(t, s, tc.check, 3)
			select {
			case <-g.Lost():
				t.Fatal("a held lock was told lost")
			default:
			}
			s.free(key) // the session lives on, without the lock
			awaitLost(t, g)
		})
	}
}
