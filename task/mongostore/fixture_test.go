package mongostore_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leasepool/leasepool/task/mongostore"
)

// openFresh opens a store on a database of its own on the shared test
// server at uri, closed and dropped when t ends. The config it returns
// reopens the same database.
func openFresh(t testing.TB, uri string) (*mongostore.Store, mongostore.Config) {
	t.Helper()
	cfg := mongostore.Config{Database: freshDB()}
	st := open(t, uri, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.Database().Drop(ctx)
	})
	return st, cfg
}

// readFixture decodes the JSON file at path into v.
func readFixture(t testing.TB, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// insertFixture inserts docs, each in MongoDB extended JSON, into the
// collection coll of st's database, as a program of an older schema
// wrote them.
func insertFixture(t testing.TB, st *mongostore.Store, coll string, docs []json.RawMessage) {
	t.Helper()
	c := st.Database().Collection(coll)
	for _, d := range docs {
		var doc bson.D
		if err := bson.UnmarshalExtJSON(d, true, &doc); err != nil {
			t.Fatalf("%s: %v", coll, err)
		}
		if _, err := c.InsertOne(t.Context(), doc); err != nil {
			t.Fatalf("insert into %s: %v", coll, err)
		}
	}
}
