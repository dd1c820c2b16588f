package testdb

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer accepts connections on 127.0.0.1 and echoes lines back until
// the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

type lineConn struct {
	net.Conn
	r *bufio.Reader
}

func dialLine(t *testing.T, addr string) *lineConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, DefaultWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &lineConn{Conn: c, r: bufio.NewReader(c)}
}

func (c *lineConn) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
}

func (c *lineConn) recv(t *testing.T) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(DefaultWait))
	s, err := c.r.ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return s[:len(s)-1]
}

func TestProxyForwardsBothWays(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	a, b := dialLine(t, p.Addr()), dialLine(t, p.Addr())
	a.send(t, "hello")
	b.send(t, "world")
	if got := a.recv(t); got != "hello" {
		t.Fatalf("a got %q", got)
	}
	if got := b.recv(t); got != "world" {
		t.Fatalf("b got %q", got)
	}
}

func TestProxyCutHoldsBytesUntilHeal(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	old := dialLine(t, p.Addr())
	old.send(t, "before")
	if got := old.recv(t); got != "before" {
		t.Fatalf("got %q", got)
	}

	p.Cut()
	fresh := dialLine(t, p.Addr()) // accepted during the cut
	old.send(t, "during")
	fresh.send(t, "new")
	WaitFor(t, 0, func() bool { return p.Held() == 2 }, "both writes held by the cut, have %d", p.Held())

	// Nothing can come back while the cut holds both requests.
	_ = old.SetReadDeadline(time.Now())
	if _, err := old.r.ReadByte(); !isTimeout(err) {
		t.Fatalf("read during cut: got %v, want a timeout", err)
	}

	p.Heal()
	if got := old.recv(t); got != "during" {
		t.Fatalf("old got %q after heal", got)
	}
	if got := fresh.recv(t); got != "new" {
		t.Fatalf("fresh got %q after heal", got)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyResetClosesConnections(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	c := dialLine(t, p.Addr())
	c.send(t, "x")
	c.recv(t)
	p.Reset()
	_ = c.SetReadDeadline(time.Now().Add(DefaultWait))
	if _, err := c.r.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("read after reset: got %v, want EOF or connection reset", err)
	}
	// The proxy still serves new connections.
	d := dialLine(t, p.Addr())
	d.send(t, "y")
	if got := d.recv(t); got != "y" {
		t.Fatalf("got %q", got)
	}
}

func TestProxyCloseEndsHeldConnections(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	c := dialLine(t, p.Addr())
	p.Cut()
	c.send(t, "held")
	WaitFor(t, 0, func() bool { return p.Held() == 1 }, "write not held")
	p.Close() // returns only once every proxy goroutine has exited
	_ = c.SetReadDeadline(time.Now().Add(DefaultWait))
	if _, err := c.r.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("read after close: got %v, want EOF or reset", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
	p.Close()
}

func TestProxyUnreachableTargetClosesClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	_ = ln.Close()
	p := NewProxy(t, dead)
	c := dialLine(t, p.Addr())
	_ = c.SetReadDeadline(time.Now().Add(DefaultWait))
	if _, err := c.r.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("got %v, want the connection closed", err)
	}
}

// serverStream builds a server->client byte stream of typed messages.
func serverStream(types string) []byte {
	var b []byte
	for i, ty := range []byte(types) {
		body := make([]byte, i%3*7) // vary the lengths
		b = append(b, ty, 0, 0, 0, byte(4+len(body)))
		b = append(b, body...)
	}
	return b
}

func TestObserveServerCountsReadyForQueryAcrossChunkBoundaries(t *testing.T) {
	stream := serverStream("RSSKZCZTDDCZ")
	for size := 1; size <= len(stream); size++ {
		pc := &proxyConn{}
		var n atomic.Int64
		for i := 0; i < len(stream); i += size {
			pc.observeServer(stream[i:min(i+size, len(stream))], &n)
		}
		if got := n.Load(); got != 3 {
			t.Fatalf("chunk size %d: counted %d, want 3", size, got)
		}
	}
}

func TestObserveSkipsSingleByteSSLAnswer(t *testing.T) {
	sslRequest := []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}
	startup := []byte{0, 0, 0, 9, 0, 3, 0, 0, 0}
	pc := &proxyConn{}
	client := append(append([]byte{}, sslRequest...), startup...)
	for _, b := range client { // byte by byte
		pc.observeClient([]byte{b})
	}
	if got := pc.pendingSingles.Load(); got != 1 {
		t.Fatalf("pending single-byte answers = %d, want 1", got)
	}
	// 'Z' as the lone answer byte would be miscounted if not skipped.
	var n atomic.Int64
	pc.observeServer(append([]byte{'N'}, serverStream("RZ")...), &n)
	if n.Load() != 1 {
		t.Fatalf("counted %d, want 1", n.Load())
	}

	tls := &proxyConn{}
	tls.observeClient(sslRequest)
	tls.observeServer(append([]byte{'S'}, serverStream("ZZZ")...), &n)
	if n.Load() != 1 || !tls.sOpaque {
		t.Fatalf("after 'S' the stream is TLS and must not be parsed: count %d", n.Load())
	}
}

// TestProxyCutBlocksQueryUntilHeal runs a real query through a cut proxy.
func TestProxyCutBlocksQueryUntilHeal(t *testing.T) {
	dsn := PostgresDSN(t)
	p := NewProxy(t, HostPort(t, dsn))
	for _, driver := range Drivers {
		t.Run(driver, func(t *testing.T) {
			db := OpenPostgresDSN(t, driver, p.DSN(dsn))
			db.SetMaxOpenConns(1)
			p.Cut()
			done := make(chan error, 1)
			go func() {
				var one int
				done <- db.QueryRowContext(context.Background(), "SELECT 1").Scan(&one)
			}()
			WaitFor(t, 0, func() bool { return p.Held() > 0 }, "query never reached the proxy")
			select {
			case err := <-done:
				t.Fatalf("query finished during the cut: %v", err)
			default:
			}
			p.Heal()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("query after heal: %v", err)
				}
			case <-time.After(DefaultWait):
				t.Fatal("query still blocked after heal")
			}
		})
	}
}

func TestRoundTripsCountsLibPQMessages(t *testing.T) {
	dsn := PostgresDSN(t)
	p := NewProxy(t, HostPort(t, dsn))
	db := OpenPostgresDSN(t, "postgres", p.DSN(dsn))
	db.SetMaxOpenConns(1)
	ctx := context.Background()

	p.ResetCount()
	var n int
	if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if got := p.RoundTrips(); got != 1 {
		t.Errorf("SELECT 1 (simple query): %d round trips, want 1", got)
	}

	p.ResetCount()
	if err := db.QueryRowContext(ctx, "SELECT $1::int", 7).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if got := p.RoundTrips(); got != 2 {
		t.Errorf("SELECT $1::int (parse, then bind/execute): %d round trips, want 2", got)
	}
}

func TestRoundTripsCountsStartupAcrossConnections(t *testing.T) {
	dsn := PostgresDSN(t)
	p := NewProxy(t, HostPort(t, dsn))
	for i := 0; i < 3; i++ {
		// sql.Open is lazy: the ping makes the connection, whose startup
		// ends in a ReadyForQuery; lib/pq's ping is one more round trip.
		OpenPostgresDSN(t, "postgres", p.DSN(dsn))
	}
	if got := p.RoundTrips(); got != 6 {
		t.Fatalf("3 connections with a ping each: %d round trips, want 6", got)
	}
}

// TestProxyCutHidesClientClose checks the server keeps a session whose
// client went away during a partition, until the partition heals.
func TestProxyCutHidesClientClose(t *testing.T) {
	dsn := PostgresDSN(t)
	p := NewProxy(t, HostPort(t, dsn))
	observer := OpenPostgres(t, "postgres")
	client, err := sql.Open("pgx", p.DSN(dsn))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var pid int
	if err := client.QueryRow("SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	alive := func() bool {
		var n int
		if err := observer.QueryRow(fmt.Sprintf("SELECT count(*) FROM pg_stat_activity WHERE pid = %d", pid)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	p.Cut()
	_ = client.Close()
	WaitFor(t, 0, func() bool { return p.Held() == 1 }, "client's goodbye not held by the cut")
	if !alive() {
		t.Fatal("backend ended while the cut hid the client's close")
	}
	p.Heal()
	WaitFor(t, 0, func() bool { return !alive() }, "backend %d still there after heal", pid)
}

func TestProxyDelayHoldsAnswersBack(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	c := dialLine(t, p.Addr())
	const d = 300 * time.Millisecond
	p.SetDelay(d)
	start := time.Now()
	c.send(t, "slow")
	if got := c.recv(t); got != "slow" {
		t.Fatalf("got %q", got)
	}
	if took := time.Since(start); took < d {
		t.Fatalf("answer came back after %v, before the %v delay", took, d)
	}
	p.SetDelay(0)
	c.send(t, "fast")
	if got := c.recv(t); got != "fast" {
		t.Fatalf("got %q after the delay ended", got)
	}
}

// greeter accepts connections on 127.0.0.1 and writes line to each, until
// the test ends.
func greeter(t *testing.T, line string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, line+"\n")
			_ = c.Close()
		}
	})
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

func TestProxyRetargetMovesNewConnectionsOnly(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	old := dialLine(t, p.Addr())
	old.send(t, "x")
	if got := old.recv(t); got != "x" {
		t.Fatalf("got %q", got)
	}
	p.Retarget(greeter(t, "moved"))
	if got := dialLine(t, p.Addr()).recv(t); got != "moved" {
		t.Fatalf("a new connection after Retarget got %q, want the new target's greeting", got)
	}
	old.send(t, "y")
	if got := old.recv(t); got != "y" {
		t.Fatalf("the connection opened before Retarget got %q, want its old target's echo", got)
	}
}
