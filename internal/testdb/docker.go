package testdb

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// startDocker runs a postgres:15 container (trust auth, published on
// 127.0.0.1 only) when a Docker daemon answers, and returns its DSN and a
// function that removes it.
func startDocker(t testing.TB) (dsn string, stop func(), err error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return "", nil, err
	}
	pool.Client.SetTimeout(5 * time.Second)
	closeIdle := func() {
		if pool.Client.HTTPClient != nil {
			pool.Client.HTTPClient.CloseIdleConnections()
		}
	}
	if err := pool.Client.Ping(); err != nil {
		closeIdle()
		return "", nil, fmt.Errorf("no Docker daemon answers (%v)", err)
	}
	pool.Client.SetTimeout(0)
	pool.MaxWait = 2 * time.Minute
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres",
		Tag:        "15",
		Env:        []string{"POSTGRES_HOST_AUTH_METHOD=trust", "POSTGRES_DB=" + defaultDatabase},
		PortBindings: map[dc.Port][]dc.PortBinding{
			"5432/tcp": {{HostIP: "127.0.0.1", HostPort: ""}},
		},
	}, func(hc *dc.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = dc.RestartPolicy{Name: "no"}
	})
	if err != nil {
		closeIdle()
		return "", nil, fmt.Errorf("starting postgres:15: %w", err)
	}
	_ = res.Expire(3600)
	stop = func() {
		_ = pool.Purge(res)
		closeIdle()
	}
	port := res.GetPort("5432/tcp")
	dsn = urlDSN("postgres", net.JoinHostPort("127.0.0.1", port), defaultDatabase)
	if err := pool.Retry(func() error { return pingDSN(dsn) }); err != nil {
		stop()
		return "", nil, fmt.Errorf("postgres:15 container did not answer: %w", err)
	}
	t.Logf("testdb: started a postgres:15 container at %s", dsn)
	return dsn, stop, nil
}
