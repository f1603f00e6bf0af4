// shareserve.go is the writer's side of sharing a store file (share.go):
// it takes other processes' writes over its socket and runs them through
// its own group-commit writer.

package sqlitestore

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"

	"github.com/leasepool/leasepool/task"
)

type writerServer struct {
	s  *Store
	ln *net.UnixListener

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closing  bool
	handlers sync.WaitGroup
	accepted chan struct{} // closed when the accept loop ends
}

// serveWrites listens on sock, which only this process's user may
// connect to, and serves until close.
func (s *Store) serveWrites(sock string) (*writerServer, error) {
	// This process holds the writer lock: a socket file there is a dead
	// writer's.
	os.Remove(sock)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	w := &writerServer{s: s, ln: ln, conns: map[net.Conn]struct{}{}, accepted: make(chan struct{})}
	go w.accept()
	return w, nil
}

func (w *writerServer) accept() {
	defer close(w.accepted)
	for {
		c, err := w.ln.AcceptUnix()
		if err != nil {
			return
		}
		if !samePeer(c) {
			c.Close()
			continue
		}
		w.mu.Lock()
		if w.closing {
			w.mu.Unlock()
			c.Close()
			continue
		}
		w.conns[c] = struct{}{}
		w.handlers.Add(1)
		w.mu.Unlock()
		go w.serveConn(c)
	}
}

// close stops taking connections and requests, waits until every request
// taken is answered, and closes the connections.
func (w *writerServer) close() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	w.ln.Close()
	<-w.accepted
	// Each connection's reader stops at the end of what was sent; its
	// requests are answered before the connection closes.
	w.mu.Lock()
	for c := range w.conns {
		c.(*net.UnixConn).CloseRead()
	}
	w.mu.Unlock()
	w.handlers.Wait()
}

// serveConn reads one connection's requests and runs each in its own
// goroutine, so that they meet in the writer's batches.
func (w *writerServer) serveConn(c net.Conn) {
	out := make(chan []byte, 256)
	dead := make(chan struct{})
	var once sync.Once
	fail := func(error) { once.Do(func() { close(dead); c.Close() }) }
	go writeFrames(c, out, dead, fail)
	var running sync.WaitGroup
	defer func() {
		running.Wait()
		fail(nil)
		w.mu.Lock()
		delete(w.conns, c)
		w.mu.Unlock()
		w.handlers.Done()
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		id, body, err := readFrame(br)
		if err != nil {
			return
		}
		req := new(wireRequest)
		if err := json.Unmarshal(body, req); err != nil {
			w.s.log.Warn("share the store: bad request", slog.Any("err", err))
			return
		}
		w.mu.Lock()
		closing := w.closing
		w.mu.Unlock()
		running.Add(1)
		go func() {
			defer running.Done()
			var rep *wireReply
			if closing {
				rep = &wireReply{Err: toWire(errNotApplied)}
			} else {
				rep = w.handle(req)
			}
			b, err := marshalWire(rep)
			if err != nil {
				b, _ = marshalWire(&wireReply{Err: &wireError{Kind: kindUnknown, Message: err.Error()}})
			}
			select {
			case out <- appendFrame(make([]byte, 0, frameHeader+len(b)), id, b):
			case <-dead:
			}
		}()
		if closing {
			return
		}
	}
}

// handle runs one request on the writer's Store.
func (w *writerServer) handle(req *wireRequest) *wireReply {
	s := w.s
	ctx := context.Background()
	if req.Internal {
		ctx = task.WithInternalWrite(ctx)
	}
	if req.Deadline != 0 {
		ctx = withFence(ctx, req.Deadline)
	}
	fail := func(err error) *wireReply { return &wireReply{Err: toWire(err)} }
	switch req.Method {
	case methodHello:
		if req.Schema != schemaVersion {
			return fail(fmt.Errorf("%w (the writer's schema version %d, the client's %d)", ErrSchemaChanged, schemaVersion, req.Schema))
		}
		return &wireReply{}
	case methodInsert:
		t, err := fromWire(req.Task, req.Payload)
		if err != nil {
			return fail(err)
		}
		stored, inserted, change, err := s.insert(ctx, t)
		if err != nil {
			return fail(err)
		}
		if inserted {
			return &wireReply{Inserted: true, Change: change, Seq: t.Seq}
		}
		doc, payload, err := wireTask(stored)
		if err != nil {
			return fail(err)
		}
		return &wireReply{Stored: doc, StoredPayload: payload, Seq: stored.Seq, Version: stored.Version}
	case methodUpdate:
		t, err := fromWire(req.Task, req.Payload)
		if err != nil {
			return fail(err)
		}
		t.Seq, t.Version = req.Seq, req.Version
		if req.Prev != nil {
			s.seen.noteVersion(t.Seq, seenVersion{t.Version, req.Prev.Kind, req.Prev.State})
		}
		change, err := s.update(ctx, t)
		if err != nil {
			return fail(err)
		}
		return &wireReply{Change: change, Version: t.Version}
	case methodAcquireLocks, methodReleaseLocks:
		if req.Locks == nil {
			return fail(fmt.Errorf("%w: locks: missing", task.ErrInvalid))
		}
		if req.Method == methodAcquireLocks {
			return fail(s.acquireLocks(ctx, *req.Locks))
		}
		return fail(s.releaseLocks(ctx, *req.Locks))
	case methodDeleteFinished:
		if req.Delete == nil {
			return fail(fmt.Errorf("%w: delete: missing", task.ErrInvalid))
		}
		n, err := s.deleteFinished(ctx, *req.Delete)
		return &wireReply{Deleted: n, Err: toWire(err)}
	case methodRegister:
		if req.Register == nil {
			return fail(fmt.Errorf("%w: register: missing", task.ErrInvalid))
		}
		return fail(s.registerWorker(ctx, *req.Register))
	case methodUnregister:
		return fail(s.unregisterWorker(ctx, req.ID, req.Instance))
	case methodPutDocument:
		if req.Document == nil {
			return fail(fmt.Errorf("%w: document: missing", task.ErrInvalid))
		}
		d, err := s.putDocument(ctx, *req.Document)
		if err != nil {
			return fail(err)
		}
		return &wireReply{Document: &d}
	case methodDeleteDocument:
		return fail(s.deleteDocument(ctx, req.Namespace, req.ID, req.Version))
	}
	return fail(errors.New("sqlitestore: unknown share method " + req.Method))
}
