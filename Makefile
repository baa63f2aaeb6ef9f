# weft: build, test and benchmark. Run as root for the kernel and lab tests.
GO        ?= go
BIN       := $(CURDIR)/bin
CNI_BIN   := $(BIN)/cni
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X github.com/weftnet/weft/internal/buildinfo.Version=$(VERSION)
# Reference plugins, built at the version go.mod pins: chained in tests, peers in benchmarks.
REF_PLUGINS := \
	github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/ipam/host-local \
	github.com/containernetworking/plugins/plugins/main/loopback \
	github.com/containernetworking/plugins/plugins/meta/portmap \
	github.com/containernetworking/plugins/plugins/meta/bandwidth

export WEFT_CNI_PATH := $(CNI_BIN)
# Static binaries: the CNI plugin is copied onto hosts whose libc we do not
# know, and a static Go binary starts ~0.6 ms faster (no dynamic loader).
export CGO_ENABLED := 0

.PHONY: all deps build kube node e2e npapi coredns lab lab-down test test-unit vm bench conformance conformance-policy lint clean generate bpf-check image

all: build

deps:
	@bash hack/install-deps.sh

# The CNI plugin is two files: bin/cni/weft, what runtimes execute, a static
# C program without the Go runtime that hands each command to the node's
# resident plugin server, and bin/cni/weft-plugin, the Go plugin, which the
# shim executes when no current server runs (see docs/cni.md). Both are
# replaced, not rewritten: the node's plugin server and reaper (weft-plugin
# serve-cni and reap-veth, up to 30 s idle) may still be running the old
# one, and a new inode is how the shim tells a server is stale.
SHIM_CC ?= gcc
build:
	@mkdir -p $(CNI_BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...
	@cp --remove-destination $(BIN)/weft-cni $(CNI_BIN)/weft-plugin
	$(SHIM_CC) -static -Os -s -Wall -Wextra -Werror -o $(CNI_BIN)/.weft.tmp cmd/weft-cni/shim/weft.c
	@mv -f $(CNI_BIN)/.weft.tmp $(CNI_BIN)/weft
	$(GO) build -trimpath -ldflags '-s -w' -o $(CNI_BIN)/ $(REF_PLUGINS)
	@mkdir -p $(BIN)/crds
	@install -m 0644 "$$($(GO) mod download -json sigs.k8s.io/network-policy-api | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')/$(CNP_CRD)" $(BIN)/crds/

# ClusterNetworkPolicy's CRD as network-policy-api publishes it (the
# version go.mod pins; the experimental channel, which has the nodes and
# networks peers and named ports weft enforces): make build copies it to
# bin/crds/, which the lab applies before deploy/ (docs/deploy.md).
CNP_CRD := config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml

# Upstream control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, kubectl) from hack/tools/go.mod; only rebuilt
# when missing or bumped.
kube:
	@bash hack/build-kube.sh

# The lab's real nodes: containerd, its shim, ctr and pause (bin/node/,
# hack/build-node.sh; the kubelet comes with `make kube`, runc from
# Debian), and the images they import, there being no registry: pause, the
# e2e suite's (agnhost and the images it stands for) and the lab workload's
# (bin/images/). agnhost's iperf is iperf 2.2 built from Debian's source
# (hack/build-iperf.sh), and its /coredns bin/coredns where that exists
# (make coredns; make conformance builds it first).
PORTER_CERTS = $(shell $(GO) -C hack/tools mod download -json k8s.io/kubernetes 2>/dev/null | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')/test/images/agnhost/porter
node: build kube
	@bash hack/build-node.sh
	@bash hack/build-iperf.sh
	$(GO) run ./hack/mkimage -test-images $(BIN)/images -pause $(BIN)/node/pause -agnhost $(BIN)/agnhost \
		-porter-certs $(PORTER_CERTS) -workload $(BIN)/weft-workload -regression-74839 $(BIN)/node/regression-issue-74839 \
		-iperf $(BIN)/node/iperf $$(test ! -x $(BIN)/coredns || echo -coredns $(BIN)/coredns)

# The upstream e2e suite: bin/e2e.test and bin/ginkgo (hack/build-e2e.sh).
e2e:
	@bash hack/build-e2e.sh

npapi:
	@bash hack/build-npapi.sh

# CoreDNS (hack/coredns/go.mod), the DNS benchmark's peer and agnhost's
# /coredns; only rebuilt when missing or bumped. Only bench and conformance
# need it (a cold build takes about 3 minutes on 2 cores, so make test,
# whose specs do not run it, does not build it).
coredns:
	@bash hack/build-coredns.sh

# The main job: a 3-node cluster of network namespaces (see docs/lab.md).
LAB_FLAGS ?= --nodes 3 --routing hostgw
lab: deps build kube image node
	$(BIN)/weftctl lab up $(LAB_FLAGS)

lab-down:
	$(BIN)/weftctl lab down

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	@# go.mod and go.sum as go mod tidy leaves them: a module imported
	@# directly is not marked indirect, and no sum is missing or stale.
	@$(GO) mod tidy -diff >/dev/null || { $(GO) mod tidy -diff; echo "go.mod/go.sum not tidy: run go mod tidy"; exit 1; }

# The BPF programs: bpf2go builds proxy/ebpf/bpf/*.c with Debian's clang
# into Go and objects, which are committed (building weft needs no clang).
generate:
	$(GO) generate ./proxy/ebpf/

# The committed BPF objects must be what their sources build to: rebuild
# them elsewhere and compare the bytes.
bpf-check:
	@out=$$(mktemp -d) && trap 'rm -rf "$$out"' EXIT && \
	BPF_OUT=$$out $(GO) generate ./proxy/ebpf/ && \
	for f in $$(cd proxy/ebpf && ls *_bpfel.o *_bpfel.go); do \
		cmp -s "$$out/$$f" proxy/ebpf/$$f || { echo "proxy/ebpf/$$f does not match its source: run make generate"; exit 1; }; \
	done

# weft's container image as an OCI archive, built without a container
# engine: Debian's iptables/ipset/nftables/conntrack plus bin/ (see
# docs/deploy.md; the Dockerfile builds the same for engines).
image: build
	$(GO) run ./hack/mkimage -bin $(BIN) -out $(BIN)/weft-image.oci.tar -version $(VERSION)

# Everything: pure, kernel (private network namespaces), image and lab
# tests, then the upstream suite's [sig-network] [Conformance] specs on a
# real-node lab in one proxy mode (CI_CONFORMANCE_MODE; make conformance
# runs more). The lab tests (test/e2e) and the VM suites (test/vm) take
# the machine's lab turn one after the other (lab.WaitTurn queues them),
# so one package may wait for the other's whole run: hence the timeout.
CI_CONFORMANCE_MODE ?= iptables
test: deps build kube lint bpf-check image node e2e
	CGO_ENABLED=1 $(GO) test -count=1 -race -timeout 80m ./...
	$(GO) run ./test/conformance -conformance-only -modes $(CI_CONFORMANCE_MODE) -out $(BIN)/conformance-ci

# The kernel suites that need another kernel (IPVS; Debian stable's 6.1),
# run inside a qemu VM booting Debian's kernel (test/vm; make test runs it too).
vm: deps build
	CGO_ENABLED=1 $(GO) test -count=1 -v -timeout 45m -run TestVM ./test/vm

# Pure tests only: no root, no kernel.
test-unit:
	$(GO) test -count=1 -short ./...

# CNI ADD+DEL against bridge+host-local; the service proxy against upstream
# kube-proxy (iptables and nftables modes). PROXY_BENCH_FLAGS picks sizes
# (-conn: the data path too).
PROXY_BENCH_FLAGS ?= -services 1000,5000 -conn
# weft-dns against CoreDNS (kubernetes plugin, cache 30); DNS_BENCH_FLAGS picks sizes.
DNS_BENCH_FLAGS ?= -services 10000
bench: deps build kube image node coredns
	$(GO) run ./test/bench/cnibench -plugins $(CNI_BIN)
	# The lab: a 3-node lab up, and pod start latency on its real nodes (a 30-replica Deployment to all Ready).
	$(GO) run ./test/bench/podstartbench
	$(GO) run ./test/bench/proxybench $(PROXY_BENCH_FLAGS)
	$(GO) run ./test/bench/pktbench
	$(GO) run ./test/bench/dnsbench $(DNS_BENCH_FLAGS)
	$(GO) run ./test/bench/policybench
	# BGP: 100 nodes through two route reflectors: podCIDR install and node deletion across all nodes, speaker peak RSS at 100 and 1,000 routes.
	$(GO) test -run '^$$' -bench BenchmarkConvergence -benchtime=1x -timeout 20m ./routing/bgp
	# The topology exporter: API writes per minute at 100 pod starts/stops per minute, time from a freed address to the taint lifted.
	CGO_ENABLED=1 $(GO) test -run '^$$' -bench TopologyExporter -benchtime=1x ./agent
	# eBPF conntrack under a storm: a million short connections from outside through a NodePort, on maps of the default size; the connection rate with the maps empty and through the storm, a long-lived connection alive after it.
	WEFT_EBPF_STORM=1000000 $(GO) test -run 'TestConnectionStorm$$' -count=1 -v -timeout 30m ./proxy/ebpf
	# eBPF maps at 10k and 100k Services (2 ports, 10 endpoints each): the time of the first sync and the kernel memory of each map (weft_ebpf_map_memory_bytes), the last Service answering.
	for n in 10000 100000; do WEFT_EBPF_SERVICES=$$n $(GO) test -run 'TestManyServices$$' -count=1 -v -timeout 20m ./proxy/ebpf || exit 1; done
	# The userspace proxy: connections per second and throughput through it (redirected and rootless) and through the nftables backend, each against a direct dial in the same run.
	$(GO) test -run '^$$' -bench DataPath -benchtime 3s ./proxy/userspace
	# ClusterIP connection rate from the node through the nftables backend at 1k and 100k Services (2 ports x 10 endpoints each), the sizes interleaved in short rounds: the rates and the ratio 100k/1k (issue 27: >= 0.95).
	$(GO) test -run '^$$' -bench ClusterIPConnRate -benchtime 30s -timeout 20m ./proxy/nftables
	# The same through the eBPF backend's socket programs (connect-time translation, each size on its own cgroup).
	$(GO) test -run '^$$' -bench ClusterIPConnRate -benchtime 30s -timeout 20m ./proxy/ebpf
	# Encryption between nodes: pod-to-pod TCP throughput (64 MiB per op) and connection rate across two nodes over plain host-gw, plain VXLAN and WireGuard (userspace; the kernel's where the kernel has it), each against host-gw in the same ops.
	$(GO) test -run '^$$' -bench PodToPod -benchtime 20x ./routing/wireguard
	# The same with the kernel's WireGuard, in the VM on Debian's kernel (emulated: the ratios only).
	WEFT_VM_SUITES=wireguard-bench CGO_ENABLED=1 $(GO) test -count=1 -v -timeout 30m -run TestVM ./test/vm

# The upstream [sig-network] e2e specs against a lab of real nodes, once
# per proxy mode (CONFORMANCE_MODES; docs/conformance.md): JUnit and a
# summary table under bin/conformance/.
CONFORMANCE_FLAGS ?=
conformance: deps build kube image coredns node e2e
	$(GO) run ./test/conformance $(CONFORMANCE_FLAGS)

# The network-policy-api conformance suite (ClusterNetworkPolicy) against a
# lab per policy backend (iptables, nftables; docs/conformance.md): a
# summary under bin/conformance-policy/.
conformance-policy: deps build kube image node npapi
	$(GO) run ./test/conformance -suite network-policy-api $(CONFORMANCE_FLAGS)

clean:
	rm -rf $(BIN)
