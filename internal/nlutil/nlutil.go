// Package nlutil holds netlink helpers shared by the CNI plugin, routing
// and the agent.
package nlutil

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// Dump runs a netlink dump, retrying one the kernel interrupted (the table
// changed while it was read, e.g. links vanishing with a deleted
// namespace), so that decisions are never taken on a partial listing.
func Dump[T any](what string, list func() ([]T, error)) ([]T, error) {
	for attempt := 1; ; attempt++ {
		out, err := list()
		switch {
		case err == nil:
			return out, nil
		case !errors.Is(err, netlink.ErrDumpInterrupted) || attempt == 5:
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
	}
}
