package mongostore

// The store clock: the local clock plus an offset to the server's, measured
// at open and refreshed in the background.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Now implements task.Store: the local clock plus the measured offset to
// the server's clock.
func (s *Store) Now() time.Time {
	return s.cfg.Clock().Add(time.Duration(s.offset.Load()))
}

// Offset is the current estimate of the server's clock minus the local
// clock.
func (s *Store) Offset() time.Duration { return time.Duration(s.offset.Load()) }

// clockOffset estimates server minus local time from one exchange: the
// request left at sent and the answer came at recv (local clock), and the
// server said server. The server is assumed to have read its clock half
// way through the round trip.
func clockOffset(sent, recv, server time.Time) (offset, rtt time.Duration) {
	rtt = recv.Sub(sent)
	mid := sent.Add(rtt / 2)
	return server.Sub(mid), rtt
}

// sampleClock runs hello once and returns the offset and round trip.
func (s *Store) sampleClock(ctx context.Context) (offset, rtt time.Duration, err error) {
	var reply struct {
		LocalTime time.Time `bson:"localTime"`
	}
	cmd := "hello"
	if s.noHello.Load() {
		cmd = "isMaster"
	}
	sent := s.cfg.Clock()
	err = s.db.RunCommand(ctx, bson.D{{Key: cmd, Value: 1}}).Decode(&reply)
	recv := s.cfg.Clock()
	if srv, ok := errors.AsType[mongo.ServerError](err); ok && srv.HasErrorCode(codeCommandNotFound) && cmd == "hello" {
		// mongo-java-server knows only the legacy name.
		s.noHello.Store(true)
		return s.sampleClock(ctx)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", cmd, mapErr(err))
	}
	if reply.LocalTime.IsZero() {
		return 0, 0, fmt.Errorf("hello: no localTime in the reply")
	}
	offset, rtt = clockOffset(sent, recv, reply.LocalTime)
	return offset, rtt, nil
}

// syncClock takes n samples and keeps the offset of the shortest round
// trip, the least uncertain one.
func (s *Store) syncClock(ctx context.Context, n int) error {
	best, bestRTT := time.Duration(0), time.Duration(-1)
	for range n {
		off, rtt, err := s.sampleClock(ctx)
		if err != nil {
			return err
		}
		if bestRTT < 0 || rtt < bestRTT {
			best, bestRTT = off, rtt
		}
	}
	s.offset.Store(int64(best))
	return nil
}

// refreshClock measures the offset every ClockRefresh until ctx is done.
// It is owned by the Store: Close cancels ctx and waits.
func (s *Store) refreshClock(ctx context.Context) {
	defer s.wg.Done()
	tick := time.NewTicker(s.cfg.ClockRefresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.syncClock(cctx, 3)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("mongostore: clock refresh failed; keeping the last offset",
				slog.Any("error", err), slog.Duration("offset", s.Offset()))
		}
	}
}
