package main

import (
	"context"
	"errors"

	"github.com/leasepool/leasepool/task"
)

func openMongo(_ context.Context, url string) (task.Store, error) {
	return nil, errors.New("--store: the MongoDB backend is not built into this version yet")
}
