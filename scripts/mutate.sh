#!/usr/bin/env bash
# mutate.sh applies each mutation of the library to a scratch copy of the
# tree, runs the tests it names (its targets), and reports which test caught
# it. Only when its targets miss it does it run the whole suite of the
# module (go test ./...): a mutation caught there is a FINDING (its targets
# should have caught it; the line names the test that did), one that passes
# the whole suite is MISSED. It is for a reviewer (TESTING.md maps each to
# its promise and test; scripts/mutate-results.txt holds the last run); CI
# runs the ordinary suite only. A mutation whose anchor no longer matches
# the code fails the run loudly: rewrite it for the code as it is now.
#
# Two paths decide, and each line says which. The fast one (schema):
# scripts/schemata compiles every mutation that changes only function
# bodies and values of top-level constants and variables (SQL text) into
# one copy of the tree, switched by ADVISORYLOCK_MUTANT (a mutated
# constant, and each constant of its file built from it, becomes a
# variable there; one needed as a constant fails schemata's build and
# goes classic, said in -n), so each package's test binary (each
# module's under extra/) is built once and a mutation is one run of it:
# its targets under -short first, then all of them. A run first checks
# that, with no mutant, that tree passes the targets (under -short; every
# one with MUTATE_SANITY=full), and stops if not. The classic one
# (build): the mutation applied to a tree of its own and go test built
# for it, as before. A mutation that changes anything else (a file that
# is not Go, a signature, a type, a name) and one the fast path's targets
# do not catch take the classic path, so FINDING and MISSED are decided
# there alone. The run starts by counting the schema-able mutations; -n
# says for each which path it takes and why.
#
#   scripts/mutate.sh               # every mutation
#   scripts/mutate.sh 'slice|55P03' # those whose name matches a regexp
#   scripts/mutate.sh -l            # list them
#   scripts/mutate.sh -n [regexp]   # only check that each still applies
#   MUTATE_FROM=45 scripts/mutate.sh # resume: skip the first 44 (as -l numbers them)
#   MUTATE_SHORT=1 scripts/mutate.sh # which mutations the fast tier (go test -short) catches
#   MUTATE_JOBS=1 scripts/mutate.sh  # one at a time [3 side by side]
#   MUTATE_SCHEMATA=0 scripts/mutate.sh # every mutation by the classic path
#   MUTATE_SHORT_FIRST=0 scripts/mutate.sh # the fast path runs all targets at once
#
# With MUTATE_SHORT=1 every run has -short: a mutation the whole fast tier
# catches but its targets do not (they may be slow tests, skipped) is
# CAUGHT BY TIER, not a finding; one the fast tier misses altogether is
# SLOW TIER ONLY, which is not a failure of the run.
#
# Needs what the test suite needs (PostgreSQL on 127.0.0.1:5432). Extra
# build flags for go test in MUTATE_GOFLAGS (say, -race); the fast path
# builds its binaries with them too. Exits non-zero if a
# mutation was missed or did not apply.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export ADVISORYLOCK_REQUIRE_DB=1

names=() files=() edits=() tests=() pkgs=()
# mutation NAME FILE PERL-EDIT TEST-REGEXP [PACKAGE]
# PERL-EDIT runs as perl -0pi -e (the whole file is one string), so anchor
# it on a distinctive line; it must change the file. PACKAGE may be a
# module under extra/ (a folder with its own go.mod): its tests run there;
# or several packages of the root module, space-separated, when the tests
# that catch it are in more than one (a backend's package and the root).
mutation() {
	names+=("$1") files+=("$2") edits+=("$3") tests+=("$4") pkgs+=("${5:-.}")
}

# --- The engine against a fake backend (engine_test.go: no database) ------------
mutation "a release recycles a lost lock's connection" conn_guard.go \
	's/if gone, why := s\.isLost\(\); gone \{/if gone, why := s.isLost(); gone \&\& false {/' \
	'^(TestEngineReleaseOfALostLockDiscardsItsConnection|TestEngineLossIsToldToLostDoAndTheObserver)$'
mutation "a loss does not close Lost" advisorylock.go \
	's/(h\.isGone = true\n)\tif h\.lostCh != nil \{\n\t\tclose\(h\.lostCh\)\n\t\}\n/$1/' \
	'^TestEngineReleaseOfALostLockDiscardsItsConnection$'
mutation "a loss does not cancel Do's context" advisorylock.go \
	's/\tif f != nil \{\n\t\tf\(err\)\n\t\}\n/\t_ = f\n/' \
	'^TestEngineLossIsToldToLostDoAndTheObserver$'
mutation "a loss is not told to the Observer" advisorylock.go \
	's/if cause != "" \{/if cause == "never" {/' \
	'^TestEngineLossIsToldToLostDoAndTheObserver$'
mutation "a try keeps its connection after a definite miss" advisorylock.go \
	's/if !wait \{\n\t\t\tcg\.recycle\(\)\n\t\t\treturn nil, ErrNotAcquired/if !wait {\n\t\t\tcg.take()\n\t\t\treturn nil, ErrNotAcquired/' \
	'^TestEngineTryMissReturnsTheConnectionToThePool$'
mutation "a grant that arrives after its caller cancelled is kept" advisorylock.go \
	's/if ctx\.Err\(\) != nil \{\n(\t+)\/\/ Cancelled as it was granted/if ctx.Err() != nil \&\& false {\n$1\/\/ Cancelled as it was granted/' \
	'^TestEngineCancelledAsTheGrantArrivesDiscardsTheGrant$'
mutation "a cancelled acquire recycles its connection" conn_guard.go \
	's/if g\.ctx\.Err\(\) != nil \{\n(\t+)g\.p\.discard\(CauseCanceled, context\.Cause\(g\.ctx\)\)/if g.ctx.Err() != nil {\n$1dbutil.Recycle(g.p.conn)/' \
	'^(TestEngineCancelledAsTheGrantArrivesDiscardsTheGrant|TestEngineCancelledWaitLeavesNoHold)$'
mutation "a clean release discards the connection" conn_guard.go \
	's/(key", s\.key\)\n\t\}\n\t)dbutil\.Recycle\(s\.p\.conn\)/$1s.p.discard(CauseError, nil)/' \
	'^TestEngineTryLockTakesAFreeLockAndReleaseRecyclesIt$'
mutation "a set's release lets go of its first name only" conn_guard.go \
	's/unlockKeys\(ctx, s\.locker, &s\.p, s\.keys, /unlockKeys(ctx, s.locker, \&s.p, s.keys[:1], /' \
	'^TestEngineSetTakesAllOrNone$'
mutation "Do keeps the lock after its function returns" advisorylock.go \
	's/relErr := g\.Release\(ctx\)/relErr := error(nil)/' \
	'^TestEngineDoHoldsTheLockForItsFunctionAlone$'
mutation "TryDo's miss is an error" advisorylock.go \
	's/if errors\.Is\(err, ErrNotAcquired\) \{\n\t\treturn false, nil/if errors.Is(err, ErrNotAcquired) \&\& false {\n\t\treturn false, nil/' \
	'^TestEngineDoHoldsTheLockForItsFunctionAlone$'
mutation "a semaphore guard reports slot 0" advisorylock.go \
	's/\tg\.slot = slot\n/\tg.slot = 0 * slot\n/' \
	'^TestEngineSemaphoreGivesEachSlotOnceAndAWaiterTheFreedOne$'
mutation "a failed unlock recycles the connection" conn_guard.go \
	's/case err != nil:\n\t\ts\.p\.discard\(CauseError, err\)\n\t\treturn err/case err != nil:\n\t\tdbutil.Recycle(s.p.conn)\n\t\treturn err/' \
	'^TestEngineFailedStatementsDiscardTheConnection$'
mutation "a release recycles the connection without unlocking (the lock rides to the pool)" conn_guard.go \
	's/return unlockHeld\(ctx, s\.locker, conn, s\.l\)/return backend.SessionResult{Session: s.session, OK: true}, nil/' \
	'^TestEngineTryLockTakesAFreeLockAndReleaseRecyclesIt$'
mutation "a keep-alive stops after its first check" conn_guard.go \
	's/if err == nil && held \{\n\t\ts\.timer\.Reset\(s\.l\.cfg\.keepAlive\)\n/if err == nil \&\& held {\n/' \
	'^TestEngineKeepAliveChecksUntilTheRelease$'
mutation "a shared session's keep-alive stops after its first check" multiplex.go \
	's/\tcase s\.timer != nil: (\/\/ nil without a keep-alive.*\n)\t\ts\.timer\.Reset\(mp\.key\.keepAlive\)/\tcase s.timer != nil: $1\t\t_ = mp/' \
	'^TestEngineKeepAliveChecksUntilTheRelease$'

# --- Multiplexed sessions and sets -------------------------------------------
mutation "a Lock with WithMinHold takes the plain claim, recording no window" advisorylock.go \
	's/\tcase w != nil:\n\t\treturn windowClaim\{l, w\}/\tcase w != nil \&\& false:\n\t\treturn windowClaim{l, w}/' \
	'^(TestMinHoldLockWaitsForTheWindow|TestMinHoldTryLockAndReleaseAreOneRoundTripEach)$'
mutation "a set takes the claim of its first key alone" advisorylock.go \
	's/\tcase l\.set != nil:\n\t\treturn setClaim\{l, s\}/\tcase l.set != nil \&\& false:\n\t\treturn setClaim{l, s}/' \
	'^TestSetTakesAllOrNone$'
mutation "a caller's context can cancel a statement on a shared session" multiplex.go \
	's/sctx, cancel := context\.WithTimeout\(context\.WithoutCancel\(o\.ctx\), mp\.key\.timeout\)/sctx, cancel := context.WithTimeout(o.ctx, mp.key.timeout)/' \
	'^(TestMultiplexingCancelledTriesSpareTheirNeighbours|TestEngineMultiplexedTryWhoseCallerLeavesSparesItsNeighbours)$'
mutation "a name held in the process is tried again on its shared session" multiplex.go \
	's/if _, ok := mp\.held\[k\]; ok \{/if _, ok := mp.held[k]; ok \&\& false {/' \
	'^(TestMultiplexingExcludesInProcessAndHandsOff|TestMultiplexedAndSetRowsUnderFaults|TestMultiplexedSessionKilledUnderContention)$'
mutation "a shared session that ends tells none of its locks" multiplex.go \
	's/for _, h := range holds \{\n\t\th\.lose\(cause, err\)\n\t\}/_ = holds/' \
	'^(TestMultiplexingSessionKilledLosesOnlyItsLocks|TestMultiplexedUnlockWithoutAnAnswerTellsTheNeighbours|TestMultiplexedSessionKilledUnderContention|TestMultiplexedAndSetRowsUnderFaults|TestEngineMultiplexedSessionLostLosesOnlyItsLocks)$'
mutation "a forgotten guard on a shared session discards the session" multiplex.go \
	's/go func\(\) \{ _ = h\.release\(context\.Background\(\), h\.relTO\) \}\(\)/go func() { h.s.mu.Lock(); h.s.end(CauseSessionEnded, ErrLockLost); h.s.mu.Unlock() }()/' \
	'^TestForgottenMultiplexedGuardIsCleanedUp$'
mutation "a set's try keeps the names it got when one is held" internal/postgresbackend/postgres.go \
	's/WHERE t\.ok AND NOT a\.ok\)/WHERE t.ok AND NOT a.ok AND false)/' \
	'^TestSetTakesAllOrNone$'
# Under load and faults (mux_fault_test.go, soak_mux_test.go):
mutation "a shared session's keep-alive is never started" multiplex.go \
	's/if s\.timer == nil && mp\.key\.keepAlive > 0 \{/if s.timer == nil \&\& mp.key.keepAlive > 0 \&\& false {/' \
	'^TestMultiplexedSessionKilledUnderContention$'
mutation "a missing key loses every lock on the shared session" multiplex.go \
	's/if h := s\.holds\[k\]; !held\[i\] && h != nil \{/if h := s.holds[k]; h != nil \&\& (!held[i] || slices.Contains(held, false)) {/' \
	'^(TestMultiplexedKeepAliveLosesOnlyTheMissingKeys|TestEngineMultiplexedSessionLostLosesOnlyItsLocks)$'
mutation "a lost set's other keys stay held on the shared session" multiplex.go \
	's/if len\(rest\) > 0 \{/if false \&\& len(rest) > 0 {/' \
	'^TestMultiplexedKeepAliveLosesOnlyTheMissingKeys$'
mutation "shared sessions may take every connection of a limited pool" multiplex.go \
	's/size := mp\.size\(\)/size := mp.key.size/' \
	'^TestMultiplexingLeavesThePoolAConnection$'
mutation "a set waits for its names in the given order, not key order" set.go \
	's/return cmp\.Compare\(a\.key, b\.key\)/return 0 * cmp.Compare(a.key, b.key)/' \
	'^TestMultiplexedAndSetRowsUnderFaults$'
# One name of a set lost alone; another session's lock; names reserved in
# the process; holders told before the names are freed (set_test.go,
# mux_fault_test.go, multiplex_test.go):
mutation "a pinned set's keep-alive checks its first name only" conn_guard.go \
	's/held, err := heldOn\(ctx, s\.locker, &s\.p, s\.keys\)/held, err := heldOn(ctx, s.locker, \&s.p, s.keys[:1])/' \
	'^(TestSetLosesOneNameAlone|TestEngineSetTakesAllOrNone)$'
mutation "a set is held while any one of its names is" set.go \
	's/len\(held\) == len\(keys\) && !slices\.Contains\(held, false\), err/len(held) == len(keys) \&\& slices.Contains(held, true), err/' \
	'^TestSetLosesOneNameAlone$'
mutation "a lost pinned set's connection goes back to the pool with its other names" conn_guard.go \
	's/if gone, why := s\.isLost\(\); gone \{\n\t\ts\.p\.discard\(s\.discardCause\(\), why\)/if gone, _ := s.isLost(); gone {\n\t\tdbutil.Recycle(s.p.conn)/' \
	'^(TestSetLosesOneNameAlone|TestEngineSetTakesAllOrNone|TestEngineReleaseOfALostLockDiscardsItsConnection|TestEngineLossIsToldToLostDoAndTheObserver)$'
mutation "a set of rows is lost only with its first name" set.go \
	's/for _, p := range parts \{\n\t\tp\.onLost\(/for _, p := range parts[:1] {\n\t\tp.onLost(/' \
	'^TestSetLosesOneNameAlone$'
mutation "a set of rows' loss is not told to the Observer" set.go \
	's/sh\.lose\(cause, err\)/sh.lose(cause[:0], err)/' \
	'^TestSetLosesOneNameAlone$'
mutation "a set's Holder names its first name" advisorylock.go \
	's/(h != nil \|\| err != nil \{\n)(\t+)return h, wrapErr\(l\.name, "holder", err\)/$1$2if h != nil \&\& l.set != nil { h.Name = l.setNames[0] }\n$2return h, wrapErr(l.name, "holder", err)/' \
	'^TestSetTakesAllOrNone$'
mutation "MySQL: a set's or shared session's keep-alive takes a freed name (NULL) for held" internal/mysqlbackend/mysql.go \
	's/IFNULL\(IS_USED_LOCK\(%s\) = CONNECTION_ID\(\), 0\)/IFNULL(IS_USED_LOCK(%s) = CONNECTION_ID(), 1)/' \
	'^(TestSetLosesOneNameAlone|TestMultiplexedKeepAliveLosesOnlyTheMissingKeys)$'
mutation "MySQL: a set's or shared session's keep-alive takes another connection's lock for its own" internal/mysqlbackend/mysql.go \
	's/IFNULL\(IS_USED_LOCK\(%s\) = CONNECTION_ID\(\), 0\)/IFNULL(IS_USED_LOCK(%s) IS NOT NULL, 0)/' \
	'^(TestSetLosesOneNameAlone|TestMultiplexedKeepAliveLosesOnlyTheMissingKeys)$'
mutation "PostgreSQL: a set's or shared session's keep-alive takes another session's lock for its own" internal/postgresbackend/postgres.go \
	's/l\.objsubid = 1 AND l\.pid = pg_backend_pid\(\) AND l\.mode = \x27ExclusiveLock\x27/l.objsubid = 1 AND l.mode = \x27ExclusiveLock\x27/' \
	'^(TestSetLosesOneNameAlone|TestMultiplexedKeepAliveLosesOnlyTheMissingKeys)$'
mutation "SQLite: a Lock's renewal extends another owner's row" internal/sqlitebackend/sqlite.go \
	's/(sqliteRenewLock   = `UPDATE advisorylock_locks SET expires_at = \?3 WHERE key = \?1 AND )owner = \?2/$1?2 = ?2/' \
	'^TestSetLosesOneNameAlone$'
mutation "an ended shared session leaves its names reserved in the process" multiplex.go \
	's/\t\tdelete\(mp\.held, k\)\n\t\}\n\tclear\(s\.holds\)/\t}\n\tclear(s.holds)/' \
	'^(TestMultiplexingSessionKilledLosesOnlyItsLocks|TestSharedSessionTellsItsHoldsBeforeARivalGetsTheirNames)$'
mutation "a lock its shared session's keep-alive lost stays reserved in the process" multiplex.go \
	's/\t\t\t\tdelete\(s\.holds, hk\)\n\t\t\t\tdelete\(mp\.held, hk\)\n/\t\t\t\tdelete(s.holds, hk)\n/' \
	'^TestMultiplexedKeepAliveLosesOnlyTheMissingKeys$'
mutation "an ended shared session frees its names before it tells its locks" multiplex.go \
	's/(\tfor _, h := range holds \{\n\t\th\.lose\(cause, err\)\n\t\}\n)(\ts\.p\.discard\(cause, err\)\n)/$2$1/' \
	'^TestSharedSessionTellsItsHoldsBeforeARivalGetsTheirNames$'
mutation "a multiplexed wait fails when no connection comes for a shared session" advisorylock.go \
	's/if !wait \|\| !errors\.Is\(err, ErrNotAcquired\) && !errors\.Is\(err, ErrPoolUnavailable\) \{/if !wait || !errors.Is(err, ErrNotAcquired) {/' \
	'^TestEngineCheckoutEndsWithItsContextOrThePoolWait$'
mutation "a batch refused for a full lock table ends its session" multiplex.go \
	's/(recovered := false\n\tif )err != nil && dbutil\.SQLState\(err\) == pgOutOfSharedMemory/$1false/' \
	'^TestEngineMultiplexedBatchOnAFullLockTableKeepsTheSession$'
mutation "a shared session runs each queued op alone" multiplex.go \
	's/ok && len\(live\) > 1 \{/false && ok && len(live) > 1 {/' \
	'^TestEngineMultiplexedOpsShareTheNextStatement$'
mutation "a batch unlocks with the try function (PostgreSQL)" internal/postgresbackend/batch.go \
	's/"pg_try_advisory_lock", "pg_advisory_unlock"\)/"pg_try_advisory_lock", "pg_try_advisory_lock")/' \
	'^TestPostgresBatchTriesAndUnlocksInOneStatement$' ./internal/postgresbackend
mutation "a MySQL batch keeps a grant made while shared holders are in" internal/mysqlbackend/batch.go \
	's/\t\tif c == .2. \{\n\t\t\tif err := m\.EndWait/\t\tif c == 0 {\n\t\t\tif err := m.EndWait/' \
	'^TestMySQLBatchTriesAndUnlocksInOneStatement$' ./internal/mysqlbackend
mutation "a MySQL batch runs before the session's wait_timeout is set" internal/mysqlbackend/batch.go \
	's/if m\.shared \|\| !dbutil\.SessionKnows\(conn, m\.triedSession\(\)\)/if m.shared/' \
	'^TestMySQLBatchTriesAndUnlocksInOneStatement$' ./internal/mysqlbackend
mutation "a lost set's other names are let go before it is told" multiplex.go \
	's/(\tfor _, h := range gone \{\n.*?\n\t\}\n)(\tif len\(rest\) > 0 \{\n.*?\n\t\}\n)/$2$1/s' \
	'^TestSharedSessionTellsItsHoldsBeforeARivalGetsTheirNames$'
mutation "the default does not multiplex" options.go \
	's/\t\tc\.multiplex = defaultMultiplex\n/\t\tc.multiplex = 0 * defaultMultiplex\n/' \
	'^(TestMultiplexingIsTheDefault|TestKindsThatCannotShareStayPinnedByDefault)$'
mutation "WithConn on a shared session does not run the keep-alive check after fn" multiplex.go \
	's/\ts\.checkLocked\(\)\n\treturn nil\n/\treturn nil\n/' \
	'^(TestWithConnOnASharedSessionTellsTheLocksFnFreed|TestEngineWithConnOnASharedSessionTellsWhatFnDid)$'

# A slot's lock left on a recycled connection rides to the next holder.
mutation "MySQL: a slot's release unlocks another key and recycles the slot's connection" semaphore.go \
	's/return locker\.UnlockSession\(ctx, conn, l\.key\)/return locker.UnlockSession(ctx, conn, Key(l.name))/' \
	'^TestSemaphoreReleaseLeavesNoSlotOnTheConnection$'
mutation "PostgreSQL: a slot's release unlocks another key and recycles the slot's connection" internal/postgresbackend/semaphore.go \
	's/q, args, err := p\.statement\(pgUnlockAndSignal, key, /q, args, err := p.statement(pgUnlockAndSignal, signal, /' \
	'^TestSemaphoreReleaseLeavesNoSlotOnTheConnection$'
mutation "MySQL: a release recycles a session still holding the lock (taken twice)" internal/mysqlbackend/mysql.go \
	's/\tcase holder\.Valid && holder\.Int64 == r\.Session:/\tcase false \&\& holder.Valid \&\& holder.Int64 == r.Session:/' \
	'^TestMySQLReleaseOfALockTakenTwiceFreesIt$'

# --- Handoffs that do not poll ------------------------------------------------
mutation "a LeaseLock waiter is never woken by a release" lease_wake.go \
	's/case lw\.wake <- struct\{\}\{\}:/case <-make(chan struct{}):/' \
	'^(TestLeaseWaiterWakesOnRelease|TestLeaseWaiterSurvivesAKilledListener)$'
mutation "a lease acquire starts the release listener before it misses" lease_wake.go \
	's/(\t\tw\.linger = nil\n\t\}\n)(\treturn lw\n)/$1\tif !w.running {\n\t\tw.running = true\n\t\tgo w.run()\n\t}\n$2/' \
	'^TestLeaseLockThatNeedsNoWaitOpensNoListener$'
mutation "a lease waiter never starts the release listener" lease_wake.go \
	's/\tif !w\.running && !w\.off \{/\tif false \&\& !w.running \&\& !w.off {/' \
	'^TestLeaseWaiterWakesOnRelease$'
mutation "a Notifier's notifications are not listened to (lib/pq waiters poll)" internal/postgresbackend/postgres.go \
	's/\tif own \{\n\t\treturn n\.Listen\(ctx, pgReleaseChannel, ready, heard\)/\tif own {\n\t\t_ = n\n\t\treturn backend.ErrUnsupported/' \
	'^(TestWaiterWakesOnRelease|TestWaiterWakesAfterItsListenerWasKilled|TestSemaphoreWaiterWakesOnRelease)$' extra/advisorylockpq
mutation "a Notifier's listener takes a connection of the pool" lease_wake.go \
	's/if _, ok := w\.db\.\(backend\.Notifier\); !ok \{/if _, ok := w.db.(backend.Notifier); !ok || true {/' \
	'^TestListenerTakesNoPoolConnection$' extra/advisorylockpq
mutation "a semaphore slot's release notifies nobody" internal/postgresbackend/semaphore.go \
	"s/pg_notify\('\\\` \\+ pgReleaseChannel \\+ \\\`', \\\$2::text\)/pg_notify('nobody', \\\$2::text)/" \
	'^(TestSemaphoreWaiterWakesOnRelease|TestSemaphoreWaiterSurvivesAKilledListener)$'
mutation "a semaphore's slot is released without its signal" semaphore.go \
	's/ok && l\.kind == kindSemaphore \{/ok \&\& l.kind == "none" {/' \
	'^(TestSemaphoreWaiterWakesOnRelease|TestAThirdPartysBackendGetsEveryCapability)$'
mutation "a semaphore's waiter ignores the releases it hears" semaphore.go \
	's/\t\tcase <-lw\.wake:/\t\tcase <-make(chan struct{}):/' \
	'^(TestSemaphoreWaiterWakesOnRelease|TestSemaphoreWaiterSurvivesAKilledListener)$'
mutation "a semaphore's waiter that cannot hear never goes back to slices" semaphore.go \
	's/\t\tif lw\.w\.isOff\(\) \{/\t\tif false \&\& lw.w.isOff() {/' \
	'^TestSemaphoreWaiterWithoutNotificationsWaitsInSlices$'

# --- Locks (session advisory locks on PostgreSQL) ---------------------------
mutation "keep-alive never reports a loss" conn_guard.go \
	's/if err == nil && held \{/if _ = held; true {/' \
	'^(TestSoak|TestKilledSessionsUnderLoad|TestNetworkCutsUnderLoad|TestKilledSessionClosesLostAndCancelsDo|TestEngineLossIsToldToLostDoAndTheObserver)$'
mutation "55P03: a timed-out slice is a miss without asking the session" internal/postgresbackend/postgres.go \
	's/(== "55P03".*\{\n\t\treturn )p\.holds\(ctx, conn, key\)/$1backend.SessionResult{}, nil/' \
	'^TestLockTimeoutRacingAGrantIsAGrantOnARealServer$'
mutation "a discarded connection goes back to the pool" internal/dbutil/session.go \
	's/CloseSession\(dc\)\n\t\treturn driver\.ErrBadConn/CloseSession(dc)\n\t\t_ = driver.ErrBadConn\n\t\treturn nil/' \
	'^(TestCancelledWaitLeavesNoLock|TestCancelHammerLeavesNothingBehind|TestForgottenGuardIsCleanedUp|TestUnlockErrorDiscardsTheConnection|TestEngineFailedStatementsDiscardTheConnection|TestEngineForgottenGuardIsDiscarded)$'
mutation "statements on a pinned lib/pq connection wait out a dead network" conn_guard.go \
	's/case !p\.bounded:\n\t\treturn stmt\(driverCtx, p\.conn\)/case true:\n\t\treturn stmt(driverCtx, p.conn)/' \
	'^TestNetworkCutLosesLocksBeforeExpiry$'
mutation "an unanswered lib/pq statement is left reading and keeps its pool slot" conn_guard.go \
	's/p\.sever = interruptible\(conn\)/p.sever = nil/' \
	'^TestReleaseDuringACutGivesBackItsPoolSlot$'
mutation "the watchdog never closes the connection under a statement" conn_guard.go \
	's/c\.made = true\n(\t+)c\.p\.sever\(\)/c.made = true/' \
	'^(TestReleaseDuringACutGivesBackItsPoolSlot|TestNetworkCutLosesLocksBeforeExpiry)$'
mutation "what a cut statement returns is taken for its answer" conn_guard.go \
	's/if !wasCut \{/if _ = wasCut; true {/' \
	'^(TestReleaseDuringACutGivesBackItsPoolSlot|TestObserverSeesANetworkCut)$'
mutation "a checked session's facts carry over to every session" internal/dbutil/session.go \
	's/sessionFact\{w, fact\}/sessionFact{func() weak.Pointer[byte] { _ = w; return weak.Pointer[byte]{} }(), fact}/g' \
	'^TestRememberedSessionTriesWithoutItsChecks$'
mutation "WithConn's statements leave the session's facts standing" lent_conn.go \
	's/\n\tdbutil\.ForgetSession\(s\.p\.conn\)\n/\n/' \
	'^TestRememberedSessionTriesWithoutItsChecks$'
mutation "WithConn on a shared session leaves the session's facts standing" multiplex.go \
	's/\n\tdbutil\.ForgetSession\(s\.p\.conn\) \/\/ fn may have changed its settings\n/\n/' \
	'^TestRememberedSessionTriesWithoutItsChecks$'
mutation "TryDoOnce's record read waits for the pool as long as the caller" once.go \
	's/rec\.RunDone\(dbutil\.WithPoolWait\(ctx, l\.cfg\.poolWait\), /rec.RunDone(ctx, /' \
	'^TestTryDoOnceBurstOnASmallPoolDoesNotHang$'
mutation "a discarded pgxpool connection goes back to the pgxpool with its lock" internal/dbutil/session.go \
	's/\t\tCloseSession\(dc\)\n/\t\t_ = dc\n/' \
	'^TestDiscardedLockOnAPgxpoolIsFreed$'
mutation "a miss asks why by reading the server's lock table" internal/postgresbackend/postgres.go \
	"s/coalesce\(current_setting\('advisorylock\.granted', true\) = 'yes', false\)/EXISTS (SELECT FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory')/" \
	'^TestMissedTryReadsNoLockTable$'
mutation "a miss leaves the last grant's note standing" internal/postgresbackend/postgres.go \
	"s/THEN set_config\('advisorylock\.granted', '', false\) IS NULL/THEN false/" \
	'^TestMissedTryReadsNoLockTable$'
mutation "a session whose try missed is checked again at every try" internal/postgresbackend/postgres.go \
	's/\t\treturn backend\.SessionResult\{\}, errStandby\n\t\}\n\tdbutil\.RememberSession\(conn, fact\)\n/\t\treturn backend.SessionResult{}, errStandby\n\t}\n\tif granted {\n\t\tdbutil.RememberSession(conn, fact)\n\t}\n/' \
	'^TestMissedTryReadsNoLockTable$'
mutation "a semaphore's try skips a new session's checks" internal/postgresbackend/semaphore.go \
	's/checks := !dbutil\.SessionKnows\(conn, fact\)/checks := !dbutil.SessionKnows(conn, fact) && len(keys) == 0/' \
	'^TestRememberedSessionTriesSemaphoreSlotsWithoutItsChecks$'
mutation "a semaphore's try forgets a checked session" internal/postgresbackend/semaphore.go \
	's/dbutil\.RememberSession\(conn, fact\)/_ = fact/' \
	'^TestRememberedSessionTriesSemaphoreSlotsWithoutItsChecks$'
mutation "8 s wait slices" advisorylock.go \
	's/const maxSlice = time\.Second/const maxSlice = 8 * time.Second/' \
	'^TestWaiterDoesNotStallCreateIndexConcurrently$'
mutation "10 s wait slices that overrun the LockTimeout budget" advisorylock.go \
	's/slice, grace = min\(slice, time\.Until\(dl\)\), budgetGrace/slice, grace = max(slice, 10*time.Second+0*time.Until(dl)), budgetGrace/' \
	'^(TestLockTimeoutReturnsTimeoutErrorAndKeepsTheConnection|TestEngineLockTimeoutReturnsATimeoutError)$'

# Look-alikes and clusters whose locks exclude nothing, told by the server.
mutation "YugabyteDB is taken for PostgreSQL" internal/postgresbackend/postgres.go \
	's/case strings\.Contains\(version, "-YB-"\):/case strings.Contains(version, "-YB-") \&\& false:/' \
	'^TestPostgreSQLLookAlikesAreRefused$'
mutation "TiDB is taken for MySQL" internal/mysqlbackend/mysql.go \
	's/case strings\.Contains\(v, "tidb"\):/case strings.Contains(v, "tidb") \&\& false:/' \
	'^(TestMySQLServersAreCheckedByWhatTheyReport|TestMySQLRefusesGaleraAndTellsReleaseAnswersApart)$' \
	'. ./internal/mysqlbackend'
mutation "Vitess is told by its version alone" internal/mysqlbackend/mysql.go \
	's/strings\.Contains\(c, "vitess"\):/strings.Contains(c, "vitess") \&\& false:/' \
	'^TestMySQLServersAreCheckedByWhatTheyReport$' \
	'./internal/mysqlbackend'
mutation "a multi-primary Group Replication member is taken for one server" internal/mysqlbackend/mysql.go \
	's/if strings\.EqualFold\(s\.vars\["group_replication_single_primary_mode"\], "OFF"\) \{/if false {/' \
	'^(TestMySQLServersAreCheckedByWhatTheyReport|TestMySQLRefusesGaleraAndTellsReleaseAnswersApart)$' \
	'. ./internal/mysqlbackend'
mutation "Validate asks a look-alike for variables it may not have" internal/mysqlbackend/mysql.go \
	's/return nil \/\/ told by its version; it may not know the next statement/_ = 0 \/\/ asks anyway/' \
	'^TestMySQLRefusesGaleraAndTellsReleaseAnswersApart$'

mutation "a checkout from a pgxpool waits for the caller's context, not WithPoolWait" internal/dbutil/statements.go \
	's/\tif poolWait > 0 \{\n\t\tvar cancel context\.CancelFunc/\tif poolWait > 0 \&\& false {\n\t\tvar cancel context.CancelFunc/' \
	'^TestLocksOnAPgxpoolCountAgainstItsMaxConns$'
# PoolerHint: the hosts and ports of the poolers docs/production.md names.
mutation "PoolerHint misses an endpoint added to an RDS Proxy" internal/dsnhint/dsnhint.go \
	's/domain = strings\.TrimPrefix\(domain, "endpoint\."\)/_ = "endpoint."/' \
	'^TestPoolerHint$'
mutation "PoolerHint reads a MySQL DSN as PostgreSQL's key=value" internal/dsnhint/dsnhint.go \
	's/\} else if addr, ok := mysqlAddress\(dsn\); ok \{/} else if addr, ok := mysqlAddress(dsn); ok \&\& false {/' \
	'^TestPoolerHint$'
mutation "PoolerHint takes PgBouncer's port for a pooler on MySQL" internal/dsnhint/dsnhint.go \
	's/name := hostHint\(host, port\)\n\t\tif p\.mysql \{/name := hostHint(host, port)\n\t\tif p.mysql \&\& name == "" {/' \
	'^TestPoolerHint$'

mutation "a PostgreSQL wait polls instead of waiting in the server's queue" advisorylock.go \
	's/\t\t\treturn session\.WaitLockSession\(ctx, conn, key, slice\)\n/\t\t\tif r, err := session.TryLockSession(ctx, conn, key); err != nil || r.OK {\n\t\t\t\treturn r, err\n\t\t\t}\n\t\t\ttime.Sleep(slice)\n\t\t\treturn backend.SessionResult{}, nil\n/' \
	'^TestLockWaitsServerSideAndHandsOff$'
mutation "a lease row's release waits ten release timeouts" lease.go \
	's/(r\.Now = s\.clock\.Now\(\)\n\tctx, cancel := context\.WithTimeout\(ctx, )timeout\)/${1}10*timeout)/' \
	'^TestSQLiteReleaseIsBoundedWhileBusy$'
mutation "the pooler probe's verdict is not kept for the pool" internal/dbutil/verdict.go \
	's/\t\tif err != nil \{\n\t\t\tforgetVerdict\(key, what, v\)\n\t\t\}\n/\t\tforgetVerdict(key, what, v)\n/' \
	'^TestNewProbesOncePerDB$'
mutation "PostgreSQL: the first use takes a hot standby for a primary" internal/postgresbackend/postgres.go \
	's/\tif standby \{\n\t\treturn errStandby\n/\tif false \&\& standby {\n\t\treturn errStandby\n/' \
	'^TestHotStandbyRefusesLocksAndLeases$'
mutation "PostgreSQL: a try on a connection that reached a hot standby is a miss" internal/postgresbackend/postgres.go \
	's/\tif standby \{\n\t\treturn backend\.SessionResult\{\}, errStandby/\tif false \&\& standby {\n\t\treturn backend.SessionResult{}, errStandby/' \
	'^TestHotStandbyRefusesLocksAndLeases$'
mutation "PostgreSQL: a semaphore on a hot standby's connection misses" internal/postgresbackend/semaphore.go \
	's/\tcase got == -2:\n\t\treturn 0, backend\.SessionResult\{\}, errStandby/\tcase got == -3:\n\t\treturn 0, backend.SessionResult{}, errStandby/' \
	'^TestHotStandbyRefusesLocksAndLeases$'
mutation "PostgreSQL: a lease statement refused read-only is not told as a hot standby" internal/postgresbackend/postgres.go \
	's/\treturn fmt\.Errorf\("%w \(%w\)", errStandby, err\)/\treturn err/' \
	'^TestHotStandbyRefusesLocksAndLeases$'
# --- Leases and fencing -------------------------------------------------------
mutation "lease re-granted 1.2 s before it expires" internal/postgresbackend/postgres.go \
	"s/= \`\\(l\\.owner IS NULL OR l\\.expires_at <= now\\(\\)\\)/= \`(l.owner IS NULL OR l.expires_at <= now() + interval '1200 milliseconds')/" \
	'^(TestSoak|TestNetworkCutsUnderLoad)$'
mutation "lease acquire takes a held lease (PostgreSQL)" internal/postgresbackend/postgres.go \
	's/= `\(l\.owner IS NULL OR l\.expires_at <= now\(\)\)/= `true/' \
	'^(TestPostgresLeaseStoreProperties|TestSoakLeaseRows)$'
mutation "a waiter's live place does not keep others out (PostgreSQL)" internal/postgresbackend/postgres.go \
	's/\tAND \(l\.next_owner IS NULL OR l\.next_expires_at <= now\(\) OR l\.next_owner = \$2::text\)`/\tAND true`/' \
	'^TestHandoverLostInACrashStillKeepsOthersOut$'
mutation "a lease try that misses locks the holder's row (PostgreSQL)" internal/postgresbackend/postgres.go \
	's/\nWHERE NOT EXISTS \(SELECT FROM advisorylock_leases AS l WHERE l\.name = \$1::text AND NOT \(` \+ pgLeaseTakable \+ `\)\)//' \
	'^TestMissedLeaseTryLeavesTheHoldersRowAlone$'
mutation "a release frees the lease instead of handing it to the waiter in line" internal/postgresbackend/postgres.go \
	's/const pgHandOver = `\(next_owner IS NOT NULL/const pgHandOver = `(false AND next_owner IS NOT NULL/' \
	'^TestLeaseReleaseHandsOverToTheQueuedWaiter$'
mutation "a waiter that gives up keeps its place in line" lease.go \
	's/\tif !l\.asked \{\n\t\treturn\n\t\}\n\tif ctx\.Err/\tif true {\n\t\treturn\n\t}\n\tif ctx.Err/' \
	'^TestWaiterThatGivesUpLeavesNoPlace$'
mutation "a waiter takes a grant heard for a place it no longer has" lease.go \
	's/if granted \&\& l\.queued \&\& !l\.moved \{/if granted \&\& l.queued {/' \
	'^TestGrantHeardForAnEarlierPlaceIsRead$'
mutation "a lease handed over with little time left is first renewed at its deadline" lease.go \
	's|start := min\(renewInterval\(req\.TTL\), left/2\)|start := min(renewInterval(req.TTL), left)|' \
	'^TestHandedOverLeaseWithLittleLeftRenewsInTime$'
mutation "a waiter passed over by a handover tries the held lease before it queues" lease.go \
	's/\} else if passed \{/} else if false {/' \
	'^TestPassedOverWaiterQueuesWithoutTrying$'
mutation "a handover does not wake the waiter sleeping in line" internal/postgresbackend/postgres.go \
	's/\tELSE pg_cancel_backend\(next_pid\) END`/\tELSE NULL END`/' \
	'^TestPlainLibPQWaiterSleepsInLine$'
mutation "a waiter sleeps in line holding a lease handed over before its sleep began" internal/postgresbackend/postgres.go \
	's/CASE WHEN EXISTS \(SELECT FROM advisorylock_leases WHERE name = \$3::text AND owner = \$4::text\) THEN \x270\x27/CASE WHEN false THEN \x270\x27/' \
	'^TestHandoverBeforeTheSleepInLineDoesNotWaitForIt$' ./internal/postgresbackend
mutation "the sleep in line reads the row before it holds the place's key" internal/postgresbackend/postgres.go \
	's/const pgSleepInLine = `SELECT pg_advisory_xact_lock\((.*?)\);\nSELECT set_config\((.*?)\n(.*?);\n/const pgSleepInLine = `SELECT set_config($2\n$3, pg_advisory_xact_lock($1);\n/' \
	'^TestHandoverBeforeTheSleepInLineDoesNotWaitForIt$' ./internal/postgresbackend
mutation "the handover's cancel ends the sleep's message (the woken waiter reads the row again)" internal/postgresbackend/postgres.go \
	's/ EXCEPTION WHEN query_canceled THEN NULL; END\x27;/ END\x27;/' \
	'^TestWokenSleeperLearnsItsGrantInTheSleepsMessage$' ./internal/postgresbackend
mutation "the sleep's message reads the row without waiting for the handover to commit" internal/postgresbackend/postgres.go \
	's/ AND l\.expires_at > now\(\) OFFSET 0 FOR SHARE OF l\) AS l/ AND l.expires_at > now()) AS l/' \
	'^TestWokenSleeperLearnsItsGrantInTheSleepsMessage$' ./internal/postgresbackend
mutation "the sleep's read tests the owner below its row lock (a slow handover reads as none)" internal/postgresbackend/postgres.go \
	's/ AND l\.expires_at > now\(\) OFFSET 0 FOR SHARE OF l\) AS l/ AND l.expires_at > now() FOR SHARE OF l) AS l/' \
	'^TestWokenSleeperLearnsItsGrantInTheSleepsMessage$' ./internal/postgresbackend
mutation "a sleep in line that ends on its own reports a grant" internal/postgresbackend/postgres.go \
	's/return err == nil \&\& mine == 1, err/return err == nil \&\& mine >= 0, err/' \
	'^TestWokenSleeperLearnsItsGrantInTheSleepsMessage$' ./internal/postgresbackend
mutation "a handover cancels the place's backend whether or not it sleeps in line" internal/postgresbackend/postgres.go \
	's/\tWHEN pg_try_advisory_xact_lock\(hashtextextended\(/\tWHEN false AND pg_try_advisory_xact_lock(hashtextextended(/' \
	'^TestHandoverSignalsOnlyASessionSleepingInLine$'
mutation "a handover signals a sleeper of another role" internal/postgresbackend/postgres.go \
	's/ \|\| \x27 \x27 \|\| (current_user|session_user), 0\)/, 0)/g' \
	'^TestAReleaseByARoleThatMayNotCancelTheSleeperStillHandsOver$'
mutation "a waiter sleeps on a connection other than the one its place names" lease.go \
	's/l\.store\.QueueLease\(budget, l\.db, l\.conn, req\)/l.store.QueueLease(budget, l.db, nil, req)/' \
	'^TestPlainLibPQWaiterSleepsInLine$'
mutation "every waiter on a pool sleeps in line, each on a connection of its own" lease.go \
	's/\t\treturn max\(n\/4, 1\)/\t\treturn n/' \
	'^TestSleepersInLineAreBounded$'
mutation "a waiter that stops sleeping keeps its sleepers' slot" lease.go \
	's/\tgo dbutil\.Discard\(l\.conn\)\n\t<-l\.slot\n/\tgo dbutil.Discard(l.conn)\n/' \
	'^TestSleeperWhoseConnectionDiesStillGetsTheLease$'
mutation "lease renew revives an expired lease (PostgreSQL)" internal/postgresbackend/postgres.go \
	's/(AND generation = \S+) AND expires_at > now\(\)(\nRETURNING generation)/$1$2/' \
	'^TestPostgresLeaseStoreProperties$'
mutation "lease tokens do not grow (PostgreSQL)" internal/postgresbackend/postgres.go \
	's/generation = greatest\(l\.generation \+ 1, EXCLUDED\.generation\)/generation = least(l.generation, EXCLUDED.generation)/' \
	'^(TestLeaseTokensOnlyGrow|TestPostgresLeaseStoreProperties|TestSoakLeaseRows)$'
mutation "the fence admits a token one lower (PostgreSQL)" internal/postgresbackend/postgres.go \
	's/WHERE f\.token <= EXCLUDED\.token/WHERE f.token <= EXCLUDED.token + 1/' \
	'^(TestFenceAdmitsEqualAndHigherAndRefusesLower|TestPostgresLeaseStoreProperties)$'
mutation "lease renew revives an expired lease (SQLite)" internal/sqlitebackend/sqlite.go \
	's/(WHERE name = \?1 AND owner = \?2 AND generation = \?3) AND expires_at > \?5/$1/' \
	'^TestLeaseStoreProperties$'
mutation "a Lock on SQLite is taken over before it expires" internal/sqlitebackend/sqlite.go \
	's/WHERE advisorylock_locks\.expires_at <= excluded\.acquired_at/WHERE advisorylock_locks.expires_at <= excluded.acquired_at + 1000/' \
	'^(TestSoak|TestSQLiteLockIsExclusiveAcrossProcesses|TestSQLiteKilledHolderFreesTheLockAtExpiry|TestSQLiteLiveHolderKeepsTheLockAcrossTTLs)$'
mutation "local deadline counts from the answer (acquire and renew)" lease.go \
	's/return keepLease\(store, db, cfg, req, sent\), nil/return keepLease(store, db, cfg, req, cfg.clock.Now()), nil/; s/s\.deadline = localDeadline\(sent, s\.req\.TTL\)/s.deadline = localDeadline(s.clock.Now(), s.req.TTL)/' \
	'^(TestSoak|TestSlowGrantIsLostBeforeItsDatabaseExpiry|TestLeaseDeadlineCountsFromTheSentAcquire)$'
mutation "local deadline is the full TTL" lease.go \
	's/return sent\.Add\(ttl - renewInterval\(ttl\)\)/return sent.Add(ttl)/' \
	'^(TestSoak|TestNetworkCutsUnderLoad|TestNetworkCutLosesLocksBeforeExpiry|TestLeaseIsLostAtTheLocalDeadlineWithoutAnyGoroutine)$'
mutation "a row Guard's Lost waits for a goroutine past the local deadline" advisorylock.go \
	's/\tg\.h\.checkDeadline\(\)\n\treturn g\.h\.lost\(\)/\treturn g.h.lost()/' \
	'^TestRowGuardReadsLostAtItsDeadline$'
mutation "a set of rows reads lost only when a row's keeper runs" set.go \
	's/\t\tp\.checkDeadline\(\)\n/\t\t_ = p\n/' \
	'^TestRowGuardReadsLostAtItsDeadline$'
mutation "Do starts fn on a lease whose deadline passed after its grant" advisorylock.go \
	's/\(ran bool, err error\) \{\n\tg\.h\.checkDeadline\(\)\n/(ran bool, err error) {\n/' \
	'^TestLeaseWhoseDeadlinePassedBeforeTheSectionDoesNotRunIt$'
mutation "a lease's Lost waits for a goroutine past the local deadline" lease.go \
	's/gone \|\| s\.clock\.Now\(\)\.Before\(s\.localDeadline\(\)\)/gone || true/' \
	'^TestLeaseIsLostAtTheLocalDeadlineWithoutAnyGoroutine$'

mutation "lease release waits for the WAL flush" internal/postgresbackend/postgres.go \
	"s/set_config\\('synchronous_commit', 'off', true\\)\\) AS relaxed(\\nWHERE name = \\S+ AND generation)/set_config('synchronous_commit', 'on', true)) AS relaxed\$1/" \
	'^TestLeaseReleaseCommitsWithoutWaitingForTheWAL$'
mutation "a forgotten LeaseGuard is never cleaned up" lease.go \
	's/runtime\.AddCleanup\(g, \(\*hold\)\.forgotten, &s\.hold\)/runtime.KeepAlive(g)/' \
	'^(TestForgottenLeaseGuardIsCleanedUp|TestForgottenSQLiteGuardIsCleanedUp)$'
mutation "a missing table is created while the try holds its connection" internal/postgresbackend/postgres.go \
	's/\t\terr := p\.runOn\(ctx, db, stmt\)\n/\t\terr := p.runOn(ctx, db, func(on dbutil.Querier) error { err := stmt(on); if dbutil.SQLState(err) == "42P01" { _ = upgradePostgresSchema(ctx, db); err = stmt(on) }; return err })\n/' \
	'^TestFirstUsesOnAFreshDatabaseShareASmallPool$'
mutation "pgx's statement cache behind a transaction pooler fails with no fix named" errors.go \
	's/return &lockError\{name: name, op: op, err: explain\(err\)\}/return \&lockError{name: name, op: op, err: err}/' \
	'^TestLeaseLockThroughTransactionPoolWithPgxDefaultsSaysWhatToSet$'

# --- Leader election -----------------------------------------------------------
mutation "a term does not grow (PostgreSQL)" internal/postgresbackend/election.go \
	's/term = greatest\(e\.term \+ 1, EXCLUDED\.term\)/term = e.term/' \
	'^TestElectionThreeCandidatesTakeTurnsOnResign$'
mutation "Leader trusts a term whose session let go (PostgreSQL)" internal/postgresbackend/election.go \
	's/WHERE e\.name = \$1::text AND EXISTS/WHERE e.name = \$1::text AND true OR EXISTS/' \
	'^TestElectionRunReturnsLeadsError$'
mutation "a handle's first-use verdicts are decided again for every Lock" internal/dbutil/verdict.go \
	's/\tif pool == nil \{\n\t\treturn decide\(ctx\)/\tif true || pool == nil {\n\t\treturn decide(ctx)/' \
	'^TestNewLockOnAWarmHandleTakesTwoRoundTrips$'
mutation "lib/pq's prepared statements outgrow the pool" internal/dbutil/prepared.go \
	's/for len\(ps\.conns\) > open \{/for false \&\& len(ps.conns) > open {/' \
	'^TestPreparedStatementsHoldNoMoreConnectionsThanThePoolHasOpen$'
mutation "lib/pq: a statement name another client took on the session is not a pooler sign" internal/dbutil/prepared.go \
	's/if SQLState\(err\) == "42P05" \{/if false \&\& SQLState(err) == "42P05" {/' \
	'^TestReleaseOnAnotherServerSessionIsTransactionPooler$'
mutation "a session that lost its prepared statements fails its steps" internal/postgresbackend/postgres.go \
	's/if dbutil\.SQLState\(err\) == "26000" \{/if false \&\& dbutil.SQLState(err) == "26000" {/' \
	'^TestLibPQLockAfterTheSessionLostItsPreparedStatements$'
mutation "lib/pq's try and unlock go as text, parsed and planned each time" internal/postgresbackend/postgres.go \
	's/if hot \&\& p\.prepared != nil \{/if false \&\& hot \&\& p.prepared != nil {/' \
	'^TestLibPQPreparesTheTryAndTheUnlockOncePerSession$'
mutation "lib/pq sends a statement's arguments (two round trips)" internal/postgresbackend/postgres.go \
	's/\tif p\.params \{\n\t\treturn text, args, nil/\tif true || p.params {\n\t\treturn text, args, nil/' \
	'^TestMinHoldTryLockAndReleaseAreOneRoundTripEach$'
mutation "lib/pq's lease steps go as text, parsed and planned each time" internal/postgresbackend/postgres.go \
	's/if name := pgSteps\[text\]; name != ""/if name := pgSteps[text]; false \&\& name != ""/' \
	'^TestLibPQPreparesTheLeaseStepsOncePerSession$'
mutation "a lease step whose statement the session lost fails" internal/postgresbackend/postgres.go \
	's/\t\tif dbutil\.SQLState\(err\) != "26000" \{\n\t\t\treturn err/\t\tif true {\n\t\t\treturn err/' \
	'^TestLibPQLeaseAfterTheSessionLostItsPreparedSteps$'
mutation "after a session lost a lease step, every step still tries it prepared first" internal/postgresbackend/postgres.go \
	's/\t\tp\.prepared\.StepsAsText\.Store\(true\)/\t\t_ = 0/' \
	'^TestLibPQLeaseAfterTheSessionLostItsPreparedSteps$'
mutation "a lease step another client prepared under its name fails" internal/postgresbackend/postgres.go \
	's/err != nil && dbutil\.SQLState\(err\) != "42P05"/err != nil/' \
	'^TestLibPQLeaseStepPreparedByAnotherClientRuns$'
mutation "MySQL: the exclusive try goes as text, parsed each time" internal/mysqlbackend/mysql.go \
	's/\tif m\.prepared == nil \{\n\t\treturn backend\.SessionResult\{\}, grabMissed, dbutil\.ErrNotPrepared/\tif true || m.prepared == nil {\n\t\treturn backend.SessionResult{}, grabMissed, dbutil.ErrNotPrepared/' \
	'^TestMySQLTryAndUnlockRunPrepared$' \
	'./internal/mysqlbackend'
mutation "MySQL: a session that lost its prepared statements fails its steps (1243)" internal/mysqlbackend/mysql.go \
	's/return dbutil\.MySQLErrno\(err\) == mysqlUnknownStatement \}/return dbutil.MySQLErrno(err) == mysqlUnknownStatement \&\& false }/' \
	'^TestMySQLSessionThatLostItsPreparedStatementsPreparesThemAgain$' \
	'./internal/mysqlbackend'
mutation "MySQL: statements a session lost are never prepared again" internal/dbutil/prepared.go \
	's/(if err != nil && lost\(err\) \{\n\t\t\t)ps\.Forget\(dc\)/$1_ = dc/' \
	'^TestMySQLSessionThatLostItsPreparedStatementsPreparesThemAgain$' \
	'./internal/mysqlbackend'
mutation "a resign leaves its term's row naming its session" election.go \
	's/\te\.endTerm\(ctx, t\)\n/\t_ = t\n/' \
	'^TestElectionLeaderIgnoresTheResignersSessionRetakingTheLock$'
mutation "a leader that lost its lock leads on" election.go \
	's/t\.g\.h\.onLost\(cancel\)/t.g.h.onLost(nil)/' \
	'^(TestElectionKilledSessionIsTakenOver|TestEngineElectionLeaderLostHandsTheTermOn)$'
mutation "a resigner on SQLite campaigns again at once" election.go \
	's/pause = max\(pause, 2\*max\(e\.cfg\.poll, leaseWaitCap\)\)/_ = leaseWaitCap/' \
	'^TestElectionThreeCandidatesTakeTurnsOnResign$'
mutation "lead returning nil ends Run" election.go \
	's/case err == nil:\n(\t+)if !e\.standAside/case err == nil \&\& false:\n$1if !e.standAside/' \
	'^TestElectionRunReturnsLeadsError$'
mutation "a lead returning nil at once campaigns again at once" election.go \
	's/if !e\.standAside\(ctx, 0\) \|\| !e\.rest\(ctx, began, &quick\)/if !e.standAside(ctx, 0) || false \&\& !e.rest(ctx, began, \&quick)/' \
	'^TestElectionLeadReturningAtOnceDoesNotHammer$'
mutation "a missing privilege is campaigned for forever" election.go \
	's/if !dbutil\.DeniedByServer\(err\) \{/if !dbutil.DeniedByServer(err) || true {/' \
	'^(TestElectionRunReturnsAMissingPrivilege|TestMySQLElectionRunReturnsAMissingPrivilege)$'
mutation "MySQL: a refused CREATE is not a missing privilege" internal/dbutil/statements.go \
	's/case 1142, 1143, 1044:/case 1143, 1044:/' \
	'^TestMySQLElectionRunReturnsAMissingPrivilege$'
# --- Shared locks -----------------------------------------------------------------
mutation "MySQL exclusive statement ignores shared rows" internal/mysqlbackend/shared.go \
	's/WHEN 1 THEN IF\(" \+ mysqlReadersIn\(key\) \+ ", 2, 1\)/WHEN 1 THEN IF(false, 2, 1)/' \
	'^TestSharedAndExclusiveHoldersNeverOverlap$'
mutation "MySQL shared holder does not check the GET_LOCK after its row" internal/mysqlbackend/shared.go \
	's/m\.getLock\(ctx, conn, "SELECT IS_FREE_LOCK\("\+mysqlLockName\(key\)\+"\)"\)/m.getLock(ctx, conn, "SELECT 1")/' \
	'^(TestSharedHoldersCoexistAndExcludeWriters|TestSharedAndExclusiveHoldersNeverOverlap)$'
mutation "MySQL writer's wait that ends keeps the GET_LOCK on the pooled session" internal/mysqlbackend/shared.go \
	's/RELEASE_LOCK\("\+name\+"\), 0\)"\)/0, 0)")/' \
	'^TestSharedHoldersCoexistAndExcludeWriters$'
mutation "SQLite lease token counter forgets deleted rows" internal/sqlitebackend/sqlite.go \
	's/SET last = max\(last, OLD\.generation\)/SET last = last/' \
	'^TestSQLiteSchemaUpgradesARoundOneFile$'
mutation "SQLite lock row ignores shared rows (no summary row)" internal/sqlitebackend/sqlite.go \
	"s/BEGIN \\\` \\+ sqliteKeepSummary \\+ \\\` VALUES \\(NEW\\.key[^\\n]*; END\\\`/BEGIN SELECT 1; END\\\`/" \
	'^(TestSharedAndExclusiveHoldersNeverOverlap|TestSQLiteExclusiveGrantWaitsForTheLatestSharedExpiry)$'
mutation "SQLite summary row keeps the newest reader's expiry, not the latest" internal/sqlitebackend/sqlite.go \
	's/THEN max\(advisorylock_locks\.expires_at, excluded\.expires_at\)/THEN excluded.expires_at/' \
	'^TestSQLiteExclusiveGrantWaitsForTheLatestSharedExpiry$'
mutation "SQLite summary row ignores shared renewals" internal/sqlitebackend/sqlite.go \
	's/BEGIN UPDATE advisorylock_locks SET expires_at = max\(expires_at, NEW\.expires_at\)/BEGIN UPDATE advisorylock_locks SET expires_at = expires_at/' \
	'^TestSQLiteRenewedReaderKeepsExclusiveGrantsOut$'
mutation "SQLite summary row outlives the readers' releases" internal/sqlitebackend/sqlite.go \
	's/(AFTER DELETE ON advisorylock_shared\nBEGIN\n).*\n.*\n/${1}\tSELECT 1;\n/' \
	'^TestSQLiteExclusiveGrantGoesInOnceTheLastReaderReleases$'
mutation "SQLite summary row keeps a released reader's expiry" internal/sqlitebackend/sqlite.go \
	's/\tUPDATE advisorylock_locks SET expires_at = \(SELECT max\(expires_at\) FROM advisorylock_shared WHERE key = OLD\.key\)[^\n]*\n//' \
	'^TestSQLiteExclusiveGrantGoesInOnceTheLastReaderReleases$'
mutation "SQLite shared holders take the summary row for an exclusive holder" internal/sqlitebackend/sqlite.go \
	"s/WHERE key = \\?1 AND expires_at > \\?4 AND owner <> ''\\)/WHERE key = ?1 AND expires_at > ?4)/" \
	'^TestSharedHoldersCoexistAndExcludeWriters$'
mutation "SQLite Holders lists the summary row as an exclusive holder" internal/sqlitebackend/sqlite.go \
	"s/(sqliteHolders = \\\`SELECT name, owner, acquired_at, expires_at, 0 FROM advisorylock_locks WHERE key = \\?1 AND expires_at > \\?2) AND owner <> ''/\\1/" \
	'^TestSQLiteSharedSummaryIsNeverReportedAsAHolder$'
mutation "SQLite upgrade leaves live shared rows without a summary" internal/sqlitebackend/sqlite.go \
	's/FROM advisorylock_shared WHERE true GROUP BY key/FROM advisorylock_shared WHERE false GROUP BY key/' \
	'^TestSQLiteSchemaUpgradesAStepThreeFileLive$'
mutation "SQLite waiting writer keeps its claim after its grant" internal/sqlitebackend/sqlite.go \
	's/if r\.Wait && r\.Retry && r\.Kind == backend\.KindLock \{/if false \&\& r.Wait \&\& r.Kind == backend.KindLock {/' \
	'^TestSQLiteReadersGetInRightAfterAWaitingWritersRelease$'
mutation "a waiting writer's later attempts are not marked as retries" lease.go \
	's/\n\t\treq\.Retry = true \/\/[^\n]*\n/\n/' \
	'^TestSQLiteReadersGetInRightAfterAWaitingWritersRelease$'
mutation "Do runs its function under a grant already lost" advisorylock.go \
	's/if _, why := g\.h\.isLost\(\); why != nil \{/if _, why := g.h.isLost(); why != nil \&\& false {/' \
	'^TestLateGrantIsLostBeforeTheSectionBegins$'
mutation "SQLite withdraws a claim its first attempt never made" internal/sqlitebackend/sqlite.go \
	's/if r\.Wait && r\.Retry && r\.Kind == backend\.KindLock \{/if r.Wait \&\& r.Kind == backend.KindLock {/' \
	'^TestSQLiteUncontendedLockWritesOnce$'
mutation "SQLite waiting writer does not claim the name" internal/sqlitebackend/sqlite.go \
	's/if n == 1 \|\| err != nil \|\| !r\.Wait/if true || n == 1 || err != nil || !r.Wait/' \
	'^TestWaitingWriterGetsInWhenTheReadersLeave$'
mutation "PostgreSQL shared keep-alive looks for an exclusive lock" internal/postgresbackend/postgres.go \
	's/return "ShareLock"/return "ExclusiveLock"/' \
	'^TestLiveSharedHolderIsNotLost$'
# --- Transaction locks and Guard.Conn -------------------------------------------
mutation "LockTx: a granted slice keeps its own lock_timeout" internal/postgresbackend/tx.go \
	"s/SELECT set_config\\('statement_timeout',%s, true\\), set_config\\('lock_timeout',%s, true\\)/SELECT %s, %s/" \
	'^TestLockTxThatEndsWithoutTheLockLeavesTheTransactionUsable$'
mutation "LockTx: a slice without the lock is not rolled back to its savepoint" internal/postgresbackend/tx.go \
	's/pgUndoWaitTx = `ROLLBACK TO SAVEPOINT advisorylock_locktx; RELEASE SAVEPOINT advisorylock_locktx`/pgUndoWaitTx = `SELECT 1`/' \
	'^TestLockTxThatEndsWithoutTheLockLeavesTheTransactionUsable$'
mutation "LockTx: the caller's ctx reaches the driver" transaction_lock.go \
	's/context\.WithTimeout\(context\.WithoutCancel\(ctx\), slice\+sliceGrace\)/context.WithTimeout(ctx, slice+sliceGrace)/' \
	'^TestLockTxThatEndsWithoutTheLockLeavesTheTransactionUsable$'
mutation "WithConn: the keep-alive runs while fn runs" conn_guard.go \
	's/if s\.lent != nil \{ \/\/ the connection is lent \(WithConn, Guard\.Conn\): step aside/if false \&\& s.lent != nil {/' \
	'^(TestWithConnStepsTheKeepAliveAside|TestEngineWithConnStepsTheKeepAliveAside)$'
mutation "Guard.Conn (deprecated): the keep-alive runs while Conn is lent" conn_guard.go \
	's/if s\.lent != nil \{ \/\/ the connection is lent \(WithConn, Guard\.Conn\): step aside/if s.lent != nil \&\& !s.lent.untilRelease {/' \
	'^TestGuardConnStepsTheKeepAliveAside$'
mutation "Guard.Conn (deprecated): a forgotten Guard's cleanup runs while its Conn is in use" lent_conn.go \
	's/return guardConn\{lentConn: s\.lendUntilRelease\(\), g: g\}/return guardConn{lentConn: s.lendUntilRelease()}/' \
	'^TestForgottenGuardConnIsCleanedUp$'
mutation "WithConn: a transaction fn left open is not rolled back when fn returns" lent_conn.go \
	's/if err := tx\.Rollback\(\); !errors\.Is/if err := func() error { _ = tx; return nil }(); !errors.Is/' \
	'^(TestWithConnEndsWhatFnLeftOpen|TestGuardConnReleaseEndsWhatWasLeftOpen)$'
mutation "WithConn: Release waits for fn forever" lent_conn.go \
	's/if !returnsBy\(c, time\.Until\(deadline\)\) \{/if !returnsBy(c, time.Hour) {/' \
	'^TestReleaseWhileWithConnRunsAStatement$'
mutation "WithConn: a forgotten Guard's cleanup runs while fn uses its connection" lent_conn.go \
	's/defer runtime\.KeepAlive\(g\)/defer runtime.KeepAlive(nil)/' \
	'^TestForgottenGuardWithConnIsCleanedUp$'

# --- lockrun ------------------------------------------------------------------
mutation "lockrun does not read a MySQL DSN for a pooler" cmd/lockrun/dsn_mysql.go \
	's/\td\.pooler, _ = advisorylock\.PoolerHint\(cfg\.FormatDSN\(\)\)/\t_ = advisorylock.PoolerHint/' \
	'^TestDatabaseSaysWhichWithoutPassword$' ./cmd/lockrun
mutation "lockrun starts the command under a lock lost as it was granted" cmd/lockrun/run.go \
	's/\tif isClosed\(h\.lost\) \{\n(\t+)\/\/ A grant/\tif false \&\& isClosed(h.lost) {\n$1\/\/ A grant/' \
	'^TestLateGrantDoesNotRunTheCommand$' ./cmd/lockrun
mutation "lockrun status with no names shows shared holders as exclusive" cmd/lockrun/status.go \
	's/(func kindOf\(h \*advisorylock\.Holder\) string \{\n\tif )h\.Shared/$1false \&\& h.Shared/' \
	'^TestSharedRunsSideBySideAndExcludesExclusive$' ./cmd/lockrun
mutation "lockrun does not pass SIGUSR1 on" cmd/lockrun/proc_unix.go \
	's/syscall\.SIGQUIT, syscall\.SIGUSR1, syscall\.SIGUSR2\}/syscall.SIGQUIT, syscall.SIGUSR2}/' \
	'^TestQuitAndUserSignalsReachTheCommand$' ./cmd/lockrun
mutation "lockrun's command outlives lockrun" cmd/lockrun/proc_linux.go \
	's/a\.Pdeathsig = syscall\.SIGTERM/_ = a/' \
	'^TestCommandGetsSIGTERMWhenLockrunDies$' ./cmd/lockrun
mutation "lockrun: slots is not a config file key" cmd/lockrun/args.go \
	's/\{long: \[\]string\{"slots"\}, config: true,/{long: []string{"slots"},/' \
	'^TestSlotsFromTheConfigFile$' ./cmd/lockrun
mutation "lockrun status without names skips SQLite's lock rows" cmd/lockrun/status.go \
	's/rs, err := sqliteLockRows\(ctx, db, say\)/rs, err := []holding(nil), error(nil)/' \
	'^TestStatusWithoutNamesListsSharedHoldersAndSlots$' ./cmd/lockrun
mutation "lockrun status lists no runs recorded done" cmd/lockrun/status.go \
	's/runs, err := doneRuns\(ctx, db, name\)/runs, err := []holding(nil), error(nil)/' \
	'^TestStatusListsTheRunsRecordedDone$' ./cmd/lockrun
mutation "lockrun status lists a name's oldest runs, not its newest" cmd/lockrun/status.go \
	's/ORDER BY done_at DESC, run DESC LIMIT 5/ORDER BY done_at, run LIMIT 5/g' \
	'^TestStatusListsTheRunsRecordedDone$' ./cmd/lockrun
mutation "lockrun status reads PostgreSQL's shared locks as exclusive" cmd/lockrun/status.go \
	"s/l\.mode = 'ShareLock'/false/" \
	'^TestStatusWithoutNamesListsSharedHoldersAndSlots$' ./cmd/lockrun
mutation "lockrun takes a subcommand only as the first argument" cmd/lockrun/args.go \
	's/if !dashdash && startsSubcommand\(rest\) \{/if !dashdash \&\& len(rest) == len(args) \&\& startsSubcommand(rest) {/' \
	'^(TestGlobalFlagsGoBeforeASubcommand|TestParseArgsReadsFlockStyleFlags)$' ./cmd/lockrun
mutation "lockrun reads a subcommand after --, where the word is a NAME" cmd/lockrun/args.go \
	's/if !dashdash && startsSubcommand\(rest\) \{/if startsSubcommand(rest) {/' \
	'^(TestFlockFormsRunTheCommand|TestParseArgsReadsFlockStyleFlags)$' ./cmd/lockrun
mutation "lockrun lets a flag that only takes a lock go with a subcommand" cmd/lockrun/args.go \
	's/return fmt\.Errorf\("flag --%s does not apply to %s", f, o\.subcommand\)/_ = f/' \
	'^(TestGlobalFlagsGoBeforeASubcommand|TestParseArgsRefusesBadInput|TestBadInputGetsOneLineAndItsExitCode)$' ./cmd/lockrun
mutation "lockrun --once exits 0 for a run it did not run, whatever --done-exit-code" cmd/lockrun/run.go \
	's/\t\treturn o\.doneCode\n/\t\treturn 0\n/' \
	'^TestOnceDoneExitCodeSaysTheCommandDidNotRun$' ./cmd/lockrun
mutation "lockrun: done-exit-code is not a config file key" cmd/lockrun/args.go \
	's/\{long: \[\]string\{"done-exit-code"\}, config: true,/{long: []string{"done-exit-code"},/' \
	'^TestOnceDoneExitCodeSaysTheCommandDidNotRun$' ./cmd/lockrun
mutation "lockrun's bash completion offers subcommands only as the first word" cmd/lockrun/completion.go \
	's/elif \[\[ \$name -eq 0 && \$set -eq 0 \]\]; then/elif [[ \$COMP_CWORD -eq 1 ]]; then/' \
	'^TestBashCompletionCompletes$' ./cmd/lockrun
mutation "lockrun's zsh completion looks for a subcommand only as the first word" cmd/lockrun/completion.go \
	's/if \(\( i < CURRENT \)\) && \{/if (( i == 2 \&\& i < CURRENT )) \&\& {/' \
	'^TestZshCompletionFindsTheSubcommandAfterFlags$' ./cmd/lockrun

# --- Scheduler adapters (modules of their own: PACKAGE is the module) ---------
mutation "the gocron Locker's default window overrides the caller's" extra/advisorylockgocron/locker.go \
	's/opts = append\(\[\]advisorylock\.Option\{advisorylock\.WithMinHold\(DefaultMinHold\)\}, opts\.\.\.\)/opts = append(opts, advisorylock.WithMinHold(DefaultMinHold))/' \
	'^(TestLockerRunsEachTickOnceAcrossSkewedSchedulers|TestLockerCallersWindowWins)$' extra/advisorylockgocron
mutation "the gocron Locker has no default window" extra/advisorylockgocron/locker.go \
	's/opts = append\(\[\]advisorylock\.Option\{advisorylock\.WithMinHold\(DefaultMinHold\)\}, opts\.\.\.\)/opts = append([]advisorylock.Option{}, opts...)/' \
	'^TestLockerReportsHeldElsewhere$' extra/advisorylockgocron
mutation "the gocron Elector still leads after its term ended" extra/advisorylockgocron/elector.go \
	's/defer el\.term\.Store\(nil\)/_ = 0/; s/if t == nil \|\| t\.ctx\.Err\(\) != nil \{/if t == nil {/' \
	'^TestElectorRunsEachTickOnTheLeaderAlone$' extra/advisorylockgocron
mutation "robfig/cron OnOneReplica drops the caller's options (no window)" extra/advisorylockcron/cron.go \
	's/lock, err := advisorylock\.New\(db, name, opts\.\.\.\)/lock, err := advisorylock.New(db, name)/' \
	'^TestOnOneReplicaRunsEachTickOnceAcrossSkewedCrons$' extra/advisorylockcron

mutation "an alerting rule reads a metric the Prometheus observer does not export" extra/advisorylockprom/alerts.yml \
	's/increase\(advisorylock_lost_total\[5m\]\)/increase(advisorylock_locks_lost_total[5m])/' \
	'^TestAlertingRulesNameExportedMetrics$' extra/advisorylockprom
mutation "an alerting rule matches on a label its metric lacks" extra/advisorylockprom/alerts.yml \
	's/advisorylock_lease_renew_duration_seconds_count\{outcome="error"\}/advisorylock_lease_renew_duration_seconds_count{result="error"}/' \
	'^TestAlertingRulesNameExportedMetrics$' extra/advisorylockprom
mutation "alerts.yml does not parse" extra/advisorylockprom/alerts.yml \
	's/\ngroups:\n/\ngroups: [\n/' \
	'^TestAlertingRulesNameExportedMetrics$' extra/advisorylockprom

# --- Once per run and Check's grant probe --------------------------------------
mutation "TryDoOnce never records a run" once.go \
	's/rec\.RecordRun\(rctx, l\.db, l\.name, run, l\.cfg\.clock\.Now\(\), l\.cfg\.runRetention\)/func() error { _ = rctx; return nil }()/' \
	'^TestTryDoOnceRunsARunOnceAcrossReplicas$'
mutation "TryDoOnce does not read the record" once.go \
	's/if done, err = rec\.RunDone\(dbutil\.WithPoolWait\(ctx, l\.cfg\.poolWait\), l\.db, l\.name, run\); err != nil \{/if done, err = false, nil; err != nil {/' \
	'^(TestTryDoOnceRunsARunOnceAcrossReplicas|TestSoakTryDoOnce)$'
mutation "TryDoOnce records a failed run" once.go \
	's/if err := fn\(ctx\); err != nil \{\n\t\t\treturn err\n\t\t\}/_ = fn(ctx)/' \
	'^(TestTryDoOnceRunsAFailedRunAgain|TestSoakTryDoOnce)$'
# Under faults (soak_once_test.go): a run whose caller left mid-fn.
mutation "TryDoOnce records a run interrupted by its caller" once.go \
	's/if err := fn\(ctx\); err != nil \{/if err := fn(ctx); err != nil \&\& ctx.Err() == nil {/' \
	'^TestSoakTryDoOnce$'
mutation "SQLite prunes run records regardless of the retention" internal/sqlitebackend/once.go \
	's/now\.Add\(-keep\)\.UnixMilli\(\)/now.UnixMilli()/' \
	'^TestTryDoOncePrunesRecordsPastTheRetention$'
mutation "PostgreSQL prunes run records younger than the retention (sign)" internal/postgresbackend/once.go \
	's/done_at < now\(\) - \$3::bigint/done_at < now() + \$3::bigint/' \
	'^TestTryDoOncePrunesExactlyTheRecordsPastTheRetention$'
mutation "PostgreSQL reads the run retention in the wrong unit" internal/postgresbackend/once.go \
	"s/\\\$3::bigint \* interval '1 millisecond'/\\\$3::bigint * interval '1 microsecond'/" \
	'^TestTryDoOncePrunesExactlyTheRecordsPastTheRetention$'
mutation "MySQL prunes run records younger than the retention (sign)" internal/mysqlbackend/once.go \
	's/done_at < UTC_TIMESTAMP\(6\) - INTERVAL/done_at < UTC_TIMESTAMP(6) + INTERVAL/' \
	'^TestTryDoOncePrunesExactlyTheRecordsPastTheRetention$'
mutation "MySQL gives the run retention in the wrong unit" internal/mysqlbackend/once.go \
	's/strconv\.FormatInt\(keep\.Microseconds\(\), 10\)/strconv.FormatInt(keep.Milliseconds(), 10)/' \
	'^TestTryDoOncePrunesExactlyTheRecordsPastTheRetention$'
mutation "TryDoOnce records a run on its caller's context" once.go \
	's/rctx, cancel := context\.WithTimeout\(dbutil\.WithPoolWait\(context\.WithoutCancel\(ctx\), l\.cfg\.poolWait\), l\.cfg\.releaseTimeout\)/rctx, cancel := context.WithTimeout(dbutil.WithPoolWait(ctx, l.cfg.poolWait), l.cfg.releaseTimeout)/' \
	'^TestTryDoOnceRecordsARunWhoseCallerLeftAsItReturned$'
mutation "TryDoOnce's record waits without a bound" once.go \
	's/rctx, cancel := context\.WithTimeout\(dbutil\.WithPoolWait\(context\.WithoutCancel\(ctx\), l\.cfg\.poolWait\), l\.cfg\.releaseTimeout\)/rctx, cancel := context.WithCancel(dbutil.WithPoolWait(context.WithoutCancel(ctx), l.cfg.poolWait))/' \
	'^TestTryDoOnceBoundsTheRecordByTheReleaseTimeout$'
mutation "Check proves no grants" lease.go \
	's/return s\.CheckTables\(ctx, db, tables\.\.\.\)/_ = s; return nil/' \
	'^TestCheckRefusesAMissingGrant$'
mutation "PostgreSQL Check proves no UPDATE grant" internal/postgresbackend/postgres.go \
	's/\t\t\tfmt\.Sprintf\("u%d AS \(UPDATE %s SET %s = %\[3\]s WHERE false RETURNING 1\)", i, t, c\),\n//' \
	'^TestCheckRefusesAPartialGrant$'
mutation "PostgreSQL Check proves no INSERT grant" internal/postgresbackend/postgres.go \
	's/,\n\t\t\tfmt\.Sprintf\("i%d AS \(INSERT INTO %s \(%s\) SELECT %\[3\]s FROM %\[2\]s WHERE false RETURNING 1\)", i, t, c\)\)/)/' \
	'^TestCheckRefusesAPartialGrant$'
mutation "PostgreSQL Check proves no grant on the token sequence" internal/postgresbackend/postgres.go \
	's/if t == "advisorylock_leases" \|\| t == "advisorylock_elections" \|\| t == "advisorylock_locks" \{/if false \&\& (t == "advisorylock_leases" || t == "advisorylock_elections") {/' \
	'^TestCheckRefusesAPartialGrant$'
mutation "MySQL Check proves no UPDATE grant" internal/mysqlbackend/mysql.go \
	's/\t\t\tfmt\.Sprintf\("UPDATE %s SET %s = %\[2\]s WHERE FALSE", t, c\),\n//; s/\t\tc := mysqlTableColumns\[t\]\n/\t\t_ = mysqlTableColumns[t]\n/' \
	'^TestMySQLCheckRefusesAPartialGrant$'
mutation "MySQL Check proves no INSERT grant" internal/mysqlbackend/mysql.go \
	's/"INSERT INTO " \+ t \+ " SELECT \* FROM " \+ t \+ " WHERE FALSE",/"SELECT * FROM " + t + " WHERE FALSE",/' \
	'^TestMySQLCheckRefusesAPartialGrant$'
mutation "robfig/cron OncePerTick keys the run by the firing time" extra/advisorylockcron/cron.go \
	's/tick := Tick\(schedule, now\(\)\)/tick := now()/' \
	'^(TestOncePerTickRunsEachTickOnceAcrossSkewedCrons|TestOncePerTickRunsEachMinuteOnceOnAFakeClock)$' extra/advisorylockcron
mutation "robfig/cron Tick truncates an interval's firing instead of rounding it" extra/advisorylockcron/cron.go \
	's/return fired\.Round\(every\.Delay\)/return fired.Truncate(every.Delay)/' \
	'^TestOncePerTickRunsEachMinuteOnceOnAFakeClock$' extra/advisorylockcron
mutation "gocron OncePerTick keys the run by the firing time" extra/advisorylockgocron/once.go \
	's/tick := Tick\(schedule, now\(\)\)/tick := now()/' \
	'^(TestOncePerTickRunsEachTickOnceAcrossReplicaProcesses|TestOncePerTickRunsEachMinuteOnceOnAFakeClock)$' extra/advisorylockgocron
# gocron's Tick is advisorylockcron's: the same mutation, caught by gocron's test.
mutation "gocron Tick truncates an interval's firing instead of rounding it" extra/advisorylockcron/cron.go \
	's/return fired\.Round\(every\.Delay\)/return fired.Truncate(every.Delay)/' \
	'^TestOncePerTickRunsEachMinuteOnceOnAFakeClock$' extra/advisorylockgocron
mutation "robfig/cron records a failed TickJob's tick done" extra/advisorylockcron/cron.go \
	's/\t\treturn j\(ctx, tick\)/\t\t_ = j(ctx, tick)/' \
	'^TestTickJobsErrorLeavesTheTickToRunAgain$' extra/advisorylockcron
mutation "gocron OncePerTick records a failed tick done" extra/advisorylockgocron/once.go \
	's/return fn\(ctx, tick\)/_ = fn(ctx, tick); return nil/' \
	'^TestOncePerTickRunsAFailedTickAgain$' extra/advisorylockgocron

mutation "advisorylocktest Memory's Revoke leaves a Lock's name taken" extra/advisorylocktest/memory.go \
	's/\tdelete\(m\.locks, key\)\n//' \
	'^(TestMemoryRevokeFreesTheNameBeforeTheHolderKnows|TestMemoryRevokeLosesTheHold)$' extra/advisorylocktest

# --- Elections, lost locks, min-hold windows, config files --------------------
# The MySQL election: who leads, and the term it records.
mutation "MySQL: Leader trusts a term while any connection holds the lock" internal/mysqlbackend/election.go \
	's/AND connection_id = IS_USED_LOCK\(` \+ mysqlLockName\(key\) \+ `\)`/AND IS_USED_LOCK(` + mysqlLockName(key) + `) IS NOT NULL`/' \
	'^(TestElectionThreeCandidatesTakeTurnsOnResign|TestElectionLeaderIgnoresTheResignersSessionRetakingTheLock|TestElectionKilledSessionIsTakenOver)$'
mutation "MySQL: Leader trusts the last term not ended, held or not" internal/mysqlbackend/election.go \
	's/AND connection_id = IS_USED_LOCK\(` \+ mysqlLockName\(key\) \+ `\)`/AND connection_id <> 0`/' \
	'^TestElectionLeaderForgetsAKilledLeadersTerm$'
mutation "MySQL: Leader trusts the last term while nobody holds the lock" internal/mysqlbackend/election.go \
	's/AND connection_id = IS_USED_LOCK\(` \+ mysqlLockName\(key\) \+ `\)`/AND (connection_id = IS_USED_LOCK(` + mysqlLockName(key) + `) OR IS_USED_LOCK(` + mysqlLockName(key) + `) IS NULL)`/' \
	'^TestElectionLeaderForgetsAKilledLeadersTerm$'
mutation "PostgreSQL: Leader trusts a term while any session holds the lock" internal/postgresbackend/election.go \
	's/WHERE l\.locktype = '"'"'advisory'"'"' AND l\.granted AND l\.pid = e\.pid/WHERE l.locktype = '"'"'advisory'"'"' AND l.granted AND l.pid > 0/' \
	'^(TestElectionThreeCandidatesTakeTurnsOnResign|TestElectionLeaderIgnoresTheResignersSessionRetakingTheLock|TestElectionKilledSessionIsTakenOver)$'
mutation "MySQL: a new term is the last plus one, behind the clock" internal/mysqlbackend/election.go \
	's/term = LAST_INSERT_ID\(GREATEST\(term \+ 1, ` \+ mysqlNowMicros \+ `\)\)/term = LAST_INSERT_ID(term + 1)/' \
	'^TestElectionTermExceedsEveryTokenIssuedBeforeIt$'
mutation "PostgreSQL: a new term is the last plus one, behind the token sequence" internal/postgresbackend/election.go \
	's/term = greatest\(e\.term \+ 1, EXCLUDED\.term\)/term = e.term + 1/' \
	'^TestElectionTermExceedsEveryTokenIssuedBeforeIt$'
mutation "MySQL: a new term keeps the last leader's connection" internal/mysqlbackend/election.go \
	's/\n\tconnection_id = CONNECTION_ID\(\), user = /\n\tuser = /' \
	'^(TestElectionThreeCandidatesTakeTurnsOnResign|TestElectionKilledSessionIsTakenOver)$'
mutation "MySQL: a new term keeps the last leader's label" internal/mysqlbackend/election.go \
	's/\), owner = ` \+ o \+ `,\n/),\n/' \
	'^(TestElectionThreeCandidatesTakeTurnsOnResign|TestElectionKilledSessionIsTakenOver)$'
mutation "a lead that returns its context's error after a loss ends Run" election.go \
	's/\tcase t\.lostBy\(err\):/\tcase false \&\& t.lostBy(err):/' \
	'^TestElectionLeadReturningItsContextErrorAfterALossCampaignsAgain$'
# The keep-alive's reading of a lock that is gone from its session.
mutation "MySQL keep-alive takes a freed lock (NULL) for held" internal/mysqlbackend/mysql.go \
	's/return held\.Valid && held\.Bool, err/return !held.Valid || held.Bool, err/' \
	'^TestKeepAliveReportsALockGoneFromItsLiveSession$'
mutation "MySQL keep-alive takes another connection's lock for its own" internal/mysqlbackend/mysql.go \
	's/holds := "IS_USED_LOCK\(" \+ mysqlLockName\(key\) \+ "\) = CONNECTION_ID\(\)"/holds := "IS_USED_LOCK(" + mysqlLockName(key) + ") IS NOT NULL"/' \
	'^TestKeepAliveReportsALockGoneFromItsLiveSession$'
mutation "PostgreSQL keep-alive takes another session's lock for its own" internal/postgresbackend/postgres.go \
	's/(l\.mode = '"'"'"\+p\.lockMode\(\)\+"'"'"') AND l\.pid = pg_backend_pid\(\)\)/$1)/' \
	'^TestKeepAliveReportsALockGoneFromItsLiveSession$'
mutation "MySQL: a shared holder's keep-alive reads its row, not its holder lock" internal/mysqlbackend/shared.go \
	's/return "IS_USED_LOCK\(" \+ mysqlHolderLock\(key, "CONNECTION_ID\(\)"\) \+ "\) = CONNECTION_ID\(\) AND EXISTS/return "EXISTS/' \
	'^TestKeepAliveReportsALockGoneFromItsLiveSession$'
# SQLite's min-hold window: taken until exactly the grant plus WithMinHold.
mutation "SQLite Lock's window counts from the release, not the grant" internal/sqlitebackend/sqlite.go \
	's/(sqliteReleaseLockWindow = `UPDATE advisorylock_locks SET expires_at = min\(expires_at, max\(\?3, )acquired_at \+ \?4\)\)/$1?3 + ?4))/' \
	'^(TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow|TestMinHoldOnSQLiteFollowsTheClock)$'
mutation "SQLite lease's window counts from the release, not the grant" internal/sqlitebackend/sqlite.go \
	's/(expires_at = min\(expires_at, max\(\?3, )acquired_at \+ \?4\)\)\nWHERE name = \?1 AND generation = \?2/$1?3 + ?4))\nWHERE name = ?1 AND generation = ?2/' \
	'^(TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow|TestMinHoldOnSQLiteFollowsTheClock)$'
mutation "SQLite Lock's renewal cuts its window short" internal/sqlitebackend/sqlite.go \
	's/(sqliteRenewLockWindow   = `UPDATE advisorylock_locks SET expires_at = )max\(\?3, acquired_at \+ \?5\)/$1?3/' \
	'^(TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow|TestMinHoldOnSQLiteFollowsTheClock)$'
mutation "SQLite lease's renewal cuts its window short" internal/sqlitebackend/sqlite.go \
	's/(sqliteRenewLeaseWindow  = `UPDATE advisorylock_leases SET expires_at = )max\(\?4, acquired_at \+ \?6\)/$1?4/' \
	'^(TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow|TestMinHoldOnSQLiteFollowsTheClock)$'
mutation "SQLite's release keeps the row for the TTL, not the window" internal/sqlitebackend/sqlite.go \
	's/(now, _ := leaseTimes\(r\)\n\treturn s\.run\(ctx, db, busyHolder, func\(q dbutil\.Querier\) error \{\n\t\tvar err error\n\t\twin := r\.)MinHold/$1TTL/' \
	'^(TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow|TestMinHoldOnSQLiteFollowsTheClock)$'
mutation "SQLite's grant does not stretch the row over the window" internal/sqlitebackend/sqlite.go \
	's/r\.TTL = max\(r\.TTL, r\.MinHold\) \/\/ the row stays taken for the window too/r.TTL = max(r.TTL, 0*r.MinHold)/' \
	'^(TestMinHoldOnSQLiteWindowEndsAtTheGrantPlusTheWindow|TestMinHoldOnSQLiteFollowsTheClock)$'
mutation "SQLite statements hand the driver a context that can end" internal/sqlitebackend/sqlite.go \
	's/q := endless\{on\}/q := on/' \
	'^TestSQLiteStatementsAreNotWatched$'
# MySQL's lease window outlives a killed holder, renewed or not.
mutation "MySQL lease's renewal cuts its window short" internal/mysqlbackend/mysql.go \
	's/expires = "GREATEST\(" \+ expires \+ ", " \+ mysqlAfterGrant\(r\.MinHold\) \+ "\)"/expires += ""/' \
	'^TestMinHoldWindowOutlivesAKilledHolder$'
# lockrun's settings from a config file: each takes effect.
mutation "lockrun: the config file's wait is dropped" cmd/lockrun/config.go \
	's/\(key == "wait" && o\.nonblock\)/key == "wait"/' \
	'^(TestEveryConfigKeyActsAsItsFlag|TestConfigFileSettingsTakeEffectInARun)$' ./cmd/lockrun
mutation "lockrun: the config file's min-hold is dropped" cmd/lockrun/config.go \
	's/if key == "dsn" \|\| o\.given\[key\]/if key == "dsn" || key == "min-hold" || o.given[key]/' \
	'^(TestEveryConfigKeyActsAsItsFlag|TestConfigFileSettingsTakeEffectInARun)$' ./cmd/lockrun
mutation "lockrun: the config file's ttl is dropped" cmd/lockrun/config.go \
	's/if key == "dsn" \|\| o\.given\[key\]/if key == "dsn" || key == "ttl" || o.given[key]/' \
	'^(TestEveryConfigKeyActsAsItsFlag|TestConfigFileSettingsTakeEffectInARun)$' ./cmd/lockrun
mutation "lockrun: the config file's kill-after is dropped" cmd/lockrun/config.go \
	's/if key == "dsn" \|\| o\.given\[key\]/if key == "dsn" || key == "kill-after" || o.given[key]/' \
	'^(TestEveryConfigKeyActsAsItsFlag|TestConfigFileSettingsTakeEffectInARun)$' ./cmd/lockrun
mutation "lockrun: a false boolean in the config file turns its flag on" cmd/lockrun/config.go \
	's/\tif on \{\n\t\tf\.bool\(o\)/\tif on || true {\n\t\tf.bool(o)/' \
	'^(TestEveryConfigKeyActsAsItsFlag|TestConfigFileSettingsTakeEffectInARun)$' ./cmd/lockrun
mutation "lockrun: the config file's dsn is ignored" cmd/lockrun/dsn.go \
	's/\{settings\["dsn"\]\.value, settings\["dsn"\]\.at\}/{"", settings["dsn"].at}/' \
	'^(TestEveryConfigKeyActsAsItsFlag|TestCronJobWithConfigFileTakesTheClusterLock|TestConfigPrecedence)$' ./cmd/lockrun

# --- Lease rows (WithLeaseRows): every kind behind a transaction pooler --------
mutation "WithLeaseRows is ignored: a Lock keeps session locks" advisorylock.go \
	's/ok \&\& l\.cfg\.leaseRows \{/ok \&\& false {/' \
	'^(TestLeaseRowsLockExcludesThroughAPooler|TestLeaseRowsSemaphoreAdmitsAtMostItsSlots)$'
mutation "WithLeaseRows is ignored: an Election keeps session locks" election.go \
	's/rows \&\& e\.cfg\.leaseRows/rows \&\& false/' \
	'^TestLeaseRowsElectionThroughAPooler$'
mutation "PostgreSQL: a lock row is taken while live" internal/postgresbackend/rows.go \
	's/WHERE NOT EXISTS \(SELECT FROM advisorylock_locks AS l WHERE l\.key = \$1::bigint AND l\.expires_at > now\(\)\)/WHERE true/; s/WHERE l\.expires_at <= now\(\)\nRETURNING token/WHERE true\nRETURNING token/' \
	'^(TestLeaseRowsLockExcludesThroughAPooler|TestLeaseRowsSemaphoreAdmitsAtMostItsSlots|TestSoakLeaseRows)$'
mutation "PostgreSQL: a lock row's renewal ignores its owner" internal/postgresbackend/rows.go \
	's/WHERE key = \$1::bigint AND owner = \$2::text AND expires_at > now\(\)/WHERE key = \$1::bigint AND expires_at > now()/' \
	'^(TestLeaseRowsLockExcludesThroughAPooler|TestLeaseRowsLostHoldersRenewalLeavesTheNewOwnersRowAlone)$'
mutation "PostgreSQL: a lock row's release frees nothing" internal/postgresbackend/rows.go \
	's/(USING \(SELECT set_config\(.synchronous_commit., .off., true\)\) AS relaxed\n)WHERE /$1WHERE false AND /' \
	'^TestLeaseRowsLockExcludesThroughAPooler$'
mutation "PostgreSQL: a lock row's release ends its window at once" internal/postgresbackend/rows.go \
	's/least\(expires_at, greatest\(now\(\), acquired_at \+ \$3::bigint/least(expires_at, greatest(now(), acquired_at + 0 * \$3::bigint/' \
	'^TestLeaseRowsKeepTheMinHoldWindow$'
mutation "MySQL: a lock row is taken while live" internal/mysqlbackend/rows.go \
	's/owner = IF\(expires_at <= UTC_TIMESTAMP\(6\), /owner = IF(TRUE, /' \
	'^(TestLeaseRowsLockExcludesThroughAPooler|TestLeaseRowsSemaphoreAdmitsAtMostItsSlots)$'
mutation "MySQL: a lock row's renewal ignores its owner" internal/mysqlbackend/rows.go \
	's/ AND owner = ` \+ mysqlHex\(r\.Owner\) \+ ` AND expires_at > UTC_TIMESTAMP\(6\)`/ AND expires_at > UTC_TIMESTAMP(6)`/' \
	'^(TestLeaseRowsLockExcludesThroughAPooler|TestLeaseRowsLostHoldersRenewalLeavesTheNewOwnersRowAlone)$'
mutation "MySQL: a lock row's release frees nothing" internal/mysqlbackend/rows.go \
	's/stmt := "DELETE FROM advisorylock_locks" \+ which/stmt := "DELETE FROM advisorylock_locks" + which + " AND FALSE"/' \
	'^TestLeaseRowsLockExcludesThroughAPooler$'
mutation "PostgreSQL: a reader is admitted beside a writer's row" internal/postgresbackend/rows.go \
	's/AND \(\(l\.owner <> .. AND l\.expires_at > now\(\)\) OR l\.claim_expires_at > now\(\)\)\)/AND l.claim_expires_at > now())/; s/WHERE \(l\.owner = .. OR l\.expires_at <= now\(\)\) AND \(l\.claim_expires_at IS NULL/WHERE (l.claim_expires_at IS NULL/' \
	'^(TestLeaseRowsSharedHoldersExcludeWriters|TestLeaseRowsSharedUnderContention)$'
mutation "PostgreSQL: a shared grant has no token of its own" internal/postgresbackend/rows.go \
	's/SELECT s\.key, \$3::text, \$2::text, g\.token, s\.token,/SELECT s.key, \$3::text, \$2::text, 0, s.token,/' \
	'^(TestLeaseRowsSharedHoldersExcludeWriters|TestPostgresKeepsSharedRows)$'
mutation "PostgreSQL: a reader's release ends the summary while another reader holds" internal/postgresbackend/rows.go \
	's/CASE WHEN l\.readers > n\.gone THEN/CASE WHEN false THEN/' \
	'^(TestLeaseRowsSharedHoldersExcludeWriters|TestLeaseRowsSharedUnderContention)$'
mutation "PostgreSQL: a reader's renewal leaves the summary to expire" internal/postgresbackend/rows.go \
	's/SET expires_at = greatest\(l\.expires_at, now\(\) \+ \$3::bigint/SET expires_at = greatest(l.expires_at, now() + 0 * \$3::bigint/' \
	'^TestLeaseRowsSharedHolderLostBeforeWriter$'
mutation "PostgreSQL: a waiting writer claims nothing (readers overtake it)" internal/postgresbackend/rows.go \
	's/(claim_expires_at = now\(\) \+ \$3::bigint \* interval .1 millisecond.\nWHERE )/$1false AND /' \
	'^TestLeaseRowsSharedHoldersExcludeWriters$'
mutation "MySQL: a reader is admitted beside a writer's row" internal/mysqlbackend/shared_rows.go \
	's/admitted := "\(\(owner = .. OR expires_at <= " \+ mysqlNow \+ "\) AND/admitted := "((TRUE) AND/' \
	'^(TestLeaseRowsSharedHoldersExcludeWriters|TestLeaseRowsSharedUnderContention)$'
mutation "MySQL: a shared grant has no token of its own" internal/mysqlbackend/shared_rows.go \
	's/SELECT lock_key, ` \+ tok \+ `,/SELECT lock_key, 0,/' \
	'^TestLeaseRowsSharedHoldersExcludeWriters$'
mutation "MySQL: a reader's release ends the summary while another reader holds" internal/mysqlbackend/shared_rows.go \
	's/AND owner = .. AND readers <= 0`/AND owner = '"''"'`/' \
	'^(TestLeaseRowsSharedHoldersExcludeWriters|TestLeaseRowsSharedUnderContention)$'
mutation "MySQL: a reader's renewal leaves the summary to expire" internal/mysqlbackend/shared_rows.go \
	's/SET l\.expires_at = GREATEST\(l\.expires_at, ` \+ expires \+ `\), /SET /' \
	'^TestLeaseRowsSharedHolderLostBeforeWriter$'
mutation "a rows holder's local deadline is the full TTL (told as a rival is granted)" lease.go \
	's/return sent\.Add\(ttl - renewInterval\(ttl\)\)/return sent.Add(ttl)/' \
	'^TestRowsHolderCutOffIsToldBeforeARival$'
mutation "lockrun --lease-rows is ignored" cmd/lockrun/run.go \
	's/if o\.leaseRows \&\& !o\.lease \{/if false {/' \
	'^TestTransactionPoolerTakesLeaseRows$' ./cmd/lockrun
mutation "lockrun status skips lock rows" cmd/lockrun/status.go \
	's/kinds = append\(kinds, "lock row"\)/_ = kinds/' \
	'^TestTransactionPoolerTakesLeaseRows$' ./cmd/lockrun

# --- Observer -----------------------------------------------------------------
mutation "a second observer is not called" observer.go \
	's/\treturn observers\{to, o\}/\treturn to/' \
	'^TestSeveralObserversAreEachToldInOrder$'
mutation "several observers get one context per acquire" observer.go \
	's/\t\t\tc = own\.each\[i\]/\t\t\tc = own.Context/' \
	'^TestSeveralObserversAreEachToldInOrder$'
mutation "a Fence ignores WithObserver" observer.go \
	's/c\.observer = addObserver\(c\.observer, o\); c\.set\(optObserver\)/c.observer = addObserver(c.observer, o)/' \
	'^TestConstructorsRefuseOptionsThatDoNotApply$'
mutation "an observer label value renamed" observer.go \
	's/CauseNotHeld Cause = "not_held"/CauseNotHeld Cause = "not-held"/' \
	'^TestObserverVocabularyKeepsItsStrings$'
mutation "a renewal that found the lease lost is told as an error" observer.go \
	's/if errors\.Is\(err, backend\.ErrLeaseLost\) && !errors\.Is\(err, ErrLockLost\) \{/if false \&\& errors.Is(err, backend.ErrLeaseLost) {/' \
	'^TestObserverTellsARenewalThatFoundTheLeaseLost$'

mutation "an acquire's start is not told to the Observer" observer.go \
	's/\tctx = ob\.emit\(ctx, Event\{Type: EventAcquireStart, MayWait: mayWait\}\)\n//' \
	'^TestEngineObserverSeesEachAcquireInOrder$'
mutation "a miss is told to the Observer as an error" observer.go \
	's/(case errors\.Is\(err, ErrNotAcquired\):\n\t\treturn )OutcomeNotAcquired/$1OutcomeError/' \
	'^TestEngineObserverSeesEachAcquireInOrder$'
mutation "a semaphore's events say kind lock" semaphore.go \
	's/l := newLock\(db, name, cfg, kindSemaphore\)/l := newLock(db, name, cfg, "lock")/' \
	'^TestSemaphoreReportsItsEventsAsSemaphore$'
mutation "a shared hold's events say kind lock" advisorylock.go \
	's/p, kind = &l\.sobs, backend\.KindShared/p, kind = \&l.sobs, l.kind/' \
	'^TestObserverSeesSharedHoldsAsKindShared$'
mutation "an election's events say kind lock" election.go \
	's/lock, lease := newLock\(db, name, cfg, kindElection\), newLeaseLock\(db, name, cfg, kindElection\)/lock, lease := newLock(db, name, cfg, "lock"), newLeaseLock(db, name, cfg, "lease")/' \
	'^TestElectionEventsHaveKindElection$'

# --- Keys ---------------------------------------------------------------------
mutation "key domain changed" advisorylock.go \
	's/(const keyDomain = ")advisorylock:v1"/$1advisorylock:v2"/' \
	'^TestKeyIsStableAcrossVersionsAndLanguages$'

# --- The test harness's fast tier ----------------------------------------------
mutation "a slow test is skipped without -short" internal/testdb/testdb.go \
	's/\tif testing\.Short\(\) \{\n\t\tt\.Skipf\("slow/\tif !testing.Short() {\n\t\tt.Skipf("slow/' \
	'^TestSlowSkipsOnlyUnderShort$' ./internal/testdb

if [ "${1:-}" = "-l" ]; then
	for i in "${!names[@]}"; do printf '%d\t%s\t%s\t%s\n' $((i + 1)) "${names[$i]}" "${files[$i]}" "${tests[$i]}"; done
	exit 0
fi
dry=0
if [ "${1:-}" = "-n" ]; then
	dry=1
	shift
fi
filter=${1:-.}

short=${MUTATE_SHORT:-0}
# -vet=off and -ldflags=-w (no DWARF): a mutation's test binary is built
# for its run alone; vet and debug information would only slow each build.
goflags=(${MUTATE_GOFLAGS:-} -count=1 -timeout 15m -vet=off -ldflags=-w)
whole="whole suite"
if [ "$short" = 1 ]; then goflags+=(-short) whole="whole fast tier"; fi

# failures prints the tests a go test log says failed (or the panic that
# ended it); a test outside the root package is followed by its package.
failures() {
	awk '
		/^--- FAIL: / { tests[++n] = $3 }
		/^panic: / && panic == "" { panic = " " $0 }
		/^(FAIL|ok)[ \t]+[^ \t]+[ \t]/ {
			pkg = $2
			sub(/^github\.com\/advisorylock\/advisorylock\/?/, "", pkg)
			for (i = 1; i <= n; i++) out = out " " tests[i] (pkg != "" ? " (" pkg ")" : "")
			n = 0
		}
		END {
			for (i = 1; i <= n; i++) out = out " " tests[i]
			print substr(out panic, 2)
		}
	' "$1"
}

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# one runs mutation i, by the fast path when it is schema-able and else
# (or when its targets miss it there) in a scratch tree of its own, and
# prints one result line (with the log's tail where no test is named).
# Its first word is the verdict the tally below counts.
one() {
	local i=$1 name=${names[$1]} tree="$scratch/tree.$1" log="$scratch/log.$1"
	if [ "$dry" -eq 0 ] && [ -n "${schema[$i]:-}" ] && fast "$i"; then
		return
	fi
	mkdir "$tree"
	(cd "$root" && tar --exclude=.git -cf - .) | (cd "$tree" && tar -xf -)
	local target="$tree/${files[$i]}"
	if [ ! -f "$target" ]; then
		echo "DOES NOT APPLY  $name: ${files[$i]} is gone"
		return
	fi
	cp "$target" "$log"
	perl -0pi -e "${edits[$i]}" "$target"
	if cmp -s "$target" "$log"; then
		echo "DOES NOT APPLY  $name: its anchor is no longer in ${files[$i]}"
		return
	fi
	if [ "$dry" -eq 1 ]; then
		if [ -n "${schema[$i]:-}" ]; then
			echo "APPLIES         $name (schema)"
		else
			echo "APPLIES         $name (build${why[$i]:+: ${why[$i]}})"
		fi
		return
	fi
	# Every test the mutation names must still exist, or a rename would
	# pass for a catch.
	# A module under extra/ (its own go.mod) is tested from its folder.
	local dir=. pkg=${pkgs[$i]} pkgargs listed want gone="" status=0 by=targets
	if [ -f "$root/$pkg/go.mod" ]; then dir=$pkg pkg=.; fi
	read -ra pkgargs <<<"$pkg"
	listed=$(cd "$root/$dir" && go test -list "${tests[$i]}" "${pkgargs[@]}" 2>/dev/null | grep '^Test' || true)
	for want in $(echo "${tests[$i]}" | tr -d '^$()' | tr '|' ' '); do
		grep -qx "$want" <<<"$listed" || gone+=" $want"
	done
	if [ -n "$gone" ]; then
		echo "DOES NOT APPLY  $name: no test named$gone"
		return
	fi
	local start=$SECONDS
	# -failfast: the first test that fails has caught the mutation; the
	# rest of the targets need not run.
	(cd "$tree/$dir" && go test "${goflags[@]}" -failfast -run "${tests[$i]}" "${pkgargs[@]}") >"$log" 2>&1 || status=$?
	if [ "$status" -eq 0 ]; then
		by=suite
		(cd "$tree/$dir" && go test "${goflags[@]}" -failfast -timeout 30m ./...) >"$log" 2>&1 || status=$?
	fi
	local took="$((SECONDS - start))s, build"
	if [ "$status" -ne 0 ] && grep -q -e '\[build failed\]' -e '\[setup failed\]' "$log"; then
		echo "DOES NOT BUILD  $name:"
		sed -n 1,20p "$log"
		return
	fi
	if [ "$status" -eq 0 ]; then
		if [ "$short" = 1 ]; then
			echo "SLOW TIER ONLY  $name (${took}; the fast tier passes, targets ${tests[$i]})"
		else
			echo "MISSED          $name (${took}; its targets ${tests[$i]} and the whole suite pass)"
		fi
		return
	fi
	local failed
	failed=$(failures "$log")
	if [ "$by" = targets ]; then
		echo "CAUGHT          $name (${took}) by: ${failed:-a failing run, see below}"
	elif [ "$short" = 1 ]; then
		# Under -short the targets may be slow tests, skipped: not a finding.
		echo "CAUGHT BY TIER  $name (${took}): its targets ${tests[$i]} pass or skip; the $whole caught it, by: ${failed:-a failing run, see below}"
	else
		echo "FINDING         $name (${took}): its targets ${tests[$i]} pass; the $whole caught it, by: ${failed:-a failing run, see below}"
	fi
	[ -n "$failed" ] || tail -n 20 "$log"
}

# fast runs mutation i on the schemata tree: the test binaries built once
# for every schema-able mutation, run with ADVISORYLOCK_MUTANT set to its
# number. It prints CAUGHT and succeeds when the targets catch the
# mutation; otherwise it prints nothing and fails, and the mutation takes
# the classic path (a build of its own), which decides FINDING and MISSED.
fast() {
	local i=$1 name=${names[$1]} log="$scratch/fastlog.$1" p bin listed want gone="" status=0
	local start=$SECONDS
	local -a pkgargs
	read -ra pkgargs <<<"${pkgs[$i]}"
	for p in "${pkgargs[@]}"; do
		listed+=$'\n'$("$scratch/bin/$(binname "$p")" -test.list "${tests[$i]}" 2>/dev/null | grep '^Test' || true)
	done
	for want in $(echo "${tests[$i]}" | tr -d '^$()' | tr '|' ' '); do
		grep -qx "$want" <<<"$listed" || gone+=" $want"
	done
	if [ -n "$gone" ]; then
		echo "DOES NOT APPLY  $name: no test named$gone"
		return 0
	fi
	# The targets run twice at most: first under -short, where their slow
	# ones skip (go test runs a package's tests in file order, not in
	# the order they are named: a fast target that catches the mutation
	# would otherwise wait for a slow one, a soak, before it), then all
	# of them. MUTATE_SHORT_FIRST=0 runs them all at once.
	local pass passes=(-test.short -test.v=false) how=""
	[ "$short" = 0 ] && [ "${MUTATE_SHORT_FIRST:-1}" = 1 ] || passes=(-test.v=false)
	: >"$log"
	for pass in "${passes[@]}"; do
		for p in "${pkgargs[@]}"; do
			bin="$scratch/bin/$(binname "$p")"
			if (cd "$schemata/$p" && ADVISORYLOCK_MUTANT=$((i + 1)) "$bin" "${testflags[@]}" "$pass" -test.failfast -test.run "${tests[$i]}") >>"$log" 2>&1; then
				echo "ok  	$(cat "$bin.path")	(schema)" >>"$log"
			else
				status=1
				echo "FAIL	$(cat "$bin.path")	(schema)" >>"$log"
				break
			fi
		done
		if [ "$status" -ne 0 ]; then
			[ "$pass" = -test.short ] && [ "${#passes[@]}" -gt 1 ] && how=" -short"
			break
		fi
	done
	[ "$status" -ne 0 ] || return 1
	local failed
	failed=$(failures "$log")
	echo "CAUGHT          $name ($((SECONDS - start))s, schema$how) by: ${failed:-a failing run, see below}"
	[ -n "$failed" ] || tail -n 20 "$log"
}

# MUTATE_JOBS mutations run side by side [3], each in its own tree: most
# of a mutation's time is its tests waiting on servers and timers, not
# CPU. Results print in the order of the list as they complete.
jobs=${MUTATE_JOBS:-3}
[ "$dry" -eq 0 ] || jobs=1
todo=()
for i in "${!names[@]}"; do
	[[ "${names[$i]}" =~ $filter ]] || continue
	[ $((i + 1)) -ge "${MUTATE_FROM:-1}" ] || continue
	todo+=("$i")
done
# The schemata: every schema-able mutation compiled into one copy of the
# tree (scripts/schemata), and a test binary built once per package its
# targets are in (a module under extra/ is one package). Those
# scripts/schemata cannot take (see its doc) build their own.
schemata="$scratch/schemata"
schema=()
declare -A why=()
binname() { local p=${1#./}; echo "${p//\//_}.test"; }
testflags=(-test.count=1 -test.timeout=15m -test.paniconexit0)
[ "$short" = 1 ] && testflags+=(-test.short)
if [ "${MUTATE_SCHEMATA:-1}" = 1 ] && [ "${#todo[@]}" -gt 0 ]; then
	mkdir -p "$schemata" "$scratch/bin" "$scratch/mutated"
	(cd "$root" && tar --exclude=.git -cf - .) | (cd "$schemata" && tar -xf -)
	: >"$scratch/manifest"
	for i in "${todo[@]}"; do
		[ -f "$root/${files[$i]}" ] || continue
		m="$scratch/mutated/$((i + 1))"
		cp "$root/${files[$i]}" "$m"
		perl -0pi -e "${edits[$i]}" "$m"
		if ! cmp -s "$m" "$root/${files[$i]}"; then
			printf '%d\t%s\t%s\n' $((i + 1)) "${files[$i]}" "$m" >>"$scratch/manifest"
		fi
	done
	(cd "$root" && go build -o "$scratch/schemata-tool" ./scripts/schemata)
	"$scratch/schemata-tool" -build -tree "$schemata" "$scratch/manifest" >"$scratch/verdicts"
	while IFS=$'\t' read -r id kind detail; do
		if [ "$kind" = schema ]; then schema[$((id - 1))]=1; else why[$((id - 1))]=$detail; fi
	done <"$scratch/verdicts"
	# Build each package the schema-able mutations' targets are in; a
	# package that does not build sends its mutations down the classic path.
	declare -A built=()
	start=$SECONDS
	for i in "${!schema[@]}"; do
		read -ra pkgargs <<<"${pkgs[$i]}"
		for p in "${pkgargs[@]}"; do
			if [ -z "${built[$p]:-}" ] && [ "$dry" -eq 0 ]; then
				bin="$scratch/bin/$(binname "$p")"
				# A module under extra/ (its own go.mod, which replaces the
				# library by ../..) is built from its folder.
				dir=. q=$p
				if [ -f "$root/$p/go.mod" ]; then dir=$p q=.; fi
				if (cd "$schemata/$dir" && go test -c -o "$bin" ${MUTATE_GOFLAGS:-} -vet=off -ldflags=-w "$q" && go list "$q" >"$bin.path") >"$scratch/build.log" 2>&1; then
					built[$p]=ok
				else
					built[$p]=failed
					echo "schemata: $p does not build; its mutations build their own:" >&2
					sed -n 1,20p "$scratch/build.log" >&2
				fi
			fi
			if [ "${built[$p]:-}" = failed ]; then
				unset "schema[$i]"
				why[$i]="the schemata of $p do not build"
			fi
		done
	done
	took=" (built in $((SECONDS - start))s)"
	[ "$dry" -eq 0 ] || took=""
	echo "schemata: ${#schema[@]} of ${#todo[@]} mutations are schema-able$took; the other ${#why[@]} build their own:"
	for r in "${why[@]}"; do echo "$r"; done | sort | uniq -c | sed 's/^/  /'
	# With no mutant, the schemata tree must pass the targets the fast
	# path will run (those of the fast tier, -short; all of them with
	# MUTATE_SANITY=full): the switch must not change what the code does.
	# ADVISORYLOCK_MUTANT=0 is set, not left out: a test that sees the
	# variable (lockrun's pass it on to the lockrun they start) sees it
	# here too.
	# The targets of each package are shared out among runs, MUTATE_JOBS
	# side by side.
	if [ "$dry" -eq 0 ] && [ "${#schema[@]}" -gt 0 ]; then
		start=$SECONDS
		checks=() running=0 sanityflags=("${testflags[@]}")
		[ "${MUTATE_SANITY:-}" = full ] || [ "$short" = 1 ] || sanityflags+=(-test.short)
		for p in "${!built[@]}"; do
			[ "${built[$p]}" = ok ] || continue
			n=0
			declare -A chunk=()
			for i in "${!schema[@]}"; do
				[[ " ${pkgs[$i]} " == *" $p "* ]] || continue
				k=$((n % jobs)) n=$((n + 1))
				chunk[$k]+="${chunk[$k]:+|}${tests[$i]}"
			done
			for k in "${!chunk[@]}"; do
				log="$scratch/sanity.$(binname "$p").$k"
				checks+=("$p $log")
				if [ "$running" -ge "$jobs" ]; then
					wait -n || true
					running=$((running - 1))
				fi
				running=$((running + 1))
				(
					cd "$schemata/$p" && ADVISORYLOCK_MUTANT=0 "$scratch/bin/$(binname "$p")" "${sanityflags[@]}" -test.run "${chunk[$k]}" >"$log" 2>&1 || touch "$log.failed"
				) &
			done
			unset chunk
		done
		wait
		# A test that fails there is run again alone: one that passes then
		# failed for the company it kept (load, the pool), not the switch.
		for check in "${checks[@]}"; do
			read -r p log <<<"$check"
			[ -f "$log.failed" ] || continue
			again=$(grep -o '^--- FAIL: [^ ]*' "$log" | cut -d' ' -f3 | paste -sd'|' || true)
			if [ -n "$again" ] && (cd "$schemata/$p" && ADVISORYLOCK_MUTANT=0 "$scratch/bin/$(binname "$p")" "${sanityflags[@]}" -test.run "^($again)\$") >"$log.again" 2>&1; then
				echo "schemata: with no mutant, $again failed beside the other targets and passed alone"
				continue
			fi
			echo "schemata: with no mutant, targets fail on the schemata tree; the switch changed what the code does:" >&2
			tail -n 40 "$log" >&2
			exit 1
		done
		echo "schemata: with no mutant the targets pass ($((SECONDS - start))s)"
	fi
fi

next=0 # index into todo of the next result to print
flush() {
	while [ "$next" -lt "${#todo[@]}" ] && [ -f "$scratch/done.${todo[$next]}" ]; do
		cat "$scratch/out.${todo[$next]}"
		next=$((next + 1))
	done
}
running=0
for i in "${todo[@]}"; do
	if [ "$running" -ge "$jobs" ]; then
		wait -n || true
		running=$((running - 1))
		flush
	fi
	(
		one "$i" >"$scratch/out.$i" 2>&1 || echo "DOES NOT RUN    ${names[$i]}: the runner failed" >>"$scratch/out.$i"
		rm -rf "$scratch/tree.$i" "$scratch/log.$i"
		touch "$scratch/done.$i"
	) &
	running=$((running + 1))
done
wait
flush

count() { cat "$scratch"/out.* 2>/dev/null | grep -c "^$1" || true; }
caught=$(($(count 'CAUGHT ') + $(count 'FINDING ')))
findings=$(($(count 'FINDING ') + $(count 'CAUGHT BY TIER ')))
missed=$(count 'MISSED ')
slow=$(count 'SLOW TIER ONLY ')
broken=$(($(count 'DOES NOT ')))
if [ "$dry" -eq 0 ]; then
	if [ "$short" = 1 ]; then
		echo "fast tier (-short): caught $caught ($findings only by the whole fast tier), slow tier only $slow, did not apply or build $broken"
	else
		echo "caught $caught ($findings only by the whole suite: findings), missed $missed, did not apply or build $broken"
	fi
fi
[ "$missed" -eq 0 ] && [ "$broken" -eq 0 ]
