package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/weftnet/weft/internal/netnsutil"
)

// The test binary is also the container shim and the program it runs:
// shimEnv makes it ContainerShim, probeEnv the probe inside the container.
const (
	shimEnv  = "WEFT_KUBELET_TEST_SHIM"
	probeEnv = "WEFT_KUBELET_TEST_PROBE"
)

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(probeEnv) != "":
		probe()
		os.Exit(0)
	case os.Getenv(shimEnv) != "":
		// weftctl lab container --spec FILE
		err := ContainerShim(os.Args[len(os.Args)-1])
		fmt.Fprintln(os.Stderr, "shim:", err)
		os.Exit(1)
	}
	os.Exit(netnsutil.RunTests(m))
}

// probe reports, one "key: value" a line, what the container may do: add
// a link to its network namespace, write a sysctl, and its capability
// sets and no_new_privs from /proc/self/status.
func probe() {
	result := func(err error) string {
		if err != nil {
			return err.Error()
		}
		return "ok"
	}
	link := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "probe0"}}
	err := netlink.LinkAdd(link)
	if err == nil {
		err = netlink.LinkDel(link)
	}
	fmt.Printf("link: %s\n", result(err))
	fmt.Printf("sysctl: %s\n", result(os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)))
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		fmt.Printf("status: %v\n", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		for _, key := range []string{"CapPrm", "CapEff", "CapBnd", "CapAmb", "CapInh", "NoNewPrivs"} {
			if v, ok := strings.CutPrefix(line, key+":"); ok {
				fmt.Printf("%s: %s\n", key, strings.TrimSpace(v))
			}
		}
	}
}

func TestSecurityOf(t *testing.T) {
	f, tr := false, true
	all := make([]string, 0, len(capNumbers))
	for name := range capNumbers {
		all = append(all, name)
	}
	slices.Sort(all)
	for _, tc := range []struct {
		name string
		sc   *corev1.SecurityContext
		want Security
	}{
		{"no securityContext: the runtime's defaults", nil, Security{Capabilities: slices.Sorted(slices.Values(runtimeDefaultCaps))}},
		{"privileged", &corev1.SecurityContext{Privileged: &tr, Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			Security{Privileged: true}},
		{"drop ALL, add two", &corev1.SecurityContext{AllowPrivilegeEscalation: &f, Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_RAW", "NET_ADMIN"}}},
			Security{Capabilities: []string{"NET_ADMIN", "NET_RAW"}, NoNewPrivs: true}},
		{"drop ALL alone", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			Security{Capabilities: []string{}}},
		{"defaults plus and minus", &corev1.SecurityContext{AllowPrivilegeEscalation: &tr, Capabilities: &corev1.Capabilities{
			Add: []corev1.Capability{"BPF"}, Drop: []corev1.Capability{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT", "AUDIT_WRITE"}}},
			Security{Capabilities: []string{"BPF", "NET_RAW"}}},
		{"added and dropped: dropped", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{"ALL", "NET_ADMIN"}, Add: []corev1.Capability{"NET_ADMIN", "BPF"}}},
			Security{Capabilities: []string{"BPF"}}},
		{"add ALL, drop one", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
			Add: []corev1.Capability{"ALL"}, Drop: []corev1.Capability{"SYS_MODULE"}}},
			Security{Capabilities: slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == "SYS_MODULE" })}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := securityOf(corev1.Container{Name: "c", SecurityContext: tc.sc})
			if err != nil {
				t.Fatal(err)
			}
			if got.Privileged != tc.want.Privileged || got.NoNewPrivs != tc.want.NoNewPrivs || !slices.Equal(got.Capabilities, tc.want.Capabilities) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, bad := range []struct {
		caps corev1.Capabilities
		want string
	}{
		{corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "CAP_BPF"}}, `container c: securityContext.capabilities.add[1]: unknown capability "CAP_BPF"`},
		{corev1.Capabilities{Drop: []corev1.Capability{"ALL", "net_raw"}}, `container c: securityContext.capabilities.drop[1]: unknown capability "net_raw"`},
	} {
		_, err := securityOf(corev1.Container{Name: "c", SecurityContext: &corev1.SecurityContext{Capabilities: &bad.caps}})
		if err == nil || !strings.HasPrefix(err.Error(), bad.want) {
			t.Errorf("%+v: error %v, want %s", bad.caps, err, bad.want)
		}
	}
}

func TestCapMask(t *testing.T) {
	m, err := capMask([]string{"NET_ADMIN", "BPF", "CHOWN"})
	if err != nil {
		t.Fatal(err)
	}
	if want := [2]uint32{1<<12 | 1, 1 << (39 - 32)}; m != want {
		t.Errorf("mask %#x, want %#x", m, want)
	}
	if len(capNumbers) != unix.CAP_LAST_CAP+1 {
		t.Errorf("%d capabilities named, the kernel headers know %d", len(capNumbers), unix.CAP_LAST_CAP+1)
	}
}

// TestShimConfines runs containers through the kubelet's shim, as the lab
// runs weft's pods, with a probe for a program: a container that is not
// privileged holds only its capabilities (without NET_ADMIN it cannot add
// a link to its network namespace, with it it can), cannot write
// /proc/sys, and runs with no_new_privs when privilege escalation is not
// allowed; a privileged container can do all of it.
func TestShimConfines(t *testing.T) {
	if !netnsutil.Isolated() {
		t.Skip("needs root: the shim mounts and chroots in a private network and mount namespace")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(shimEnv, "1")
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{root, filepath.Join(dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	k := &Kubelet{opts: Options{StateDir: dir, Shim: []string{exe}}}
	// The image: the probe (this test binary) and the libraries it may
	// link, from the machine.
	binds := []Bind{{Source: exe, Target: "/probe", ReadOnly: true}}
	for _, d := range []string{"/usr", "/lib", "/lib64"} {
		if _, err := os.Stat(d); err == nil {
			binds = append(binds, Bind{Source: d, Target: d, ReadOnly: true})
		}
	}
	mask := func(names ...string) string {
		m, err := capMask(names)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("%016x", uint64(m[1])<<32|uint64(m[0]))
	}
	// A privileged container has what the kubelet has.
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	full := ""
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			full = strings.TrimSpace(v)
		}
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("ip_forward of a fresh network namespace: %q %v", b, err)
	}
	f, tr := false, true
	nobody := int64(65534)
	for i, tc := range []struct {
		name string
		sc   *corev1.SecurityContext
		want map[string]string
	}{
		{"without NET_ADMIN", &corev1.SecurityContext{AllowPrivilegeEscalation: &f,
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_RAW"}}},
			map[string]string{"link": "operation not permitted", "sysctl": "read-only file system",
				"CapEff": mask("NET_RAW"), "CapPrm": mask("NET_RAW"), "CapBnd": mask("NET_RAW"), "CapInh": mask(), "CapAmb": mask(), "NoNewPrivs": "1"}},
		{"with NET_ADMIN", &corev1.SecurityContext{
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}}},
			map[string]string{"link": "ok", "sysctl": "read-only file system",
				"CapEff": mask("NET_ADMIN"), "CapBnd": mask("NET_ADMIN"), "NoNewPrivs": "0"}},
		{"the runtime's defaults", nil,
			map[string]string{"link": "operation not permitted", "sysctl": "read-only file system", "CapEff": mask(runtimeDefaultCaps...)}},
		{"NET_ADMIN for a user other than root", &corev1.SecurityContext{RunAsUser: &nobody, RunAsGroup: &nobody,
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN"}}},
			map[string]string{"link": "operation not permitted", "CapEff": mask(), "CapPrm": mask(), "CapBnd": mask("NET_ADMIN")}},
		{"privileged", &corev1.SecurityContext{Privileged: &tr},
			map[string]string{"link": "ok", "sysctl": "ok", "CapEff": full, "CapBnd": full}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := corev1.Container{Name: fmt.Sprintf("c%d", i), SecurityContext: tc.sc}
			spec := ContainerSpec{Root: root, Binds: binds, Argv: []string{"/probe"}, Env: []string{probeEnv + "=1"}}
			spec.UID, spec.GID = runAs(&corev1.Pod{}, c)
			if spec.Security, err = securityOf(c); err != nil {
				t.Fatal(err)
			}
			run := &podRun{UID: "pod", Namespace: "ns", Name: "p", HostNetwork: true}
			cr := &containerRun{Name: c.Name}
			if err := k.launch(run, cr, spec); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			waitErr := waitExit(ctx, cr.PID, time.Minute)
			out, err := os.ReadFile(k.containerLog(run, c.Name))
			if err := errors.Join(waitErr, err); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			got := map[string]string{}
			for _, line := range strings.Split(string(out), "\n") {
				if key, v, ok := strings.Cut(line, ": "); ok {
					got[key] = v
				}
			}
			for key, want := range tc.want {
				if !strings.Contains(got[key], want) {
					t.Errorf("%s: %q, want %q\n%s", key, got[key], want, out)
				}
			}
		})
	}
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Errorf("the privileged container did not set the network namespace's ip_forward: %q %v", b, err)
	}
}
