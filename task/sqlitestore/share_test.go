package sqlitestore_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/task/storetest"
)

// writerEnv makes the test binary a store's writer (see TestMain): it
// opens the store at the path it names with ServeWrites, says "serving"
// once it is the writer, and serves until it is killed.
const writerEnv = "LEASEPOOL_TEST_STORE_WRITER"

func serveAsWriter(path string) {
	s, err := sqlitestore.Open(context.Background(), path, &sqlitestore.Config{ServeWrites: true})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	for !s.Serving() {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("serving")
	select {}
}

// startWriter starts a writer process on path and returns once it serves.
func startWriter(t *testing.T, path string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), writerEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "serving" {
		t.Fatalf("writer process: %q", line)
	}
	return cmd
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
	}
}

// TestConformanceThroughWriter runs the conformance suite on a Store
// whose writes all go to another Store on the file, the writer.
func TestConformanceThroughWriter(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Opened {
		path := filepath.Join(t.TempDir(), "leasepool.db")
		w := open(t, path, &sqlitestore.Config{ServeWrites: true})
		if !w.Serving() {
			t.Fatal("the first Store offering to serve is not the writer")
		}
		c := open(t, path, nil)
		if !c.Forwarding() {
			t.Fatal("a Store opened beside a writer does not forward its writes")
		}
		return storetest.Opened{
			Store:  c,
			Reopen: func(t *testing.T) task.Store { return open(t, path, nil) },
		}
	})
}

// TestWriterProcessKilledAndFrozen: goroutines of a client Store update
// their own task by compare-and-set, counting each update that reported
// success, and publish new keys, while the writer process they forward
// to is SIGKILLed, replaced, and then frozen with SIGSTOP for longer than
// a forwarded write waits. Every update reported done is stored exactly
// once (none lost, none applied twice, none applied after its sender gave
// up on it), and every key is reported inserted exactly once.
func TestWriterProcessKilledAndFrozen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	c := open(t, path, nil)
	writer := startWriter(t, path)
	waitFor(t, "the client connects to the writer", c.Forwarding)

	const workers = 8
	var stop atomic.Bool
	var done [workers]int
	var inserted sync.Map // key -> times reported inserted
	var wg sync.WaitGroup
	for i := range workers {
		tk, _, err := task.Publish(ctx, c, task.PublishParams{Key: fmt.Sprintf("counter-%d", i), Kind: "noop", Payload: json.RawMessage(`{"n":0}`)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for j := 0; !stop.Load(); j++ {
				var p struct{ N int }
				json.Unmarshal(tk.Payload, &p)
				next := tk.Clone()
				next.Payload = json.RawMessage(fmt.Sprintf(`{"n":%d}`, p.N+1))
				switch err := c.Update(ctx, next); {
				case err == nil:
					done[i]++
					tk = next
				case errors.Is(err, task.ErrConflict):
					t.Errorf("counter %d: a conflict with no other writer of the task: %v", i, err)
					return
				default:
					// Outcome unknown: read it back.
					if tk, err = c.Get(ctx, tk.Key); err != nil {
						t.Error(err)
						return
					}
					json.Unmarshal(tk.Payload, &p)
					done[i] = p.N
				}
				if j%10 == 0 {
					key := fmt.Sprintf("new-%d-%d", i, j)
					_, ins, err := task.Publish(ctx, c, task.PublishParams{Key: key, Kind: "noop"})
					if err != nil {
						t.Errorf("publish %s: %v", key, err)
						return
					}
					if ins == task.Inserted {
						n, _ := inserted.LoadOrStore(key, new(atomic.Int32))
						n.(*atomic.Int32).Add(1)
					}
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	writer.Process.Kill()
	writer.Wait()
	time.Sleep(300 * time.Millisecond)
	writer = startWriter(t, path)
	waitFor(t, "the client connects to the new writer", c.Forwarding)
	time.Sleep(300 * time.Millisecond)
	writer.Process.Signal(syscall.SIGSTOP)
	waitFor(t, "the client writes directly while the writer is frozen", func() bool { return !c.Forwarding() })
	time.Sleep(300 * time.Millisecond)
	writer.Process.Signal(syscall.SIGCONT)
	waitFor(t, "the client forwards again to the thawed writer", c.Forwarding)
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	for i := range workers {
		tk, err := c.Get(ctx, fmt.Sprintf("counter-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		var p struct{ N int }
		json.Unmarshal(tk.Payload, &p)
		if p.N != done[i] || tk.Version != int64(done[i])+1 {
			t.Errorf("counter %d: stored n=%d version %d, %d updates reported done", i, p.N, tk.Version, done[i])
		}
		if done[i] == 0 {
			t.Errorf("counter %d: no update done", i)
		}
	}
	keys := 0
	inserted.Range(func(k, v any) bool {
		keys++
		if n := v.(*atomic.Int32).Load(); n != 1 {
			t.Errorf("%s reported inserted %d times", k, n)
		}
		if _, err := c.Get(ctx, k.(string)); err != nil {
			t.Errorf("%s reported inserted: %v", k, err)
		}
		return true
	})
	t.Logf("%d updates, %d keys published", func() (n int) {
		for _, d := range done {
			n += d
		}
		return n
	}(), keys)
}

// TestHostileFrames: what a connection to the writer's socket sends
// cannot stop the writer serving others or write anything bad.
func TestHostileFrames(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "s.db")
	w := open(t, path, &sqlitestore.Config{ServeWrites: true})
	c := open(t, path, nil)
	sock := sqlitestore.SocketPath(path)
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v, mode %v; want 0600", sock, err, fi.Mode().Perm())
	}
	frame := func(body string) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		b = binary.BigEndian.AppendUint64(b, 7)
		return append(b, body...)
	}
	cases := map[string][]byte{
		"oversized length": binary.BigEndian.AppendUint32(nil, 1<<31),
		"not JSON":         frame("{{{"),
		"unknown method":   frame(`{"m":"drop-table"}`),
		"bad task":         frame(`{"m":"insert","t":"x"}`),
		"reserved key":     frame(`{"m":"insert","t":{"key":"leasepool:x","kind":"noop"}}`),
		"no lock params":   frame(`{"m":"acquire-locks"}`),
		"truncated":        frame(`{"m":"hello"}`)[:9],
	}
	for name, b := range cases {
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		conn.SetDeadline(time.Now().Add(2 * time.Second))
		conn.Write(b)
		buf := make([]byte, 4096)
		n, _ := conn.Read(buf)
		if n > frameHeaderLen && !strings.Contains(string(buf[frameHeaderLen:n]), `"e":`) {
			t.Errorf("%s: answered without an error: %s", name, buf[:n])
		}
		conn.Close()
	}
	if _, err := c.Get(ctx, "leasepool:x"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("a hostile frame stored a reserved key: %v", err)
	}
	if !w.Serving() {
		t.Fatal("the writer stopped serving")
	}
	waitFor(t, "the client forwards", c.Forwarding)
	if _, _, err := task.Publish(ctx, c, task.PublishParams{Key: "after", Kind: "noop"}); err != nil {
		t.Fatalf("publish after hostile frames: %v", err)
	}
}

const frameHeaderLen = 12

// TestLongPathSharesThroughTempSocket: a store whose path is too long for
// a socket beside it shares through one in the temporary directory.
func TestLongPathSharesThroughTempSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 120))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "s.db")
	sock := sqlitestore.SocketPath(path)
	if !strings.HasPrefix(sock, os.TempDir()) || len(sock) > 100 {
		t.Fatalf("socket path %q", sock)
	}
	w := open(t, path, &sqlitestore.Config{ServeWrites: true})
	c := open(t, path, nil)
	if !w.Serving() || !c.Forwarding() {
		t.Fatalf("serving %v, forwarding %v", w.Serving(), c.Forwarding())
	}
	if _, _, err := task.Publish(context.Background(), c, task.PublishParams{Key: "k", Kind: "noop"}); err != nil {
		t.Fatal(err)
	}
}
