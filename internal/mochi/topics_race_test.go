package mqtt

import (
	"sync"
	"testing"

	"github.com/leasepool/leasepool/internal/mochi/packets"
)

// TestRetainedMessagesReadWhileSet: the broker's topic index serves a
// wildcard subscription's retained messages while another client sets and
// clears a retained message (a device's retained will, its status): with
// the race detector on, a read of the topic's retained path outside its
// lock fails the test.
func TestRetainedMessagesReadWhileSet(t *testing.T) {
	t.Parallel()
	x := NewTopicsIndex()
	x.RetainMessage(packets.Packet{TopicName: "leasepool/dev/d0/status", Payload: []byte("x"), FixedHeader: packets.FixedHeader{Retain: true}})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 2000 {
			payload := []byte("online")
			if i%2 == 1 {
				payload = nil // cleared
			}
			x.RetainMessage(packets.Packet{TopicName: "leasepool/dev/d1/status", Payload: payload, FixedHeader: packets.FixedHeader{Retain: true}})
		}
	})
	wg.Go(func() {
		for range 2000 {
			x.Messages("leasepool/dev/+/status")
			x.Messages("leasepool/dev/d1/+")
		}
	})
	wg.Wait()
	if got := x.Messages("leasepool/dev/+/status"); len(got) != 1 {
		t.Errorf("%d retained messages under the wildcard, want d0's alone (d1's was cleared last)", len(got))
	}
}
