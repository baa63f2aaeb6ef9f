package cni

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/weftnet/weft/ipam"
)

// Defaults of the plugin configuration.
const (
	DefaultBridge  = "weft0"
	DefaultDataDir = "/var/lib/weft/ipam"
	// maxIfNameLen is IFNAMSIZ minus the terminating NUL.
	maxIfNameLen = 15
)

// NetConf is the plugin's network configuration, as the runtime passes it on stdin:
//
//	{"cniVersion":"1.1.0","name":"weft","type":"weft","bridge":"weft0","mtu":1450,
//	 "ipam":{"ranges":[[{"subnet":"10.244.1.0/24"}]],"dataDir":"/var/lib/weft/ipam"}}
type NetConf struct {
	types.PluginConf

	// Bridge is the node bridge the pods attach to (default weft0).
	Bridge string `json:"bridge"`
	// MTU of the bridge and the veth pair; 0 derives it from the interface of
	// the node's default route.
	MTU int `json:"mtu,omitempty"`
	// HairpinMode lets a pod reach itself through a service VIP (default true).
	HairpinMode *bool `json:"hairpinMode,omitempty"`
	// IPAM shadows PluginConf.IPAM: weft allocates in-process.
	IPAM IPAMConf `json:"ipam"`
}

// IPAMConf configures weft's built-in address management.
type IPAMConf struct {
	// Type is accepted for familiarity; only "" and "weft" are valid.
	Type string `json:"type,omitempty"`
	// Ranges holds one range set per IP family, spelt as host-local spells it.
	Ranges [][]RangeConf `json:"ranges"`
	// Routes are extra routes for the pod; default routes are always added.
	Routes []*types.Route `json:"routes,omitempty"`
	// DataDir holds the allocation state, one directory per network.
	DataDir string `json:"dataDir,omitempty"`
}

// RangeConf is one address range as written in the configuration.
type RangeConf struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart,omitempty"`
	RangeEnd   string `json:"rangeEnd,omitempty"`
	Gateway    string `json:"gateway,omitempty"`
}

// Config is a parsed and validated NetConf with its address pool.
type Config struct {
	NetConf
	Pool    *ipam.Pool
	Hairpin bool
	// Prev is the decoded prevResult (CHECK), nil if none was passed.
	Prev *Result
}

// errInvalidConfig builds a spec error (code 7) whose message names the field.
func errInvalidConfig(field, problem, details string) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, field+": "+problem, details)
}

// ParseConfig decodes and validates the stdin configuration. Every problem is
// reported as a CNI spec error that names the offending field.
func ParseConfig(stdin []byte) (*Config, error) {
	var nc NetConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decoding network configuration from stdin", err.Error())
	}
	var prev *Result
	if nc.RawPrevResult != nil {
		var err error
		if prev, err = parsePrevResult(nc.RawPrevResult); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "prevResult: cannot be parsed", err.Error())
		}
	}
	if nc.Name == "" {
		return nil, errInvalidConfig("name", "missing network name", "")
	}
	if nc.Bridge == "" {
		nc.Bridge = DefaultBridge
	}
	if err := validIfName(nc.Bridge); err != nil {
		return nil, errInvalidConfig("bridge", err.Error(), nc.Bridge)
	}
	if nc.MTU < 0 || (nc.MTU > 0 && nc.MTU < 576) || nc.MTU > 65535 {
		return nil, errInvalidConfig("mtu", fmt.Sprintf("%d is outside 576..65535", nc.MTU), "")
	}
	if t := nc.IPAM.Type; t != "" && t != "weft" {
		return nil, errInvalidConfig("ipam.type", fmt.Sprintf("%q is not supported: weft allocates addresses itself (use \"weft\" or leave it out)", t), "")
	}
	if nc.IPAM.DataDir == "" {
		nc.IPAM.DataDir = DefaultDataDir
	}
	sets, err := parseRanges(nc.IPAM.Ranges)
	if err != nil {
		return nil, err
	}
	pool, err := ipam.NewPool(sets)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	for i, r := range nc.IPAM.Routes {
		if r == nil || r.Dst.IP == nil {
			return nil, errInvalidConfig(fmt.Sprintf("ipam.routes[%d].dst", i), "missing destination", "")
		}
	}
	cfg := &Config{NetConf: nc, Pool: pool, Hairpin: true, Prev: prev}
	if nc.HairpinMode != nil {
		cfg.Hairpin = *nc.HairpinMode
	}
	return cfg, nil
}

func validIfName(name string) error {
	switch {
	case len(name) > maxIfNameLen:
		return fmt.Errorf("name %q is %d bytes, longer than the kernel's limit of %d", name, len(name), maxIfNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("name %q is not a valid interface name", name)
	case strings.ContainsAny(name, "/: \t\n"):
		return fmt.Errorf("name %q contains '/', ':' or whitespace", name)
	}
	return nil
}

// parseRanges turns the configured strings into ipam range sets; semantic
// checks (overlaps, bounds, families) are the allocator's.
func parseRanges(raw [][]RangeConf) ([]ipam.RangeSet, error) {
	sets := make([]ipam.RangeSet, 0, len(raw))
	for i, rs := range raw {
		set := make(ipam.RangeSet, 0, len(rs))
		for j, rc := range rs {
			path := fmt.Sprintf("ipam.ranges[%d][%d]", i, j)
			var r ipam.Range
			var err error
			if rc.Subnet == "" {
				return nil, errInvalidConfig(path+".subnet", "missing", "")
			}
			if r.Subnet, err = netip.ParsePrefix(rc.Subnet); err != nil {
				return nil, errInvalidConfig(path+".subnet", fmt.Sprintf("%q is not a CIDR", rc.Subnet), err.Error())
			}
			for _, f := range []struct {
				name string
				val  string
				dst  *netip.Addr
			}{{"rangeStart", rc.RangeStart, &r.RangeStart}, {"rangeEnd", rc.RangeEnd, &r.RangeEnd}, {"gateway", rc.Gateway, &r.Gateway}} {
				if f.val == "" {
					continue
				}
				if *f.dst, err = netip.ParseAddr(f.val); err != nil {
					return nil, errInvalidConfig(path+"."+f.name, fmt.Sprintf("%q is not an IP address", f.val), err.Error())
				}
			}
			set = append(set, r)
		}
		sets = append(sets, set)
	}
	return sets, nil
}
