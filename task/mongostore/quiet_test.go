package mongostore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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

// TestRenewalsLeftOutWhateverTheLookupReads: a SkipQuiet stream leaves out
// renewals by what their own write set, not by the document the event
// looks up, which on the wire test server is read when the stream is
// polled: renewals written before the poll come with a later document,
// of another version than theirs, and must still be left out.
func TestRenewalsLeftOutWhateverTheLookupReads(t *testing.T) {
	st, _ := openFresh(t, testservers.MongoURI(t))
	ctx := context.Background()
	cs, err := st.Watch(ctx, task.WatchParams{SkipQuiet: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	tk, _, err := task.Publish(ctx, st, task.PublishParams{Key: "a", Kind: "k"})
	if err != nil {
		t.Fatal(err)
	}
	holder := tk.Claim(task.Holder{TaskKey: "a", WorkerID: "w", Instance: "i"}, st.Now())
	if err := st.Update(ctx, tk); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := tk.Renew(holder, st.Now()); err != nil {
			t.Fatal(err)
		}
		if err := st.Update(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "b", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) == 0 || got[len(got)-1] != "b" {
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ev, err := cs.Next(nctx)
		cancel()
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		v := int64(0)
		if ev.Task != nil {
			v = ev.Task.Version
		}
		got = append(got, fmt.Sprintf("%s@%d", ev.Key, v))
		if ev.Key == "b" {
			got[len(got)-1] = "b"
		}
	}
	// The insert and the claim of a, then b: the claim's event may carry a
	// later document (a renewal's), but no renewal has an event of its own.
	if len(got) != 3 {
		t.Fatalf("events %v; want a's insert, a's claim and b's insert (no renewal)", got)
	}
}
