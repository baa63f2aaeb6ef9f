#!/usr/bin/env bash
# Build the container runtime of the lab's nodes from Go modules: containerd,
# ctr and containerd-shim-runc-v2 at CONTAINERD_VERSION, into bin/node/, and
# the pause program of pod sandboxes (bin/node/pause: upstream's pause.c from
# the k8s.io/kubernetes module that hack/tools/go.mod pins, built static with
# the system's gcc), and the e2e suite's regression-issue-74839 server. runc comes from Debian (hack/install-deps.sh). The
# kubelet itself is built by hack/build-kube.sh with the control plane.
#
# Builds only what is missing or was built at another version; quiet on
# success apart from one line per thing built.
#
# Environment: GO (default: go), CONTAINERD_VERSION.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
BIN=$ROOT/bin
OUT=$BIN/node
GO=${GO:-go}
# The long-term support line; Kubernetes 1.36 needs containerd 2.2 or later
# (Debian bookworm's 1.6 is too old).
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.3.7}

# shellcheck source=hack/build-lib.sh
source "$ROOT/hack/build-lib.sh"
build_init node
mkdir -p "$OUT"

stamp=$OUT/.containerd-version
if [[ ! -x $OUT/containerd || ! -x $OUT/ctr || ! -x $OUT/containerd-shim-runc-v2 || $(cat "$stamp" 2>/dev/null) != "$CONTAINERD_VERSION" ]]; then
	echo "building containerd $CONTAINERD_VERSION..." >&2
	tmp=$(mktemp -d "$BIN/.node-build.XXXXXX")
	mod=github.com/containerd/containerd/v2
	# No btrfs or devmapper snapshotters (their C headers are not here);
	# overlayfs and native are what the lab uses.
	GOBIN=$tmp "$GO" install -trimpath -ldflags "-s -w -X $mod/version.Version=$CONTAINERD_VERSION" \
		-tags "no_btrfs no_devmapper no_zfs" "$mod/cmd/containerd@$CONTAINERD_VERSION" "$mod/cmd/ctr@$CONTAINERD_VERSION" >"$log" 2>&1 ||
		fail "go install containerd failed"
	GOBIN=$tmp "$GO" install -trimpath -ldflags "-s -w" -tags no_grpc "$mod/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" >"$log" 2>&1 ||
		fail "go install containerd-shim-runc-v2 failed"
	rm -f "$stamp"
	mv -f "$tmp"/* "$OUT/"
	echo "$CONTAINERD_VERSION" >"$stamp"
fi

# The invalid-conntrack-state spec's server, one more image of the e2e
# suite (make node), built with the suite's module.
if [[ ! -x $OUT/regression-issue-74839 ]]; then
	echo "building regression-issue-74839..." >&2
	"$GO" -C "$ROOT/hack/tools" build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT/regression-issue-74839" \
		k8s.io/kubernetes/test/images/regression-issue-74839 >"$log" 2>&1 || fail "go build regression-issue-74839 failed"
fi

if [[ ! -x $OUT/pause ]]; then
	echo "building pause..." >&2
	src=$("$GO" -C "$ROOT/hack/tools" mod download -json k8s.io/kubernetes 2>"$log" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p') && [[ -n $src ]] ||
		fail "cannot download the k8s.io/kubernetes module"
	version=$("$GO" -C "$ROOT/hack/tools" list -mod=readonly -m -f '{{.Version}}' k8s.io/kubernetes)
	${CC:-gcc} -Os -static -s -Wall -DVERSION="$version" -o "$OUT/.pause.tmp" "$src/build/pause/linux/pause.c" >"$log" 2>&1 ||
		fail "compiling pause.c failed"
	mv -f "$OUT/.pause.tmp" "$OUT/pause"
fi
