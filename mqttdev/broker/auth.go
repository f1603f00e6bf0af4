// Who may connect to the embedded broker, and which topics each client
// may use.

package broker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	mqtt "github.com/leasepool/leasepool/internal/mochi"
	"github.com/leasepool/leasepool/internal/mochi/packets"
)

// WorkerUserPrefix starts a worker's MQTT user name: "worker:" and the
// worker id. A user name without it is a device id.
const WorkerUserPrefix = "worker:"

// Credentials are what the broker checks passwords against: SHA-256
// hashes of the secrets (package mqttdev/credential reads them from the
// task store).
type Credentials interface {
	// DeviceHash returns the hash of device id's secret; found is false
	// when the device has no credential.
	DeviceHash(ctx context.Context, id string) (hash [32]byte, found bool, err error)
	// DeviceHashes returns every device's hash, by device id.
	DeviceHashes(ctx context.Context) (map[string][32]byte, error)
	// WorkerHash returns the hash of the cluster's worker secret; found is
	// false when there is none yet.
	WorkerHash(ctx context.Context) (hash [32]byte, found bool, err error)
}

// lookupTimeout bounds the credential read of one connection attempt.
const lookupTimeout = 5 * time.Second

// session is what a connected client logged in as.
type session struct {
	worker bool
	// cert: logged in by a verified client certificate; its device
	// credential need only exist, not match.
	cert bool
	user string // resolved user name: the certificate's common name, or the login's
	id   string // device id, or worker id
	hash [32]byte
	at   time.Time
	// revoked is set when the credential stopped matching: every ACL
	// check fails from then on, before the connection is closed.
	revoked atomic.Bool
}

// authHook is the mochi hook that checks logins against Credentials and
// keeps each client to its own topics.
type authHook struct {
	mqtt.HookBase
	srv   *mqtt.Server
	creds Credentials
	log   *slog.Logger

	mu       sync.Mutex
	sessions map[*mqtt.Client]*session
	// owners holds, by client id, the login of each session the server
	// keeps, connected or persisted: a persisted session outlives its
	// connection, and is the identity's as long as the server keeps it.
	owners map[string]*session
}

func newAuthHook(srv *mqtt.Server, creds Credentials, log *slog.Logger) *authHook {
	return &authHook{srv: srv, creds: creds, log: log,
		sessions: map[*mqtt.Client]*session{}, owners: map[string]*session{}}
}

func (h *authHook) ID() string { return "leasepool-auth" }

func (h *authHook) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnDisconnect}, []byte{b})
}

// OnConnectAuthenticate lets a client in when its user name and password
// match a credential, its will (if any) is on a topic it may publish, and
// its client id is one of its identity's (ClientIDOwner): it can then
// neither take over another identity's session, live or persisted, with
// its subscriptions, queued messages and will, nor hold another's client
// id before its owner connects.
func (h *authHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	user := string(pk.Connect.Username)
	refuse := func(why string, attrs ...any) bool {
		h.log.Warn("MQTT client refused: "+why, append([]any{slog.String("user", user),
			slog.String("client_id", cl.ID), slog.String("remote", cl.Net.Remote)}, attrs...)...)
		return false
	}
	cn, byCert := peerName(cl)
	if byCert {
		if user != "" && user != cn {
			return refuse("user name differs from the certificate's common name", slog.String("common_name", cn))
		}
		user = cn
	}
	if user == "" {
		return refuse("no user name (anonymous clients are not allowed)")
	}
	if !validUser(user) {
		return refuse("user name is not a device id or " + WorkerUserPrefix + "<worker id>")
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	s := &session{at: time.Now(), cert: byCert, user: user}
	var (
		found bool
		err   error
	)
	if id, ok := strings.CutPrefix(user, WorkerUserPrefix); ok {
		s.worker, s.id = true, id
		if byCert {
			found = true // the certificate is the credential
		} else {
			s.hash, found, err = h.creds.WorkerHash(ctx)
		}
	} else {
		s.id = user
		s.hash, found, err = h.creds.DeviceHash(ctx, user)
	}
	switch {
	case err != nil:
		return refuse("credentials unreadable", slog.Any("error", err))
	case !found:
		return refuse("no credential for this user")
	}
	if !byCert {
		got := hashSecret(pk.Connect.Password)
		if subtle.ConstantTimeCompare(got[:], s.hash[:]) != 1 {
			return refuse("wrong password")
		}
	}
	if pk.Connect.WillFlag && !s.may(pk.Connect.WillTopic, true) {
		return refuse("will on a topic this client may not publish", slog.String("topic", pk.Connect.WillTopic))
	}
	if owner := ClientIDOwner(cl.ID); owner != user {
		return refuse("client id belongs to another identity", slog.String("owner", owner))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	// The rule above already keeps each session to one identity; a
	// session is never handed to another, whatever the rule says.
	if old, ok := h.owners[cl.ID]; ok && old.user != user {
		return refuse("client id in use by another identity's session", slog.String("owner", old.user))
	}
	h.sessions[cl] = s
	h.owners[cl.ID] = s
	h.log.Debug("MQTT client logged in", slog.String("user", user), slog.String("client_id", cl.ID))
	return true
}

// OnACLCheck allows what the client's role allows, on a session whose
// credential still holds.
func (h *authHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	h.mu.Lock()
	s := h.sessions[cl]
	h.mu.Unlock()
	if s == nil || s.revoked.Load() {
		return false
	}
	if !s.may(topic, write) {
		h.log.Warn("MQTT client refused a topic", slog.String("user", string(cl.Properties.Username)),
			slog.String("topic", topic), slog.Bool("publish", write))
		return false
	}
	return true
}

func (h *authHook) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.mu.Lock()
	delete(h.sessions, cl)
	h.mu.Unlock()
}

// may reports whether the session may publish (write) to topic or receive
// from it (a subscription's filter, or a message's topic).
//
// Topics are <prefix>/devices/<id>/<kind>, with any one-level prefix.
func (s *session) may(topic string, write bool) bool {
	levels := strings.Split(topic, "/")
	if len(levels) != 4 || levels[1] != "devices" || !literal(levels[0]) {
		return false
	}
	id, kind := levels[2], levels[3]
	if s.worker {
		if write {
			return kind == "cmd" && literal(id)
		}
		return (kind == "status" || kind == "ack" || kind == "result") && (id == "+" || literal(id))
	}
	if id != s.id {
		return false
	}
	if write {
		return kind == "status" || kind == "ack" || kind == "result"
	}
	return kind == "cmd"
}

// literal reports whether a topic level is a plain name: not empty, no
// wildcard.
func literal(level string) bool {
	return level != "" && !strings.ContainsAny(level, "+#")
}

// validUser reports whether user can name a device or a worker: one topic
// level, no wildcard, no control character (a device's user name is the
// id in its topics).
func validUser(user string) bool {
	return !strings.ContainsAny(user, "+#/") && strings.IndexFunc(user, unicode.IsControl) < 0
}

func hashSecret(password []byte) [32]byte { return sha256.Sum256(password) }

// peerName returns the common name of the client's certificate, when it
// connected over TLS with one the listener verified.
func peerName(cl *mqtt.Client) (string, bool) {
	tc, ok := cl.Net.Conn.(*tls.Conn)
	if !ok {
		return "", false
	}
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return "", false
	}
	return st.PeerCertificates[0].Subject.CommonName, true
}

// refreshLoop reads the credentials every period and closes the
// connections whose credential was revoked or rotated since they logged
// in, and removes the persisted sessions of revoked identities. Their wills are sent: a will's topic was checked at login, and it
// tells the workers the device is gone. A failed read keeps the
// connections: they were checked at login, and the next read decides.
func (h *authHook) refreshLoop(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := h.refresh(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn("MQTT broker: credentials unreadable; connections kept until the next read", slog.Any("error", err))
		}
	}
}

func (h *authHook) refresh(ctx context.Context) error {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	devices, err := h.creds.DeviceHashes(rctx)
	if err != nil {
		return err
	}
	worker, workerFound, err := h.creds.WorkerHash(rctx)
	if err != nil {
		return err
	}
	var gone []*mqtt.Client
	h.mu.Lock()
	for cl, s := range h.sessions {
		// A login after the read began may use a credential the read
		// missed: the next read decides.
		if !s.at.Before(start) {
			continue
		}
		current, ok := devices[s.id]
		if s.worker {
			current, ok = worker, workerFound
		}
		switch {
		case s.worker && s.cert, s.cert && ok, ok && current == s.hash:
			continue
		}
		s.revoked.Store(true)
		gone = append(gone, cl)
	}
	h.mu.Unlock()
	for _, cl := range gone {
		err := h.srv.DisconnectClient(cl, packets.ErrNotAuthorized)
		h.log.Warn("MQTT client disconnected: its credential was revoked or replaced",
			slog.String("user", string(cl.Properties.Username)), slog.String("client_id", cl.ID),
			slog.Any("error", ignoreCode(err)))
	}
	h.sweepSessions(start, devices, workerFound)
	return nil
}

// ignoreCode drops the reason code that DisconnectClient returns as an
// error after a successful disconnect.
func ignoreCode(err error) error {
	var code packets.Code
	if errors.As(err, &code) {
		return nil
	}
	return err
}
