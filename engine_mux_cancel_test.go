package advisorylock_test

// A try on a shared session whose caller goes away while its statement
// runs: the statement is not cancelled (that would leave the session's
// state unknown and end it, and every neighbour's lock with it); the
// grant, if any, is let go again and the caller gets its context's error.

import (
	"context"
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/backend"
)

// goneMidTry is the fake backend whose tries see their caller go away
// while the statement runs: the cancel set in gone (once) ends the
// caller's context, and the statement then fails if its own context has
// ended, as a driver cancels a statement whose context ends.
type goneMidTry struct {
	fakeBackend
	gone *atomic.Pointer[context.CancelFunc]
}

func (b goneMidTry) midTry(ctx context.Context) error {
	if cancel := b.gone.Swap(nil); cancel != nil {
		(*cancel)()
	}
	return ctx.Err()
}

func (b goneMidTry) TryLockSession(ctx context.Context, conn *sql.Conn, key int64) (backend.SessionResult, error) {
	if err := b.midTry(ctx); err != nil {
		return backend.SessionResult{}, err
	}
	return b.fakeBackend.TryLockSession(ctx, conn, key)
}

func (b goneMidTry) TryLockAll(ctx context.Context, conn *sql.Conn, keys []int64) (backend.SessionResult, error) {
	if err := b.midTry(ctx); err != nil {
		return backend.SessionResult{}, err
	}
	return b.fakeBackend.TryLockAll(ctx, conn, keys)
}

func TestEngineMultiplexedTryWhoseCallerLeavesSparesItsNeighbours(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"lock", "set"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			s, db := openFake(t)
			b := goneMidTry{fakeBackend{s}, new(atomic.Pointer[context.CancelFunc])}
			opts := append(fakeOptions(s), advisorylock.WithBackend(b), advisorylock.WithMultiplexing(1))
			neighbour := newLock(t, db, "h-mut-neighbour", opts...)
			gn := mustTry(t, neighbour)
			defer mustRelease(t, gn)
			session := s.holder(advisorylock.Key(neighbour.Name()))

			l := newLock(t, db, "h-mut-leaver", opts...)
			keys := []int64{advisorylock.Key(l.Name())}
			if kind == "set" {
				set, err := advisorylock.NewSet(db, []string{"h-mut-a", "h-mut-b"}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				l, keys = set, []int64{advisorylock.Key("h-mut-a"), advisorylock.Key("h-mut-b")}
			}
			ctx, cancel := context.WithCancel(context.Background())
			b.gone.Store(&cancel)
			g, err := l.TryLock(ctx)
			if err == nil {
				_ = g.Release(context.Background())
				t.Fatal("a try whose caller left mid-statement returned a Guard")
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a try whose caller left mid-statement: %v; want context.Canceled", err)
			}
			select {
			case <-gn.Lost():
				t.Fatal("a neighbour on the shared session was lost when a try's caller left")
			default:
			}
			if h := s.holder(advisorylock.Key(neighbour.Name())); h != session {
				t.Fatalf("the neighbour's key is held by session %d; want its shared session %d", h, session)
			}
			for _, k := range keys {
				if h := s.holder(k); h != 0 {
					t.Fatalf("the left try's key %d is held by session %d", k, h)
				}
			}
		})
	}
}
