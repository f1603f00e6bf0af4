package mongostore_test

import (
	"context"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// TestQuietWritesAreMarkedForTheServer: a lease renewal sets quiet_version
// to the version it writes, and no other write sets it, so that the
// $match of a SkipQuiet stream on updateDescription.updatedFields
// leaves out exactly the renewals on MongoDB (the wire test server's
// events carry no updateDescription; its streams drop renewals in the
// client, which storetest's Watch/SkipQuiet checks).
func TestQuietWritesAreMarkedForTheServer(t *testing.T) {
	st, _ := openFresh(t, testservers.MongoURI(t))
	ctx := context.Background()
	marked := func(what string, want int64) {
		t.Helper()
		var raw bson.Raw
		if err := st.Database().Collection(mongostore.TasksCollection).FindOne(ctx, bson.D{{Key: "key", Value: "a"}}).Decode(&raw); err != nil {
			t.Fatal(err)
		}
		got, _ := raw.Lookup("quiet_version").AsInt64OK()
		if got != want {
			t.Fatalf("after the %s: quiet_version %d, want %d", what, got, want)
		}
	}
	tk, _, err := task.Publish(ctx, st, task.PublishParams{Key: "a", Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	holder := tk.Claim(task.Holder{TaskKey: "a", WorkerID: "w", Instance: "i"}, st.Now())
	write := func(what string, change func() error) {
		t.Helper()
		if err := change(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := st.Update(ctx, tk); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	write("claim", func() error { return nil })
	marked("claim", 0)
	write("renewal", func() error { return tk.Renew(holder, st.Now()) })
	marked("first renewal", 3)
	write("renewal", func() error { return tk.Renew(holder, st.Now()) })
	marked("second renewal", 4)
	write("finish", func() error { return tk.Succeed(holder, st.Now()) })
	marked("finish", 4)
}
