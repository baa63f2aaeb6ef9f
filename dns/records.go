package dns

import (
	"fmt"
	"net/netip"
	"strings"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Config is what the records depend on besides kube state.
type Config struct {
	Zone       string // e.g. "cluster.local." (FQDN, lower case)
	TTL        uint32 // TTL of every record served from the index
	PodRecords bool   // serve a-b-c-d.<ns>.pod.<zone> for pods that exist ("verified")
}

// Records maps a lower-case FQDN to the resource records one owner
// (a Service, a Pod, or the zone itself) contributes there.
type Records map[string][]mdns.RR

func (r Records) add(rr mdns.RR) {
	n := rr.Header().Name
	r[n] = append(r[n], rr)
}

// ObjectError names the object and field that made a record impossible.
type ObjectError struct {
	Kind, Key, Field string
	Err              error
}

func (e *ObjectError) Error() string {
	return fmt.Sprintf("%s %s: %s: %v", e.Kind, e.Key, e.Field, e.Err)
}

func (e *ObjectError) Unwrap() error { return e.Err }

func hdr(name string, t uint16, ttl uint32) mdns.RR_Header {
	return mdns.RR_Header{Name: name, Rrtype: t, Class: mdns.ClassINET, Ttl: ttl}
}

// addrRR is an A or AAAA record for a.
func addrRR(name string, a netip.Addr, ttl uint32) mdns.RR {
	if a.Is4() {
		return &mdns.A{Hdr: hdr(name, mdns.TypeA, ttl), A: a.AsSlice()}
	}
	return &mdns.AAAA{Hdr: hdr(name, mdns.TypeAAAA, ttl), AAAA: a.AsSlice()}
}

func ptrRR(a netip.Addr, target string, ttl uint32) mdns.RR {
	rev, _ := mdns.ReverseAddr(a.String())
	return &mdns.PTR{Hdr: hdr(rev, mdns.TypePTR, ttl), Ptr: target}
}

// DashedLabel is the label the spec gives an address: 10-244-1-5, fd00--5.
func DashedLabel(a netip.Addr) string {
	if a.Is4() {
		return strings.ReplaceAll(a.String(), ".", "-")
	}
	return strings.ReplaceAll(a.String(), ":", "-")
}

// ZoneRecords are the records of the zone itself: its SOA and dns-version.
func ZoneRecords(cfg Config) Records {
	r := Records{}
	r.add(SOA(cfg))
	r.add(&mdns.TXT{Hdr: hdr("dns-version."+cfg.Zone, mdns.TypeTXT, cfg.TTL), Txt: []string{"1.1.0"}})
	return r
}

// SOA is the zone's start of authority, also sent in negative answers.
func SOA(cfg Config) *mdns.SOA {
	return &mdns.SOA{
		Hdr:     hdr(cfg.Zone, mdns.TypeSOA, cfg.TTL),
		Ns:      "ns.dns." + cfg.Zone,
		Mbox:    "hostmaster." + cfg.Zone,
		Serial:  1,
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  cfg.TTL,
	}
}

// ServiceRecords computes the records of one Service: ClusterIP A/AAAA, SRV
// and PTR; headless A/AAAA per endpoint, per-hostname names, SRV and PTR;
// ExternalName CNAME; and the names of pods whose subdomain is a headless
// Service's name. A field that makes the whole Service unusable returns an
// error and no records; a bad endpoint address is skipped and reported.
func ServiceRecords(cfg Config, svc *corev1.Service, slices []*discoveryv1.EndpointSlice, pods []*corev1.Pod) (Records, []error) {
	key := svc.Namespace + "/" + svc.Name
	bad := func(field string, err error) []error {
		return []error{&ObjectError{Kind: "Service", Key: key, Field: field, Err: err}}
	}
	if err := checkLabel(svc.Namespace); err != nil {
		return nil, bad("metadata.namespace", err)
	}
	if err := checkLabel(svc.Name); err != nil {
		return nil, bad("metadata.name", err)
	}
	base := strings.ToLower(svc.Name + "." + svc.Namespace + ".svc." + cfg.Zone)
	if len(base) > 254 {
		return nil, bad("metadata.name", fmt.Errorf("name %s is over 253 bytes", base))
	}
	r := Records{}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		target := strings.ToLower(mdns.Fqdn(svc.Spec.ExternalName))
		if _, ok := mdns.IsDomainName(target); !ok || svc.Spec.ExternalName == "" || len(target) > 254 {
			return nil, bad("spec.externalName", fmt.Errorf("%q is not a domain name", svc.Spec.ExternalName))
		}
		r.add(&mdns.CNAME{Hdr: hdr(base, mdns.TypeCNAME, cfg.TTL), Target: target})
		return r, nil
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return headlessRecords(cfg, svc, base, slices, pods), nil
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var addrs []netip.Addr
	for i, s := range ips {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, bad(fmt.Sprintf("spec.clusterIPs[%d]", i), err)
		}
		addrs = append(addrs, a.Unmap())
	}
	if len(addrs) == 0 {
		return r, nil // not allocated yet
	}
	for _, a := range addrs {
		r.add(addrRR(base, a, cfg.TTL))
		r.add(ptrRR(a, base, cfg.TTL))
	}
	for _, p := range svc.Spec.Ports {
		if p.Name == "" {
			continue
		}
		name := srvName(p.Name, string(p.Protocol), base)
		r.add(&mdns.SRV{Hdr: hdr(name, mdns.TypeSRV, cfg.TTL), Priority: 0, Weight: 100, Port: uint16(p.Port), Target: base})
	}
	return r, nil
}

func srvName(port, proto, base string) string {
	if proto == "" {
		proto = "TCP"
	}
	return "_" + strings.ToLower(port) + "._" + strings.ToLower(proto) + "." + base
}

type srvPort struct {
	name, proto string
	port        uint16
}

func headlessRecords(cfg Config, svc *corev1.Service, base string, slices []*discoveryv1.EndpointSlice, pods []*corev1.Pod) Records {
	r := Records{}
	seen := map[string]bool{} // dedups an address listed by two slices
	srvs := map[string][]*mdns.SRV{}
	add := func(label string, a netip.Addr, ports []srvPort) {
		host := label + "." + base
		if len(host) > 254 || checkLabel(label) != nil {
			return
		}
		k := host + "|" + a.String()
		if seen[k] {
			return
		}
		seen[k] = true
		if !seen[a.String()] {
			seen[a.String()] = true
			r.add(addrRR(base, a, cfg.TTL))
		}
		r.add(addrRR(host, a, cfg.TTL))
		r.add(ptrRR(a, host, cfg.TTL))
		for _, p := range ports {
			name := srvName(p.name, p.proto, base)
			sk := name + "|" + host + "|" + fmt.Sprint(p.port)
			if seen[sk] { // the same host by another address
				continue
			}
			seen[sk] = true
			srvs[name] = append(srvs[name], &mdns.SRV{Hdr: hdr(name, mdns.TypeSRV, cfg.TTL), Port: p.port, Target: host})
		}
	}
	for _, sl := range slices {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var ports []srvPort
		for _, p := range sl.Ports {
			if p.Name == nil || *p.Name == "" || p.Port == nil {
				continue
			}
			proto := "TCP"
			if p.Protocol != nil {
				proto = string(*p.Protocol)
			}
			ports = append(ports, srvPort{name: *p.Name, proto: proto, port: uint16(*p.Port)})
		}
		for _, ep := range sl.Endpoints {
			if !svc.Spec.PublishNotReadyAddresses && ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, s := range ep.Addresses {
				a, err := netip.ParseAddr(s)
				if err != nil {
					continue
				}
				a = a.Unmap()
				label := DashedLabel(a)
				if ep.Hostname != nil && *ep.Hostname != "" {
					label = strings.ToLower(*ep.Hostname)
				}
				add(label, a, ports)
			}
		}
	}
	for _, p := range pods {
		if p.Spec.Hostname == "" || !podServing(p, svc.Spec.PublishNotReadyAddresses) {
			continue
		}
		for _, a := range podAddrs(p) {
			add(strings.ToLower(p.Spec.Hostname), a, nil)
		}
	}
	for _, list := range srvs {
		w := uint16(100 / len(list))
		if w == 0 {
			w = 1
		}
		for _, s := range list {
			s.Weight = w
			r.add(s)
		}
	}
	return r
}

// podServing: a running pod that is Ready, or any running pod when
// not-ready addresses are published.
func podServing(p *corev1.Pod, notReadyToo bool) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	if notReadyToo {
		return true
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podAddrs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// PodRecords are a pod's a-b-c-d.<ns>.pod.<zone> records (only when
// cfg.PodRecords): one per pod address, so a name answers only for an
// address a pod in that namespace really has.
func PodRecords(cfg Config, p *corev1.Pod) Records {
	if !cfg.PodRecords || checkLabel(p.Namespace) != nil || p.DeletionTimestamp != nil ||
		p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil
	}
	r := Records{}
	for _, a := range podAddrs(p) {
		r.add(addrRR(DashedLabel(a)+"."+strings.ToLower(p.Namespace)+".pod."+cfg.Zone, a, cfg.TTL))
	}
	return r
}

// checkLabel accepts a DNS label: 1-63 bytes of [a-z0-9-_].
func checkLabel(l string) error {
	if l == "" || len(l) > 63 {
		return fmt.Errorf("label %q must be 1 to 63 bytes", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("label %q has a character that is not a letter, digit, '-' or '_'", l)
		}
	}
	return nil
}
