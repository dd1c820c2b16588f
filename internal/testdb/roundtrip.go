package testdb

import (
	"testing"
	"time"
)

// PgxPingAfter is how long a pgx stdlib connection may sit idle before
// database/sql's ResetSession makes pgx ping it on the next checkout: a
// round trip of the driver's, not ours. A measurement that waited longer
// than this between two steps is taken again (see MeasureOneRoundTrip).
const PgxPingAfter = time.Second

// Counted runs fn and returns the round trips it made through p.
func (p *Proxy) Counted(fn func() error) (int64, error) {
	p.ResetCount()
	err := fn()
	return p.RoundTrips(), err
}

// MeasureOneRoundTrip runs step, which returns the round trips it made,
// and asserts it made exactly one. If more than PgxPingAfter passed since
// the previous step ended (*last), the pool may have pinged the
// connection it checked out, and the step is measured again.
func MeasureOneRoundTrip(t testing.TB, name string, last *time.Time, step func() (int64, error)) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		trips, err := step()
		slow := time.Since(*last) >= PgxPingAfter
		*last = time.Now()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if trips == 1 {
			return
		}
		if !slow || attempt == 5 {
			t.Fatalf("%s made %d round trips, want 1", name, trips)
		}
		t.Logf("%s: %d round trips in a slow attempt; measuring again", name, trips)
	}
}
