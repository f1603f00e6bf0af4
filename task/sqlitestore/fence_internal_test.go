package sqlitestore

import "testing"

func TestFlockHolder(t *testing.T) {
	// fd:01 is device 253:1; the file is inode 4242 on it.
	const dev = 253<<8 | 1
	locks := []byte(`1: POSIX  ADVISORY  WRITE 111 fd:01:4242 0 EOF
2: FLOCK  ADVISORY  WRITE 222 fd:01:9999 0 EOF
2: -> FLOCK  ADVISORY  WRITE 333 fd:01:4242 0 EOF
3: FLOCK  ADVISORY  WRITE 444 08:01:4242 0 EOF
4: FLOCK  ADVISORY  WRITE 555 fd:01:4242 0 EOF
`)
	if got := flockHolder(locks, dev, 4242, 1); got != 555 {
		t.Errorf("holder = %d, want 555 (not the POSIX lock, the other file, the waiter or the other device)", got)
	}
	if got := flockHolder(locks, dev, 4242, 555); got != 0 {
		t.Errorf("holder = %d, want 0: this process's own lock is not another's", got)
	}
	// A device number too big for the old 8-bit encoding: 259:65536.
	big := uint64(259)<<8 | uint64(65536)&0xff | (uint64(65536)&^0xff)<<12
	if devMajor(big) != 259 || devMinor(big) != 65536 {
		t.Errorf("dev %#x splits into %d:%d, want 259:65536", big, devMajor(big), devMinor(big))
	}
}
