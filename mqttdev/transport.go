package mqttdev

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

func (c *ClientConfig) validate() error {
	if c.BrokerURL == "" {
		return errors.New("broker_url: required")
	}
	u, err := url.Parse(c.BrokerURL)
	if err != nil {
		return fmt.Errorf("broker_url: %w", err)
	}
	switch u.Scheme {
	case "tcp", "mqtt", "ssl", "tls", "mqtts", "tcps":
	default:
		return fmt.Errorf("broker_url: scheme %q is not one of tcp, mqtt, ssl, tls, mqtts", u.Scheme)
	}
	if u.Host == "" {
		return fmt.Errorf("broker_url: %q has no host", c.BrokerURL)
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
	// Publish sends payload at QoS 1 and returns once the broker has it, or
	// with ctx's error. On a lost connection the message stays queued in
	// the client and is resent after reconnect.
	Publish(ctx context.Context, topic string, retained bool, payload []byte) error
	// Subscribe adds filter to the subscriptions.
	Subscribe(ctx context.Context, filter string) error
}

// pahoOptions are the parts of a paho client that differ between the
// handler and a simulated device.
type pahoOptions struct {
	role string
	// onMessage gets every message; it runs on paho's goroutine and must
	// not block.
	onMessage func(Message)
	// onConnect runs (in its own goroutine) after each connection, after
	// the subscriptions were made again.
	onConnect func()
	// onLost runs when the connection is lost.
	onLost      func(error)
	willTopic   string
	willPayload func() []byte
	// dial replaces the TCP dial (simulated outages); nil dials normally.
	dial func(u *url.URL, tc *tls.Config) (net.Conn, error)
	// cleanSession asks for a throwaway session (read-only tools).
	cleanSession bool
	// maxReconnect caps the reconnect backoff; zero means
	// defaultMaxReconnect.
	maxReconnect time.Duration
	logger       *slog.Logger
}

// defaultMaxReconnect caps the time between connection attempts: a broker
// that comes back (a restart, or another host taking it over) is found
// again within it. A dial per half second to a dead loopback or LAN
// address costs nothing worth saving.
const defaultMaxReconnect = 500 * time.Millisecond

// pahoTransport is Transport over a paho client with a persistent session.
type pahoTransport struct {
	client mqtt.Client
	logger *slog.Logger

	mu   sync.Mutex
	subs []string
}

func newPahoTransport(cfg ClientConfig, o pahoOptions) (*pahoTransport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if cfg.ClientID == "" {
		cfg.ClientID = defaultClientID(o.role)
	}
	t := &pahoTransport{logger: o.logger}
	if o.maxReconnect == 0 {
		o.maxReconnect = defaultMaxReconnect
	}
	onMessage := func(_ mqtt.Client, m mqtt.Message) {
		o.onMessage(Message{Topic: m.Topic(), Payload: m.Payload(), Retained: m.Retained()})
	}
	opts := mqtt.NewClientOptions().
		AddBroker(cfg.BrokerURL).
		SetClientID(cfg.ClientID).
		SetCleanSession(o.cleanSession).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(defaultMaxReconnect).
		SetMaxReconnectInterval(o.maxReconnect).
		SetKeepAlive(10 * time.Second).
		SetPingTimeout(5 * time.Second).
		SetConnectTimeout(5 * time.Second).
		SetOrderMatters(false).
		// Messages of a resumed session arrive before any Subscribe call:
		// the default handler routes (and so acks) them.
		SetDefaultPublishHandler(onMessage).
		SetOnConnectHandler(func(mqtt.Client) {
			t.resubscribe()
			if o.onConnect != nil {
				o.onConnect()
			}
		}).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) {
			t.logger.Warn("mqtt connection lost", slog.String("client_id", cfg.ClientID), slog.Any("error", err))
			if o.onLost != nil {
				o.onLost(err)
			}
		})
	if cfg.Username != "" {
		opts.SetUsername(cfg.Username).SetPassword(cfg.Password)
	}
	if tc != nil {
		opts.SetTLSConfig(tc)
	}
	if o.willTopic != "" {
		opts.SetBinaryWill(o.willTopic, o.willPayload(), 1, true)
	}
	if o.dial != nil {
		opts.SetCustomOpenConnectionFn(func(u *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			return o.dial(u, tc)
		})
	}
	t.client = mqtt.NewClient(opts)
	return t, nil
}

// connect connects, retrying until ctx ends.
func (t *pahoTransport) connect(ctx context.Context) error {
	tok := t.client.Connect()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		t.client.Disconnect(0)
		return fmt.Errorf("mqtt connect: %w", context.Cause(ctx))
	}
}

func (t *pahoTransport) disconnect() { t.client.Disconnect(250) }

func (t *pahoTransport) Publish(ctx context.Context, topic string, retained bool, payload []byte) error {
	return wait(ctx, t.client.Publish(topic, 1, retained, payload))
}

func (t *pahoTransport) Subscribe(ctx context.Context, filter string) error {
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
// (restarted without persistence) no longer has them.
func (t *pahoTransport) resubscribe() {
	t.mu.Lock()
	subs := make(map[string]byte, len(t.subs))
	for _, s := range t.subs {
		subs[s] = 1
	}
	t.mu.Unlock()
	if len(subs) == 0 {
		return
	}
	tok := t.client.SubscribeMultiple(subs, nil)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.logger.Warn("mqtt resubscribe failed", slog.Any("error", tok.Error()))
	}
}

func wait(ctx context.Context, tok mqtt.Token) error {
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func dialBroker(u *url.URL, tc *tls.Config) (net.Conn, error) {
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

// FaultTransport wraps a Transport and injects faults into its publishes,
// for unit tests: Drop loses a publish silently (the broker never sees it,
// the caller sees success), Delay holds each publish back, Err fails it.
type FaultTransport struct {
	Inner Transport

	mu    sync.Mutex
	drop  func(topic string, payload []byte) bool
	delay time.Duration
	err   error
	count map[string]int
}

// NewFaultTransport wraps inner with no faults set.
func NewFaultTransport(inner Transport) *FaultTransport {
	return &FaultTransport{Inner: inner, count: map[string]int{}}
}

// SetDrop sets the function that decides which publishes are lost; nil
// loses none.
func (f *FaultTransport) SetDrop(fn func(topic string, payload []byte) bool) {
	f.mu.Lock()
	f.drop = fn
	f.mu.Unlock()
}

// SetDelay delays every publish by d.
func (f *FaultTransport) SetDelay(d time.Duration) { f.mu.Lock(); f.delay = d; f.mu.Unlock() }

// SetErr makes every publish fail with err; nil clears it.
func (f *FaultTransport) SetErr(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

// Published reports how many publishes to topic were attempted.
func (f *FaultTransport) Published(topic string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[topic]
}

func (f *FaultTransport) Publish(ctx context.Context, topic string, retained bool, payload []byte) error {
	f.mu.Lock()
	f.count[topic]++
	drop, delay, err := f.drop, f.delay, f.err
	f.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
	if err != nil {
		return err
	}
	if drop != nil && drop(topic, payload) {
		return nil
	}
	return f.Inner.Publish(ctx, topic, retained, payload)
}

func (f *FaultTransport) Subscribe(ctx context.Context, filter string) error {
	return f.Inner.Subscribe(ctx, filter)
}
