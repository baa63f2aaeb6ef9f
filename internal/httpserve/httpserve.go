// Package httpserve starts the small HTTP servers of weft's daemons
// (health, readiness, metrics).
package httpserve

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Serve listens on addr (nothing when addr is empty) and serves h until ctx
// ends. A listen error is returned at once, naming flag.
func Serve(ctx context.Context, flag, addr string, h http.Handler) error {
	if addr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return nil
}
