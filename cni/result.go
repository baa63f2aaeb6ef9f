package cni

import (
	"encoding/json"
	"io"
	"net"

	"github.com/containernetworking/cni/pkg/types"
)

// Result is what ADD prints and CHECK receives back as prevResult, in the
// shape of the CNI 1.x specification. Version 0.4.0 differs only in that
// each IP names its family ("version") and interfaces carry no MTU; a
// 0.4.0 prevResult decodes into the same struct.
type Result struct {
	CNIVersion string         `json:"cniVersion,omitempty"`
	Interfaces []*Interface   `json:"interfaces,omitempty"`
	IPs        []*IPConfig    `json:"ips,omitempty"`
	Routes     []*types.Route `json:"routes,omitempty"`
	DNS        types.DNS      `json:"dns,omitempty"`
}

// Interface is one interface of a Result.
type Interface struct {
	Name    string `json:"name"`
	Mac     string `json:"mac,omitempty"`
	Mtu     int    `json:"mtu,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
}

// IPConfig is one address of a Result; Interface indexes Result.Interfaces.
type IPConfig struct {
	Version   string      `json:"version,omitempty"`
	Interface *int        `json:"interface,omitempty"`
	Address   types.IPNet `json:"address"`
	Gateway   net.IP      `json:"gateway,omitempty"`
}

// print writes the result in the shape of cniVersion.
func (r *Result) print(w io.Writer, cniVersion string) *types.Error {
	out := *r
	out.CNIVersion = cniVersion
	if cniVersion == "0.4.0" {
		out.Interfaces = make([]*Interface, len(r.Interfaces))
		for i, iface := range r.Interfaces {
			c := *iface
			c.Mtu = 0
			out.Interfaces[i] = &c
		}
		out.IPs = make([]*IPConfig, len(r.IPs))
		for i, ip := range r.IPs {
			c := *ip
			c.Version = "6"
			if ip.Address.IP.To4() != nil {
				c.Version = "4"
			}
			out.IPs[i] = &c
		}
	}
	return printJSON(w, &out)
}

// parsePrevResult decodes the prevResult of a configuration, of any
// supported version.
func parsePrevResult(raw map[string]any) (*Result, error) {
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	return &r, nil
}
