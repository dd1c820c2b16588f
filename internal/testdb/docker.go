package testdb

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// startDocker runs a postgres:15 container (trust auth, published on
// 127.0.0.1 only) when a Docker daemon answers, and returns its DSN and a
// function that removes it. It drives the docker command (which honours
// DOCKER_HOST) rather than a client library, so that the module's users
// never carry Docker's dependencies in their module graph.
func startDocker(t testing.TB) (dsn string, stop func(), err error) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return "", nil, fmt.Errorf("no Docker daemon answers (no docker command: %w)", err)
	}
	run := func(timeout time.Duration, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, docker, args...)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("docker %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
		}
		return strings.TrimSpace(string(out)), nil
	}
	if _, err := run(5*time.Second, "version", "--format", "{{.Server.Version}}"); err != nil {
		return "", nil, fmt.Errorf("no Docker daemon answers (%w)", err)
	}
	id, err := run(2*time.Minute, "run", "--detach", "--rm", "--restart=no",
		"--env", "POSTGRES_HOST_AUTH_METHOD=trust", "--env", "POSTGRES_DB="+defaultDatabase,
		"--publish", "127.0.0.1::5432", "postgres:15")
	if err != nil {
		return "", nil, fmt.Errorf("starting postgres:15: %w", err)
	}
	stop = func() { _, _ = run(30*time.Second, "rm", "--force", id) }
	ports, err := run(10*time.Second, "port", id, "5432/tcp")
	if err != nil {
		stop()
		return "", nil, err
	}
	hostPort, _, _ := strings.Cut(ports, "\n") // "127.0.0.1:49153"
	dsn = urlDSN("postgres", hostPort, defaultDatabase)
	// The server restarts once inside the container after initdb: poll
	// until it answers, for as long as a first image pull may take.
	deadline := time.Now().Add(2 * time.Minute)
	for err = pingDSN(dsn); err != nil; err = pingDSN(dsn) {
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("postgres:15 container did not answer: %w", err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("testdb: started a postgres:15 container at %s", dsn)
	return dsn, stop, nil
}
