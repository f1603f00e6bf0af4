// Command triggerwriter is the other process of the trigger tests: it
// writes a collection's changes, as an application would, while the
// workers under test come and go.
//
//	triggerwriter -uri URI -db DB -coll COLL -n N [-writers W]
//
// It makes N changes, W writers at once, each on documents of its own and
// one change at a time: inserts of documents _id w, w+W, ... (match is
// false for every fourth) alternating with updates ($inc n) of one of its
// earlier documents picked by a fixed sequence, so a run makes the same
// changes every time (their order across writers aside). Each document written carries written_at (Unix
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
	writers := flag.Int("writers", 4, "writers at once")
	flag.Parse()
	if err := run(*uri, *db, *coll, *n, *writers); err != nil {
		fmt.Fprintln(os.Stderr, "triggerwriter:", err)
		os.Exit(1)
	}
	fmt.Println("done", *n)
}

func run(uri, db, coll string, n, writers int) error {
	ctx := context.Background()
	cl, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return err
	}
	defer cl.Disconnect(ctx)
	c := cl.Database(db).Collection(coll)
	errs := make(chan error, writers)
	for w := range writers {
		go func() { errs <- write(ctx, c, w, writers, n/writers+boolInt(w < n%writers)) }()
	}
	for range writers {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// write makes writer w's n changes, on the documents whose _id is w
// modulo writers.
func write(ctx context.Context, c *mongo.Collection, w, writers, n int) error {
	inserted := 0
	var err error
	for i := range n {
		now := time.Now().UnixNano()
		if i%2 == 0 || inserted == 0 {
			id := w + inserted*writers
			_, err = c.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "match", Value: id%4 != 3},
				{Key: "n", Value: 0}, {Key: "written_at", Value: now}})
			inserted++
		} else {
			id := w + (i*7919)%inserted*writers
			_, err = c.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}, {Key: "$set", Value: bson.D{{Key: "written_at", Value: now}}}})
		}
		if err != nil {
			return fmt.Errorf("writer %d, change %d: %w", w, i, err)
		}
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
