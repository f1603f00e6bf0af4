//go:build !unix

package device

// RaiseFileLimit is a no-op where there is no RLIMIT_NOFILE: the system
// refuses a connection past its own limit, and the device reports it.
func RaiseFileLimit(need int) (uint64, error) { return uint64(need), nil }
