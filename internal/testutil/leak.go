package testutil

import "go.uber.org/goleak"

// PahoShutdownGoroutines are the goroutines paho.mqtt.golang leaves for a
// while after a client's Disconnect, for goleak.VerifyTestMain of the
// packages whose tests disconnect MQTT clients:
//   - a client disconnected between reconnect attempts: Disconnect
//     returns after its quiesce; the reconnect goroutine ends with its
//     backoff sleep (at most a few seconds), and the Disconnect goroutine
//     can wait for good (v1.5.1's connectionStatus.Disconnecting receives
//     from a nil channel then, seen in cmd/leasepool's tests);
//   - a connection that drops between paho's connect and the resubscribe
//     of its OnConnect handler: the subscribe waits for the stopped writer
//     up to paho's write timeout (30 s).
func PahoShutdownGoroutines() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).reconnect"),
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).Disconnect.func1"),
		goleak.IgnoreAnyFunction("github.com/eclipse/paho%2emqtt%2egolang.(*client).SubscribeMultiple"),
	}
}
