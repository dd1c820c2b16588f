// Package renewal names the outcome of a lease renewal for the metric
// adapters (extra/advisorylockotel, extra/advisorylockprom) and the
// tests' recorder, so that all of them label it alike. An
// advisorylock.EventRenew carries no Outcome: its Err says how the
// renewal went.
package renewal

import (
	"errors"

	"github.com/advisorylock/advisorylock"
)

// The outcomes of a renewal, the values of the renewal metrics' "outcome"
// label (attribute).
const (
	// Renewed: the renewal extended the lease (Err nil).
	Renewed = "renewed"
	// Lost: the renewal found the lease no longer this holder's (Err
	// matches advisorylock.ErrLockLost); an EventLoss follows.
	Lost = "lost"
	// Error: the renewal's outcome is unknown (any other Err); the keeper
	// tries again sooner, until the lease's local deadline.
	Error = "error"
)

// Outcome returns the outcome of a renewal whose EventRenew carried err.
func Outcome(err error) string {
	switch {
	case err == nil:
		return Renewed
	case errors.Is(err, advisorylock.ErrLockLost):
		return Lost
	}
	return Error
}
