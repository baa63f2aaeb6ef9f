package kubelet

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// A container's securityContext is enforced as containerd and runc
// enforce it, so that the lab proves what deploy/ asks of a node: a
// container that is not privileged keeps only the runtime's default
// capabilities, less its `drop`, plus its `add` (in its bounding,
// permitted and effective sets; none inheritable or ambient), sees /proc/sys
// and the other kernel knobs of /proc read-only and /sys read-only, and
// runs with no_new_privs when allowPrivilegeEscalation is false. A
// privileged container keeps every capability and writable /proc/sys and
// /sys.

// capNumbers are the capabilities Linux knows, by their names in a
// securityContext (without the CAP_ prefix).
var capNumbers = map[string]int{
	"CHOWN": unix.CAP_CHOWN, "DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "DAC_READ_SEARCH": unix.CAP_DAC_READ_SEARCH,
	"FOWNER": unix.CAP_FOWNER, "FSETID": unix.CAP_FSETID, "KILL": unix.CAP_KILL, "SETGID": unix.CAP_SETGID,
	"SETUID": unix.CAP_SETUID, "SETPCAP": unix.CAP_SETPCAP, "LINUX_IMMUTABLE": unix.CAP_LINUX_IMMUTABLE,
	"NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "NET_BROADCAST": unix.CAP_NET_BROADCAST,
	"NET_ADMIN": unix.CAP_NET_ADMIN, "NET_RAW": unix.CAP_NET_RAW, "IPC_LOCK": unix.CAP_IPC_LOCK,
	"IPC_OWNER": unix.CAP_IPC_OWNER, "SYS_MODULE": unix.CAP_SYS_MODULE, "SYS_RAWIO": unix.CAP_SYS_RAWIO,
	"SYS_CHROOT": unix.CAP_SYS_CHROOT, "SYS_PTRACE": unix.CAP_SYS_PTRACE, "SYS_PACCT": unix.CAP_SYS_PACCT,
	"SYS_ADMIN": unix.CAP_SYS_ADMIN, "SYS_BOOT": unix.CAP_SYS_BOOT, "SYS_NICE": unix.CAP_SYS_NICE,
	"SYS_RESOURCE": unix.CAP_SYS_RESOURCE, "SYS_TIME": unix.CAP_SYS_TIME, "SYS_TTY_CONFIG": unix.CAP_SYS_TTY_CONFIG,
	"MKNOD": unix.CAP_MKNOD, "LEASE": unix.CAP_LEASE, "AUDIT_WRITE": unix.CAP_AUDIT_WRITE,
	"AUDIT_CONTROL": unix.CAP_AUDIT_CONTROL, "SETFCAP": unix.CAP_SETFCAP, "MAC_OVERRIDE": unix.CAP_MAC_OVERRIDE,
	"MAC_ADMIN": unix.CAP_MAC_ADMIN, "SYSLOG": unix.CAP_SYSLOG, "WAKE_ALARM": unix.CAP_WAKE_ALARM,
	"BLOCK_SUSPEND": unix.CAP_BLOCK_SUSPEND, "AUDIT_READ": unix.CAP_AUDIT_READ, "PERFMON": unix.CAP_PERFMON,
	"BPF": unix.CAP_BPF, "CHECKPOINT_RESTORE": unix.CAP_CHECKPOINT_RESTORE,
}

// runtimeDefaultCaps are the capabilities containerd gives a container
// that is not privileged, before its securityContext adds and drops.
var runtimeDefaultCaps = []string{
	"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
	"NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}

// Security is how a container is confined.
type Security struct {
	Privileged bool `json:"privileged,omitempty"`
	// Capabilities are all the container keeps when it is not privileged
	// (sorted names without CAP_).
	Capabilities []string `json:"capabilities,omitempty"`
	// NoNewPrivs: no exec gains privileges (allowPrivilegeEscalation
	// false).
	NoNewPrivs bool `json:"noNewPrivs,omitempty"`
}

// securityOf is how the container c is to run, from its securityContext,
// as containerd computes it: "ALL" in add starts from every capability,
// "ALL" in drop from none, then the named adds, then the named drops (a
// capability both added and dropped is dropped). An unknown capability is
// an error naming the field.
func securityOf(c corev1.Container) (Security, error) {
	sc := c.SecurityContext
	if sc == nil {
		sc = &corev1.SecurityContext{}
	}
	sec := Security{
		Privileged: sc.Privileged != nil && *sc.Privileged,
		NoNewPrivs: sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation,
	}
	if sec.Privileged {
		return sec, nil
	}
	var add, drop []corev1.Capability
	if sc.Capabilities != nil {
		add, drop = sc.Capabilities.Add, sc.Capabilities.Drop
	}
	set := map[string]bool{}
	for _, name := range runtimeDefaultCaps {
		set[name] = true
	}
	if slices.Contains(add, "ALL") {
		for name := range capNumbers {
			set[name] = true
		}
	}
	if slices.Contains(drop, "ALL") {
		clear(set)
	}
	for _, l := range []struct {
		field string
		caps  []corev1.Capability
		keep  bool
	}{{"add", add, true}, {"drop", drop, false}} {
		for i, cp := range l.caps {
			if cp == "ALL" {
				continue
			}
			name := string(cp)
			if _, ok := capNumbers[name]; !ok {
				return sec, fmt.Errorf("container %s: securityContext.capabilities.%s[%d]: unknown capability %q (names go without CAP_, e.g. NET_ADMIN)", c.Name, l.field, i, name)
			}
			if l.keep {
				set[name] = true
			} else {
				delete(set, name)
			}
		}
	}
	sec.Capabilities = make([]string, 0, len(set))
	for name := range set {
		sec.Capabilities = append(sec.Capabilities, name)
	}
	slices.Sort(sec.Capabilities)
	return sec, nil
}

// capMask is the kernel's two-word capability mask of names.
func capMask(names []string) (mask [2]uint32, err error) {
	for _, name := range names {
		n, ok := capNumbers[name]
		if !ok {
			return mask, fmt.Errorf("unknown capability %q", name)
		}
		mask[n/32] |= 1 << (n % 32)
	}
	return mask, nil
}

// readOnlyProcPaths are the kernel's knobs in /proc that runtimes mount
// read-only in a container that is not privileged.
var readOnlyProcPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}

// confineMounts makes the kernel's knobs in /proc read-only, as for a
// container that is not privileged (/sys is mounted read-only already).
func confineMounts() error {
	for _, p := range readOnlyProcPaths {
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			if err == unix.ENOENT {
				continue
			}
			return fmt.Errorf("binding %s on itself: %w", p, err)
		}
		if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("making %s read-only: %w", p, err)
		}
	}
	return nil
}

// limitBounding removes from the calling thread's bounding set every
// capability not in keep: no later exec can gain it back, not even as
// root. Call it before changing users, while CAP_SETPCAP is held.
func limitBounding(keep []string) error {
	for name, n := range capNumbers {
		if slices.Contains(keep, name) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(n), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("dropping %s from the bounding set: %w", name, err)
		}
	}
	return nil
}

// limitCaps leaves the calling thread with keep as its permitted and
// effective capabilities (those of them it still has: a user other than
// root has none left), none inheritable and none ambient; an exec then
// gives a root program exactly keep and any other none.
func limitCaps(keep []string) error {
	want, err := capMask(keep)
	if err != nil {
		return err
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var cur [2]unix.CapUserData
	if err := unix.Capget(&hdr, &cur[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	var data [2]unix.CapUserData
	for i := range data {
		data[i].Permitted = cur[i].Permitted & want[i]
		data[i].Effective = data[i].Permitted
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("setting capabilities %s: %w", strings.Join(keep, ","), err)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("clearing ambient capabilities: %w", err)
	}
	return nil
}
