package nftables_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/weftnet/weft/proxy"
	"github.com/weftnet/weft/proxy/nftables"
	"github.com/weftnet/weft/proxy/proxytest"
)

// BenchmarkClusterIPConnRate: new TCP connections per second from the node
// to a ClusterIP through the nftables backend's DNAT, the table holding 1k
// and 100k other Services, measured interleaved in one run, and the ratio
// (issue 27: at least 0.95). See proxytest.BenchConnRate.
//
//	go test -run '^$' -bench ClusterIPConnRate -benchtime 6x ./proxy/nftables
//
// Run as root.
func BenchmarkClusterIPConnRate(b *testing.B) {
	proxytest.BenchConnRate(b, proxytest.ConnRateBackend{Mode: "nftables", Programmed: nftProgrammed})
}

// nftProgrammed asks the kernel (nft get element) for each TCP frontend of
// svc in the clusterip set and for its last endpoint in its load-balancing
// map.
func nftProgrammed(_ proxy.Config, svc *corev1.Service, eps *discoveryv1.EndpointSlice) error {
	out, err := exec.Command("nft", "-t", "list", "maps", "inet").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft list maps: %v: %s", err, out)
	}
	n := len(eps.Endpoints)
	var lb string
	for _, f := range strings.Fields(string(out)) {
		if name := fmt.Sprintf("lb4-%d", n); f == name || strings.HasPrefix(f, name+"-s") {
			lb = f
		}
	}
	if lb == "" {
		return fmt.Errorf("no map lb4-%d in table %s", n, nftables.TableName)
	}
	last := eps.Endpoints[n-1].Addresses[0]
	for _, p := range svc.Spec.Ports {
		fe := fmt.Sprintf("%s . tcp . %d", svc.Spec.ClusterIP, p.Port)
		if out, err := exec.Command("nft", "get", "element", "inet", nftables.TableName, "clusterip4", "{ "+fe+" }").CombinedOutput(); err != nil {
			return fmt.Errorf("%s not in clusterip4: %v: %s", fe, err, out)
		}
		out, err := exec.Command("nft", "get", "element", "inet", nftables.TableName, lb, fmt.Sprintf("{ %s . %d }", fe, n-1)).CombinedOutput()
		if err != nil || !strings.Contains(string(out), last+" . ") {
			return fmt.Errorf("%s, endpoint %d not %s in %s: %v: %s", fe, n-1, last, lb, err, out)
		}
	}
	return nil
}
