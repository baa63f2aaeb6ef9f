package model

import "slices"

// Equal reports whether p and q program the same thing. Nil and empty lists
// are equal.
func (p *ServicePort) Equal(q *ServicePort) bool {
	if p == nil || q == nil {
		return p == q
	}
	return p.Name == q.Name &&
		slices.Equal(p.ClusterIPs, q.ClusterIPs) &&
		p.Port == q.Port &&
		p.Protocol == q.Protocol &&
		p.NodePort == q.NodePort &&
		slices.Equal(p.ExternalIPs, q.ExternalIPs) &&
		slices.Equal(p.LoadBalancerIPs, q.LoadBalancerIPs) &&
		slices.Equal(p.SourceRanges, q.SourceRanges) &&
		p.ExternalPolicyLocal == q.ExternalPolicyLocal &&
		p.InternalPolicyLocal == q.InternalPolicyLocal &&
		p.HealthCheckNodePort == q.HealthCheckNodePort &&
		p.AffinitySeconds == q.AffinitySeconds &&
		p.KeepConnections == q.KeepConnections &&
		p.PreferClose == q.PreferClose &&
		p.PreferSameNode == q.PreferSameNode
}

// Equal reports whether e and f are the same endpoint in the same state.
func (e Endpoint) Equal(f Endpoint) bool {
	return e.IP == f.IP && e.Port == f.Port &&
		e.Ready == f.Ready && e.Serving == f.Serving && e.Terminating == f.Terminating &&
		e.NodeName == f.NodeName && e.Zone == f.Zone &&
		slices.Equal(e.ForZones(), f.ForZones()) && slices.Equal(e.ForNodes(), f.ForNodes())
}

// EqualEndpoints reports whether two endpoint lists are equal, in order.
func EqualEndpoints(a, b []Endpoint) bool {
	return slices.EqualFunc(a, b, Endpoint.Equal)
}
