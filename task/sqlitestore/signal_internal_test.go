package sqlitestore

import "testing"

func TestCommitSignal(t *testing.T) {
	for _, seq := range []int64{0, 1, 255, 1 << 40} {
		if got, ok := decodeSignal(encodeSignal(seq)); !ok || got != seq {
			t.Errorf("decode(encode(%d)) = %d, %v", seq, got, ok)
		}
	}
	legacy := encodeSignal(7)
	legacy[0] = 0 // an older version's commit wrote its zero byte over the marker
	torn := encodeSignal(7)
	torn[15] ^= 1 // half of a newer signal
	for name, b := range map[string][]byte{
		"empty file": nil, "older version's byte alone": {0}, "older version's byte over a signal": legacy,
		"torn": torn, "short": encodeSignal(7)[:signalLen-1],
	} {
		if seq, ok := decodeSignal(b); ok {
			t.Errorf("%s: decoded seq %d; want none", name, seq)
		}
	}
}
