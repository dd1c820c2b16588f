package advisorylock

// Unexported values the external tests check against their documented
// definitions.
var SlotKey = slotKey

const (
	MaxSlots     = maxSlots
	LeaseWaitCap = leaseWaitCap // a lease waiter's longest pause between polls
)
