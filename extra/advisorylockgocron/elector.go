package advisorylockgocron

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/advisorylock/advisorylock"
	"github.com/go-co-op/gocron/v2"
)

// ErrNotLeader is what an Elector's IsLeader returns (wrapped) when this
// replica does not lead: gocron then skips the job here.
var ErrNotLeader = errors.New("advisorylockgocron: not the leader")

// Elector is a gocron.Elector that campaigns in an advisorylock.Election
// for as long as it runs: the replica that leads runs every job, the others
// skip them. It is safe for concurrent use.
//
// A goroutine that NewElector starts, and Close stops, runs the election's
// Run; the term it leads is kept in memory, so IsLeader does no I/O. A
// leader whose session is killed learns it at its next keep-alive check
// (see advisorylock.Election): until then it still says it leads, and a
// job may run on two replicas. Jobs that write where that matters pass
// Term's token to an advisorylock.Fence.
type Elector struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Run has returned
	err    error         // Run's error, written before done is closed
	term   atomic.Pointer[term]
}

// term is one leadership: its lead function's context, which ends when
// the term does, and its fencing token.
type term struct {
	ctx   context.Context
	token advisorylock.FencingToken
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning in e, for gocron.WithDistributedElector,
// and returns at once: this replica leads (IsLeader returns nil) once it
// wins, which on a fresh election takes a round trip or two. It campaigns
// until ctx ends or Close is called, and then resigns; each replica runs
// one Elector per election name. It fails only for a nil e.
func NewElector(ctx context.Context, e *advisorylock.Election) (*Elector, error) {
	if e == nil {
		return nil, errors.New("advisorylockgocron: nil election")
	}
	ctx, cancel := context.WithCancel(ctx)
	el := &Elector{cancel: cancel, done: make(chan struct{})}
	go el.run(ctx, e)
	return el, nil
}

// run is the Elector's goroutine: Run, whose lead function publishes its
// term until the term ends.
func (el *Elector) run(ctx context.Context, e *advisorylock.Election) {
	defer close(el.done)
	el.err = e.Run(ctx, func(ctx context.Context, token advisorylock.FencingToken) error {
		el.term.Store(&term{ctx: ctx, token: token})
		defer el.term.Store(nil)
		<-ctx.Done()
		return nil // a lost term: campaign again
	})
}

// IsLeader returns nil while this replica leads, and otherwise an error
// matching ErrNotLeader; after the campaign ended (Close, the context given
// to NewElector, or an error of the election's such as
// advisorylock.ErrUnsupported) the error wraps the reason too. It does no
// I/O; ctx is not used.
func (el *Elector) IsLeader(context.Context) error {
	if _, ok := el.Term(); ok {
		return nil
	}
	select {
	case <-el.done:
		return fmt.Errorf("%w: campaign ended: %w", ErrNotLeader, el.err)
	default:
		return ErrNotLeader
	}
}

// Term returns the fencing token of the term this replica leads, and
// true; or false when it does not lead. Pass the token to an
// advisorylock.Fence with a job's writes so that a replaced leader's
// writes are refused.
func (el *Elector) Term() (advisorylock.FencingToken, bool) {
	t := el.term.Load()
	if t == nil || t.ctx.Err() != nil {
		return 0, false
	}
	return t.token, true
}

// Close stops campaigning, resigns if this replica leads (another takes
// over within about a round trip on PostgreSQL and MySQL), and waits until
// that is done. It returns the error that ended the campaign, nil when it
// ended with a context (Close's own or NewElector's). Later calls return
// the same.
func (el *Elector) Close() error {
	el.cancel()
	<-el.done
	if errors.Is(el.err, context.Canceled) || errors.Is(el.err, context.DeadlineExceeded) {
		return nil
	}
	return el.err
}
