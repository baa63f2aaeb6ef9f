package workload

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultTimeout bounds a client call whose context has no deadline.
const DefaultTimeout = 5 * time.Second

// httpClient opens a fresh connection per request (no keep-alive: each
// check is its own flow through the data plane) and ignores proxy
// environment variables.
var httpClient = &http.Client{
	Transport: &http.Transport{
		Proxy:             nil,
		DialContext:       (&net.Dialer{}).DialContext,
		DisableKeepAlives: true,
	},
}

// HTTPGet fetches url (a workload's GET /) and parses its JSON reply. A
// status other than 200 is an error.
func HTTPGet(ctx context.Context, url string) (Reply, error) { return HTTPGetVia(ctx, nil, url) }

// HTTPGetVia is HTTPGet with connections opened by dial (for instance from
// inside a network namespace); a nil dial is a plain dialer.
func HTTPGetVia(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), url string) (Reply, error) {
	client := httpClient
	if dial != nil {
		client = dialClient(dial)
	}
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Reply{}, fmt.Errorf("workload: GET %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Reply{}, fmt.Errorf("workload: GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return Reply{}, fmt.Errorf("workload: GET %s: reading reply: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return Reply{}, fmt.Errorf("workload: GET %s: %s: %.200q", url, resp.Status, body)
	}
	var r Reply
	if err := json.Unmarshal(body, &r); err != nil {
		return Reply{}, fmt.Errorf("workload: GET %s: bad reply %.200q: %w", url, body, err)
	}
	return r, nil
}

// TCPExchange connects to a workload's TCP echo address, sends "hello\n"
// and returns the first line of the answer, trimmed: "<name> saw <ip>".
func TCPExchange(ctx context.Context, addr string) (string, error) {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("workload: tcp exchange with %s: %w", addr, ctxErr(ctx, err))
	}
	defer c.Close()
	defer bound(ctx, c)()
	if _, err := io.WriteString(c, "hello\n"); err != nil {
		return "", fmt.Errorf("workload: tcp exchange with %s: %w", addr, ctxErr(ctx, err))
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && (err != io.EOF || line == "") {
		return "", fmt.Errorf("workload: tcp exchange with %s: %w", addr, ctxErr(ctx, err))
	}
	return strings.TrimSpace(line), nil
}

// UDPExchange sends payload in one datagram to a workload's UDP echo
// address and returns the reply datagram: "<name> saw <ip>: <payload>".
// It sends once; a lost datagram is a timeout, and retrying is the
// caller's choice.
func UDPExchange(ctx context.Context, addr string, payload string) (string, error) {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return "", fmt.Errorf("workload: udp exchange with %s: %w", addr, ctxErr(ctx, err))
	}
	defer c.Close()
	defer bound(ctx, c)()
	if _, err := io.WriteString(c, payload); err != nil {
		return "", fmt.Errorf("workload: udp exchange with %s: %w", addr, ctxErr(ctx, err))
	}
	buf := make([]byte, 64<<10)
	n, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("workload: udp exchange with %s: %w", addr, ctxErr(ctx, err))
	}
	return string(buf[:n]), nil
}

func withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, DefaultTimeout)
}

// bound makes c's I/O end at ctx's deadline or cancellation; the returned
// function releases the watch.
func bound(ctx context.Context, c net.Conn) func() {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	return func() { stop() }
}

// ctxErr prefers the context's error, which callers can test for, to the
// I/O error it caused. A connection deadline is the context's deadline,
// and may pass a moment before the context notices.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return context.DeadlineExceeded
	}
	return err
}

// SetReadyVia turns the readiness of the workload at base (http://ADDR)
// that GET /ready reports, dialing with dial.
func SetReadyVia(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), base string, ready bool) error {
	client := dialClient(dial)
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/ready", strings.NewReader(strconv.FormatBool(ready)))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("workload: PUT %s/ready: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return fmt.Errorf("workload: PUT %s/ready: %s: %q", base, resp.Status, body)
	}
	return nil
}

// dialClient is an HTTP client that connects through dial, a fresh
// connection per request.
func dialClient(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
	return &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: dial, DisableKeepAlives: true}}
}
