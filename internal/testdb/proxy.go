package testdb

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on 127.0.0.1 in front of one target address. It can
// simulate a network partition (Cut, Heal), kill connections (Reset), and
// counts the PostgreSQL round trips that pass through it (RoundTrips).
//
// Each accepted connection is served by one goroutine and its two copying
// goroutines; Close ends them all before it returns.
type Proxy struct {
	ln     net.Listener
	ctx    context.Context // cancelled by Close: aborts dials in progress
	cancel context.CancelFunc
	wg     sync.WaitGroup

	rounds atomic.Int64 // ReadyForQuery messages forwarded to clients (MySQL: commands)
	mysql  bool         // count MySQL commands instead (see NewMySQLProxy)
	held   atomic.Int64 // chunks read but held back by a cut
	delay  atomic.Int64 // nanoseconds each server->client chunk is held back

	mu     sync.Mutex
	target string // where new connections go (see Retarget)
	cut    bool
	healed chan struct{} // closed while not cut
	conns  map[*proxyConn]struct{}
	closed bool
}

// NewProxy starts a proxy in front of target ("host:port") and closes it at
// t.Cleanup.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: proxy listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	healed := make(chan struct{})
	close(healed)
	p := &Proxy{target: target, ln: ln, ctx: ctx, cancel: cancel, healed: healed, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's listening address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// DSN returns dsn pointed at the proxy.
func (p *Proxy) DSN(dsn string) string { return WithHostPort(dsn, p.Addr()) }

// Retarget sends the connections the proxy accepts from now on to target
// ("host:port") instead, as a virtual IP moved to a promoted standby
// would; connections already open stay with the old target (Reset ends
// them).
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
}

// Cut stops forwarding bytes in both directions, on existing connections and
// on new ones, while keeping every socket open, as a network partition
// would: a side that closes its connection during the cut is not seen to
// close by the other side until Heal. New connections are still accepted
// (the kernel completes the handshake) but their bytes go nowhere until
// Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.cut {
		p.cut = true
		p.healed = make(chan struct{})
	}
}

// Heal resumes forwarding. Bytes sent during the cut are delivered late,
// as TCP would retransmit them once a partition ends; connections whose
// peer gave up in the meantime are simply closed.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		p.cut = false
		close(p.healed)
	}
}

// SetDelay holds back every chunk the server sends for d before passing
// it on (0 ends the delay): a slow network on the way back, so an answer
// arrives d after the server gave it. Order is kept; chunks already
// waiting keep the delay they started with.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Reset closes every current connection abruptly (with a TCP reset), on
// both sides. The proxy keeps accepting new ones.
func (p *Proxy) Reset() {
	for _, pc := range p.takeConns(false) {
		pc.shut(true)
	}
}

// Close stops accepting, closes every connection and waits for all of the
// proxy's goroutines to exit. It is safe to call more than once.
func (p *Proxy) Close() {
	conns := p.takeConns(true)
	p.cancel()
	_ = p.ln.Close()
	for _, pc := range conns {
		pc.shut(true)
	}
	p.wg.Wait()
}

// RoundTrips returns how many ReadyForQuery ('Z') messages servers sent
// through the proxy, over all its connections, since it started or since
// the last ResetCount. Each is the end of one client/server round trip.
// A message is counted before it is forwarded, so the count is current by
// the time the client has its answer.
func (p *Proxy) RoundTrips() int64 { return p.rounds.Load() }

// ResetCount sets RoundTrips back to zero.
func (p *Proxy) ResetCount() { p.rounds.Store(0) }

// Held reports how many reads a cut holds back, waiting for Heal: above
// zero once a statement was sent into the cut, so a test can wait for a
// statement in flight on a dead network.
func (p *Proxy) Held() int64 { return p.held.Load() }

func (p *Proxy) takeConns(closing bool) []*proxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	if closing {
		p.closed = true
	}
	conns := make([]*proxyConn, 0, len(p.conns))
	for pc := range p.conns {
		conns = append(conns, pc)
	}
	return conns
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		pc := &proxyConn{client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.conns[pc] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(pc)
	}
}

// serve dials the target and copies both ways until either side ends or
// the connection is shut.
func (p *Proxy) serve(pc *proxyConn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, pc)
		p.mu.Unlock()
		pc.shut(false)
	}()
	p.mu.Lock()
	target := p.target
	p.mu.Unlock()
	d := net.Dialer{Timeout: 10 * time.Second}
	server, err := d.DialContext(p.ctx, "tcp", target)
	if err != nil {
		return
	}
	if !pc.setServer(server) {
		return
	}
	var copiers sync.WaitGroup
	copiers.Add(2)
	go func() {
		defer copiers.Done()
		observe := pc.observeClient
		if p.mysql {
			observe = func(b []byte) { pc.observeMySQLClient(b, &p.rounds) }
		}
		p.pump(pc, pc.client, server, observe)
		pc.shut(false)
	}()
	go func() {
		defer copiers.Done()
		p.pump(pc, server, pc.client, func(b []byte) {
			p.hold(pc)
			if !p.mysql {
				pc.observeServer(b, &p.rounds)
			}
		})
		pc.shut(false)
	}()
	copiers.Wait()
}

// pump copies src to dst, holding each chunk while the proxy is cut.
func (p *Proxy) pump(pc *proxyConn, src, dst net.Conn, observe func([]byte)) {
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitHealed(pc) {
				return
			}
			observe(buf[:n])
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			// A partition hides the close too: the other side learns of it
			// only once the cut heals.
			p.waitHealed(pc)
			return
		}
	}
}

// waitHealed blocks while the proxy is cut; it reports false if the
// connection was shut meanwhile.
func (p *Proxy) waitHealed(pc *proxyConn) bool {
	p.mu.Lock()
	healed := p.healed
	p.mu.Unlock()
	select {
	case <-healed:
		return true
	default:
	}
	p.held.Add(1)
	defer p.held.Add(-1)
	select {
	case <-healed:
		return true
	case <-pc.done:
		return false
	}
}

// hold sleeps for the delay set by SetDelay, or until pc is shut.
func (p *Proxy) hold(pc *proxyConn) {
	d := time.Duration(p.delay.Load())
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-pc.done:
	}
}

// PostgreSQL protocol codes of the untyped messages a client may send first.
const (
	codeCancelRequest = 80877102
	codeSSLRequest    = 80877103
	codeGSSENCRequest = 80877104
)

// proxyConn is one proxied connection. The client-side parser state (c*)
// belongs to the client->server copier, the server-side state (s*) to the
// server->client copier; pendingSingles links them.
type proxyConn struct {
	client net.Conn
	done   chan struct{}

	mu     sync.Mutex
	server net.Conn
	isShut bool

	// pendingSingles counts SSLRequest/GSSENCRequest messages whose one-byte
	// answer the server has yet to send. The client copier increments it
	// before forwarding the request, so the server copier sees it first.
	pendingSingles atomic.Int32

	cDone bool   // the client's startup phase is over
	cHdr  []byte // partial 8-byte untyped header
	cSkip int    // bytes of the current client message still to skip

	sOpaque bool   // stream encrypted or not understood: stop parsing
	sHdr    []byte // partial 5-byte typed header
	sSkip   int    // bytes of the current server message still to skip

	mHdr     []byte // partial 4-byte MySQL packet header (client side)
	mSkip    int    // bytes of the current MySQL client packet still to skip
	mCommand bool   // the current MySQL client packet starts a command
}

func (pc *proxyConn) setServer(server net.Conn) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.isShut {
		_ = server.Close()
		return false
	}
	pc.server = server
	return true
}

// shut closes both sides once; abrupt makes the close send a TCP reset.
func (pc *proxyConn) shut(abrupt bool) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.isShut {
		return
	}
	pc.isShut = true
	close(pc.done)
	for _, c := range []net.Conn{pc.client, pc.server} {
		if c == nil {
			continue
		}
		if tc, ok := c.(*net.TCPConn); ok && abrupt {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
}

// observeClient follows the client's untyped startup messages: each
// SSLRequest or GSSENCRequest means one single-byte answer will come before
// the server's typed messages. Parsing stops at the StartupMessage.
func (pc *proxyConn) observeClient(b []byte) {
	for len(b) > 0 && !pc.cDone {
		if pc.cSkip > 0 {
			k := min(pc.cSkip, len(b))
			pc.cSkip -= k
			b = b[k:]
			continue
		}
		take := min(8-len(pc.cHdr), len(b))
		pc.cHdr = append(pc.cHdr, b[:take]...)
		b = b[take:]
		if len(pc.cHdr) < 8 {
			return
		}
		length := int(binary.BigEndian.Uint32(pc.cHdr[:4]))
		code := binary.BigEndian.Uint32(pc.cHdr[4:])
		pc.cHdr = pc.cHdr[:0]
		pc.cSkip = max(length-8, 0)
		switch code {
		case codeSSLRequest, codeGSSENCRequest:
			pc.pendingSingles.Add(1)
		case codeCancelRequest:
			pc.cDone = true
		default:
			pc.cDone = true
		}
	}
}

// observeServer frames the server's stream (1-byte type, int32 length that
// counts itself) and counts ReadyForQuery messages into rounds.
func (pc *proxyConn) observeServer(b []byte, rounds *atomic.Int64) {
	for len(b) > 0 && !pc.sOpaque {
		if pc.sSkip > 0 {
			k := min(pc.sSkip, len(b))
			pc.sSkip -= k
			b = b[k:]
			continue
		}
		if len(pc.sHdr) == 0 && pc.pendingSingles.Load() > 0 {
			pc.pendingSingles.Add(-1)
			if b[0] != 'N' { // 'S' or 'G': TLS or GSS encryption follows
				pc.sOpaque = true
				return
			}
			b = b[1:]
			continue
		}
		take := min(5-len(pc.sHdr), len(b))
		pc.sHdr = append(pc.sHdr, b[:take]...)
		b = b[take:]
		if len(pc.sHdr) < 5 {
			return
		}
		typ := pc.sHdr[0]
		length := int(binary.BigEndian.Uint32(pc.sHdr[1:]))
		pc.sHdr = pc.sHdr[:0]
		if length < 4 {
			pc.sOpaque = true
			return
		}
		if typ == 'Z' {
			rounds.Add(1)
		}
		pc.sSkip = length - 4
	}
}
