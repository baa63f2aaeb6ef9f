package nftables_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/knftables"

	"github.com/weftnet/weft/internal/netnsutil"
	"github.com/weftnet/weft/policy"
	nt "github.com/weftnet/weft/policy/netpoltest"
	polnft "github.com/weftnet/weft/policy/nftables"
)

// BenchmarkPartialApply measures the applies that follow the cluster's
// common changes on a node holding 2,000 pods selected by 1,000 policies
// (the shape of policybench's scale world): a pod relabelled (its address
// leaves peer sets), a new pod selected by a policy (its dispatch
// elements: goto verdicts, so the kernel validates the table), a policy
// edited (a new chain and sets, the old ones deleted). Besides the wall
// time of the apply (mostly the nft tool in user space), it reports the
// kernel's time for the commit ("kernel-ms": the longest sendmsg of nft,
// by strace -T, which holds the commit) when strace is installed.
//
//	go test -run NONE -bench PartialApply -benchtime 5x ./policy/nftables/
func BenchmarkPartialApply(b *testing.B) {
	if !netnsutil.Isolated() {
		b.Skip("kernel benchmark: needs root to run in a private network namespace")
	}
	in := scaleWorld(2000, 1000)
	a, err := polnft.New(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = a.Cleanup(context.Background()) }()
	st := &straceNFT{Interface: a.Inet}
	if _, err := exec.LookPath("strace"); err == nil {
		a.Inet = st
	}
	cfg := polnft.Config{NodeName: "node1"}
	apply := func(b *testing.B) {
		b.Helper()
		if _, err := a.Apply(context.Background(), polnft.Render(policy.Compile(in), cfg)); err != nil {
			b.Fatal(err)
		}
	}
	run := func(name string, change, undo func()) {
		b.Run(name, func(b *testing.B) {
			total, n := 0.0, 0
			for b.Loop() {
				b.StopTimer()
				undo()
				apply(b)
				change()
				r := polnft.Render(policy.Compile(in), cfg)
				st.kernel = 0
				b.StartTimer()
				if _, err := a.Apply(context.Background(), r); err != nil {
					b.Fatal(err)
				}
				total, n = total+st.kernel, n+1
			}
			b.ReportMetric(1000*total/float64(n), "kernel-ms")
		})
	}
	apply(b)
	pod := in.Pods[0]
	run("relabel", func() { pod.Labels["role"] = "moved" }, func() { pod.Labels["role"] = "0" })
	fresh := pod.DeepCopy()
	fresh.Name, fresh.Labels = "fresh", map[string]string{"app": "app-00", "role": "0"}
	nt.SetIP(fresh, netip.MustParseAddr("10.244.100.1"))
	n := len(in.Pods)
	run("new-selected-pod", func() { in.Pods = append(in.Pods[:n:n], fresh) }, func() { in.Pods = in.Pods[:n] })
	pol := in.Policies[5]
	run("policy-edit", func() { pol.Spec.Ingress[0].Ports[0].Port.IntVal = 8080 }, func() { pol.Spec.Ingress[0].Ports[0].Port.IntVal = 80 })
}

// scaleWorld is nPods pods over 20 namespaces on node1, and nPol policies
// each selecting an app's pods and admitting a role from a tier of
// namespaces on TCP 80.
func scaleWorld(nPods, nPol int) policy.Input {
	var in policy.Input
	for i := range 20 {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns-%02d", i), Labels: map[string]string{"tier": strconv.Itoa(i % 4)}}})
	}
	for j := range nPods {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%02d", j%20), Name: fmt.Sprintf("pod-%05d", j),
			Labels: map[string]string{"app": fmt.Sprintf("app-%02d", j%20), "role": strconv.Itoa(j % 3)}}, Spec: corev1.PodSpec{NodeName: "node1"}}
		nt.SetIP(p, netip.AddrFrom4([4]byte{10, 244, byte(j / 250), byte(2 + j%250)}))
		in.Pods = append(in.Pods, p)
	}
	for k := range nPol {
		peer := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": strconv.Itoa(k % 4)}},
			PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": strconv.Itoa(k % 3)}}}
		in.Policies = append(in.Policies, nt.Policy(fmt.Sprintf("ns-%02d", k%20), fmt.Sprintf("pol-%04d", k), map[string]string{"app": fmt.Sprintf("app-%02d", k%20)},
			nt.Ingress(nt.From(nt.Peers(peer), nt.Port(corev1.ProtocolTCP, 80)))))
	}
	return in
}

// straceNFT runs each transaction with the nft tool under strace and
// keeps the longest sendmsg: the batch whose commit the kernel runs.
type straceNFT struct {
	knftables.Interface
	kernel float64 // seconds
}

var sendmsgRE = regexp.MustCompile(`sendmsg\(.*<([0-9.]+)>`)

func (s *straceNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	dir, err := os.MkdirTemp("", "nftbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	f := filepath.Join(dir, "tx.nft")
	if err := os.WriteFile(f, []byte(tx.String()), 0o644); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "strace", "-s", "0", "-T", "-e", "trace=sendmsg", "nft", "-f", f).CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft -f: %w: %s", err, out)
	}
	for _, m := range sendmsgRE.FindAllStringSubmatch(string(out), -1) {
		if v, _ := strconv.ParseFloat(m[1], 64); v > s.kernel {
			s.kernel = v
		}
	}
	return nil
}
