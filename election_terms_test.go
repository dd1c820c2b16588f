package advisorylock_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/advisorylock/advisorylock"
	"github.com/advisorylock/advisorylock/internal/testdb"
)

// TestElectionTermExceedsEveryTokenIssuedBeforeIt: a term comes from the
// source lease tokens come from, so a new term is larger than every token
// issued before it, not only than the election's last term: a lease
// granted during the first term has a token between the first term and
// the second (PostgreSQL: the token sequence; MySQL: the database clock
// in microseconds).
func TestElectionTermExceedsEveryTokenIssuedBeforeIt(t *testing.T) {
	eachElectionDBInParallel(t, true, func(t *testing.T, edb electionDB) {
		db := edb.open(t)
		e := newElection(t, db, testdb.UniqueName(t), edb.opts...)
		lease := newLeaseLock(t, db, testdb.UniqueName(t), edb.opts...)
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		stop := errors.New("two terms led")
		var terms []advisorylock.FencingToken
		var leased advisorylock.FencingToken
		err := e.Run(ctx, func(ctx context.Context, term advisorylock.FencingToken) error {
			if terms = append(terms, term); len(terms) == 2 {
				return stop
			}
			g, err := lease.TryLock(ctx) // a token issued during the first term
			if err != nil {
				return err
			}
			leased = g.Lease().Token()
			return g.Release(ctx) // nil: Run resigns and leads again
		})
		if !errors.Is(err, stop) {
			t.Fatalf("Run = %v, want the lead's error after two terms", err)
		}
		if !(terms[0] < leased && leased < terms[1]) {
			t.Fatalf("first term %v, a lease's token %v granted during it, second term %v: want each larger than the one before", terms[0], leased, terms[1])
		}
	})
}

// TestElectionLeadReturningItsContextErrorAfterALossCampaignsAgain: a
// lead whose context ended because its session was killed, and that
// returns its context's error (as a lead that passes ctx to its work
// does), has lost its term: Run campaigns again and the candidate leads a
// new, larger term, instead of Run returning that error.
func TestElectionLeadReturningItsContextErrorAfterALossCampaignsAgain(t *testing.T) {
	eachElectionDBInParallel(t, true, func(t *testing.T, edb electionDB) {
		name := testdb.UniqueName(t)
		admin := edb.open(t)
		e := newElection(t, edb.open(t), name, append(slices.Clone(edb.opts), advisorylock.WithKeepAlive(100*time.Millisecond))...)
		watcher := newElection(t, admin, name, edb.opts...)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		terms := make(chan advisorylock.FencingToken, 10)
		causes := make(chan error, 10)
		done := make(chan error, 1)
		go func() {
			done <- e.Run(ctx, func(ctx context.Context, term advisorylock.FencingToken) error {
				terms <- term
				<-ctx.Done()
				causes <- context.Cause(ctx)
				return ctx.Err()
			})
		}()
		next := func() advisorylock.FencingToken {
			select {
			case tm := <-terms:
				return tm
			case err := <-done:
				t.Fatalf("Run returned %v while a term was awaited, want it campaigning", err)
			case <-time.After(wait):
				t.Fatal("no term within the wait")
			}
			return 0
		}
		first := next()
		var h *advisorylock.Holder
		testdb.WaitFor(t, wait, func() bool {
			var err error
			h, err = watcher.Leader(context.Background())
			return err == nil && h != nil && h.Token == first
		}, "Leader never named the first term")
		killSession(t, edb, admin, h)
		if cause := <-causes; !errors.Is(cause, advisorylock.ErrLockLost) {
			t.Fatalf("the lead's context ended with %v, want ErrLockLost", cause)
		}
		if second := next(); second <= first {
			t.Fatalf("term %v after term %v, want a larger one", second, first)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run after cancel = %v, want context.Canceled", err)
		}
	})
}
