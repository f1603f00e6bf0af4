//go:build !linux

package sqlitestore

import (
	"errors"
	"net"
	"os"
)

// Sharing a store file needs OFD locks and peer credentials (Linux):
// elsewhere every Store writes the file itself.
const shareSupported = false

func tryWriterLock(*os.File) (bool, error) { return false, errors.New("not supported") }

func releaseWriterLock(*os.File) {}

func samePeer(*net.UnixConn) bool { return false }
