package web

// The guard in front of every route: the Host check (DNS rebinding), the
// login and the credential's scope. docs/security.md describes the
// answers.

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// check validates cfg's credentials and hosts, naming the field at fault.
func (cfg Config) check() error {
	if (cfg.BasicUser == "") != (cfg.BasicPassword == "") {
		return errors.New("web: Config.BasicUser and Config.BasicPassword go together")
	}
	if (cfg.ReadBasicUser == "") != (cfg.ReadBasicPassword == "") {
		return errors.New("web: Config.ReadBasicUser and Config.ReadBasicPassword go together")
	}
	if strings.Contains(cfg.BasicUser, ":") {
		return errors.New("web: Config.BasicUser must not contain ':'")
	}
	if strings.Contains(cfg.ReadBasicUser, ":") {
		return errors.New("web: Config.ReadBasicUser must not contain ':'")
	}
	// One secret in both roles would make the request's scope depend on
	// which compare ran first.
	if cfg.ReadToken != "" && cfg.ReadToken == cfg.Token {
		return errors.New("web: Config.ReadToken must differ from Config.Token")
	}
	if cfg.WorkerToken != "" && (cfg.WorkerToken == cfg.Token || cfg.WorkerToken == cfg.ReadToken) {
		return errors.New("web: Config.WorkerToken must differ from Config.Token and Config.ReadToken")
	}
	if len(cfg.WorkerKinds) > 0 && cfg.WorkerToken == "" {
		return errors.New("web: Config.WorkerKinds needs Config.WorkerToken")
	}
	for i, k := range cfg.WorkerKinds {
		if err := task.ValidateName(fmt.Sprintf("web: Config.WorkerKinds[%d]", i), k); err != nil {
			return err
		}
	}
	if cfg.ReadBasicUser != "" && cfg.ReadBasicUser == cfg.BasicUser && cfg.ReadBasicPassword == cfg.BasicPassword {
		return errors.New("web: Config.ReadBasicUser and ReadBasicPassword must differ from BasicUser and BasicPassword")
	}
	for _, h := range cfg.AllowedHosts {
		if net.ParseIP(h) == nil && (h == "" || strings.ContainsAny(h, ":/[]@ \t") || h != strings.ToLower(h)) {
			return fmt.Errorf("web: Config.AllowedHosts: %q is not a lower-case host name or an IP address, without a port", h)
		}
	}
	return nil
}

// hasCredentials reports whether cfg requires a login.
func (cfg Config) hasCredentials() bool {
	return cfg.Token != "" || cfg.BasicUser != "" || cfg.ReadToken != "" || cfg.ReadBasicUser != "" || cfg.WorkerToken != ""
}

// Guard puts next behind cfg's guard, exactly as NewHandler guards its own
// routes, so that a server can serve other handlers (such as a worker's
// /metrics) under the same rules. In order:
//
//  1. The Host check (see Config.AllowedHosts): a Host not served here is
//     answered 421 Misdirected Request before anything else runs.
//  2. The login, when cfg has credentials: none or wrong ones get 401 and
//     the connection is closed.
//  3. The scope: a read-only credential (ReadToken, ReadBasicUser) may only
//     GET and HEAD; any other method gets 403.
//
// Every answer carries X-Content-Type-Options: nosniff.
func Guard(cfg Config, next http.Handler) (http.Handler, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	h := next
	if cfg.hasCredentials() {
		h = authenticate(cfg, h)
	}
	if !cfg.hasCredentials() || len(cfg.AllowedHosts) > 0 {
		h = checkHost(cfg.AllowedHosts, cfg.AllowAddressHosts, h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	}), nil
}

// checkHost serves only requests whose Host names this machine's loopback
// interface (localhost, 127.x.y.z, [::1]) or one of allowed (or, with
// addresses, is any IP literal), with any port. A page on another name
// that the attacker's DNS points at 127.0.0.1 (DNS rebinding) counts as
// same-origin in the browser: the Host header, which is that name, is
// what gives it away.
func checkHost(allowed []string, addresses bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, ok := hostName(r.Host)
		if ok && (loopbackHost(host) || containsFold(allowed, host) || (addresses && net.ParseIP(host) != nil)) {
			next.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusMisdirectedRequest, fmt.Sprintf(
			"host %q is not served here; use localhost, 127.0.0.1 or [::1], or a host the server is told to serve (serve --public-url)", r.Host))
	})
}

// hostName is the host of a Host header value without its port, lower
// case; ok is false when it does not parse (a port that is not digits, an
// unclosed bracket, an empty host).
func hostName(hostport string) (host string, ok bool) {
	host, port := hostport, ""
	if strings.HasPrefix(hostport, "[") {
		end := strings.IndexByte(hostport, ']')
		if end < 0 {
			return "", false
		}
		host, port = hostport[1:end], hostport[end+1:]
		if !strings.Contains(host, ":") || net.ParseIP(host) == nil {
			return "", false // only IPv6 literals go in brackets
		}
	} else if i := strings.LastIndexByte(hostport, ':'); i >= 0 {
		host, port = hostport[:i], hostport[i:]
	}
	if port != "" && (port[0] != ':' || len(port) > 6 || strings.Trim(port[1:], "0123456789") != "") {
		return "", false
	}
	if host == "" || (!strings.HasPrefix(hostport, "[") && strings.Contains(host, ":")) {
		return "", false
	}
	return strings.ToLower(host), true
}

// loopbackHost reports whether host, as hostName returns it, is exactly
// localhost or a loopback IP literal. Names under .localhost are not
// included: nothing guarantees every resolver keeps them local.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func containsFold(list []string, s string) bool {
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

// readOnlyKey marks a request made with a read-only credential.
type readOnlyKey struct{}

// workerKey marks a request made with the worker credential; its value is
// the kinds the credential covers (none: every kind).
type workerKey struct{}

// workerKinds reports whether r came with the worker credential, and the
// kinds it covers.
func workerKinds(r *http.Request) ([]string, bool) {
	kinds, ok := r.Context().Value(workerKey{}).([]string)
	return kinds, ok
}

// workerRoute reports whether r is a call of the remote worker protocol,
// the only calls a worker credential may make.
func workerRoute(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodHead && strings.HasPrefix(r.URL.Path, "/api/v1/workers/")
}

// readOnlyRequest reports whether r came with a read-only credential.
func readOnlyRequest(r *http.Request) bool {
	ro, _ := r.Context().Value(readOnlyKey{}).(bool)
	return ro
}

// safeMethod reports whether method only reads.
func safeMethod(method string) bool {
	return method == http.MethodGet || method == http.MethodHead
}

// authenticate lets through only requests carrying one of cfg's
// credentials, and a read-only one only for GET and HEAD. Secrets are
// hashed first so the constant-time compare also hides their length.
func authenticate(cfg Config, next http.Handler) http.Handler {
	hash := func(s string) [32]byte { return sha256.Sum256([]byte(s)) }
	wantToken, wantReadToken, wantWorkerToken := hash(cfg.Token), hash(cfg.ReadToken), hash(cfg.WorkerToken)
	wantBasic := hash(cfg.BasicUser + ":" + cfg.BasicPassword)
	wantReadBasic := hash(cfg.ReadBasicUser + ":" + cfg.ReadBasicPassword)
	same := func(given string, want [32]byte) bool {
		got := hash(given)
		return subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	// scope is 0 for no valid credential, 1 for a read-only one, 2 for the
	// full one, 3 for the worker one.
	scope := func(r *http.Request) int {
		if given, ok := bearer(r); ok {
			switch {
			case cfg.Token != "" && same(given, wantToken):
				return 2
			case cfg.ReadToken != "" && same(given, wantReadToken):
				return 1
			case cfg.WorkerToken != "" && same(given, wantWorkerToken):
				return 3
			}
		}
		if user, pass, ok := r.BasicAuth(); ok {
			switch {
			case cfg.BasicUser != "" && same(user+":"+pass, wantBasic):
				return 2
			case cfg.ReadBasicUser != "" && same(user+":"+pass, wantReadBasic):
				return 1
			}
		}
		return 0
	}
	basic := cfg.BasicUser != "" || cfg.ReadBasicUser != ""
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch scope(r) {
		case 2:
			next.ServeHTTP(w, r)
			return
		case 3:
			if !workerRoute(r) {
				writeError(w, http.StatusForbidden, "this credential is a worker's: it may only register, claim, renew and finish (/api/v1/workers/{id}...)")
				return
			}
			kinds := cfg.WorkerKinds
			if kinds == nil {
				kinds = []string{}
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), workerKey{}, kinds)))
			return
		case 1:
			if !safeMethod(r.Method) {
				writeError(w, http.StatusForbidden, "this credential is read-only")
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), readOnlyKey{}, true)))
			return
		}
		// Nothing more is read from a client that could not log in: the
		// connection ends with the answer, whatever body it was sending.
		w.Header().Set("Connection", "close")
		if basic {
			// The browser asks for a user and password on this challenge.
			w.Header().Set("WWW-Authenticate", `Basic realm="leasepool", charset="UTF-8"`)
			writeError(w, http.StatusUnauthorized, "missing or wrong credentials (basic auth, or Authorization: Bearer TOKEN)")
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="leasepool"`)
		writeError(w, http.StatusUnauthorized, "missing or wrong bearer token (Authorization: Bearer TOKEN)")
	})
}

// bearer is the token of an "Authorization: Bearer TOKEN" header: the
// scheme is case-insensitive (RFC 9110, section 11.1), then one space,
// then the token exactly.
func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}
