// Command triggerwriter is the other process of the trigger tests: it
// writes a collection's changes, as an application would, while the
// workers under test come and go.
//
//	triggerwriter -uri URI -db DB -coll COLL -n N [-every K]
//
// It makes N changes, one at a time: inserts of documents _id 0, 1, ...
// (match is false for every fourth) alternating with updates ($inc n) of
// an earlier document picked by a fixed sequence, so a run is the same
// every time. Each document written carries written_at (Unix
// nanoseconds), for the lag of the task it publishes. It prints "done N"
// when every write has been acknowledged.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func main() {
	uri := flag.String("uri", "", "MongoDB URI")
	db := flag.String("db", "", "database")
	coll := flag.String("coll", "", "collection")
	n := flag.Int("n", 1000, "changes to make")
	flag.Parse()
	if err := run(*uri, *db, *coll, *n); err != nil {
		fmt.Fprintln(os.Stderr, "triggerwriter:", err)
		os.Exit(1)
	}
	fmt.Println("done", *n)
}

func run(uri, db, coll string, n int) error {
	ctx := context.Background()
	cl, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return err
	}
	defer cl.Disconnect(ctx)
	c := cl.Database(db).Collection(coll)
	inserted := 0
	for i := range n {
		now := time.Now().UnixNano()
		if i%2 == 0 || inserted == 0 {
			_, err = c.InsertOne(ctx, bson.D{{Key: "_id", Value: inserted}, {Key: "match", Value: inserted%4 != 3},
				{Key: "n", Value: 0}, {Key: "written_at", Value: now}})
			inserted++
		} else {
			id := (i * 7919) % inserted
			_, err = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "$set", Value: bson.D{{Key: "written_at", Value: now}}}})
		}
		if err != nil {
			return fmt.Errorf("change %d: %w", i, err)
		}
	}
	return nil
}
