package mqttdev

import (
	mqtt "github.com/leasepool/leasepool/internal/mochi"
	"github.com/leasepool/leasepool/internal/mochi/packets"
)

// inlineHandler adapts fn to a mochi inline subscription; fn must not block.
func inlineHandler(fn func(payload []byte)) mqtt.InlineSubFn {
	return func(_ *mqtt.Client, _ packets.Subscription, pk packets.Packet) { fn(pk.Payload) }
}
