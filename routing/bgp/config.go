package bgp

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// ConfigKey is the key of the BGP ConfigMap that holds the configuration.
const ConfigKey = "config.yaml"

// DefaultASN is the cluster's ASN when the configuration names none: the
// first private 16-bit ASN, what Calico and kube-router use too.
const DefaultASN = 64512

// DefaultRestartTime is how long (seconds) peers keep a restarting node's
// routes, announced in the graceful-restart capability.
const DefaultRestartTime = 120

// Config is the cluster's BGP configuration, as users write it in the
// ConfigMap (key ConfigKey, YAML). Every field is optional.
type Config struct {
	// ASN of every node (iBGP among nodes). Default DefaultASN.
	ASN uint32 `json:"asn,omitempty"`
	// RouteReflectors, when set, replaces the full mesh: the nodes it
	// selects reflect routes; every other node peers only with them.
	RouteReflectors *RouteReflectors `json:"routeReflectors,omitempty"`
	// Peers are routers outside the cluster (top-of-rack switches).
	Peers []Peer `json:"peers,omitempty"`
	// Import lists the prefixes besides the nodes' podCIDRs that nodes
	// accept from peers and install.
	Import Import `json:"import,omitempty"`
	// Announce says what nodes announce besides their podCIDRs.
	Announce Announce `json:"announce,omitempty"`
	// RestartTimeSeconds is the graceful-restart time peers are asked to
	// keep a node's routes while its agent restarts. Default
	// DefaultRestartTime; at most 4095 (the capability's field).
	RestartTimeSeconds uint32 `json:"restartTimeSeconds,omitempty"`
}

// RouteReflectors selects the route reflector nodes by label.
type RouteReflectors struct {
	NodeSelector map[string]string `json:"nodeSelector"`
	// ClusterID is the reflectors' cluster ID (an IPv4 address); default
	// the reflector's router ID.
	ClusterID string `json:"clusterID,omitempty"`
}

// Peer is one external BGP peer.
type Peer struct {
	// Name identifies the peer in errors and logs; default its address.
	Name    string `json:"name,omitempty"`
	Address string `json:"address"`
	ASN     uint32 `json:"asn"`
	Port    uint16 `json:"port,omitempty"`
	// Password (TCP MD5) from a Secret in the ConfigMap's namespace or a
	// file on the node; at most one.
	PasswordSecret *SecretKey `json:"passwordSecret,omitempty"`
	PasswordFile   string     `json:"passwordFile,omitempty"`
	// Timers in seconds; 0 takes gobgp's defaults (90 and 30).
	HoldTimeSeconds  uint32 `json:"holdTimeSeconds,omitempty"`
	KeepaliveSeconds uint32 `json:"keepaliveSeconds,omitempty"`
	// MultihopTTL > 0 enables eBGP multihop with that TTL.
	MultihopTTL uint8 `json:"multihopTTL,omitempty"`
	// NodeSelector chooses the nodes that peer; empty: every node.
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// Families negotiated: "ipv4", "ipv6"; default both.
	Families []string `json:"families,omitempty"`
}

// SecretKey names one key of a Secret.
type SecretKey struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

// Import configures what nodes accept from peers.
type Import struct {
	Prefixes []string `json:"prefixes,omitempty"`
}

// Announce configures what nodes announce besides their podCIDRs.
type Announce struct {
	// ServiceCIDRs announced by every node.
	ServiceCIDRs []string `json:"serviceCIDRs,omitempty"`
	// ExternalIPs and LoadBalancerIPs of Services, as /32 or /128 host
	// routes; a Service with externalTrafficPolicy Local only from nodes
	// with a ready endpoint of it.
	ExternalIPs     bool `json:"externalIPs,omitempty"`
	LoadBalancerIPs bool `json:"loadBalancerIPs,omitempty"`
	// Communities per kind of announcement, "AS:value" or a number.
	Communities Communities `json:"communities,omitempty"`
}

// Communities per kind of announcement.
type Communities struct {
	PodCIDR        []string `json:"podCIDR,omitempty"`
	ServiceCIDR    []string `json:"serviceCIDR,omitempty"`
	ExternalIP     []string `json:"externalIP,omitempty"`
	LoadBalancerIP []string `json:"loadBalancerIP,omitempty"`
}

// FieldError names the field of the configuration at fault.
type FieldError struct {
	Field string // e.g. "peers[1].asn"
	Err   error
}

func (e FieldError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }

func (e FieldError) Unwrap() error { return e.Err }

// ErrInvalid is what a FieldError wraps for a value out of range or
// malformed.
var ErrInvalid = errors.New("invalid")

// Settings is a validated Config in the form Compute uses.
type Settings struct {
	ASN            uint32
	Reflectors     labels.Selector // nil: full mesh
	ClusterID      netip.Addr      // zero: each reflector's router ID
	Peers          []PeerSettings
	ImportPrefixes []netip.Prefix
	ServiceCIDRs   []netip.Prefix
	ExternalIPs    bool
	LBIPs          bool
	Communities    map[Kind][]uint32
	RestartTime    uint32
}

// PeerSettings is a validated Peer.
type PeerSettings struct {
	Name           string
	Index          int // in Config.Peers, for errors
	Address        netip.Addr
	ASN            uint32
	Port           uint16
	PasswordSecret *SecretKey
	PasswordFile   string
	HoldTime       uint32
	Keepalive      uint32
	MultihopTTL    uint8
	Nodes          labels.Selector
	IPv4, IPv6     bool
}

// Kind is a kind of announcement.
type Kind string

// Kinds of announcements.
const (
	KindPodCIDR        Kind = "podCIDR"
	KindServiceCIDR    Kind = "serviceCIDR"
	KindExternalIP     Kind = "externalIP"
	KindLoadBalancerIP Kind = "loadBalancerIP"
)

// Parse reads the ConfigMap's data. A malformed document, an unknown key
// or a bad cluster-wide value refuses the whole configuration (the caller
// keeps its previous one) with an error naming the key and the field. A
// bad peer only drops that peer: it is returned among peerErrs, naming the
// field, and the rest is used.
func Parse(data map[string]string) (s Settings, peerErrs []error, err error) {
	for k := range data {
		if k != ConfigKey {
			return Settings{}, nil, fmt.Errorf("key %q: unknown (the configuration is in %q)", k, ConfigKey)
		}
	}
	var c Config
	if err := yaml.UnmarshalStrict([]byte(data[ConfigKey]), &c); err != nil {
		return Settings{}, nil, fmt.Errorf("key %s: %w", ConfigKey, err)
	}
	s, peerErrs, err = c.Validate()
	if err != nil {
		return Settings{}, nil, fmt.Errorf("key %s: %w", ConfigKey, err)
	}
	for i, e := range peerErrs {
		peerErrs[i] = fmt.Errorf("key %s: %w", ConfigKey, e)
	}
	return s, peerErrs, nil
}

// Validate checks c and returns its Settings (see Parse).
func (c Config) Validate() (Settings, []error, error) {
	s := Settings{ASN: c.ASN, RestartTime: c.RestartTimeSeconds, ExternalIPs: c.Announce.ExternalIPs, LBIPs: c.Announce.LoadBalancerIPs}
	if s.ASN == 0 {
		s.ASN = DefaultASN
	}
	if s.RestartTime == 0 {
		s.RestartTime = DefaultRestartTime
	}
	if s.RestartTime > 4095 {
		return s, nil, FieldError{"restartTimeSeconds", fmt.Errorf("%d is more than 4095: %w", s.RestartTime, ErrInvalid)}
	}
	if rr := c.RouteReflectors; rr != nil {
		if len(rr.NodeSelector) == 0 {
			return s, nil, FieldError{"routeReflectors.nodeSelector", errors.New("empty: no node would be a reflector")}
		}
		sel, err := selector(rr.NodeSelector)
		if err != nil {
			return s, nil, FieldError{"routeReflectors.nodeSelector", err}
		}
		s.Reflectors = sel
		if rr.ClusterID != "" {
			id, err := netip.ParseAddr(rr.ClusterID)
			if err != nil || !id.Is4() {
				return s, nil, FieldError{"routeReflectors.clusterID", fmt.Errorf("%q is not an IPv4 address: %w", rr.ClusterID, ErrInvalid)}
			}
			s.ClusterID = id
		}
	}
	var err error
	if s.ImportPrefixes, err = prefixes("import.prefixes", c.Import.Prefixes); err != nil {
		return s, nil, err
	}
	if s.ServiceCIDRs, err = prefixes("announce.serviceCIDRs", c.Announce.ServiceCIDRs); err != nil {
		return s, nil, err
	}
	s.Communities = map[Kind][]uint32{}
	for kind, list := range map[Kind][]string{
		KindPodCIDR: c.Announce.Communities.PodCIDR, KindServiceCIDR: c.Announce.Communities.ServiceCIDR,
		KindExternalIP: c.Announce.Communities.ExternalIP, KindLoadBalancerIP: c.Announce.Communities.LoadBalancerIP,
	} {
		for i, v := range list {
			cm, err := ParseCommunity(v)
			if err != nil {
				return s, nil, FieldError{fmt.Sprintf("announce.communities.%s[%d]", kind, i), err}
			}
			s.Communities[kind] = append(s.Communities[kind], cm)
		}
	}
	var peerErrs []error
	seen := map[netip.Addr]string{}
	for i, p := range c.Peers {
		ps, err := p.validate(i, s.ASN)
		if err == nil {
			if prev, dup := seen[ps.Address]; dup {
				err = FieldError{fmt.Sprintf("peers[%d].address", i), fmt.Errorf("%s is already peer %q", ps.Address, prev)}
			}
		}
		if err != nil {
			peerErrs = append(peerErrs, err)
			continue
		}
		seen[ps.Address] = ps.Name
		s.Peers = append(s.Peers, ps)
	}
	return s, peerErrs, nil
}

func (p Peer) validate(i int, localASN uint32) (PeerSettings, error) {
	field := func(f string) string { return fmt.Sprintf("peers[%d].%s", i, f) }
	ps := PeerSettings{Name: p.Name, Index: i, ASN: p.ASN, Port: p.Port, PasswordSecret: p.PasswordSecret, PasswordFile: p.PasswordFile,
		HoldTime: p.HoldTimeSeconds, Keepalive: p.KeepaliveSeconds, MultihopTTL: p.MultihopTTL}
	addr, err := netip.ParseAddr(p.Address)
	if err != nil || addr.Zone() != "" || addr.IsUnspecified() || addr.IsMulticast() {
		return ps, FieldError{field("address"), fmt.Errorf("%q is not a unicast IP address: %w", p.Address, ErrInvalid)}
	}
	ps.Address = addr.Unmap()
	if ps.Name == "" {
		ps.Name = ps.Address.String()
	}
	if p.ASN == 0 || p.ASN == 23456 || p.ASN == 65535 || p.ASN == 4294967295 {
		return ps, FieldError{field("asn"), fmt.Errorf("%d is not a usable ASN: %w", p.ASN, ErrInvalid)}
	}
	if p.PasswordSecret != nil && p.PasswordFile != "" {
		return ps, FieldError{field("passwordSecret"), fmt.Errorf("both passwordSecret and passwordFile are set: %w", ErrInvalid)}
	}
	if s := p.PasswordSecret; s != nil && (s.Name == "" || s.Key == "") {
		return ps, FieldError{field("passwordSecret"), fmt.Errorf("name and key are required: %w", ErrInvalid)}
	}
	if p.HoldTimeSeconds != 0 && p.HoldTimeSeconds < 3 {
		return ps, FieldError{field("holdTimeSeconds"), fmt.Errorf("%d: a hold time is 0 (default) or at least 3: %w", p.HoldTimeSeconds, ErrInvalid)}
	}
	if p.KeepaliveSeconds != 0 && p.HoldTimeSeconds != 0 && p.KeepaliveSeconds*3 > p.HoldTimeSeconds {
		return ps, FieldError{field("keepaliveSeconds"), fmt.Errorf("%d is more than a third of the hold time %d: %w", p.KeepaliveSeconds, p.HoldTimeSeconds, ErrInvalid)}
	}
	if p.MultihopTTL != 0 && p.ASN == localASN {
		return ps, FieldError{field("multihopTTL"), fmt.Errorf("multihop is for eBGP peers, this one has the cluster's ASN: %w", ErrInvalid)}
	}
	if ps.Nodes, err = selector(p.NodeSelector); err != nil {
		return ps, FieldError{field("nodeSelector"), err}
	}
	if len(p.Families) == 0 {
		ps.IPv4, ps.IPv6 = true, true
	}
	for j, f := range p.Families {
		switch f {
		case "ipv4":
			ps.IPv4 = true
		case "ipv6":
			ps.IPv6 = true
		default:
			return ps, FieldError{field(fmt.Sprintf("families[%d]", j)), fmt.Errorf("%q is neither ipv4 nor ipv6: %w", f, ErrInvalid)}
		}
	}
	return ps, nil
}

func selector(m map[string]string) (labels.Selector, error) {
	if len(m) == 0 {
		return labels.Everything(), nil
	}
	sel, err := labels.ValidatedSelectorFromSet(m)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return sel, nil
}

func prefixes(field string, list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for i, v := range list {
		p, err := netip.ParsePrefix(v)
		if err != nil || p != p.Masked() {
			return nil, FieldError{fmt.Sprintf("%s[%d]", field, i), fmt.Errorf("%q is not a CIDR (address bits past the mask?): %w", v, ErrInvalid)}
		}
		out = append(out, p)
	}
	return out, nil
}

var communityRE = regexp.MustCompile(`^(\d+):(\d+)$`)

// ParseCommunity reads a standard community, "AS:value" or one number.
func ParseCommunity(v string) (uint32, error) {
	if m := communityRE.FindStringSubmatch(v); m != nil {
		hi, err1 := strconv.ParseUint(m[1], 10, 16)
		lo, err2 := strconv.ParseUint(m[2], 10, 16)
		if err1 == nil && err2 == nil {
			return uint32(hi)<<16 | uint32(lo), nil
		}
	} else if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
		return uint32(n), nil
	}
	return 0, fmt.Errorf("%q is not a community (AS:value, each at most 65535): %w", v, ErrInvalid)
}

// LoadPasswords resolves the peers' MD5 passwords: a passwordFile is read
// on the node, a passwordSecret through secret (name, key). A peer whose
// password cannot be had is left out of the map (Compute then skips it)
// and reported, naming the field.
func LoadPasswords(s Settings, secret func(name, key string) (string, error)) (map[int]string, []error) {
	out := map[int]string{}
	var errs []error
	for _, p := range s.Peers {
		switch {
		case p.PasswordFile != "":
			data, err := os.ReadFile(p.PasswordFile)
			if err != nil {
				errs = append(errs, FieldError{fmt.Sprintf("peers[%d].passwordFile", p.Index), err})
				continue
			}
			out[p.Index] = strings.TrimRight(string(data), "\r\n")
		case p.PasswordSecret != nil:
			pw, err := secret(p.PasswordSecret.Name, p.PasswordSecret.Key)
			if err != nil {
				errs = append(errs, FieldError{fmt.Sprintf("peers[%d].passwordSecret", p.Index), err})
				continue
			}
			out[p.Index] = pw
		}
	}
	return out, errs
}
