//go:build !linux

package sqlitestore

import (
	"errors"
	"time"
)

// defaultHost has no shared boot clock outside Linux: stores fall back to
// a private epoch (see clock.go).
var defaultHost = hostClock{
	bootID:   func() (string, error) { return "", errors.ErrUnsupported },
	boottime: rawBoottime,
}

func rawBoottime() (time.Duration, error) { return 0, errors.ErrUnsupported }
