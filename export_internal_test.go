package advisorylock

import "fmt"

// Unexported values the external tests check against their documented
// definitions.
var SlotKey = slotKey

// StaleTokenErr is a Fence's refusal, for histories the tests build.
var StaleTokenErr = staleTokenErr

const (
	MaxSlots     = maxSlots
	LeaseWaitCap = leaseWaitCap // a lease waiter's longest pause between polls
)

// MuxQueued counts the ops waiting for the next statement on the shared
// sessions of l's handle (see muxSession.exec).
func MuxQueued(l *Lock) int {
	muxPools.mu.Lock()
	pools := make([]*muxPool, 0, len(muxPools.m))
	for _, mp := range muxPools.m {
		pools = append(pools, mp)
	}
	muxPools.mu.Unlock()
	n := 0
	for _, mp := range pools {
		if mp.key.db != l.db {
			continue
		}
		mp.mu.Lock()
		for _, s := range mp.sessions {
			n += len(s.queue)
		}
		mp.mu.Unlock()
	}
	return n
}

// GuardOrigin says where g's lock is held, for a violation's report: on
// which shared session (by identity) or on a pinned connection (with the
// server session that granted it).
func GuardOrigin(g *Guard) string {
	if g == nil {
		return "no guard"
	}
	switch h := g.h.end.(type) {
	case *muxHold:
		return fmt.Sprintf("shared session %p", h.s)
	case *sessionHold:
		return fmt.Sprintf("pinned, server session %d", h.session)
	}
	return fmt.Sprintf("%T", g.h.end)
}
