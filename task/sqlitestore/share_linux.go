package sqlitestore

import (
	"errors"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

const shareSupported = true

// writerByte is the byte of the -lock file whose OFD lock makes its
// holder the writer (share.go); apart from the commit signal at the
// file's start and from the flock(2) write lock, which locks of this kind
// never meet.
const writerByte = 1 << 20

// tryWriterLock takes the writer's lock on f if no process holds it. It
// is held until releaseWriterLock or until f is closed (the process's
// end included).
func tryWriterLock(f *os.File) (bool, error) {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: writerByte, Len: 1}
	err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
	if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES) {
		return false, nil
	}
	return err == nil, err
}

func releaseWriterLock(f *os.File) {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: io.SeekStart, Start: writerByte, Len: 1}
	unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// samePeer reports whether the process at the other end of c runs as
// this process's user: no other user's process may write through the
// writer (it could not write the file itself either, in the usual modes).
func samePeer(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return false
	}
	return int(cred.Uid) == os.Getuid()
}
