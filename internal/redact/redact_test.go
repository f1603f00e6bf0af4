package redact_test

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
		secret   string // must not be in the output; "" when nothing is hidden
	}{
		// Nothing to hide.
		{"mongodb://h:27017/db", "mongodb://h:27017/db", ""},
		{"mongodb://alice@h/db", "mongodb://alice@h/db", ""},
		{"tcp://127.0.0.1:1883", "tcp://127.0.0.1:1883", ""},
		{"mongodb://h/db?appName=a@b", "mongodb://h/db?appName=a@b", ""},
		{"sqlite:/tmp/a:b@c.db", "sqlite:/tmp/a:b@c.db", ""},
		{"sqlite:x.db", "sqlite:x.db", ""},
		{"", "", ""},
		{"not a url", "not a url", ""},
		// A password in the user information.
		{"mongodb://alice:pw1234@h1,h2/db?replicaSet=rs0", "mongodb://alice:xxxxx@h1,h2/db?replicaSet=rs0", "pw1234"},
		{"mongodb+srv://bob:s3cret@cluster.example/", "mongodb+srv://bob:xxxxx@cluster.example/", "s3cret"},
		{"tcp://user:mqttpass@broker:1883", "tcp://user:xxxxx@broker:1883", "mqttpass"},
		{"ssl://user:mqttpass@broker:8883", "ssl://user:xxxxx@broker:8883", "mqttpass"},
		{"tcp://:onlypass@broker:1883", "tcp://:xxxxx@broker:1883", "onlypass"},
		// Hostile passwords: unescaped ? @ / # and percent-encoded ones.
		{"mongodb://alice:pa?ss1@h/db", "mongodb://alice:xxxxx@h/db", "pa?ss1"},
		{"mongodb://alice:p@ss/w@h/db?w=majority", "mongodb://alice:xxxxx@h/db?w=majority", "p@ss/w"},
		{"mongodb://alice:a/b/c@h/db", "mongodb://alice:xxxxx@h/db", "a/b/c"},
		{"mongodb://alice:se#cret@h/db", "mongodb://alice:xxxxx@h/db", "se#cret"},
		{"mongodb://alice:q?w=1&x@y#z@h/db?appName=k", "mongodb://alice:xxxxx@h/db?appName=k", "q?w=1&x@y#z"},
		{"mongodb://alice:p%40ss%3Fw%2F@h/db", "mongodb://alice:xxxxx@h/db", "p%40ss%3Fw%2F"},
		{"tcp://user:url-pw-8d1e4b%3Fx@y@127.0.0.1:1", "tcp://user:xxxxx@127.0.0.1:1", "url-pw-8d1e4b"},
		{"mongodb://alice:pw:with:colons@h/db", "mongodb://alice:xxxxx@h/db", "with:colons"},
		// An '@' in the options after a host with a port: hidden too, since
		// the MongoDB driver reads everything before the first '@' as user
		// information.
		{"mongodb://h:27017/db?appName=a@b", "mongodb://h:xxxxx@b", "27017/db?appName=a"},
		// Secret-bearing options.
		{"mongodb://h/db?tlsCertificateKeyFilePassword=kfpw99&w=1", "mongodb://h/db?tlsCertificateKeyFilePassword=xxxxx&w=1", "kfpw99"},
		{"mongodb://h/db?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok77", "mongodb://h/db?authMechanism=MONGODB-AWS&authMechanismProperties=xxxxx", "tok77"},
		{"https://h/x?token=abc123#frag", "https://h/x?token=xxxxx#frag", "abc123"},
		{"https://h/x?access_token=abc123&page=2", "https://h/x?access_token=xxxxx&page=2", "abc123"},
	}
	for _, tt := range tests {
		got := redact.URL(tt.in)
		if got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if tt.secret != "" && strings.Contains(got, tt.secret) {
			t.Errorf("URL(%q) = %q still holds %q", tt.in, got, tt.secret)
		}
	}
}

// TestURLHidesWhatParsersReadAsPassword checks, over many generated URLs,
// that whatever Go's net/url reads as the password never survives URL.
func TestURLHidesWhatParsersReadAsPassword(t *testing.T) {
	t.Parallel()
	chars := []string{"a", "Z", "9", "?", "@", "/", "#", ":", "%40", "%3F", "&", "=", ";", "[", "]", "!", "~"}
	n := 0
	for _, a := range chars {
		for _, b := range chars {
			for _, c := range chars {
				pw := "Pw" + a + b + c + "q7"
				for _, raw := range []string{
					"tcp://user:" + pw + "@broker:1883",
					"mongodb://user:" + pw + "@h1,h2/db?w=1",
					"mongodb+srv://user:" + pw + "@c.example/db",
				} {
					got := redact.URL(raw)
					if strings.Contains(got, "Pw"+a) || strings.Contains(got, pw) {
						t.Fatalf("URL(%q) = %q shows the password", raw, got)
					}
					if u, err := url.Parse(raw); err == nil && u.User != nil {
						if p, ok := u.User.Password(); ok && p != "" && strings.Contains(got, p) {
							t.Fatalf("URL(%q) = %q shows net/url's password %q", raw, got, p)
						}
					}
					n++
				}
			}
		}
	}
	if n < 10000 {
		t.Fatalf("only %d cases", n)
	}
}

func TestString(t *testing.T) {
	t.Parallel()
	raw := "tcp://user:p@ss%zzword@broker:1883"
	_, perr := url.Parse(raw)
	if perr == nil {
		t.Fatal("url.Parse accepted a hostile URL: pick another")
	}
	msg := "broker_url: " + perr.Error() + "; password p@ss%zzword refused"
	got := redact.String(msg, []string{raw}, "hunter22")
	for _, s := range []string{"p@ss%zzword", "p@ss"} {
		if strings.Contains(got, s) {
			t.Errorf("String = %q still holds %q", got, s)
		}
	}
	if !strings.Contains(got, "tcp://user:xxxxx@broker:1883") {
		t.Errorf("String = %q, want the hidden URL in it", got)
	}
	if got := redact.String("token hunter22 sent", nil, "hunter22", ""); got != "token xxxxx sent" {
		t.Errorf("String = %q", got)
	}
}

func TestError(t *testing.T) {
	t.Parallel()
	base := errors.New("dial failed")
	raw := "tcp://u:secret99@h:1"
	err := redact.Error(fmt.Errorf("mqtt %s: %w", raw, base), []string{raw})
	if strings.Contains(err.Error(), "secret99") || !strings.Contains(err.Error(), "u:xxxxx@h:1") {
		t.Errorf("Error = %q", err)
	}
	if !errors.Is(err, base) {
		t.Error("Error lost the wrapped error")
	}
	if redact.Error(nil, []string{raw}) != nil {
		t.Error("Error(nil) is not nil")
	}
	if e := fmt.Errorf("clean"); redact.Error(e, []string{raw}) != e {
		t.Error("Error wrapped an error with nothing to hide")
	}
}

func TestSecret(t *testing.T) {
	t.Parallel()
	if redact.Secret("") != "" || redact.Secret("x") != redact.Mask {
		t.Errorf("Secret: %q %q", redact.Secret(""), redact.Secret("x"))
	}
}
