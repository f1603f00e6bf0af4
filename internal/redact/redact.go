// Package redact hides credentials in text bound for a log, an error,
// standard output or the store: the password of a URL's user information,
// secret-bearing query options, and secret values given whole.
//
// It errs on the side of hiding: drivers disagree on which '@' ends a URL's
// user information (the MongoDB driver takes the first, Go's net/url the
// last one before the path), so URL hides everything between the first ':'
// after the scheme and the last '@'. A URL with a port and an '@' in its
// query loses its host to the mask; a password never shows.
package redact

import (
	"net/url"
	"strings"
)

// Mask replaces every hidden value.
const Mask = "xxxxx"

// secretOptions are query option names whose values are credentials,
// matched in lower case: a name containing one of these is hidden.
var secretOptions = []string{"password", "secret", "token", "authmechanismproperties", "signature", "credential"}

// URL returns s with the password of its user information and the values
// of its secret-bearing query options replaced by Mask. The user name stays
// (it tells which account was used). Strings without "://" are returned as
// they are: an opaque "sqlite:PATH" holds no credential, and a path may
// well contain ':' and '@'.
func URL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || scheme == "" || strings.ContainsAny(scheme, "/?#@ ") {
		return s
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if user, _, hasPassword := strings.Cut(rest[:at], ":"); hasPassword {
			rest = user + ":" + Mask + rest[at:]
		}
	}
	return scheme + "://" + options(rest)
}

// options hides the values of secret-bearing options in rest's query.
func options(rest string) string {
	q := strings.IndexByte(rest, '?')
	if q < 0 {
		return rest
	}
	query, fragment, hasFragment := strings.Cut(rest[q+1:], "#")
	parts := strings.Split(query, "&")
	for i, p := range parts {
		name, _, hasValue := strings.Cut(p, "=")
		if hasValue && secretOption(name) {
			parts[i] = name + "=" + Mask
		}
	}
	out := rest[:q+1] + strings.Join(parts, "&")
	if hasFragment {
		out += "#" + fragment
	}
	return out
}

func secretOption(name string) bool {
	name = strings.ToLower(name)
	for _, s := range secretOptions {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

// Secret returns Mask for a set value and "" for an empty one, for
// printing whether a credential was given without printing it.
func Secret(s string) string {
	if s == "" {
		return ""
	}
	return Mask
}

// String returns s with every URL in urls replaced by its URL form, and
// every secret in secrets, and every password in urls (as written and
// percent-decoded), replaced by Mask wherever else it appears. Use it on
// text a library made from a credential it was given, such as a parse
// error quoting the whole URL or a driver error quoting the password.
func String(s string, urls []string, secrets ...string) string {
	for _, u := range urls {
		if u == "" {
			continue
		}
		s = strings.ReplaceAll(s, u, URL(u))
		if p := urlPassword(u); p != "" {
			secrets = append(secrets, p)
			if d, err := url.PathUnescape(p); err == nil && d != p {
				secrets = append(secrets, d)
			}
		}
	}
	for _, sec := range secrets {
		if sec != "" {
			s = strings.ReplaceAll(s, sec, Mask)
		}
	}
	return s
}

// urlPassword is the text URL hides in u's user information, "" if none.
func urlPassword(u string) string {
	_, rest, ok := strings.Cut(u, "://")
	if !ok {
		return ""
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}

// Error returns err with its message passed through String, or nil for a
// nil err. errors.Is and errors.As still see err and its chain.
func Error(err error, urls []string, secrets ...string) error {
	if err == nil {
		return nil
	}
	msg := String(err.Error(), urls, secrets...)
	if msg == err.Error() {
		return err
	}
	return &redacted{msg: msg, err: err}
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
