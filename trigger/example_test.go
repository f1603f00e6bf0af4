package trigger_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/trigger"
)

// A trigger from Go: every new order of shop.orders publishes an
// order-placed task, holding the lock "shop", with the order's status and
// customer as payload. The workers' elected one publishes; a program of
// its own runs trigger.NewRunner's Duty on its own elector instead.
func Example() {
	ctx := context.Background()
	st, err := store.Open(ctx, "mongodb://db.example.com/leasepool?replicaSet=rs0", store.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	t, err := trigger.Add(ctx, st, trigger.Trigger{
		Name:       "neworders",
		Collection: "shop.orders",
		Filter:     json.RawMessage(`{"status": "new"}`),
		Operations: []string{task.OpInsert},
		Fields:     []string{"status", "customer"},
		Kind:       "order-placed",
		Options:    task.Options{LockKeys: []string{"shop"}},
	}, false)
	if err != nil {
		fmt.Println(err) // bad input: one line naming the field, nothing written
		return
	}
	fmt.Println("added", t.Name, "from", t.Since)
}
