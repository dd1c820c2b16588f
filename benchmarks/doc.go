// Package benchmarks measures advisorylock against the SQL it is built on
// and against peer libraries, side by side on one server in one run.
//
// The benchmarks live in the _test.go files of this package; they need a
// PostgreSQL server (ADVISORYLOCK_TEST_POSTGRES, else
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable) and write SQLite
// files under the test's temporary directory. Run them all, summarize them
// with benchstat and write README.md (the gates, the handoff against the
// peers, the machine, the commands), details.md (every other table) and
// handoff.svg with
//
//	go run ./cmd/report          # full run, pinned then unpinned, about 30 minutes on 2 cores
//	go run ./cmd/report -quick   # one pass, for development
//
// To tell whether a change to the library makes an operation cheaper,
// compare the two versions in one sitting, run by run: on this shared
// machine two runs minutes apart drift by 3% or more, as much as most
// changes gain. Build the benchmarks against each version (the old one in
// a git worktree, ../old here) and alternate the binaries, pinned as the
// report pins (PostgreSQL on CPU 0 with taskset -a -p 0x1, the benchmark
// on CPU 1):
//
//	(cd ../old/benchmarks && go test -c -o /tmp/old.test .) && go test -c -o /tmp/new.test .
//	for i in $(seq 10); do for v in old new; do
//		taskset -c 1 /tmp/$v.test -test.run '^$' -test.benchtime 6000x \
//			-test.bench 'Paired/trylock_release_vs_raw_literal/pq' | grep -o '[0-9.]* x-base' | sed "s/^/$v /"
//	done; done
//
// BenchmarkPeers (peers_test.go) also needs Redis (ADVISORYLOCK_TEST_REDIS,
// else 127.0.0.1:6379; .ci/run starts one where none answers) and
// MariaDB (ADVISORYLOCK_TEST_MYSQL), and starts an etcd server of its own
// in the test process.
//
// This is its own module so that the peers (goose, golang-migrate,
// redislock, redsync, etcd) never enter the library's go.mod.
package benchmarks
