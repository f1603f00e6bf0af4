// share.go lets the processes that write one store file send their writes
// to one of them, the file's writer, over a Unix socket beside the file.
//
// Why: processes that each commit on their own pass the file's write lock
// back and forth at every commit, and each commit drops every other
// process's page cache, so a write costs several times what it costs one
// process, and each process's batches stay small. The writer runs every
// process's writes in its group commit (writer.go) as if they were its
// own. Reads and change streams stay in each process, on the file.
//
// Safety does not rest on the writer. Every transaction, the writer's
// included, still takes the file's write lock; a process writes the file
// itself whenever no writer is connected. A request carries a deadline
// after which the writer refuses it unapplied, checked inside the write
// transaction (runBatch); a client that had no answer by then takes the
// write lock once, after which its request is committed or never will be,
// and reads the file to learn which (shareforward.go). So a write
// forwarded to a writer that dies, freezes or closes is applied at most
// once and its caller learns the outcome, as with a write of its own.
//
// Roles: of the Stores that offer to serve (Config.ServeWrites: workers),
// the one holding an OFD lock on one byte of the -lock file (Linux) is
// the writer; every other Store connects to it. A Store without a writer
// writes directly and tries, every shareRetry, to connect to one (or to
// become it).

package sqlitestore

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

const (
	// forwardWait is how long a client waits for the writer's answer
	// before it writes directly.
	forwardWait = time.Second
	// helloWait bounds a new connection's first round trip: a frozen
	// writer's socket still accepts connections.
	helloWait = 500 * time.Millisecond
	// shareRetry is how often a process without a writer tries again.
	shareRetry = 250 * time.Millisecond
)

// share is a Store's part in sharing its file: serving as the writer, or
// connected to one, or neither.
type share struct {
	sock string // the writer's socket path

	mu     sync.Mutex
	server *writerServer // set while this Store is the writer
	conn   *clientConn   // set while connected to a writer
	wake   chan struct{} // closed to make the loop look again at once
	stop   chan struct{}
	ended  chan struct{}
}

// socketPath is the writer's socket beside the store file, or, where that
// path is too long for a socket, one in the temporary directory named by
// the file's absolute path.
func socketPath(path string) string {
	const max = 100 // sun_path holds 108 bytes
	if p := path + "-writer"; len(p) <= max {
		return p
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	sum := sha256.Sum256([]byte(abs))
	p := filepath.Join(os.TempDir(), "leasepool-"+hex.EncodeToString(sum[:12])+".sock")
	if len(p) > max {
		return ""
	}
	return p
}

// startShare takes the store's part in sharing: one attempt now, so that
// the first write already goes to a writer when there is one, then a
// goroutine that keeps trying while there is none.
func (s *Store) startShare() {
	if s.cfg.ReadOnly || s.cfg.DirectWrites || !shareSupported {
		return
	}
	sock := socketPath(s.path)
	if sock == "" {
		return
	}
	sh := &share{sock: sock, wake: make(chan struct{}), stop: make(chan struct{}), ended: make(chan struct{})}
	s.share = sh
	s.shareStep()
	go s.shareLoop()
}

// shareLoop becomes the writer or connects to it whenever this Store is
// neither, until stopShare.
func (s *Store) shareLoop() {
	sh := s.share
	defer close(sh.ended)
	t := time.NewTicker(shareRetry)
	defer t.Stop()
	for {
		sh.mu.Lock()
		var dead <-chan struct{}
		if sh.conn != nil {
			dead = sh.conn.dead
		}
		serving := sh.server != nil
		sh.mu.Unlock()
		if serving {
			<-sh.stop
			return
		}
		select {
		case <-sh.stop:
			return
		case <-dead:
			sh.mu.Lock()
			if sh.conn != nil && sh.conn.isDead() {
				sh.conn = nil
			}
			sh.mu.Unlock()
			s.shareStep() // the writer may have died: take its place at once
			continue
		case <-t.C:
		}
		if dead == nil {
			s.shareStep()
		}
	}
}

// shareStep makes this Store the writer if none holds the role, or
// connects it to the one that does.
func (s *Store) shareStep() {
	sh := s.share
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.server != nil || (sh.conn != nil && !sh.conn.isDead()) {
		return
	}
	select {
	case <-sh.stop:
		return
	default:
	}
	owner := false
	if s.cfg.ServeWrites {
		var err error
		if owner, err = tryWriterLock(s.writeLock); err != nil {
			s.log.Warn("share the store: writer lock", slog.Any("err", err))
			return
		}
	}
	if owner {
		srv, err := s.serveWrites(sh.sock)
		if err != nil {
			releaseWriterLock(s.writeLock)
			s.log.Warn("share the store: serve writes", slog.Any("err", err))
			return
		}
		sh.server, sh.conn = srv, nil
		return
	}
	if c, err := dialWriter(sh.sock); err == nil {
		sh.conn = c
	}
}

// stopShare ends this Store's part: a writer stops taking requests,
// answers those it took and closes its connections; a client closes its
// connection, and its waiting callers resolve their writes on their own.
func (s *Store) stopShare() {
	sh := s.share
	if sh == nil {
		return
	}
	sh.mu.Lock()
	close(sh.stop)
	srv, conn := sh.server, sh.conn
	sh.server, sh.conn = nil, nil
	sh.mu.Unlock()
	<-sh.ended
	if srv != nil {
		srv.close()
		releaseWriterLock(s.writeLock)
	}
	if conn != nil {
		conn.kill(errors.New("store closing"))
	}
}

// writerConn returns the connection to the writer, or nil when this
// Store writes directly.
func (s *Store) writerConn() *clientConn {
	sh := s.share
	if sh == nil {
		return nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.conn != nil && sh.conn.isDead() {
		sh.conn = nil
	}
	return sh.conn
}

// dropConn forgets c after it failed to answer in time, so that the next
// writes go to the file directly until the loop connects again.
func (s *Store) dropConn(c *clientConn) {
	c.kill(errors.New("the writer did not answer in time"))
	sh := s.share
	sh.mu.Lock()
	if sh.conn == c {
		sh.conn = nil
	}
	sh.mu.Unlock()
}

// clientConn is a connection to the writer. Requests are pipelined: any
// number wait for their answers at once, matched by id.
type clientConn struct {
	c   net.Conn
	out chan []byte

	mu      sync.Mutex
	pending map[uint64]chan *wireReply
	nextID  uint64
	err     error

	dead     chan struct{}
	killOnce sync.Once
}

// dialWriter connects to the writer at sock and checks that it answers
// and runs this program's schema.
func dialWriter(sock string) (*clientConn, error) {
	nc, err := net.DialTimeout("unix", sock, helloWait)
	if err != nil {
		return nil, err
	}
	c := &clientConn{c: nc, out: make(chan []byte, 256), pending: map[uint64]chan *wireReply{}, dead: make(chan struct{})}
	go c.readLoop()
	go c.writeLoop()
	ch, id, err := c.send(&wireRequest{Method: methodHello, Schema: schemaVersion})
	if err != nil {
		c.kill(err)
		return nil, err
	}
	t := time.NewTimer(helloWait)
	defer t.Stop()
	select {
	case rep := <-ch:
		if rep.Err != nil {
			err := rep.Err.toError()
			c.kill(err)
			return nil, err
		}
		return c, nil
	case <-c.dead:
		return nil, c.err
	case <-t.C:
		c.forget(id)
		c.kill(errors.New("the writer did not answer hello"))
		return nil, errors.New("the writer did not answer hello")
	}
}

func (c *clientConn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

func (c *clientConn) kill(err error) {
	c.killOnce.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.dead)
		c.c.Close()
	})
}

// send queues req and returns where its answer will come.
func (c *clientConn) send(req *wireRequest) (chan *wireReply, uint64, error) {
	body, err := marshalWire(req)
	if err != nil {
		return nil, 0, err
	}
	ch := make(chan *wireReply, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, 0, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()
	select {
	case c.out <- appendFrame(make([]byte, 0, frameHeader+len(body)), id, body):
		return ch, id, nil
	case <-c.dead:
		c.forget(id)
		return nil, 0, errors.New("connection to the writer closed")
	}
}

func (c *clientConn) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// writeLoop writes queued frames, flushing when none is left queued, so
// that requests made at once share a system call.
func (c *clientConn) writeLoop() {
	writeFrames(c.c, c.out, c.dead, c.kill)
}

func writeFrames(w net.Conn, out <-chan []byte, dead <-chan struct{}, fail func(error)) {
	bw := bufio.NewWriterSize(w, 64<<10)
	for {
		var b []byte
		select {
		case b = <-out:
		case <-dead:
			return
		}
		for {
			if _, err := bw.Write(b); err != nil {
				fail(err)
				return
			}
			select {
			case b = <-out:
				continue
			default:
			}
			break
		}
		if err := bw.Flush(); err != nil {
			fail(err)
			return
		}
	}
}

func (c *clientConn) readLoop() {
	br := bufio.NewReaderSize(c.c, 64<<10)
	for {
		id, body, err := readFrame(br)
		if err != nil {
			c.kill(err)
			return
		}
		rep := new(wireReply)
		if err := json.Unmarshal(body, rep); err != nil {
			c.kill(fmt.Errorf("sqlitestore: reply from the writer: %w", err))
			return
		}
		c.mu.Lock()
		ch := c.pending[id]
		delete(c.pending, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- rep
		}
	}
}

// fenceKey carries a forwarded request's deadline (store-clock unix ns)
// from the writer's handler to its writeReq.
type fenceKey struct{}

func withFence(ctx context.Context, deadline int64) context.Context {
	return context.WithValue(ctx, fenceKey{}, deadline)
}

func fenceOf(ctx context.Context) int64 {
	d, _ := ctx.Value(fenceKey{}).(int64)
	return d
}
