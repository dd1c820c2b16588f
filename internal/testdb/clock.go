package testdb

import (
	"sync"
	"time"
)

// FakeClock is a clock (advisorylock.Clock) that moves only when told: it
// drives lease expiry deterministically where lease times come from the
// application (SQLite) and the holder's local deadline everywhere. It is
// safe for concurrent use.
type FakeClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewFakeClock returns a FakeClock reading the current time, truncated to
// whole milliseconds (SQLite stores lease times as Unix milliseconds).
func NewFakeClock() *FakeClock {
	return &FakeClock{now: time.UnixMilli(time.Now().UnixMilli())}
}

// Now returns the clock's time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Add moves the clock by d.
func (c *FakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// SkewedClock is the system clock off by a fixed amount, as on a host
// whose wall clock is wrong. It keeps time.Now's monotonic reading.
type SkewedClock time.Duration

// Now returns time.Now() moved by the skew.
func (s SkewedClock) Now() time.Time { return time.Now().Add(time.Duration(s)) }

// FakeClockAt returns a FakeClock reading t.
func FakeClockAt(t time.Time) *FakeClock { return &FakeClock{now: t} }
