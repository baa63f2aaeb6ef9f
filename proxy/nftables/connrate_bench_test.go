package nftables_test

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/proxytest"
)

// BenchmarkClusterIPConnRate: new TCP connections per second from the node
// to a ClusterIP through the nftables backend's DNAT, the table holding 1k
// and 100k other Services, measured interleaved in one run, and the ratio
// (issue 27: at least 0.95). See proxytest.BenchConnRate.
//
//	go test -run '^$' -bench ClusterIPConnRate -benchtime 30s ./proxy/nftables
//
// Run as root.
func BenchmarkClusterIPConnRate(b *testing.B) {
	proxytest.BenchConnRate(b, proxytest.ConnRateBackend{Mode: "nftables", Programmed: nftProgrammed})
}

// nftProgrammed sends a SYN to each TCP frontend of svc and asks the
// kernel's conntrack table where the table's DNAT sent it: to one of the
// endpoints of eps. (nft get element would do, but nft reads the whole set
// first: over a minute at 100k Services.) The endpoints are not there; the
// SYN goes unanswered.
func nftProgrammed(_ proxy.Config, svc *corev1.Service, eps *discoveryv1.EndpointSlice) error {
	var want []string
	for _, e := range eps.Endpoints {
		want = append(want, e.Addresses...)
	}
	for _, p := range svc.Spec.Ports {
		fe := net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(p.Port)))
		if c, err := net.DialTimeout("tcp4", fe, 100*time.Millisecond); err == nil {
			c.Close()
			return fmt.Errorf("%s answered: none of its endpoints is there", fe)
		}
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		found := false
		for _, f := range flows {
			if f.Forward.DstIP.String() == svc.Spec.ClusterIP && f.Forward.DstPort == uint16(p.Port) {
				if to := f.Reverse.SrcIP.String(); !slices.Contains(want, to) {
					return fmt.Errorf("%s went to %s, not an endpoint of %s", fe, to, svc.Name)
				}
				found = true
			}
		}
		if !found {
			return fmt.Errorf("no conntrack entry for a connection to %s", fe)
		}
	}
	return nil
}
