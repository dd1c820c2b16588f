package benchmarks

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// countingProxy forwards TCP connections to a PostgreSQL server and counts
// the ReadyForQuery ('Z') messages the server sends: each one ends a
// client/server round trip. It assumes sslmode=disable (no TLS to parse).
type countingProxy struct {
	ln     net.Listener
	rounds atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

// startProxy listens on 127.0.0.1 in front of target and stops at cleanup.
func startProxy(tb testing.TB, target string) *countingProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("proxy: %v", err)
	}
	p := &countingProxy{ln: ln}
	p.wg.Add(1)
	go p.accept(target)
	tb.Cleanup(p.close)
	return p
}

func (p *countingProxy) addr() string      { return p.ln.Addr().String() }
func (p *countingProxy) roundTrips() int64 { return p.rounds.Load() }
func (p *countingProxy) resetCount()       { p.rounds.Store(0) }

func (p *countingProxy) accept(target string) {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(server, client)
			_ = server.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.countFrom(server, client)
			_ = client.Close()
		}()
	}
}

// countFrom copies server messages to the client, counting ReadyForQuery
// before forwarding it, so the count is current when the client has its
// answer.
func (p *countingProxy) countFrom(server, client net.Conn) {
	r := bufio.NewReaderSize(server, 64<<10)
	var head [5]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		if head[0] == 'Z' {
			p.rounds.Add(1)
		}
		if _, err := client.Write(head[:]); err != nil {
			return
		}
		n := int64(binary.BigEndian.Uint32(head[1:])) - 4
		if _, err := io.CopyN(client, r, n); err != nil {
			return
		}
	}
}

func (p *countingProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
