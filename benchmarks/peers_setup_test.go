package benchmarks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/advisorylock/advisorylock"
)

// envRedis names the Redis server (host:port) the Redis peers run against.
// It is never skipped: .ci/run starts one where none answers.
const envRedis = "ADVISORYLOCK_TEST_REDIS"

// Redis peers' settings. Neither library waits in the server: a taken
// name is polled. redislock does not retry by default (its Obtain misses
// at once) and redsync retries 32 times after a random 50–250 ms; both
// poll here every redisRetry, the period at which advisorylock's own
// pollers (LeaseLock, SQLite) and goose's table locker run in these
// benchmarks, so that pollers compare like for like. A wait lasts up to
// redisTTL (redislock's own bound when the context has no deadline), and
// a lock expires after redisTTL, longer than any hold here.
const (
	redisRetry = libraryPoll
	redisTTL   = 30 * time.Second
)

// redisAddr returns the Redis server's address.
func redisAddr() string {
	if a := os.Getenv(envRedis); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// openRedis returns a client of the Redis server with a pool of 64
// connections, and closes it at cleanup.
func openRedis(b *testing.B) *redis.Client {
	cli := redis.NewClient(&redis.Options{Addr: redisAddr(), PoolSize: 64})
	b.Cleanup(func() { _ = cli.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := cli.Ping(ctx).Err(); err != nil {
		b.Fatalf("no Redis at %s (set %s; .ci/run starts one): %v", redisAddr(), envRedis, err)
	}
	return cli
}

// peerLock is one name of one library: a single attempt (errNotGranted
// when the name is taken) and a wait until granted, each returning the
// release. Both may be called from any goroutine, for a name no other
// goroutine of the same client uses at the same time.
type peerLock struct {
	try  func(ctx context.Context) (release func(context.Context) error, err error)
	lock func(ctx context.Context) (release func(context.Context) error, err error)
}

// peer is one row of the peer benchmarks: a library, or advisorylock in
// one mode on one engine. open sets up a client (a handle, a Redis client,
// an etcd session) for b and returns the lock of a name on it; probe, if
// set, returns a waitProbe of name's waiters (nil for pollers).
type peer struct {
	name      string
	holdsMany bool // whether it holds many names without a connection each (the held-names rows run only those)
	open      func(b *testing.B) func(name string) peerLock
	probe     func(b *testing.B, name string) waitProbe
}

// peerMux is the multiplexed mode of the peer rows (4 shared sessions,
// from a pool of peerMuxPool), and peerPinned the pinned one (a
// connection per held lock, from a pool of peerPinnedPool: the 32
// goroutines of the throughput rows wait for it in turn; an unlimited
// pool would take 64 of the shared server's 100 connections). peerMux is
// New's default, named so that the row says what it measures.
var (
	peerMux        = []advisorylock.Option{advisorylock.WithMultiplexing(4)}
	peerPinned     = []advisorylock.Option{advisorylock.WithMultiplexing(0)}
	peerMuxPool    = 8
	peerPinnedPool = 16
)

// peers are the rows, redislock first: ratios are to it.
var peers = []peer{
	{"redislock", true, openRedislock, nil},
	{"redsync", true, openRedsync, nil},
	{"etcd", true, openEtcdMutex, etcdProbe},
	{"pq-pinned", false, openAdvisoryLock("pq", false), pgProbe},
	{"pq-mux", true, openAdvisoryLock("pq", true), pgProbe},
	{"pgx-pinned", false, openAdvisoryLock("pgx", false), pgProbe},
	{"pgx-mux", true, openAdvisoryLock("pgx", true), pgProbe},
	{"mysql-pinned", false, openAdvisoryLock("mysql", false), mysqlQueuedOn},
	{"mysql-mux", true, openAdvisoryLock("mysql", true), mysqlQueuedOn},
}

func pgProbe(b *testing.B, name string) waitProbe { return queuedOn(b, advisorylock.Key(name)) }

// openAdvisoryLock returns the opener of advisorylock Locks on engine,
// multiplexed (peerMux, a pool of peerMuxPool) or pinned (peerPinned, a
// pool of peerPinnedPool).
func openAdvisoryLock(engine string, mux bool) func(b *testing.B) func(name string) peerLock {
	pool, opts := peerPinnedPool, peerPinned
	if mux {
		pool, opts = peerMuxPool, peerMux
	}
	return func(b *testing.B) func(name string) peerLock {
		db := openEngine(b, engine, pool)
		if engine == "mysql" {
			mysqlReady(b)
		}
		warm(b, db, 4)
		if mux {
			muxAnchor(b, db, opts...)
		}
		return func(name string) peerLock {
			l := newLock(b, db, name, opts...)
			return peerLock{
				try: func(ctx context.Context) (func(context.Context) error, error) {
					g, err := l.TryLock(ctx)
					if errors.Is(err, advisorylock.ErrNotAcquired) {
						return nil, errNotGranted
					}
					if err != nil {
						return nil, err
					}
					return g.Release, nil
				},
				lock: func(ctx context.Context) (func(context.Context) error, error) {
					g, err := l.Lock(ctx)
					if err != nil {
						return nil, err
					}
					return g.Release, nil
				},
			}
		}
	}
}

// openRedislock returns the opener of bsm/redislock locks.
func openRedislock(b *testing.B) func(name string) peerLock {
	rl := redislock.New(openRedis(b))
	retry := &redislock.Options{RetryStrategy: redislock.LinearBackoff(redisRetry)}
	obtain := func(ctx context.Context, key string, opt *redislock.Options) (func(context.Context) error, error) {
		l, err := rl.Obtain(ctx, key, redisTTL, opt)
		if errors.Is(err, redislock.ErrNotObtained) {
			return nil, errNotGranted
		}
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
	return func(name string) peerLock {
		return peerLock{
			try:  func(ctx context.Context) (func(context.Context) error, error) { return obtain(ctx, name, nil) },
			lock: func(ctx context.Context) (func(context.Context) error, error) { return obtain(ctx, name, retry) },
		}
	}
}

// openRedsync returns the opener of go-redsync mutexes on one Redis
// server (a quorum of one). A redsync Mutex keeps the value of its grant,
// so each acquire makes a new one, as concurrent users of one name must.
func openRedsync(b *testing.B) func(name string) peerLock {
	rs := redsync.New(goredis.NewPool(openRedis(b)))
	release := func(m *redsync.Mutex) func(context.Context) error {
		return func(ctx context.Context) error {
			ok, err := m.UnlockContext(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("redsync: %s was not held at its unlock", m.Name())
			}
			return err
		}
	}
	return func(name string) peerLock {
		return peerLock{
			try: func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(name, redsync.WithExpiry(redisTTL))
				err := m.TryLockContext(ctx)
				var taken *redsync.ErrTaken
				if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) {
					return nil, errNotGranted
				}
				if err != nil {
					return nil, err
				}
				return release(m), nil
			},
			lock: func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(name, redsync.WithExpiry(redisTTL), redsync.WithRetryDelay(redisRetry),
					redsync.WithTries(int(redisTTL/redisRetry)))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return release(m), nil
			},
		}
	}
}

// openEtcdMutex returns the opener of etcd concurrency.Mutexes, all on
// one session (one lease) of a client of the embedded server. A Mutex
// keeps its key, so each acquire makes a new one; its waits are
// server-side (a watch on the key ahead of it).
func openEtcdMutex(b *testing.B) func(name string) peerLock {
	cli := openEtcd(b)
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(60))
	must(b, err, "etcd session")
	b.Cleanup(func() { _ = s.Close() })
	return func(name string) peerLock {
		pfx := etcdPrefix(name)
		return peerLock{
			try: func(ctx context.Context) (func(context.Context) error, error) {
				m := concurrency.NewMutex(s, pfx)
				err := m.TryLock(ctx)
				if errors.Is(err, concurrency.ErrLocked) {
					return nil, errNotGranted
				}
				if err != nil {
					return nil, err
				}
				return m.Unlock, nil
			},
			lock: func(ctx context.Context) (func(context.Context) error, error) {
				m := concurrency.NewMutex(s, pfx)
				if err := m.Lock(ctx); err != nil {
					return nil, err
				}
				return m.Unlock, nil
			},
		}
	}
}

// etcdPrefix is the key prefix of name's etcd mutex.
func etcdPrefix(name string) string { return "/advisorylock-bench/" + name }

// etcdProbe counts name's etcd mutex keys: the holder's and one per
// waiter, each made as its Lock starts waiting.
func etcdProbe(b *testing.B, name string) waitProbe {
	cli := openEtcd(b)
	pfx := etcdPrefix(name) + "/"
	return func(ctx context.Context, rivals int) (bool, error) {
		resp, err := cli.Get(ctx, pfx, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err
		}
		return resp.Count >= int64(1+rivals), nil
	}
}

// openEtcd returns a client of the embedded etcd server, and closes it at
// cleanup.
func openEtcd(b *testing.B) *clientv3.Client {
	endpoint, err := etcdServer()
	must(b, err, "start the embedded etcd server")
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: setupTimeout})
	must(b, err, "etcd client")
	b.Cleanup(func() { _ = cli.Close() })
	return cli
}

// The embedded etcd server: one per process, started by the first
// benchmark that needs it and stopped by TestMain (stopEtcd).
var etcd struct {
	once     sync.Once
	e        *embed.Etcd
	dir      string
	endpoint string
	err      error
}

// etcdServer starts the embedded etcd server (a one-member cluster on
// loopback, data in a temporary directory, fsync on as in production)
// once, and returns its client URL.
func etcdServer() (string, error) {
	etcd.once.Do(func() {
		etcd.endpoint, etcd.err = startEtcd()
	})
	return etcd.endpoint, etcd.err
}

func startEtcd() (string, error) {
	dir, err := os.MkdirTemp("", "advisorylock-bench-etcd")
	if err != nil {
		return "", err
	}
	etcd.dir = dir
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
	clientURL := url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))}
	cfg := embed.NewConfig()
	cfg.Name = "bench"
	cfg.Dir = dir
	cfg.LogLevel = "fatal" // its Close logs errors of its own listeners' closing
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", fmt.Errorf("start etcd: %w", err)
	}
	etcd.e = e
	select {
	case <-e.Server.ReadyNotify():
		return clientURL.String(), nil
	case err := <-e.Err():
		return "", fmt.Errorf("etcd: %w", err)
	case <-time.After(setupTimeout):
		return "", fmt.Errorf("etcd was not ready within %v", setupTimeout)
	}
}

// stopEtcd stops the embedded etcd server, if one started, and removes
// its data.
func stopEtcd() {
	if etcd.e != nil {
		etcd.e.Close()
	}
	if etcd.dir != "" {
		_ = os.RemoveAll(etcd.dir)
	}
}

// freePorts returns n loopback TCP ports free right now.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopEtcd()
	os.Exit(code)
}
