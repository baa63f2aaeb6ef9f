package ebpf

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/proxy/iptables"
	"github.com/weftnet/weft/proxy/model"
)

// hook is one cgroup hook weft attaches a program to.
type hook struct {
	name   string // the link's pin name is "link_" + name
	attach ebpf.AttachType
	prog   func(*sockPrograms) *ebpf.Program
}

var hooks = []hook{
	{"connect4", ebpf.AttachCGroupInet4Connect, func(p *sockPrograms) *ebpf.Program { return p.WeftConnect4 }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(p *sockPrograms) *ebpf.Program { return p.WeftConnect6 }},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, func(p *sockPrograms) *ebpf.Program { return p.WeftSendmsg4 }},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg, func(p *sockPrograms) *ebpf.Program { return p.WeftSendmsg6 }},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, func(p *sockPrograms) *ebpf.Program { return p.WeftRecvmsg4 }},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, func(p *sockPrograms) *ebpf.Program { return p.WeftRecvmsg6 }},
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(p *sockPrograms) *ebpf.Program { return p.WeftGetpeername4 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(p *sockPrograms) *ebpf.Program { return p.WeftGetpeername6 }},
}

// mapNames are the maps weft pins (the names in bpf/*.c).
var mapNames = []string{"weft_services", "weft_backends", "weft_revnat", "weft_affinity", "weft_affinity_members",
	"weft_ct", "weft_nat_rev", "weft_src_ranges", "weft_maglev", "weft_ext_affinity"}

// Backend is the eBPF service proxy backend.
type Backend struct {
	// mu serialises Sync, Cleanup and Collect (metrics).
	mu    sync.Mutex
	cfg   Config
	r     *Renderer
	objs  *sockObjects
	np    *nodeportObjects
	links []link.Link
	w     *writer
	// uplinks run weft_nodeport and weft_reply (Config.Devices, or the
	// links holding the NodePort addresses); tc holds what runs on each
	// side of each.
	uplinks []string
	tc      map[tcHook]tcAttached
	// xdp: each uplink's XDP program (--bpf-xdp; xdp.go).
	xdp map[string]xdpAttached
	ipt iptables.Exec
	// udp terminates connected UDP sockets of removed backends; nil where
	// the kernel cannot (weft_ebpf_udp_socket_termination_available 0).
	udp *udpTerminator
	// tcp finds the TCP sockets translated to given backends; nil where
	// the kernel cannot (no TCP iterators).
	tcp *tcpFlowFinder
	// stopWatch ends the conntrack maps' pressure watch (started with the
	// programs).
	stopWatch chan struct{}
	// fresh: the maps the writer fills are new (none were pinned, or
	// those pinned could not be reused: lbmaps.go), not pinned yet; the
	// first sync fills them before it attaches the programs.
	fresh bool
	// adopt: the per-packet programs did not run before this backend
	// loaded them (no pinned conntrack map, or the mode was retired), so
	// the first sync adopts the connections the kernel translates.
	adopt bool
	// failed: the last apply failed, the next one is full.
	failed bool
	// synced: a sync attached the programs (start).
	synced bool
	// For the metrics: programs attached again per hook, UDP sockets
	// terminated, the last counts of the LRU maps (own lock).
	reattached map[string]int
	terminated int
	lru        lruCounts
	// lbWarned: the maps the writer fills reported nearly full.
	lbWarned map[string]bool
	// rpWarned: the VXLAN device's strict rp_filter could not be made
	// loose (dsr mode), and a warning said so.
	rpWarned bool
	// grace and ret: the grace periods between a sync and the deletion of
	// what it retired (grace.go).
	grace *graceWaiter
	ret   retirement
	// migrating: pinned flow maps of another size, replaced once the
	// programs that use the new ones are attached (flowmaps.go).
	migrating []flowMigration
}

// New checks that the kernel and the configured paths support the
// backend and returns it; the programs are loaded and attached by the
// first Sync (so that --cleanup loads nothing).
func New(cfg Config) (*Backend, error) {
	if cfg.CTMax == 0 {
		cfg.CTMax = CTMaxFor(memTotal())
	}
	if cfg.CTMax < MinCTMax || cfg.CTMax > MaxCTMax {
		return nil, fmt.Errorf("--bpf-ct-max: %d entries is outside %d..%d", cfg.CTMax, MinCTMax, MaxCTMax)
	}
	if cfg.LBMax == 0 {
		cfg.LBMax = LBMaxFor(memTotal())
	}
	if cfg.LBMax < MinLBMax || cfg.LBMax > MaxLBMax {
		return nil, fmt.Errorf("--bpf-lb-map-max: %d entries is outside %d..%d", cfg.LBMax, MinLBMax, MaxLBMax)
	}
	if err := CheckLBMode(cfg.LBMode); err != nil {
		return nil, err
	}
	if err := CheckXDPMode(cfg.XDP); err != nil {
		return nil, err
	}
	if err := Probe(cfg); err != nil {
		return nil, err
	}
	return newBackend(cfg), nil
}

// Retiring returns a backend for what the eBPF mode left pinned under
// cfg.PinPath, for another mode to retire and remove it (Retire, Drained,
// Cleanup; it must not Sync). It checks only that the pin path is on a
// bpffs: retiring needs the pins, CAP_BPF and CAP_NET_ADMIN, none of the
// eBPF mode's other mounts and capabilities, so the base DaemonSet's
// agent leaves the eBPF mode in one rollout (docs/deploy.md).
func Retiring(cfg Config) (*Backend, error) {
	if err := isFS(filepath.Dir(cfg.PinPath), unix.BPF_FS_MAGIC); err != nil {
		return nil, fmt.Errorf("--bpf-pin-path %s: not in a bpffs mount: %w", cfg.PinPath, err)
	}
	return newBackend(cfg), nil
}

func newBackend(cfg Config) *Backend {
	if len(cfg.Families) == 0 {
		cfg.Families = []int{4}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &Backend{cfg: cfg, r: NewRenderer(cfg), tc: map[tcHook]tcAttached{}, xdp: map[string]xdpAttached{}, ipt: iptables.Exec{Variant: cfg.IPTablesVariant},
		reattached: map[string]int{}, lbWarned: map[string]bool{}}
}

// Probe returns an error naming the first thing the backend needs that
// the kernel or the node lacks.
func Probe(cfg Config) error {
	if err := isFS(cfg.CgroupRoot, unix.CGROUP2_SUPER_MAGIC); err != nil {
		return fmt.Errorf("--cgroup-root %s: not a cgroup v2 directory: %w", cfg.CgroupRoot, err)
	}
	if err := isFS(filepath.Dir(cfg.PinPath), unix.BPF_FS_MAGIC); err != nil {
		return fmt.Errorf("--bpf-pin-path %s: not in a bpffs mount: %w", cfg.PinPath, err)
	}
	if err := features.HaveProgramType(ebpf.CGroupSockAddr); err != nil {
		return lacks("cgroup sock_addr programs (Linux >= 4.17)", err)
	}
	for _, h := range []struct {
		fn   asm.BuiltinFunc
		what string
	}{
		{asm.FnGetSocketCookie, "bpf_get_socket_cookie in cgroup sock_addr programs (Linux >= 5.3)"},
		{asm.FnGetNetnsCookie, "bpf_get_netns_cookie in cgroup sock_addr programs (Linux >= 5.7)"},
		{asm.FnSetRetval, "bpf_set_retval (Linux >= 5.18), to refuse connections to a Service without endpoints"},
	} {
		if err := features.HaveProgramHelper(ebpf.CGroupSockAddr, h.fn); err != nil {
			return lacks(h.what, err)
		}
	}
	return nil
}

// lacks names a missing kernel feature, or the probe that failed.
func lacks(what string, err error) error {
	if errors.Is(err, ebpf.ErrNotSupported) {
		return fmt.Errorf("ebpf mode: the kernel lacks %s: %w", what, err)
	}
	return fmt.Errorf("ebpf mode: probing the kernel for %s: %w", what, err)
}

func isFS(path string, magic int64) error {
	if path == "" {
		return errors.New("not set")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return err
	}
	if int64(st.Type) != magic {
		return fmt.Errorf("file system type %#x", st.Type)
	}
	return nil
}

// Sync makes the maps hold st's frontends; the first sync loads the
// programs (reusing pinned maps and links: a restart reads the maps back
// and swaps its programs into the links) and rewrites everything. Maps
// new to the node are filled before the programs that read them are
// attached (lbmaps.go). A state that does not fit the maps is refused
// whole (a CapacityError): nothing is written, the previous state stays.
func (b *Backend) Sync(st model.State, full bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	// What the last sync retired goes first: this sync may rewrite the
	// halves its readers used.
	if err := b.settle(); err != nil {
		b.cfg.Log.Warn("after a grace period of the eBPF programs", "err", err)
	}
	first := !b.synced
	applied := false
	var applyErr error
	if first {
		if err := b.prepare(); err != nil {
			return fmt.Errorf("starting the ebpf backend: %w", err)
		}
		if b.fresh {
			applyErr = b.writeState(st, true)
			if errors.As(applyErr, new(*CapacityError)) {
				// The programs of an earlier proxy, if any, go on
				// serving from the maps it pinned.
				b.failed = true
				return fmt.Errorf("syncing ebpf maps: %w", applyErr)
			}
			applied = true
		}
		if err := b.start(); err != nil {
			return fmt.Errorf("starting the ebpf backend: %w", err)
		}
		b.synced = true
		full = true
		// Before the per-packet programs run on a node where they did not
		// (or were retired): the connections another mode translated stay
		// with the kernel's conntrack.
		if b.adopt {
			if err := b.adoptKernelFlows(); err != nil {
				return fmt.Errorf("taking over the connections the kernel's conntrack translates: %w", err)
			}
		}
	} else if err := b.reattach(); err != nil {
		return fmt.Errorf("attaching detached programs again: %w", err)
	}
	if err := b.attachDevices(); err != nil {
		return fmt.Errorf("attaching the per-packet programs: %w", err)
	}
	if err := b.attachXDP(); err != nil {
		return fmt.Errorf("attaching the XDP program: %w", err)
	}
	if first {
		if err := b.dropStaleTC(); err != nil {
			return fmt.Errorf("removing per-packet programs from devices that no longer run one: %w", err)
		}
		if err := b.dropStaleXDP(); err != nil {
			return fmt.Errorf("removing XDP programs from devices that no longer run one: %w", err)
		}
	}
	if b.fresh {
		if err := b.pinLB(); err != nil {
			return fmt.Errorf("pinning the new service maps: %w", err)
		}
	}
	if err := b.pinFlowMaps(); err != nil {
		return fmt.Errorf("pinning the resized flow maps: %w", err)
	}
	if !applied {
		applyErr = b.writeState(st, full)
	}
	if applyErr != nil {
		b.failed = true
		return fmt.Errorf("syncing ebpf maps: %w", applyErr)
	}
	b.failed = false
	b.startGrace()
	return nil
}

// terminateUDP destroys the connected UDP sockets of backends the sync
// removed from their frontends, now that the frontends hold the new
// lists (a client opening a new socket gets one of them) and the grace
// period after it is over. Pairs whose termination failed are tried again
// after the next sync.
func (b *Backend) terminateUDP() error {
	if len(b.w.stale) == 0 {
		return nil
	}
	if b.udp == nil {
		b.w.stale = nil
		return nil
	}
	n, err := b.udp.terminate(b.w.stale)
	b.w.Stats.UDPSocketsTerminated = n
	b.terminated += n
	if err != nil {
		return fmt.Errorf("terminating connected UDP sockets of removed backends: %w", err)
	}
	b.w.stale = nil
	return nil
}

// LastStats are the map writes of the last sync.
func (b *Backend) LastStats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.w == nil {
		return Stats{}
	}
	return b.w.Stats
}

// writeState renders st and writes what changed into the maps (with full,
// every frontend is compared). After a failed apply the renderer has moved
// on while some frontends were not written: everything is compared until
// an apply succeeds.
func (b *Backend) writeState(st model.State, full bool) error {
	want, dirty := b.r.Update(st)
	err := b.w.apply(want, dirty, full || b.failed)
	b.warnLB()
	return err
}

// Prepare loads the programs and opens the maps (pinned ones are read
// back), the part of the first Sync that does not depend on the Services:
// a caller may run it while the initial lists are read, before the first
// Sync. It attaches nothing and writes no map entry the programs could
// see (slots left without a master entry by an interrupted removal
// excepted, which it deletes): the first Sync still attaches the programs,
// writes the masquerade glue and the whole cluster view. Once it has
// succeeded it does nothing more; after an error, the first Sync tries
// again (and returns the error).
func (b *Backend) Prepare() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.prepare()
}

// start is the first Sync's part before the maps are written: prepare,
// then the masquerade glue and the cgroup links.
func (b *Backend) start() error {
	if err := b.prepare(); err != nil {
		return err
	}
	// Active again after another mode retired it.
	if err := os.Remove(filepath.Join(b.cfg.PinPath, retiredMarker)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the retired mark: %w", err)
	}
	if err := installMasq(b.ipt, b.cfg.Families, b.cfg.masqMark()); err != nil {
		return err
	}
	links := make([]link.Link, 0, len(hooks))
	for _, h := range hooks {
		l, err := b.attach(h, h.prog(&b.objs.sockPrograms))
		if err != nil {
			for _, l := range links {
				_ = l.Close()
			}
			return fmt.Errorf("attaching %s to %s: %w", h.name, b.cfg.CgroupRoot, err)
		}
		links = append(links, l)
	}
	b.links = links
	watched := map[string]*ebpf.Map{}
	for name, m := range map[string]*ebpf.Map{"weft_ct": b.np.WeftCt, "weft_nat_rev": b.np.WeftNatRev} {
		if c, err := m.Clone(); err == nil {
			watched[name] = c
		}
	}
	b.stopWatch = make(chan struct{})
	go func(stop <-chan struct{}) {
		defer func() {
			for _, m := range watched {
				_ = m.Close()
			}
		}()
		b.watchPressure(watched, stop)
	}(b.stopWatch)
	return nil
}

// prepare loads the programs and the maps once.
func (b *Backend) prepare() error {
	if b.objs != nil {
		return nil
	}
	if err := os.MkdirAll(b.cfg.PinPath, 0o700); err != nil {
		return err
	}
	uplinks := b.cfg.Devices
	if len(uplinks) == 0 {
		var err error
		if uplinks, err = uplinksOf(b.cfg.NodePortIPs); err != nil {
			return fmt.Errorf("finding the uplinks (--bpf-devices): %w", err)
		}
	}
	sockSpec, err := loadSock()
	if err != nil {
		return err
	}
	npSpec, err := loadNodeport()
	if err != nil {
		return err
	}
	if b.grace == nil {
		if b.grace, err = newGraceWaiter(); err != nil {
			return err
		}
		if b.ret.wait == nil {
			b.ret.wait = b.grace.wait
		}
	}
	caps := LBCapacities(b.cfg.LBMax)
	sizeLB(sockSpec, caps)
	sizeLB(npSpec, caps)
	sizeFlowMaps(sockSpec, b.cfg.CTMax)
	sizeFlowMaps(npSpec, b.cfg.CTMax)
	lb, fresh, err := openLBMaps(b.cfg.PinPath, npSpec.Maps)
	if err != nil {
		return err
	}
	defer func() {
		for _, m := range lb {
			_ = m.Close() // the programs' collections hold their own
		}
	}()
	flowSpecs := map[string]*ebpf.MapSpec{"weft_revnat": sockSpec.Maps["weft_revnat"], "weft_affinity": sockSpec.Maps["weft_affinity"],
		"weft_ext_affinity": npSpec.Maps["weft_ext_affinity"]}
	migrating, err := openFlowMaps(b.cfg.PinPath, flowSpecs)
	if err != nil {
		return err
	}
	replacements := func(spec *ebpf.CollectionSpec) map[string]*ebpf.Map {
		out := replacementsIn(spec, lb)
		maps.Copy(out, flowReplacements(spec, migrating))
		return out
	}
	pinned := ebpf.MapOptions{PinPath: b.cfg.PinPath}
	var objs sockObjects
	if err := sockSpec.LoadAndAssign(&objs, &ebpf.CollectionOptions{Maps: pinned, MapReplacements: replacements(sockSpec)}); err != nil {
		closeMigrations(migrating)
		return fmt.Errorf("loading the socket programs: %w", err)
	}
	var np nodeportObjects
	var udp *udpTerminator
	var tcp *tcpFlowFinder
	loaded := false
	defer func() {
		if loaded {
			return
		}
		if udp != nil {
			udp.close()
		}
		if tcp != nil {
			tcp.close()
		}
		_ = objs.Close()
		_ = np.Close()
		closeMigrations(migrating)
	}()
	_, ctPinned := os.Stat(filepath.Join(b.cfg.PinPath, "weft_ct"))
	_, retired := os.Stat(filepath.Join(b.cfg.PinPath, retiredMarker))
	adopt := ctPinned != nil || retired == nil
	if err := loadPerPacket(&np, npSpec, &ebpf.CollectionOptions{Maps: pinned, MapReplacements: replacements(npSpec)}, b.cfg.masqMark(), b.cfg.CTMax); err != nil {
		return fmt.Errorf("loading the per-packet programs: %w", err)
	}
	// Without bpf_sock_destroy (Linux < 6.5) the socket programs still
	// serve; connected UDP sockets stay on a removed backend until the
	// client closes them.
	udp, udpErr := loadUDPTerminator(b.cfg.CgroupRoot, objs.WeftRevnat)
	if udpErr != nil && !errors.Is(udpErr, ebpf.ErrNotSupported) && !errors.Is(udpErr, btf.ErrNotFound) {
		return udpErr
	}
	tcp, tcpErr := loadTCPFlowFinder(b.cfg.CgroupRoot, objs.WeftRevnat)
	if tcpErr != nil && !errors.Is(tcpErr, ebpf.ErrNotSupported) && !errors.Is(tcpErr, btf.ErrNotFound) {
		return tcpErr
	}
	w := newWriter(writerMaps{services: objs.WeftServices, backends: objs.WeftBackends, members: objs.WeftAffinityMembers,
		ranges: np.WeftSrcRanges, maglev: np.WeftMaglev})
	w.lbMax = b.cfg.LBMax
	if err := w.load(); err != nil {
		return err
	}
	if err := w.dropOrphans(); err != nil {
		return err
	}
	loaded = true
	b.cfg.Log.Info("ebpf per-packet programs loaded", "uplinks", uplinks, "lbMode", b.cfg.lbMode())
	b.objs, b.np, b.w, b.uplinks, b.udp, b.tcp, b.adopt, b.fresh = &objs, &np, w, uplinks, udp, tcp, adopt, fresh
	b.migrating = migrating
	return nil
}

// loadPerPacket loads the per-packet programs of spec, which mark the
// traffic to masquerade with mark, with conntrack maps of ctMax entries
// each. Conntrack maps pinned by a version of weft whose entries differ,
// or of another size, are removed first (their flows are lost, once).
func loadPerPacket(np *nodeportObjects, spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions, mark uint32, ctMax int) error {
	if err := spec.Variables["masq_mark"].Set(mark); err != nil {
		return fmt.Errorf("setting masq_mark: %w", err)
	}
	for _, name := range []string{"weft_ct", "weft_nat_rev"} {
		spec.Maps[name].MaxEntries = uint32(ctMax)
	}
	for _, name := range []string{"weft_ct", "weft_nat_rev"} {
		path := filepath.Join(opts.Maps.PinPath, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			continue // none pinned: the load creates it
		}
		incompatible := spec.Maps[name].Compatible(m) != nil
		_ = m.Close()
		if incompatible {
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("removing %s of an earlier version: %w", name, err)
			}
		}
	}
	if err := spec.LoadAndAssign(np, opts); err != nil {
		return fmt.Errorf("with conntrack maps of %d entries (--bpf-ct-max): %w", ctMax, err)
	}
	return nil
}

// attach swaps prog into the pinned link of h, or attaches and pins a new
// link; other programs on the cgroup are left alone.
func (b *Backend) attach(h hook, prog *ebpf.Program) (link.Link, error) {
	path := filepath.Join(b.cfg.PinPath, "link_"+h.name)
	l, err := link.LoadPinnedLink(path, nil)
	if err == nil {
		if err := l.Update(prog); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("updating the pinned link: %w", err)
		}
		return l, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("loading the pinned link: %w", err)
	}
	l, err = link.AttachCgroup(link.CgroupOptions{Path: b.cfg.CgroupRoot, Attach: h.attach, Program: prog})
	if err != nil {
		return nil, err
	}
	if err := l.Pin(path); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("pinning the link: %w", err)
	}
	return l, nil
}

// Close releases the backend's programs, maps and links without removing
// anything pinned, as the process's exit would: what is pinned goes on
// serving (a later backend takes it over, or removes it).
func (b *Backend) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.release()
}

// release closes the backend's programs, maps and links and stops the
// pressure watch; what is pinned stays. b.mu is held.
func (b *Backend) release() {
	if err := b.settle(); err != nil {
		b.cfg.Log.Warn("after a grace period of the eBPF programs", "err", err)
	}
	if b.grace != nil {
		b.grace.close()
		b.grace = nil
	}
	closeMigrations(b.migrating)
	b.migrating = nil
	for _, l := range b.links {
		_ = l.Close()
	}
	b.links = nil
	for _, a := range b.tc {
		if a.link != nil {
			_ = a.link.Close()
		}
	}
	b.tc = map[tcHook]tcAttached{}
	for _, a := range b.xdp {
		if a.link != nil {
			_ = a.link.Close()
		}
	}
	b.xdp = map[string]xdpAttached{}
	if b.stopWatch != nil {
		close(b.stopWatch)
		b.stopWatch = nil
	}
	if b.udp != nil {
		b.udp.close()
		b.udp = nil
	}
	if b.tcp != nil {
		b.tcp.close()
		b.tcp = nil
	}
	if b.objs != nil {
		_ = b.objs.Close()
		_ = b.np.Close()
		b.objs, b.np, b.w = nil, nil, nil
		b.synced = false
	}
}

// Cleanup detaches weft's programs (cgroup links, tcx links, cls_bpf
// filters) and removes its pinned links and maps: what is pinned under
// the pin path by the names weft uses, nothing else.
func (b *Backend) Cleanup() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.links {
		_ = l.Unpin()
	}
	b.release()
	errs := detachHookLinks(b.cfg.PinPath)
	// Every device: weft's pinned tcx links and its cls_bpf filters
	// (other programs and filters stay, and so does a clsact qdisc).
	if err := removeTC(b.cfg.PinPath, func(int, bool) bool { return false }); err != nil {
		errs = append(errs, err)
	}
	if err := removeXDP(b.cfg.PinPath, func(string) bool { return false }); err != nil {
		errs = append(errs, err)
	}
	if err := removeMasq(b.ipt, b.cfg.Families); err != nil {
		errs = append(errs, err)
	}
	for _, name := range append(mapNames, retiredMarker) {
		if err := os.Remove(filepath.Join(b.cfg.PinPath, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cleanup: %w", err))
		}
	}
	if err := os.Remove(b.cfg.PinPath); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
		errs = append(errs, fmt.Errorf("cleanup: %w", err))
	}
	return errors.Join(errs...)
}

// detachHookLinks unpins and closes weft's pinned cgroup links under
// pinPath: with no process holding them any more, their programs detach.
func detachHookLinks(pinPath string) []error {
	var errs []error
	for _, h := range hooks {
		path := filepath.Join(pinPath, "link_"+h.name)
		l, err := link.LoadPinnedLink(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("loading %s: %w", path, err))
			continue
		}
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpinning %s: %w", path, err))
		}
		_ = l.Close() // the last reference: the program detaches
	}
	return errs
}
