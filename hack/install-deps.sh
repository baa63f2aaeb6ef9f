#!/usr/bin/env bash
# Installs the system tools weft's tests and lab use. Idempotent and quiet:
# packages already present are not touched, apt runs only when one is missing.
set -euo pipefail

packages=(
	iproute2   # ip: namespaces, links, routes
	iptables   # the reference portmap plugin; later the iptables proxy backend
	nftables   # nft: portmap's nftables backend and the nftables proxy backend
	util-linux # unshare, flock
	etcd-server # the lab control plane's store
	ipset      # NetworkPolicy address sets
	conntrack  # conntrack CLI: inspecting flows in tests
	bind9-dnsutils # dig: DNS tests against weft-dns
	dnsperf    # DNS benchmark (make bench)
	gcc libc6-dev # the CNI plugin's static shim (make build: gcc -static)
	g++ xz-utils # iperf 2 of the lab's test images, from Debian's source tarball (hack/build-iperf.sh)
	clang llvm libbpf-dev # BPF programs: make generate, and make test's check of the committed objects
	qemu-system-x86 busybox-static cpio kmod # test/vm: Debian's kernel booted under qemu (IPVS, Debian stable's kernel)
	bird2      # the lab's top-of-rack router (weftctl lab up --racks): weft's BGP peer
	frr        # a second kind of BGP peer in the BGP tests
	runc       # the lab's real nodes: containerd's OCI runtime
)

missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: need root to install: ${missing[*]}" >&2
	exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
