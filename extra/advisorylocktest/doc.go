// Package advisorylocktest tests code that takes advisorylock locks
// without a database server: go-sqlmock expectations said as intents (a
// try that wins, one that loses, a wait that is granted, a release), for
// each built-in backend, and Memory, an in-memory backend for tests that
// want no mock at all.
//
// The expectations spell the library's statements so that tests do not.
// This module's own tests run the real library through every one of them,
// so a change to a statement of the library fails here, and changes here,
// before it reaches a user's mocks.
package advisorylocktest
