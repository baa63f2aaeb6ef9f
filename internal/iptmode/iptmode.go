// Package iptmode lets weft's image use the iptables variant the node uses.
// A node's rules live either in the legacy xtables tables or in nf_tables,
// depending on which iptables its kubelet and other tools run; rules that
// weft wrote to the other one would be evaluated too, but apart from the
// node's own, in an order nobody chose. So in the image every iptables name
// is a link to weftctl, which at its first call looks at both variants,
// picks the node's, points every name at that variant's binary, and runs
// it; later calls go straight to the chosen binary.
package iptmode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Names are the iptables commands weft runs, all in SbinDir.
var Names = []string{
	"iptables", "iptables-save", "iptables-restore",
	"ip6tables", "ip6tables-save", "ip6tables-restore",
}

// SbinDir holds Names and the two variants' multi-call binaries.
const SbinDir = "/usr/sbin"

// Mode is an iptables variant.
type Mode string

// The variants, named as their multi-call binaries are
// (xtables-legacy-multi, xtables-nft-multi).
const (
	Legacy Mode = "legacy"
	NFT    Mode = "nft"
)

// Binary is the variant's multi-call binary, which runs as the command its
// argv[0] names.
func (m Mode) Binary() string { return "xtables-" + string(m) + "-multi" }

// hints are the chains kubelet (and kube-proxy) create in the variant the
// node uses, precisely so that tools in containers can tell.
var hints = []string{"KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// Choose picks the node's variant from the output of each variant's
// iptables-save and ip6tables-save: the one holding kubelet's hint chains,
// else the one with more rules, else nf_tables (what current distributions
// use).
func Choose(legacy, nft string) Mode {
	hinted := func(s string) bool {
		for _, h := range hints {
			if strings.Contains(s, ":"+h+" ") {
				return true
			}
		}
		return false
	}
	switch {
	case hinted(nft):
		return NFT
	case hinted(legacy):
		return Legacy
	case rules(legacy) > rules(nft):
		return Legacy
	default:
		return NFT
	}
}

func rules(save string) int {
	n := 0
	for _, line := range strings.Split(save, "\n") {
		if strings.HasPrefix(line, "-A ") {
			n++
		}
	}
	return n
}

// Detect runs both variants' save commands from sbin and chooses.
func Detect(sbin string) Mode {
	save := func(m Mode) string {
		var out strings.Builder
		for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
			// A variant the kernel cannot serve fails: it holds no rules.
			c := exec.Command(filepath.Join(sbin, m.Binary()))
			c.Args = []string{cmd}
			b, _ := c.Output()
			out.Write(b)
		}
		return out.String()
	}
	return Choose(save(Legacy), save(NFT))
}

// Link points every name in sbin at mode's binary, each by an atomic
// rename, so that a concurrent call runs either the wrapper or the chosen
// variant.
func Link(sbin string, mode Mode) error {
	for _, name := range Names {
		tmp := filepath.Join(sbin, "."+name+".weft-link")
		_ = os.Remove(tmp)
		if err := os.Symlink(mode.Binary(), tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(sbin, name)); err != nil {
			os.Remove(tmp)
			return err
		}
	}
	return nil
}

// IsName reports whether argv0 calls one of Names.
func IsName(argv0 string) bool {
	base := filepath.Base(argv0)
	for _, n := range Names {
		if base == n {
			return true
		}
	}
	return false
}

// Wrap is the wrapper's whole job: detect, relink (a read-only root
// filesystem only costs the detection on every call), and run the chosen
// variant as argv[0] with the same arguments. It returns only on error.
func Wrap(argv []string) error {
	mode := Detect(SbinDir)
	if err := Link(SbinDir, mode); err != nil && !errors.Is(err, syscall.EROFS) {
		fmt.Fprintf(os.Stderr, "weft iptables wrapper: pointing %s at %s: %v\n", strings.Join(Names, ", "), mode.Binary(), err)
	}
	bin := filepath.Join(SbinDir, mode.Binary())
	args := append([]string{filepath.Base(argv[0])}, argv[1:]...)
	return syscall.Exec(bin, args, os.Environ())
}
