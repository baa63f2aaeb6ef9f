package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/weftnet/weft/internal/sysctl"
)

// setSysctls is the weft-agent DaemonSet's privileged init container: it
// makes the kernel settings the agent needs (forwarding, bridge
// netfilter), which the agent's own container, not privileged, cannot
// write (runtimes mount /proc/sys read-only in it). Each argument is
// NAME=VALUE (all are checked before any is written); a setting already at
// its value is not written. Every setting is tried; the errors name the
// ones that failed.
func setSysctls(args []string) error {
	fs := flag.NewFlagSet("sysctl", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: weftctl sysctl NAME=VALUE...   e.g. net.ipv4.ip_forward=1")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("no NAME=VALUE given")
	}
	type setting struct{ name, value string }
	var settings []setting
	for _, arg := range fs.Args() {
		name, value, ok := strings.Cut(arg, "=")
		if !ok || name == "" || value == "" {
			return fmt.Errorf("%q: not NAME=VALUE", arg)
		}
		settings = append(settings, setting{name, value})
	}
	var errs []error
	for _, st := range settings {
		if err := sysctl.Ensure(st.name, st.value); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Printf("%s = %s\n", st.name, st.value)
	}
	return errors.Join(errs...)
}
