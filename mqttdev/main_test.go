package mqttdev

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// paho's Disconnect of a client that is between reconnect attempts
		// returns at once; its reconnect goroutine notices at the end of
		// its backoff sleep (at most a few seconds) and then exits.
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).reconnect"),
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).Disconnect.func1"),
		// A connection that drops (a disconnect, a broker closing) between
		// paho's connect and the resubscribe of its OnConnect handler leaves
		// the subscribe waiting for the stopped writer up to paho's write
		// timeout (30s); then it ends.
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).SubscribeMultiple"),
	)
}
