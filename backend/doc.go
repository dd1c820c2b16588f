// Package backend is the contract between the advisorylock package and a
// database dialect, as database/sql/driver is database/sql's. Users of the
// built-in backends (advisorylock.Postgres, MySQL, SQLite) need nothing
// from it; it is for writing another, which is given to the library with
// advisorylock.WithBackend.
//
// # Writing a backend
//
// A backend is a value that implements Backend (a Name, and its Traits:
// facts such as whether its driver ends statements with their context)
// and one or both of two interfaces:
//
//   - SessionLocker, for locks tied to a pinned connection's session:
//     try, wait for at most a slice, release, check, and read the holder
//     of a key. Each statement returns a SessionResult.
//   - LeaseStore, for locks and leases kept as rows: acquire, renew,
//     release and read the holder of the row a LeaseRequest names (its
//     Kind says which: a Lock's row, a shared holder's, a LeaseLock's); a
//     grant returns its fencing token. Schema returns the tables' DDL.
//
// Every method sends at most one statement (one round trip); the library
// owns connections, retries, keep-alives and the lease schedule. A Lock
// on a SessionLocker is a session lock; on a backend that is only a
// LeaseStore it is a renewed row. A LeaseLock needs a LeaseStore; a
// Semaphore's slots are locks of the same kind as a Lock's. An Election
// on a LeaseStore needs nothing more (its lease's token is the term).
//
// No required method may refuse its job. Everything else is an optional
// interface of its own, which the library looks for with a type
// assertion on the Backend it uses (what Configure returned, where the
// backend is a Configurer), and which says what the library does without
// it. An optional method may still return an error matching
// ErrUnsupported, before it sends anything, where the capability depends
// on the driver or the server: the library then takes the same fallback.
//
// # How the library uses each interface
//
// At the first operation on a handle: Recognizer (tell the database
// behind a wrapped driver; without it, not a candidate), Validator
// (refuse a handle that cannot be locked safely; without it, no check),
// Configurer (adjust to the driver and to a Lock's settings; without it,
// the Backend as it is, and WithDeadHolderTimeout changes nothing on the
// server), SessionIdentifier (the transaction-pooler probe; without it, no probe)
// and TableChecker (Check proves the tables and grants; without it,
// nothing to prove).
//
// Locks on a SessionLocker: SharedSessionLocker (RLock; without it, RLock
// fails with ErrUnsupported), WindowedSessionLocker (WithMinHold; without
// it, refused with ErrUnsupported), TxLocker (Lock.LockTx and TryLockTx;
// without it, refused with ErrUnsupported), TermKeeper (an Election's
// terms; without it, an Election fails with ErrUnsupported), and the
// interfaces of sessions that hold many keys: SlotLocker (a Semaphore's
// slots in one statement; without it, one statement per slot), SetLocker
// (a set's keys in one statement; without it, one per key),
// MultiplexLocker (WithMultiplexing, and a set's keep-alive in one
// statement; without it, WithMultiplexing fails with ErrUnsupported) and
// ReleaseSignaler (a Semaphore's slot release that wakes its waiters;
// without it, they poll).
//
// Rows on a LeaseStore: Traits.KeepsWindows (WithMinHold; without it,
// refused), SharedRowStore (RLock on a Lock kept as rows; without it,
// refused), RunRecorder (Lock.TryDoOnce; without it, refused),
// TokenAdmitter (a Fence; without it, Fence.Admit is refused),
// ReleaseListener (a LeaseLock waiter woken by the release it waits for;
// without it, waiters poll), LeaseQueuer (a waiter's place in line, which
// the holder's release hands the lease to; without it, waiters race for
// the row) and LeaseSleeper (a waiter in line that sleeps on the server
// where releases are not heard; without it, it polls). A Notifier is a
// handle, not a backend: one that delivers notifications on a connection
// of its own, which a ReleaseListener listens through.
//
// # Errors and tokens
//
// A backend speaks ErrNotAcquired (a row held elsewhere), ErrLeaseLost (a
// renewal by someone who no longer holds the lease) and ErrUnsupported
// (a refusal). The advisorylock package's ErrNotAcquired and
// ErrUnsupported are the same values; ErrLeaseLost it reports to users as
// the lease's loss, matching advisorylock.ErrLockLost.
// Other errors are the driver's, returned as they are. Tokens are
// uint64 values of at least 1 that strictly increase per name, stored as
// a BIGINT; the library hands them to users as advisorylock.FencingToken,
// and a Holder as an advisorylock.Holder.
//
// The advisorylock package's own tests run a backend of a third party's
// making through every interface (plugin_test.go), and an in-memory
// LeaseStore (extra/advisorylocktest's Memory) is one to read.
package backend
