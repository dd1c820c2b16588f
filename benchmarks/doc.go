// Package benchmarks measures advisorylock against the SQL it is built on
// and against peer libraries, side by side on one server in one run.
//
// The benchmarks live in the _test.go files of this package; they need a
// PostgreSQL server (ADVISORYLOCK_TEST_POSTGRES, else
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and write SQLite
// files under the test's temporary directory. Run them all, summarize them
// with benchstat and write README.md and handoff.svg with
//
//	go run ./cmd/report          # full run, pinned then unpinned, about 10 minutes on 2 cores
//	go run ./cmd/report -quick   # one pass, for development
//
// This is its own module so that the peers (goose, golang-migrate) never
// enter the library's go.mod.
package benchmarks
