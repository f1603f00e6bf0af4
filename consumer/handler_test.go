package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/task"
)

func TestMuxMiddlewareOrderAndNotFound(t *testing.T) {
	t.Parallel()
	var trace []string
	tag := func(name string) consumer.Middleware {
		return func(next consumer.Handler) consumer.Handler {
			return consumer.HandlerFunc(func(ctx context.Context, job *consumer.Job) error {
				trace = append(trace, name+">")
				err := next.Handle(ctx, job)
				trace = append(trace, "<"+name)
				return err
			})
		}
	}
	m := consumer.NewMux()
	m.RegisterFunc("a", func(context.Context, *consumer.Job) error { trace = append(trace, "a"); return nil })
	m.Use(tag("outer"), tag("inner")) // applies to handlers registered before, too
	job := func(kind string) *consumer.Job { return &consumer.Job{Task: &task.Task{Key: "k", Kind: kind}} }
	if err := m.Handle(context.Background(), job("a")); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(trace, " "); got != "outer> inner> a <inner <outer" {
		t.Fatalf("trace %q", got)
	}
	trace = nil
	if err := m.Handle(context.Background(), job("nope")); !errors.Is(err, consumer.ErrUnknownKind) || len(trace) != 4 {
		t.Fatalf("unknown kind: %v, trace %v; want ErrUnknownKind through the middleware", err, trace)
	}
	m.NotFound(consumer.HandlerFunc(func(context.Context, *consumer.Job) error { return errors.New("custom") }))
	if err := m.Handle(context.Background(), job("nope")); err == nil || err.Error() != "custom" {
		t.Fatalf("NotFound handler: %v", err)
	}
}

func TestMuxRegisterPanics(t *testing.T) {
	t.Parallel()
	for name, reg := range map[string]func(m *consumer.Mux){
		"duplicate": func(m *consumer.Mux) { m.RegisterFunc("a", nil) },
		"empty kind": func(m *consumer.Mux) {
			m.Register("", consumer.HandlerFunc(func(context.Context, *consumer.Job) error { return nil }))
		},
		"nil handler": func(m *consumer.Mux) { m.Register("b", nil) },
	} {
		m := consumer.NewMux()
		m.RegisterFunc("a", func(context.Context, *consumer.Job) error { return nil })
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: Register did not panic", name)
				}
			}()
			reg(m)
		}()
	}
}
