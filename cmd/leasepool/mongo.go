package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

func openMongo(ctx context.Context, url string) (task.Store, error) {
	s, err := mongostore.Open(ctx, url, &mongostore.Config{Logger: slog.Default()})
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	return s, nil
}
