package mqttdev_test

import (
	"encoding/json"
	"fmt"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

func ExamplePublishParams() {
	p, err := mqttdev.PublishParams("reboot-pump-7", mqttdev.Command{
		Device:  "pump-7",
		Command: "reboot",
		Args:    json.RawMessage(`{"delay_s":5}`),
	}, task.Options{Priority: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.Kind, p.LockKeys, string(p.Payload))
	// Pass p to task.Publish(ctx, store, p).

	_, err = mqttdev.PublishParams("bad", mqttdev.Command{Device: "pump/#", Command: "reboot"}, task.Options{})
	fmt.Println(err)
	// Output:
	// device [device:pump-7] {"device":"pump-7","command":"reboot","args":{"delay_s":5}}
	// invalid: device: "pump/#" must not contain '+', '#' or '/'
}

func ExampleTopics() {
	t := mqttdev.Topics{Prefix: "plant1"}
	fmt.Println(t.Device("pump-7", mqttdev.TopicCmd))
	fmt.Println(t.All(mqttdev.TopicStatus))
	// Output:
	// plant1/devices/pump-7/cmd
	// plant1/devices/+/status
}
