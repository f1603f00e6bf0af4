package mongostore

// Open's first contact with the deployment: bounded by ConnectTimeout, cut
// short once every server the driver tried was refused or named no host,
// and failing with one line naming each server and why it was not reached
// instead of the driver's topology dump.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/description"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
)

// DefaultConnectTimeout is Config.ConnectTimeout's default: a server that
// answers at all does so well within it, even across a WAN with TLS and
// authentication, and a user who typed a wrong host hears it in seconds.
const DefaultConnectTimeout = 4 * time.Second

// reachWatch follows the driver's view of each server during the first
// contact (its heartbeats), and cuts that contact short once every server
// has failed for good. After the first contact it does nothing.
type reachWatch struct {
	done atomic.Bool

	mu     sync.Mutex
	failed map[string]error // address → its last heartbeat's failure; nil: answered
	order  []string         // addresses, as the driver opened them
	cancel context.CancelCauseFunc
}

func newReachWatch() *reachWatch { return &reachWatch{failed: map[string]error{}} }

// monitor is the driver's server monitor feeding w.
func (w *reachWatch) monitor() *event.ServerMonitor {
	return &event.ServerMonitor{
		ServerOpening: func(e *event.ServerOpeningEvent) { w.note(e.Address.String(), nil, true) },
		ServerClosed: func(e *event.ServerClosedEvent) {
			if w.done.Load() {
				return
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			addr := e.Address.String()
			delete(w.failed, addr)
			w.order = slices.DeleteFunc(w.order, func(a string) bool { return a == addr })
		},
		ServerHeartbeatFailed:    func(e *event.ServerHeartbeatFailedEvent) { w.note(heartbeatAddr(e.ConnectionID), e.Failure, false) },
		ServerHeartbeatSucceeded: func(e *event.ServerHeartbeatSucceededEvent) { w.note(heartbeatAddr(e.ConnectionID), nil, false) },
	}
}

// heartbeatAddr is the address of a heartbeat's connection id, which the
// driver spells ADDRESS[-N].
func heartbeatAddr(id string) string {
	if i := strings.LastIndex(id, "[-"); i >= 0 {
		return id[:i]
	}
	return id
}

func (w *reachWatch) note(addr string, failure error, opening bool) {
	if w.done.Load() {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, known := w.failed[addr]; !known {
		w.order = append(w.order, addr)
	}
	if !opening || w.failed[addr] == nil {
		w.failed[addr] = failure
	}
	w.checkLocked()
}

// checkLocked cuts the first contact short once every server known has
// failed for good. w.mu is held.
func (w *reachWatch) checkLocked() {
	if w.cancel == nil || len(w.order) == 0 {
		return
	}
	for _, a := range w.order {
		if !definitive(w.failed[a]) {
			return
		}
	}
	w.cancel(errAllRefused)
}

// errAllRefused cuts the first contact short: every server was refused or
// named no host, which waiting would not change.
var errAllRefused = errors.New("every server refused or unknown")

// definitive reports whether a heartbeat's failure means the server is not
// there at all (nothing listens, no such host) rather than slow or busy.
func definitive(err error) bool {
	var dns *net.DNSError
	return err != nil && (errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dns) && dns.IsNotFound)
}

// firstContact asks the server for its clock once, bounded as reach says.
func (s *Store) firstContact(ctx context.Context, reach *reachWatch) error {
	err := reach.reach(ctx, s.cfg.ConnectTimeout, func(ctx context.Context) error {
		_, _, err := s.sampleClock(ctx)
		return err
	})
	if u, ok := errors.AsType[*unreachableError](err); ok {
		return u // its line names the servers: no prefix needed
	}
	if err != nil {
		return fmt.Errorf("mongostore: %w", err)
	}
	return nil
}

// reach runs first (the first command) bounded by timeout and by w. An
// error that is the servers' (none selectable) becomes an unreachableError.
func (w *reachWatch) reach(ctx context.Context, timeout time.Duration, first func(context.Context) error) error {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cctx, stop := context.WithTimeout(cctx, timeout)
	defer stop()
	w.mu.Lock()
	w.cancel = cancel
	w.checkLocked() // the driver may have heard already
	w.mu.Unlock()
	err := first(cctx)
	w.done.Store(true)
	var sel topology.ServerSelectionError
	if err == nil || ctx.Err() != nil || !errors.As(err, &sel) {
		return err
	}
	if ce := sel.Desc.CompatibilityErr; ce != nil {
		// Reached, but a server this driver cannot speak to.
		return &contactError{msg: ce.Error(), err: err}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	u := &unreachableError{err: err}
	for _, s := range sel.Desc.Servers {
		addr := s.Addr.String()
		failure := s.LastError
		if f := w.failed[addr]; f != nil {
			failure = f
		}
		why := reason(failure, timeout)
		if failure == nil && s.Kind != description.Unknown {
			// It answered, but is not one an operation may use (a
			// secondary while the set has no primary, say).
			why = "answered as " + s.Kind.String() + ", which takes no commands now"
		}
		u.servers = append(u.servers, fmt.Sprintf("%s (%s)", addr, why))
	}
	if len(u.servers) == 0 {
		u.servers = []string{fmt.Sprintf("any server (none answered within %s)", timeout)}
	}
	return u
}

// lookupError is Open's error when a mongodb+srv URI's host lookup fails,
// or nil when err is not that.
func lookupError(err error) error {
	var dns *net.DNSError
	if !errors.As(err, &dns) {
		return nil
	}
	return &unreachableError{servers: []string{fmt.Sprintf("%s (%s)", dns.Name, reason(dns, 0))}, err: err}
}

// unreachableError is Open's error when no server could be reached: one
// line naming each server and why, wrapping the driver's error.
type unreachableError struct {
	servers []string
	err     error
}

func (e *unreachableError) Error() string { return "cannot reach " + strings.Join(e.servers, ", ") }
func (e *unreachableError) Unwrap() error { return e.err }

// contactError is another failure of the first contact, its message
// without the driver's topology dump.
type contactError struct {
	msg string
	err error
}

func (e *contactError) Error() string { return e.msg }
func (e *contactError) Unwrap() error { return e.err }

// reason says in a few words why a server was not reached.
func reason(err error, timeout time.Duration) string {
	var dns *net.DNSError
	var sys *os.SyscallError
	var nerr net.Error
	var conn topology.ConnectionError
	switch {
	case err == nil:
		return fmt.Sprintf("no answer within %s", timeout)
	case errors.As(err, &dns) && dns.IsNotFound:
		return "no such host"
	case errors.As(err, &dns):
		return "host lookup failed: " + dns.Err
	case errors.As(err, &sys):
		return sys.Err.Error() // "connection refused", "network is unreachable"
	case errors.As(err, &nerr) && nerr.Timeout():
		return fmt.Sprintf("no answer within %s", timeout)
	case errors.As(err, &conn) && conn.Wrapped != nil:
		return reason(conn.Wrapped, timeout) // without the connection's id
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}
