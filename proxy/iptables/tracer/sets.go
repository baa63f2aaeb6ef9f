package tracer

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Set is an ipset defined in the traced text, as "ipset save" prints it.
// The types the tracer evaluates are hash:ip, hash:net and hash:ip,port,ip.
type Set struct {
	Name, Type string
	members    map[string]bool // normalized members
	nets       []netip.Prefix  // hash:net members
}

// dims is the number of packet fields a set type looks up.
var dims = map[string]int{"hash:ip": 1, "hash:net": 1, "hash:ip,port,ip": 3}

// setLine reads one "create" or "add" line.
func (rs *Ruleset) setLine(line string) error {
	f := strings.Fields(line)
	if len(f) < 3 {
		return fmt.Errorf("ipset line needs a set name and a type or member")
	}
	switch f[0] {
	case "create":
		if _, ok := dims[f[2]]; !ok {
			return fmt.Errorf("ipset type %q is not supported", f[2])
		}
		if rs.Sets[f[1]] != nil {
			return fmt.Errorf("ipset %q created twice", f[1])
		}
		rs.Sets[f[1]] = &Set{Name: f[1], Type: f[2], members: map[string]bool{}}
		return nil
	default: // add
		s := rs.Sets[f[1]]
		if s == nil {
			return fmt.Errorf("ipset %q: add before create", f[1])
		}
		return s.add(f[2])
	}
}

func (s *Set) add(member string) error {
	parts := strings.Split(member, ",")
	if len(parts) != dims[s.Type] {
		return fmt.Errorf("ipset %q (%s): member %q has %d parts", s.Name, s.Type, member, len(parts))
	}
	if s.Type == "hash:net" {
		p, err := netip.ParsePrefix(parts[0])
		if err != nil {
			a, aerr := netip.ParseAddr(parts[0])
			if aerr != nil {
				return fmt.Errorf("ipset %q: member %q: %w", s.Name, member, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		s.nets = append(s.nets, p.Masked())
		return nil
	}
	var key []string
	for i, part := range parts {
		if i == 1 { // proto:port
			proto, port, ok := strings.Cut(part, ":")
			n, err := strconv.ParseUint(port, 10, 16)
			if !ok || err != nil {
				return fmt.Errorf("ipset %q: member %q: want proto:port in %q", s.Name, member, part)
			}
			key = append(key, fmt.Sprintf("%s:%d", proto, n))
			continue
		}
		a, err := netip.ParseAddr(part)
		if err != nil {
			return fmt.Errorf("ipset %q: member %q: %w", s.Name, member, err)
		}
		key = append(key, a.String())
	}
	s.members[strings.Join(key, ",")] = true
	return nil
}

// has looks up the packet's fields named by dirs.
func (s *Set) has(pkt *packet, dirs []string) (bool, error) {
	if len(dirs) != dims[s.Type] {
		return false, fmt.Errorf("ipset %q (%s) is matched with %d directions", s.Name, s.Type, len(dirs))
	}
	addr := func(d string) netip.Addr {
		if d == "dst" {
			return pkt.dst
		}
		return pkt.src
	}
	switch s.Type {
	case "hash:net":
		a := addr(dirs[0])
		for _, p := range s.nets {
			if p.Contains(a) {
				return true, nil
			}
		}
		return false, nil
	case "hash:ip":
		return s.members[addr(dirs[0]).String()], nil
	}
	port := pkt.sport
	if dirs[1] == "dst" {
		port = pkt.dport
	}
	return s.members[fmt.Sprintf("%s,%s:%d,%s", addr(dirs[0]), pkt.proto, port, addr(dirs[2]))], nil
}
