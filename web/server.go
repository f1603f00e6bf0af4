package web

// The http.Server every leasepool listener runs (`leasepool serve` and
// each --metrics-addr), so that a client that connects and then sends
// slowly, or not at all, cannot hold a connection.

import (
	"net/http"
	"time"
)

// The defaults of ServerLimits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
)

// ServerLimits bound a server's connections; each zero field takes its
// default. The event stream (GET /api/v1/events) lifts ReadTimeout and
// WriteTimeout for itself: it bounds each of its writes by WriteTimeout
// instead of the whole answer.
type ServerLimits struct {
	// ReadHeaderTimeout bounds reading a request's headers.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing an answer, from the end of the
	// request's headers.
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection waits for its next
	// request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers; more gets 431.
	MaxHeaderBytes int
}

// withDefaults fills l's zero fields.
func (l ServerLimits) withDefaults() ServerLimits {
	set := func(d *time.Duration, def time.Duration) {
		if *d <= 0 {
			*d = def
		}
	}
	set(&l.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	set(&l.ReadTimeout, DefaultReadTimeout)
	set(&l.WriteTimeout, DefaultWriteTimeout)
	set(&l.IdleTimeout, DefaultIdleTimeout)
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	return l
}

// NewServer returns a server of h whose connections l bounds (zero
// fields: the defaults). Pass the same l as Config.Limits to the handler
// of NewHandler, so that its event streams know the write bound.
func NewServer(h http.Handler, l ServerLimits) *http.Server {
	l = l.withDefaults()
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}
