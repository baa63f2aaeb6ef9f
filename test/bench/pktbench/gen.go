package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/weftnet/weft/internal/netnsutil"
)

// The generator is this program again (roleEnv=gen), started in the
// generator's namespace: one locked thread writes pre-built frames to a
// packet socket on the uplink toward the node (PACKET_QDISC_BYPASS: no
// qdisc, no routing; the frames carry the node's MAC address), sendmmsg
// batches of genSpec.Batch, cycling over one frame per flow (the flows
// differ in their UDP source port), until genSpec.Duration has passed.
// It prints one JSON line: packets sent, the loop's duration and the
// thread's CPU time over the loop (its schedstat run time: everything the
// kernel did in the thread, including the node's receive processing that
// veth runs in the sender's softirq).
const roleEnv = "PKTBENCH_ROLE"

type genSpec struct {
	Dev    string     `json:"dev"`
	DstMAC string     `json:"dstMAC"`
	SrcMAC string     `json:"srcMAC"`
	Src    netip.Addr `json:"src"`
	Dst    netip.Addr `json:"dst"`
	// Dsts, when set, replaces Dst: flow i goes to Dsts[i % len(Dsts)]
	// (the routing reference sends to the pods themselves).
	Dsts     []netip.Addr  `json:"dsts,omitempty"`
	Dport    uint16        `json:"dport"`
	SportMin uint16        `json:"sportMin"`
	Flows    int           `json:"flows"`
	Size     int           `json:"size"`
	Batch    int           `json:"batch"`
	Duration time.Duration `json:"duration"`
	Nonce    uint64        `json:"nonce"`
}

type genResult struct {
	Sent    int64         `json:"sent"`
	Elapsed time.Duration `json:"elapsed"`
	CPU     time.Duration `json:"cpu"`
	Errors  int64         `json:"errors"` // sendmmsg calls that failed (ENOBUFS...)
}

// frames builds the spec's frames, one per flow.
func (s genSpec) frames() ([][]byte, error) {
	dst, err := net.ParseMAC(s.DstMAC)
	if err != nil {
		return nil, err
	}
	src, err := net.ParseMAC(s.SrcMAC)
	if err != nil {
		return nil, err
	}
	if s.Flows < 1 || int(s.SportMin)+s.Flows > 65536 {
		return nil, fmt.Errorf("%d flows from source port %d", s.Flows, s.SportMin)
	}
	out := make([][]byte, s.Flows)
	for i := range out {
		to := s.Dst
		if len(s.Dsts) > 0 {
			to = s.Dsts[i%len(s.Dsts)]
		}
		f := flowFrame{dstMAC: dst, srcMAC: src, src: s.Src, dst: to, sport: s.SportMin + uint16(i), dport: s.Dport, size: s.Size, nonce: s.Nonce}
		if out[i], err = f.build(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// runGen starts the generator in the namespace at ns and waits for it.
func runGen(ns string, spec genSpec) (genResult, error) {
	self, err := os.Executable()
	if err != nil {
		return genResult{}, err
	}
	js, _ := json.Marshal(spec)
	cmd := exec.Command(self)
	cmd.Env = []string{roleEnv + "=gen", "PKTBENCH_SPEC=" + string(js), "GODEBUG=asyncpreemptoff=1", "GOMAXPROCS=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := netnsutil.Do(ns, cmd.Start); err != nil {
		return genResult{}, fmt.Errorf("starting the generator: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return genResult{}, fmt.Errorf("generator: %w: %s", err, strings.TrimSpace(errb.String()))
	}
	var r genResult
	if err := json.Unmarshal([]byte(out.String()), &r); err != nil {
		return r, fmt.Errorf("generator printed %q: %w", out.String(), err)
	}
	return r, nil
}

// mmsghdr is struct mmsghdr of sendmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

func genMain() int {
	runtime.LockOSThread()
	var spec genSpec
	if err := json.Unmarshal([]byte(os.Getenv("PKTBENCH_SPEC")), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "spec:", err)
		return 2
	}
	r, err := generate(spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	js, _ := json.Marshal(r)
	fmt.Println(string(js))
	return 0
}

func generate(spec genSpec) (genResult, error) {
	frames, err := spec.frames()
	if err != nil {
		return genResult{}, err
	}
	ifi, err := net.InterfaceByName(spec.Dev)
	if err != nil {
		return genResult{}, err
	}
	// Protocol 0: the socket sends only, it receives nothing.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return genResult{}, fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_QDISC_BYPASS, 1); err != nil {
		return genResult{}, fmt.Errorf("PACKET_QDISC_BYPASS: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
	sa := unix.RawSockaddrLinklayer{Family: unix.AF_PACKET, Protocol: htons(unix.ETH_P_IP), Ifindex: int32(ifi.Index), Halen: 6}
	copy(sa.Addr[:], frames[0][0:6])
	iovs := make([]unix.Iovec, len(frames))
	msgs := make([]mmsghdr, len(frames))
	for i, f := range frames {
		iovs[i].Base = &f[0]
		iovs[i].SetLen(len(f))
		msgs[i].hdr.Name = (*byte)(unsafe.Pointer(&sa))
		msgs[i].hdr.Namelen = uint32(unsafe.Sizeof(sa))
		msgs[i].hdr.Iov = &iovs[i]
		msgs[i].hdr.SetIovlen(1)
	}
	batch := max(1, min(spec.Batch, len(msgs)))
	var r genResult
	cpu0, err := threadRunTime()
	if err != nil {
		return r, err
	}
	start := time.Now()
	deadline := start.Add(spec.Duration)
	off := 0
	for time.Now().Before(deadline) {
		n := min(batch, len(msgs)-off)
		sent, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[off])), uintptr(n), 0, 0, 0)
		if errno != 0 {
			if errno != unix.ENOBUFS && errno != unix.EAGAIN && errno != unix.EINTR {
				return r, fmt.Errorf("sendmmsg: %w", errno)
			}
			r.Errors++
			continue
		}
		r.Sent += int64(sent)
		off = (off + int(sent)) % len(msgs)
	}
	r.Elapsed = time.Since(start)
	cpu1, err := threadRunTime()
	r.CPU = cpu1 - cpu0
	runtime.KeepAlive(frames)
	runtime.KeepAlive(iovs)
	runtime.KeepAlive(&sa)
	return r, err
}

// threadRunTime is the calling thread's run time on a CPU (schedstat:
// the scheduler's nanoseconds, not ticks).
func threadRunTime() (time.Duration, error) {
	return schedstat("/proc/thread-self/schedstat")
}

func schedstat(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, fmt.Errorf("%s: %q", path, b)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns), err
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
