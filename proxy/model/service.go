package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// DefaultAffinitySeconds is the ClientIP affinity timeout of a Service that
// gives none (Kubernetes' default, three hours).
const DefaultAffinitySeconds = 10800

// maxAffinitySeconds is the largest timeout the API server accepts (a day).
const maxAffinitySeconds = 86400

// reporter collects the errors of one object.
type reporter struct {
	kind, key string
	errs      []ObjectError
}

func (r *reporter) add(field string, err error) {
	r.errs = append(r.errs, objErr(r.kind, r.key, field, err))
}

// Labels that take a Service or an EndpointSlice away from weft, as from
// kube-proxy (which lists neither kind with them): another proxy serves
// it (its name is the value), or it is to be treated as headless whatever
// its Service's ClusterIP.
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
)

// AnnotationResetConnections, "false" on a Service, keeps the TCP
// connections to an endpoint that leaves it: by default the proxy resets
// them at their clients (see proxy.GoneEndpoint).
const AnnotationResetConnections = "weft.dev/reset-connections"

// keepConnections reads AnnotationResetConnections; a value other than
// "true" or "false" is reported and ignored (connections are reset).
func keepConnections(svc *corev1.Service, r *reporter) bool {
	v, ok := svc.Annotations[AnnotationResetConnections]
	switch {
	case !ok || v == "true":
		return false
	case v == "false":
		return true
	}
	r.add("metadata.annotations["+AnnotationResetConnections+"]",
		fmt.Errorf("%q is neither \"true\" nor \"false\": ignored, connections to removed endpoints are reset: %w", v, ErrInvalid))
	return false
}

// notProxied reports whether an object's labels take it away from weft.
func notProxied(labels map[string]string) bool {
	_, other := labels[LabelServiceProxyName]
	_, headless := labels[LabelHeadless]
	return other || headless
}

// servicePorts builds the ports of one Service. A Service that is not
// proxied (ExternalName, headless, no ClusterIP, labelled for another
// proxy or as headless) gives nothing. A bad
// Service-wide field (a ClusterIP, a source range, the affinity timeout)
// fails the whole Service closed: no ports, only errors. A bad port, or a
// bad externalIP, LoadBalancer ingress IP or healthCheckNodePort, is left
// out and reported; the rest is built.
func servicePorts(svc *corev1.Service) ([]*ServicePort, []ObjectError) {
	r := &reporter{kind: "Service", key: svc.Namespace + "/" + svc.Name}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		return nil, nil
	}
	if notProxied(svc.Labels) {
		return nil, nil
	}
	cips := clusterIPs(svc, r)
	if len(cips) == 0 && len(r.errs) == 0 {
		return nil, nil // headless or no ClusterIP: not proxied
	}
	ranges := sourceRanges(svc, r)
	affinity := affinitySeconds(svc, r)
	if len(r.errs) > 0 {
		return nil, r.errs
	}
	served := func(a netip.Addr) bool {
		return slices.ContainsFunc(cips, func(c netip.Addr) bool { return c.Is6() == a.Is6() })
	}
	base := ServicePort{
		ClusterIPs:          cips,
		ExternalIPs:         externalIPs(svc, served, r),
		LoadBalancerIPs:     loadBalancerIPs(svc, served, r),
		SourceRanges:        slices.DeleteFunc(ranges, func(p netip.Prefix) bool { return !served(p.Addr()) }),
		ExternalPolicyLocal: externallyAccessible(svc) && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal,
		InternalPolicyLocal: svc.Spec.InternalTrafficPolicy != nil && *svc.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal,
		AffinitySeconds:     affinity,
		KeepConnections:     keepConnections(svc, r),
	}
	if td := svc.Spec.TrafficDistribution; td != nil {
		switch *td {
		case corev1.ServiceTrafficDistributionPreferClose, corev1.ServiceTrafficDistributionPreferSameZone:
			base.PreferClose = true
		case corev1.ServiceTrafficDistributionPreferSameNode:
			base.PreferSameNode = true
		}
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer && base.ExternalPolicyLocal {
		if hc := svc.Spec.HealthCheckNodePort; validPort(hc) {
			base.HealthCheckNodePort = uint16(hc)
		} else {
			r.add("spec.healthCheckNodePort", fmt.Errorf("%d is not a port number (1-65535), no health check: %w", hc, ErrInvalid))
		}
	}
	return ports(svc, &base, r), r.errs
}

// ports makes one ServicePort per valid port of svc, from base.
func ports(svc *corev1.Service, base *ServicePort, r *reporter) []*ServicePort {
	nodePorts := svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	seen := map[ServicePortName]int{}
	var out []*ServicePort
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		field := fmt.Sprintf("spec.ports[%d]", i)
		proto := Protocol(p.Protocol)
		switch proto {
		case "":
			proto = TCP
		case TCP, UDP, SCTP:
		default:
			r.add(field+".protocol", fmt.Errorf("%q is not TCP, UDP or SCTP: %w", p.Protocol, ErrInvalid))
			continue
		}
		if !validPort(p.Port) {
			r.add(field+".port", fmt.Errorf("%d is not a port number (1-65535): %w", p.Port, ErrInvalid))
			continue
		}
		var nodePort uint16
		if nodePorts {
			if p.NodePort != 0 && !validPort(p.NodePort) {
				r.add(field+".nodePort", fmt.Errorf("%d is not a port number (1-65535): %w", p.NodePort, ErrInvalid))
				continue
			}
			nodePort = uint16(p.NodePort)
		}
		name := ServicePortName{Namespace: svc.Namespace, Name: svc.Name, Port: p.Name, Protocol: proto}
		if j, dup := seen[name]; dup {
			r.add(field+".name", fmt.Errorf("port %q/%s is also spec.ports[%d]: %w", p.Name, proto, j, ErrDuplicate))
			continue
		}
		seen[name] = i
		sp := *base
		sp.Name, sp.Port, sp.Protocol, sp.NodePort = name, uint16(p.Port), proto, nodePort
		out = append(out, &sp)
	}
	return out
}

// clusterIPs returns the Service's ClusterIPs, from spec.clusterIPs or, when
// that is empty, spec.clusterIP; nil for a headless Service or one without a
// ClusterIP. Each must parse and each family may appear once.
func clusterIPs(svc *corev1.Service, r *reporter) []netip.Addr {
	ips, field := svc.Spec.ClusterIPs, "spec.clusterIPs[%d]"
	if len(ips) == 0 {
		ips, field = []string{svc.Spec.ClusterIP}, "spec.clusterIP"
	}
	if ips[0] == "" || ips[0] == corev1.ClusterIPNone {
		return nil
	}
	var out []netip.Addr
	for i, s := range ips {
		f := field
		if strings.Contains(f, "%d") {
			f = fmt.Sprintf(field, i)
		}
		a, err := parseIP(s)
		if err != nil {
			r.add(f, err)
			continue
		}
		if j := slices.IndexFunc(out, func(b netip.Addr) bool { return b.Is6() == a.Is6() }); j >= 0 {
			r.add(f, fmt.Errorf("second %s ClusterIP %s (first %s): %w", familyName(a), a, out[j], ErrDuplicate))
			continue
		}
		out = append(out, a)
	}
	return out
}

// sourceRanges parses spec.loadBalancerSourceRanges, trimming the spaces
// API validation lets through (as kube-proxy does).
func sourceRanges(svc *corev1.Service, r *reporter) []netip.Prefix {
	var out []netip.Prefix
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		p, err := parseCIDR(strings.TrimSpace(s))
		if err != nil {
			r.add(fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i), err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// affinitySeconds is the ClientIP affinity timeout, 0 without affinity.
func affinitySeconds(svc *corev1.Service, r *reporter) int {
	if svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		return 0
	}
	t := int32(DefaultAffinitySeconds)
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		t = *c.ClientIP.TimeoutSeconds
	}
	if t < 1 || t > maxAffinitySeconds {
		r.add("spec.sessionAffinityConfig.clientIP.timeoutSeconds",
			fmt.Errorf("%d is not in 1-%d: %w", t, maxAffinitySeconds, ErrInvalid))
		return 0
	}
	return int(t)
}

// externalIPs parses spec.externalIPs, keeping each once and only those of a
// family the Service has a ClusterIP of (kube-proxy ignores the others).
func externalIPs(svc *corev1.Service, served func(netip.Addr) bool, r *reporter) []netip.Addr {
	var out []netip.Addr
	for i, s := range svc.Spec.ExternalIPs {
		a, err := parseIP(s)
		if err != nil {
			r.add(fmt.Sprintf("spec.externalIPs[%d]", i), err)
			continue
		}
		if served(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// loadBalancerIPs are the ingress IPs a VIP-mode load balancer delivers to
// the node with the destination unchanged. Proxy-mode ingress, and
// hostname-only ingress, is the load balancer's business.
func loadBalancerIPs(svc *corev1.Service, served func(netip.Addr) bool, r *reporter) []netip.Addr {
	var out []netip.Addr
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != corev1.LoadBalancerIPModeVIP) {
			continue
		}
		a, err := parseIP(ing.IP)
		if err != nil {
			r.add(fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i), err)
			continue
		}
		if served(a) && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// externallyAccessible is Kubernetes' test for a Service whose
// externalTrafficPolicy matters: NodePort, LoadBalancer, or ClusterIP with
// externalIPs.
func externallyAccessible(svc *corev1.Service) bool {
	switch svc.Spec.Type {
	case corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
		return true
	case corev1.ServiceTypeClusterIP, "":
		return len(svc.Spec.ExternalIPs) > 0
	}
	return false
}

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
