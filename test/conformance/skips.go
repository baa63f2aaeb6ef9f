package main

import "strings"

// skipGroup is one reason the lab cannot run some [sig-network] specs,
// and the regexp (matched against the spec's full text, as ginkgo's
// --skip is) that leaves them out. docs/conformance.md lists each
// group's specs; keep the two in step.
type skipGroup struct {
	Reason string
	Regexp string
}

// skipGroups make the default -skip. The order is the documentation's:
// a spec two groups match is counted in the first.
var skipGroups = []skipGroup{
	{"SCTP: this kernel has no SCTP (CONFIG_IP_SCTP off, CONFIG_MODULES off)",
		`\[Feature:SCTPConnectivity\]|SCTP HostPort|basic SCTP service`},
	{"disruptive: they restart the API server or kube-proxy through a provider's SSH, or migrate kube-proxy",
		`\[Disruptive\]`},
	{"kube-proxy itself: its status ports (10256, 10249), its metrics, its conntrack sysctls",
		`\[Feature:KubeProxyNFAcct\]|should check kube-proxy urls|should set TCP CLOSE_WAIT timeout`},
	{"CoreDNS or kube-dns reconfigured through their ConfigMap in kube-system",
		`DNS configMap`},
	{"the Internet: the lab has no route out",
		`\[Feature:Networking-IPv4\]|\[Feature:Networking-IPv6\]|\[Feature:Networking-DNS\]`},
	{"a cloud provider (GCE)",
		`\[Provider:GCE\]`},
	{"scale: 10,000 Services made one at a time at the e2e client's 20 requests/s",
		`\[Feature:PerformanceDNS\]`},
	{"eviction on an ephemeral-storage limit: the lab's kubelets run with localStorageCapacityIsolation off",
		`should be rejected for evicted pods`},
}

// defaultSkip is the -skip default: every group's regexp.
func defaultSkip() string {
	res := make([]string, len(skipGroups))
	for i, g := range skipGroups {
		res[i] = g.Regexp
	}
	return strings.Join(res, "|")
}
