package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/lab"
)

// dnsPort and dnsHealthPort are where the test runs weft-dns on node1.
const (
	dnsPort       = 53
	dnsHealthPort = 8081
	upstreamName  = "upstream.test."
)

// dnsKubeconfig copies the admin kubeconfig, pointed at the API server's
// underlay address (the admin's 127.0.0.1 forwarder is on the test's own
// loopback, out of the nodes' reach).
func dnsKubeconfig(t *testing.T, c *cluster) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(lab.AdminKubeconfig(c.dir))
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range cfg.Clusters {
		cl.Server = fmt.Sprintf("https://%s:%d", lab.ControlIP, lab.APIServerPort)
	}
	path := filepath.Join(c.dir, "dns.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// startUpstream serves names under upstream.test. (A 192.0.2.53) from the
// external host's namespace: the upstream weft-dns forwards to.
func startUpstream(t *testing.T, c *cluster) string {
	t.Helper()
	var pc net.PacketConn
	addr := net.JoinHostPort(c.node("ext").IP.String(), "53")
	if err := netnsutil.Do(c.node("ext").NSPath(), func() (err error) {
		pc, err = net.ListenPacket("udp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg)
		m.SetReply(r)
		qn := strings.ToLower(r.Question[0].Name)
		switch {
		case qn == upstreamName && r.Question[0].Qtype == mdns.TypeA:
			m.Answer = []mdns.RR{&mdns.A{Hdr: mdns.RR_Header{Name: r.Question[0].Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 53)}}
		case qn != upstreamName:
			m.Rcode = mdns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return addr
}

// startDNS runs bin/weft-dns inside node1's namespace.
func startDNS(t *testing.T, c *cluster, upstream string) string {
	t.Helper()
	bin := filepath.Join(binDir(t), "weft-dns")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run `make build` first", bin)
	}
	n1 := c.node("node1")
	logf, err := os.Create(filepath.Join(c.dir, "logs", "weft-dns.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig", dnsKubeconfig(t, c), "--listen", fmt.Sprintf(":%d", dnsPort),
		"--upstream", upstream, "--pod-records", "verified", "--metrics-addr", "",
		"--health-addr", fmt.Sprintf(":%d", dnsHealthPort))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := netnsutil.Do(n1.NSPath(), cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("--- weft-dns log\n%s", b)
		}
	})
	waitHealthy(t, n1.NSPath(), fmt.Sprintf("http://%s:%d/readyz", n1.IP, dnsHealthPort))
	return n1.IP.String()
}

// digReply is what dig printed: the status, the flags and the answer and
// authority records (as "name TYPE rdata", TTL dropped, lower case).
type digReply struct {
	status       string
	flags        []string
	answer, auth []string
	raw          string
}

var (
	statusRE = regexp.MustCompile(`status: ([A-Z]+)`)
	flagsRE  = regexp.MustCompile(`;; flags: ([a-z ]+);`)
)

// dig asks server from inside the namespace at nsPath, as a pod would.
func dig(t *testing.T, nsPath, server, name, qtype string, extra ...string) digReply {
	t.Helper()
	args := append([]string{"--net=" + nsPath, "dig", "@" + server, "+time=2", "+tries=2", "+nocookie", name, qtype}, extra...)
	out, err := exec.Command("nsenter", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %s %s: %v\n%s", name, qtype, err, out)
	}
	r := digReply{raw: string(out)}
	if m := statusRE.FindStringSubmatch(r.raw); m != nil {
		r.status = m[1]
	}
	if m := flagsRE.FindStringSubmatch(r.raw); m != nil {
		r.flags = strings.Fields(m[1])
	}
	section := ""
	for _, l := range strings.Split(r.raw, "\n") {
		switch {
		case strings.HasPrefix(l, ";; ANSWER SECTION"):
			section = "answer"
		case strings.HasPrefix(l, ";; AUTHORITY SECTION"):
			section = "auth"
		case strings.HasPrefix(l, ";;") || strings.TrimSpace(l) == "":
			section = ""
		case section != "" && !strings.HasPrefix(l, ";"):
			f := strings.Fields(strings.ToLower(l))
			if len(f) < 5 {
				continue
			}
			rec := f[0] + " " + strings.ToUpper(f[3]) + " " + strings.Join(f[4:], " ")
			if section == "answer" {
				r.answer = append(r.answer, rec)
			} else {
				r.auth = append(r.auth, rec)
			}
		}
	}
	slices.Sort(r.answer)
	return r
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// TestDNS runs weft-dns against a lab's API server and asks it the spec
// cases with dig from a pod, with answers checked against the real pods and
// Services.
func TestDNS(t *testing.T) {
	c := up(t, 3, "hostgw")
	ctx := context.Background()
	if _, err := exec.LookPath("dig"); err != nil {
		t.Fatal("dig missing: run `make deps`")
	}
	app := map[string]string{"app": "web"}
	web1, _ := c.pod(t, "web-1", "node1", app)
	web2, _ := c.pod(t, "web-2", "node2", app)
	client, clientNS := c.pod(t, "client", "node3", nil)
	// A pod naming itself under the headless Service "db".
	named := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "named", Labels: app},
		Spec: corev1.PodSpec{NodeName: "node2", Hostname: "db-host", Subdomain: "db",
			Containers: []corev1.Container{{Name: "w", Image: lab.WorkloadImage, Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}}}
	if _, err := c.client.CoreV1().Pods("default").Create(ctx, named, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	named = waitRunning(t, c, "default", "named")
	ports := []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}
	svcs := []*corev1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: corev1.ServiceSpec{Selector: app, Ports: ports}},
		{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: corev1.ServiceSpec{Selector: app, Ports: ports, ClusterIP: corev1.ClusterIPNone}},
		{ObjectMeta: metav1.ObjectMeta{Name: "nobody"}, Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "none"}, Ports: ports, ClusterIP: corev1.ClusterIPNone}},
		{ObjectMeta: metav1.ObjectMeta{Name: "out"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: strings.TrimSuffix(upstreamName, ".")}},
	}
	for i, s := range svcs {
		got, err := c.client.CoreV1().Services("default").Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svcs[i] = got
	}
	c.waitEndpoints(t, "db", 3)
	server := startDNS(t, c, startUpstream(t, c))

	const zone = "cluster.local."
	web, db := "web.default.svc."+zone, "db.default.svc."+zone
	vip := svcs[0].Spec.ClusterIP
	revVIP, _ := mdns.ReverseAddr(vip)
	revWeb1, _ := mdns.ReverseAddr(web1.Status.PodIP)
	dashed := func(ip string) string { return strings.ReplaceAll(ip, ".", "-") }
	soa := "cluster.local. SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"
	podName := func(p *corev1.Pod) string {
		// The EndpointSlice controller names a pod by its hostname when its
		// subdomain is the Service; the others get their dashed address.
		if p.Spec.Hostname != "" {
			return p.Spec.Hostname + "." + db
		}
		return dashed(p.Status.PodIP) + "." + db
	}
	cases := []struct {
		name, qtype, status string
		answer, auth        []string
	}{
		{"dns-version." + zone, "TXT", "NOERROR", []string{`dns-version.cluster.local. TXT "1.1.0"`}, nil},
		{web, "A", "NOERROR", []string{web + " A " + vip}, nil},
		{"WEB.Default.SVC.cluster.LOCAL.", "A", "NOERROR", []string{"web.default.svc.cluster.local. A " + vip}, nil},
		{"_http._tcp." + web, "SRV", "NOERROR", []string{"_http._tcp." + web + " SRV 0 100 80 " + web}, nil},
		{revVIP, "PTR", "NOERROR", []string{revVIP + " PTR " + web}, nil},
		{web, "TXT", "NOERROR", nil, []string{soa}},
		{db, "A", "NOERROR", sorted(db+" A "+web1.Status.PodIP, db+" A "+web2.Status.PodIP, db+" A "+named.Status.PodIP), nil},
		{"_http._tcp." + db, "SRV", "NOERROR", sorted(
			"_http._tcp."+db+" SRV 0 33 80 "+podName(web1), "_http._tcp."+db+" SRV 0 33 80 "+podName(web2),
			"_http._tcp."+db+" SRV 0 33 80 "+podName(named)), nil},
		{"db-host." + db, "A", "NOERROR", []string{"db-host." + db + " A " + named.Status.PodIP}, nil},
		{podName(web1), "A", "NOERROR", []string{podName(web1) + " A " + web1.Status.PodIP}, nil},
		{revWeb1, "PTR", "NOERROR", []string{revWeb1 + " PTR " + podName(web1)}, nil},
		{"nobody.default.svc." + zone, "A", "NXDOMAIN", nil, []string{soa}},
		{"nope.default.svc." + zone, "A", "NXDOMAIN", nil, []string{soa}},
		{"default.svc." + zone, "A", "NOERROR", nil, []string{soa}},
		{"out.default.svc." + zone, "A", "NOERROR", sorted("out.default.svc."+zone+" CNAME "+upstreamName, upstreamName+" A 192.0.2.53"), nil},
		{dashed(client.Status.PodIP) + ".default.pod." + zone, "A", "NOERROR",
			[]string{dashed(client.Status.PodIP) + ".default.pod." + zone + " A " + client.Status.PodIP}, nil},
		{dashed(client.Status.PodIP) + ".kube-system.pod." + zone, "A", "NXDOMAIN", nil, []string{soa}},
		{upstreamName, "A", "NOERROR", []string{upstreamName + " A 192.0.2.53"}, nil},
		{"other.test.", "A", "NXDOMAIN", nil, nil},
	}
	for _, tc := range cases {
		for _, transport := range []string{"+notcp", "+tcp"} {
			r := dig(t, clientNS, server, tc.name, tc.qtype, transport)
			if r.status != tc.status || !slices.Equal(r.answer, tc.answer) || !slices.Equal(r.auth, tc.auth) {
				t.Errorf("dig %s %s %s: %s %q %q, want %s %q %q\n%s", transport, tc.name, tc.qtype,
					r.status, r.answer, r.auth, tc.status, tc.answer, tc.auth, r.raw)
			}
		}
	}

	truncation(t, c, clientNS, server)
	badPackets(t, clientNS, server)

	// A pod turning not ready leaves the headless Service's answer.
	if err := c.state.SetReady(ctx, web2, false); err != nil {
		t.Fatal(err)
	}
	want := sorted(db+" A "+web1.Status.PodIP, db+" A "+named.Status.PodIP)
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := dig(t, clientNS, server, db, "A")
		if slices.Equal(r.answer, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after web-2 turned not ready: %q, want %q", r.answer, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A deleted Service is gone from the next answers.
	if err := c.client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(20 * time.Second)
	for dig(t, clientNS, server, web, "A").status != "NXDOMAIN" {
		if time.Now().After(deadline) {
			t.Fatal("deleted Service still answered")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// truncation: a headless Service with a hand-made EndpointSlice of many
// addresses (and publishNotReadyAddresses, with half of them not ready):
// over UDP dig sees TC and a cut answer; by default dig retries over TCP
// and gets every address.
func truncation(t *testing.T, c *cluster, nsPath, server string) {
	t.Helper()
	ctx := context.Background()
	const n = 120
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "many"}, Spec: corev1.ServiceSpec{
		ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := c.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sl := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "many-1", Labels: map[string]string{discoveryv1.LabelServiceName: "many"}},
		AddressType: discoveryv1.AddressTypeIPv4}
	base := netip.MustParsePrefix(lab.ClusterCIDR).Addr()
	var want []string
	name := "many.default.svc.cluster.local."
	for i := range n {
		a := base.As4()
		a[2], a[3] = 200+byte(i/200), byte(i%200+1)
		ip := netip.AddrFrom4(a).String()
		ready := i%2 == 0
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
		want = append(want, name+" A "+ip)
	}
	slices.Sort(want)
	if _, err := c.client.DiscoveryV1().EndpointSlices("default").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r := dig(t, nsPath, server, name, "A")
		if slices.Equal(r.answer, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dig (TCP retry) %s: %d answers, want %d\n%s", name, len(r.answer), n, r.raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := dig(t, nsPath, server, name, "A", "+ignore", "+notcp")
	if !slices.Contains(r.flags, "tc") || len(r.answer) >= n {
		t.Errorf("UDP without retry: flags %v, %d answers; want tc and fewer than %d", r.flags, len(r.answer), n)
	}
}

// badPackets sends garbage from the pod; dig keeps being answered.
func badPackets(t *testing.T, nsPath, server string) {
	t.Helper()
	var conn net.Conn
	if err := netnsutil.Do(nsPath, func() (err error) {
		conn, err = net.Dial("udp", net.JoinHostPort(server, strconv.Itoa(dnsPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, pkt := range [][]byte{{0}, make([]byte, 12), []byte("GET / HTTP/1.1\r\n\r\n"), make([]byte, 600)} {
		if _, err := conn.Write(pkt); err != nil {
			t.Fatal(err)
		}
	}
	if r := dig(t, nsPath, server, "dns-version.cluster.local.", "TXT"); r.status != "NOERROR" || len(r.answer) != 1 {
		t.Errorf("after garbage packets: %s %q", r.status, r.answer)
	}
}
