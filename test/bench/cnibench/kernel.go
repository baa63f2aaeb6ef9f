package main

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// kernelCosts measures, interleaved, what the ways of taking a pod's veth
// out of its namespace cost the caller, against the start of a plugin
// process (docs/cni.md): deleting the pair, moving the pod side to a fresh
// namespace, only setting the host side down, the delay until the pod
// namespace hears RTM_DELLINK, and `weft` answering VERSION.
func kernelCosts(bin string, rounds int) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "bprobe", TxQLen: -1, Flags: unix.IFF_UP}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("bridge bprobe: %w", err)
	}
	defer func() { _ = netlink.LinkDel(br) }()
	ops := []struct {
		name string
		fn   func(pod netns.NsHandle, host netlink.Link) (time.Duration, error)
	}{
		{"delete the pair (RTM_DELLINK)", func(_ netns.NsHandle, host netlink.Link) (time.Duration, error) {
			return timed(func() error { return netlink.LinkDel(host) })
		}},
		{"move the pod side to a new netns", func(pod netns.NsHandle, _ netlink.Link) (time.Duration, error) {
			return timed(func() error { return moveToFreshNS(pod) })
		}},
		{"set the host side down", func(_ netns.NsHandle, host netlink.Link) (time.Duration, error) {
			return timed(func() error { return netlink.LinkSetDown(host) })
		}},
		{"pod netns hears RTM_DELLINK", delNotification},
		{"exec weft VERSION", func(netns.NsHandle, netlink.Link) (time.Duration, error) {
			cmd := exec.Command(filepath.Join(bin, "weft"))
			cmd.Env = []string{"CNI_COMMAND=VERSION"}
			cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
			return timed(cmd.Run)
		}},
	}
	res := make([][]time.Duration, len(ops))
	for r := range rounds {
		for i, op := range ops {
			pod, host, err := probePair(br, fmt.Sprintf("probe%d", r*len(ops)+i))
			if err != nil {
				return err
			}
			d, err := op.fn(pod, host)
			_ = netlink.LinkDel(host)
			pod.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", op.name, err)
			}
			res[i] = append(res[i], d)
		}
	}
	fmt.Printf("\nkernel costs seen by the caller, %d interleaved rounds (median, p90)\n", rounds)
	for i, op := range ops {
		slices.Sort(res[i])
		fmt.Printf("%-34s %10s %10s\n", op.name, round(res[i][len(res[i])/2]), round(res[i][len(res[i])*9/10]))
	}
	return nil
}

func timed(fn func() error) (time.Duration, error) {
	start := time.Now()
	err := fn()
	return time.Since(start), err
}

// probePair makes a pod namespace (anonymous) and a veth pair like ADD's:
// host side up on br, pod side "eth0" inside.
func probePair(br *netlink.Bridge, name string) (netns.NsHandle, netlink.Link, error) {
	pod, err := newAnonNS()
	if err != nil {
		return 0, nil, err
	}
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MasterIndex: br.Index, TxQLen: -1, Flags: unix.IFF_UP},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(int(pod)), PeerTxQLen: -1}
	if err := netlink.LinkAdd(v); err != nil {
		pod.Close()
		return 0, nil, fmt.Errorf("veth %s: %w", name, err)
	}
	host, err := netlink.LinkByName(name)
	if err != nil {
		pod.Close()
		return 0, nil, err
	}
	return pod, host, nil
}

// newAnonNS returns a new network namespace, held only by the handle.
func newAnonNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return 0, err
	}
	defer orig.Close()
	h, err := netns.New()
	if err != nil {
		return 0, err
	}
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("restoring the thread's namespace: %v", err)) // the thread must not run on elsewhere
	}
	return h, nil
}

func moveToFreshNS(pod netns.NsHandle) error {
	to, err := newAnonNS()
	if err != nil {
		return err
	}
	defer to.Close()
	h, err := netlink.NewHandleAt(pod, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	return h.LinkSetNsFd(link, int(to))
}

// delNotification times from sending the deletion of the pair to the pod
// namespace receiving RTM_DELLINK for its side (what DEL waits for).
func delNotification(pod netns.NsHandle, host netlink.Link) (time.Duration, error) {
	updates := make(chan netlink.LinkUpdate, 16)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{Namespace: &pod}); err != nil {
		return 0, err
	}
	start := time.Now()
	heard := make(chan time.Duration, 1)
	go func() {
		for u := range updates {
			if u.Header.Type == unix.RTM_DELLINK {
				heard <- time.Since(start)
				return
			}
		}
	}()
	if err := netlink.LinkDel(host); err != nil {
		return 0, err
	}
	select {
	case d := <-heard:
		return d, nil
	case <-time.After(10 * time.Second):
		return 0, errors.New("no RTM_DELLINK within 10s")
	}
}
