package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/weftnet/weft/internal/netnsutil"
)

// On racks the lab's ToR is a router as data centres have them: BIRD 2
// (Debian's bird2) in the ToR namespace, an eBGP peer of every node of
// every rack, with TCP MD5 on each session and graceful restart on. It
// installs what the nodes announce (podCIDRs, Service addresses) in its
// kernel table, merging equal routes into ECMP, so the external host
// behind it reaches pods and Services with no overlay; and like many ToRs
// it announces a default route, which weft's import policy must refuse.
const (
	// ToRASN is the ToR's AS; the nodes are in the cluster's (weft's
	// default, 64512).
	ToRASN = 65000
	// clusterASN is the nodes' AS, weft's default.
	clusterASN = 64512
	// RackLabel is the Node label that carries a lab node's rack, as an
	// operator's provisioning would set it; the BGP configuration selects
	// each rack's ToR peer by it.
	RackLabel = "lab.weft.dev/rack"
	// ZoneLabel is the well-known zone label (corev1.LabelTopologyZone).
	ZoneLabel = "topology.kubernetes.io/zone"
	// torPassword is the TCP MD5 password of the ToR's sessions.
	torPassword = "weft-lab-tor"
)

// ToRPassword is the TCP MD5 password of the ToR's BGP sessions.
func ToRPassword() string { return torPassword }

// ToRAddr is the ToR's address on rack r, the rack's default router and
// its nodes' BGP peer.
func ToRAddr(r int) string { return torAddr(r).String() }

// birdConfig is BIRD's configuration for the ToR of a lab with these
// members.
func birdConfig(members []Member, nodeASN uint32) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# The lab's top-of-rack router (weftctl lab up --racks).
router id %s;
log stderr all;
protocol device { scan time 5; }
# Routes learned from the nodes go to the ToR's kernel table; equal ones
# from several nodes (a Service address) become one ECMP route.
protocol kernel {
	ipv4 { import none; export where source = RTS_BGP; };
	merge paths on;
}
# The ToR's way out, announced to the nodes as data-centre ToRs do.
protocol static default4 {
	ipv4;
	route 0.0.0.0/0 via %s;
}
template bgp node {
	local as %d;
	password "%s";
	graceful restart on;
	passive on;
	hold time 9;
	keepalive time 3;
	connect retry time 1;
	error wait time 1, 5;
	ipv4 { import all; export where source = RTS_STATIC; next hop self; };
}
`, hostIn(outsideNet, 1), hostIn(outsideNet, 100), ToRASN, torPassword)
	for _, n := range NodeMembers(members) {
		fmt.Fprintf(&b, "protocol bgp %s from node { neighbor %s as %d; }\n", n.Name, n.IP, nodeASN)
	}
	return b.String()
}

func birdSocket(dir string) string { return filepath.Join(dir, "tor", "bird.ctl") }

// torDaemon is BIRD on the ToR, its configuration written in dir.
func torDaemon(dir string, members []Member, nodeASN uint32) (Proc, error) {
	conf := filepath.Join(dir, "tor", "bird.conf")
	if err := os.MkdirAll(filepath.Dir(conf), 0o755); err != nil {
		return Proc{}, err
	}
	if err := os.WriteFile(conf, []byte(birdConfig(members, nodeASN)), 0o644); err != nil {
		return Proc{}, err
	}
	bird, err := exec.LookPath("bird")
	if err != nil {
		return Proc{}, fmt.Errorf("--racks: the ToR runs BIRD 2 (Debian's bird2, `make deps` installs it): %w", err)
	}
	return Proc{Name: "tor-bird", NS: netnsutil.RunDir + "/" + ToRNS, Args: []string{
		bird, "-f", "-c", conf, "-s", birdSocket(dir),
	}}, nil
}

// Birdc runs a BIRD command on the lab's ToR ("show route", "show
// protocols") and returns its output.
func Birdc(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "birdc", append([]string{"-s", birdSocket(dir)}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("birdc %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}
