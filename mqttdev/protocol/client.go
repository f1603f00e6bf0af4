// The MQTT client transport: how both sides reach the broker.

package protocol

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"

	"github.com/leasepool/leasepool/internal/redact"
)

// ClientConfig says how to reach the broker.
type ClientConfig struct {
	// BrokerURL is tcp://host:port, ssl://host:port (or tls://, mqtts://).
	// Required.
	BrokerURL string
	// ClientID is the MQTT client id. It must be stable for the life of the
	// process and unique across clients: with a persistent session (clean
	// session off) the broker keeps QoS 1 messages for it across
	// reconnects and broker restarts. Empty means a default made of the
	// host name and process id.
	ClientID string
	// Username and Password authenticate to the broker; empty means none.
	Username, Password string
	// CAFile verifies the broker (PEM); empty means the system roots.
	CAFile string
	// CertFile and KeyFile are a client certificate (PEM); both or neither.
	CertFile, KeyFile string
}

// Validate checks c: a broker URL of a known scheme with a host, and a
// client certificate given whole or not at all.
func (c *ClientConfig) Validate() error {
	if c.BrokerURL == "" {
		return errors.New("broker_url: required")
	}
	u, err := url.Parse(c.BrokerURL)
	if err != nil {
		// The parse error quotes the whole URL, password included.
		return fmt.Errorf("broker_url: %w", redact.Error(err, []string{c.BrokerURL}))
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps":
	default:
		return fmt.Errorf("broker_url: scheme %q is not one of tcp, mqtt, ssl, tls, mqtts", u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("broker_url: %q has no host", redact.URL(c.BrokerURL))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("cert_file, key_file: give both or neither")
	}
	return nil
}

func defaultClientID(role string) string {
	h, _ := os.Hostname()
	if h == "" {
		h = "host"
	}
	id := fmt.Sprintf("leasepool-%s-%s-%d", role, h, os.Getpid())
	if role == "admin" { // several may run in one process: throwaway sessions
		id += "-" + NewCorrelationID()[:8]
	}
	return id
}

func (c *ClientConfig) tlsConfig() (*tls.Config, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file: %s holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// Message is one MQTT message received.
type Message struct {
	Topic    string
	Payload  []byte
	Retained bool
}

// Transport is the small MQTT surface the handler, the tracker and the
// simulated devices use, so tests can wrap it (see FaultTransport).
// Subscriptions are at QoS 1 and are made again after every reconnect;
// received messages go to the function given when the transport was made.
type Transport interface {
	// Connect connects, retrying until it succeeds or ctx ends, and
	// returns once the subscriptions are made; after that the transport
	// reconnects by itself whenever the connection drops, until
	// Disconnect. Received messages reach OnMessage in the order the
	// broker sent them.
	Connect(ctx context.Context) error
	// Disconnect ends the connection cleanly (a device's will is not sent)
	// and stops reconnecting; a later Connect connects again.
	Disconnect()
	// Connected reports whether the connection is open now.
	Connected() bool
	// Publish sends payload at QoS 1 and returns once the broker has it, or
	// with ctx's error. On a lost connection the message stays queued in
	// the client and is resent after reconnect.
	Publish(ctx context.Context, topic string, retained bool, payload []byte) error
	// Subscribe adds filter to the subscriptions.
	Subscribe(ctx context.Context, filter string) error
}

// ClientOptions are the parts of a client that differ between the
// handler, a simulated device and an admin tool.
type ClientOptions struct {
	// Role names the client in its default id: "worker", "sim", "admin"
	// (an admin's id gets a random suffix: several may run at once).
	Role string
	// OnMessage gets every message; it runs on paho's goroutine and must
	// not block.
	OnMessage func(Message)
	// OnConnect runs (in its own goroutine) after each connection, after
	// the subscriptions were made again. Messages of the new connection
	// may reach OnMessage before it runs.
	OnConnect func()
	// OnConnecting runs before each connection attempt, once every
	// message of the previous connection has been through OnMessage:
	// whatever OnMessage gets after it came on the new connection.
	OnConnecting func()
	// OnLost runs when the connection is lost, and after Disconnect of an
	// open connection.
	OnLost func(error)
	// WillTopic and WillPayload make the retained last will; empty: none.
	WillTopic   string
	WillPayload func() []byte
	// Dial replaces the TCP dial (simulated outages); nil dials normally.
	Dial func(u *url.URL, tc *tls.Config) (net.Conn, error)
	// CleanSession asks for a throwaway session (read-only tools).
	CleanSession bool
	// MaxReconnect caps the reconnect backoff; zero means
	// defaultMaxReconnect.
	MaxReconnect time.Duration
	// Logger gets connection losses; nil discards them.
	Logger *slog.Logger
}

// ErrDisconnected is what OnLost gets after Disconnect.
var ErrDisconnected = errors.New("mqtt: disconnected")

// ErrRefused is wrapped by Connect's error when the broker refused the
// client's credentials (CONNACK return code 4 or 5): trying again with
// the same ones cannot help.
var ErrRefused = errors.New("mqtt: the broker refused the connection")

// defaultMaxReconnect caps the time between connection attempts: a broker
// that comes back (a restart, or another host taking it over) is found
// again within it. A dial per half second to a dead loopback or LAN
// address costs nothing worth saving.
const defaultMaxReconnect = 500 * time.Millisecond

// Client is Transport over a paho client with a persistent session.
type Client struct {
	client mqtt.Client
	logger *slog.Logger
	onLost func(error)

	mu   sync.Mutex
	subs []string
	// subscribed is closed once the subscriptions are made on a
	// connection opened since the last Connect or Disconnect.
	subscribed chan struct{}
	// refused gets the broker's refusal of a connection attempt (paho
	// retries those silently until Connect's context ends).
	refused chan error
}

var _ Transport = (*Client)(nil)

// NewClient checks cfg and makes a client; Connect connects it.
func NewClient(cfg ClientConfig, o ClientOptions) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		cfg.ClientID = defaultClientID(o.Role)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Client{logger: o.Logger, onLost: o.OnLost, subscribed: make(chan struct{}), refused: make(chan error, 1)}
	if o.MaxReconnect == 0 {
		o.MaxReconnect = defaultMaxReconnect
	}
	onMessage := func(_ mqtt.Client, m mqtt.Message) {
		o.OnMessage(Message{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained()})
	}
	opts := mqtt.NewClientOptions().
		AddBroker(cfg.BrokerURL).
		SetClientID(cfg.ClientID).
		SetCleanSession(o.CleanSession).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(defaultMaxReconnect).
		SetMaxReconnectInterval(o.MaxReconnect).
		SetKeepAlive(10 * time.Second).
		SetPingTimeout(5 * time.Second).
		SetConnectTimeout(5 * time.Second).
		// One goroutine hands the messages over in the order the broker
		// sent them: a device's online status and the will that follows
		// it must not swap places (OnMessage never blocks).
		SetOrderMatters(true).
		SetStore(copyingStore{mqtt.NewMemoryStore()}).
		// Messages of a resumed session arrive before any Subscribe call:
		// the default handler routes (and so acks) them.
		SetDefaultPublishHandler(onMessage).
		SetOnConnectHandler(func(mqtt.Client) {
			if t.resubscribe() {
				t.mu.Lock()
				select {
				case <-t.subscribed:
				default:
					close(t.subscribed)
				}
				t.mu.Unlock()
			}
			if o.OnConnect != nil {
				o.OnConnect()
			}
		}).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			t.logger.Warn("mqtt connection lost", slog.String("client_id", cfg.ClientID), slog.Any("error", err))
			if o.OnLost != nil {
				o.OnLost(err)
			}
		})
	if cfg.Username != "" {
		opts.SetUsername(cfg.Username).SetPassword(cfg.Password)
	}
	if tc != nil {
		opts.SetTLSConfig(tc)
	}
	if o.WillTopic != "" {
		opts.SetBinaryWill(o.WillTopic, o.WillPayload(), 1, true)
	}
	if o.OnConnecting != nil {
		opts.SetConnectionAttemptHandler(func(_ *url.URL, tc *tls.Config) *tls.Config {
			o.OnConnecting()
			return tc
		})
	}
	dial := o.Dial
	if dial == nil {
		dial = DialBroker
	}
	opts.SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
		nc, err := dial(u, tc)
		if err != nil {
			return nil, err
		}
		return &connackConn{Conn: nc, refused: t.refuse}, nil
	})
	t.client = mqtt.NewClient(opts)
	return t, nil
}

// refuse records the broker's refusal of a connection attempt for
// Connect; a refusal while none waits (a reconnect) is dropped.
func (t *Client) refuse(code byte) {
	reason := "not authorized"
	if code == 4 {
		reason = "bad user name or password"
	}
	select {
	case t.refused <- fmt.Errorf("%w: %s (CONNACK return code %d)", ErrRefused, reason, code):
	default:
	}
}

// connackConn watches the first packet the broker sends, the CONNACK, for
// a refusal of the client's credentials: return code 4 (bad user name or
// password) or 5 (not authorized). paho reads a connection from one
// goroutine at a time.
type connackConn struct {
	net.Conn
	head    []byte // the first bytes read, up to the CONNACK's four
	refused func(code byte)
}

func (c *connackConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if len(c.head) < 4 && n > 0 {
		c.head = append(c.head, b[:min(n, 4-len(c.head))]...)
		if h := c.head; len(h) == 4 && h[0] == 0x20 && h[1] == 2 && (h[3] == 4 || h[3] == 5) {
			c.refused(h[3])
		}
	}
	return n, err
}

// copyingStore is paho's memory store keeping its own copy of each publish.
// On connect, paho 1.5.1 resumes the session by setting Dup on the stored
// packets; with the plain memory store a stored packet is the very one a
// publish made meanwhile (a device's online status, from OnConnect) is
// being written from: a data race. Put runs on the publishing goroutine
// before the packet is handed to the writer, so copying there is safe.
type copyingStore struct{ *mqtt.MemoryStore }

func (s copyingStore) Put(key string, m packets.ControlPacket) {
	if p, ok := m.(*packets.PublishPacket); ok {
		cp := *p
		m = &cp
	}
	s.MemoryStore.Put(key, m)
}

// Connect connects, retrying until ctx ends or the broker refuses the
// credentials (an error wrapping ErrRefused), and returns once the
// subscriptions are made: a message published after it returns reaches
// OnMessage.
func (t *Client) Connect(ctx context.Context) error {
	t.mu.Lock()
	subscribed := t.subscribed
	t.mu.Unlock()
	select {
	case <-t.refused: // from a reconnect before this call
	default:
	}
	tok := t.client.Connect()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return err
		}
	case err := <-t.refused:
		t.client.Disconnect(0)
		return fmt.Errorf("mqtt connect: %w", err)
	case <-ctx.Done():
		t.client.Disconnect(0)
		return fmt.Errorf("mqtt connect: %w", context.Cause(ctx))
	}
	// paho completes the connect before its OnConnect handler, which
	// subscribes, runs on a goroutine of its own.
	select {
	case <-subscribed:
		return nil
	case <-ctx.Done():
		t.client.Disconnect(0)
		return fmt.Errorf("mqtt connect: subscribing: %w", context.Cause(ctx))
	}
}

// Disconnect disconnects cleanly, waiting up to 250ms for the DISCONNECT
// to go out. OnLost runs if the connection was open, so that a user
// tracking the link sees it down.
func (t *Client) Disconnect() {
	open := t.client.IsConnectionOpen()
	t.client.Disconnect(250)
	t.mu.Lock()
	t.subscribed = make(chan struct{})
	t.mu.Unlock()
	if open && t.onLost != nil {
		t.onLost(ErrDisconnected)
	}
}

// Connected reports whether the connection is open now.
func (t *Client) Connected() bool { return t.client.IsConnectionOpen() }

func (t *Client) Publish(ctx context.Context, topic string, retained bool, payload []byte) error {
	return wait(ctx, t.client.Publish(topic, 1, retained, payload))
}

func (t *Client) Subscribe(ctx context.Context, filter string) error {
	t.mu.Lock()
	t.subs = append(t.subs, filter)
	t.mu.Unlock()
	if !t.client.IsConnectionOpen() {
		return nil // made on connect
	}
	// A nil callback routes messages to the default publish handler.
	return wait(ctx, t.client.Subscribe(filter, 1, nil))
}

// resubscribe runs on every connection: a broker that lost its sessions
// (restarted without persistence) no longer has them. It reports whether
// the subscriptions are made.
func (t *Client) resubscribe() bool {
	t.mu.Lock()
	subs := make(map[string]byte, len(t.subs))
	for _, s := range t.subs {
		subs[s] = 1
	}
	t.mu.Unlock()
	if len(subs) == 0 {
		return true
	}
	tok := t.client.SubscribeMultiple(subs, nil)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.logger.Warn("mqtt resubscribe failed", slog.Any("error", tok.Error()))
		return false
	}
	return true
}

func wait(ctx context.Context, tok mqtt.Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// DialBroker dials the broker at u as paho would, over TLS for the ssl,
// tls, mqtts and tcps schemes; a ClientOptions.Dial that wraps it adds
// faults.
func DialBroker(u *url.URL, tc *tls.Config) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	switch u.Scheme {
	case "ssl", "tls", "mqtts", "tcps":
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		tc = tc.Clone()
		if tc.ServerName == "" {
			tc.ServerName = u.Hostname()
		}
		return tls.DialWithDialer(&d, "tcp", u.Host, tc)
	}
	return d.Dial("tcp", u.Host)
}
