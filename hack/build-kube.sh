#!/usr/bin/env bash
# Build the upstream Kubernetes binaries that weft's lab and tests run --
# bin/kube-apiserver, bin/kube-controller-manager, bin/kube-scheduler,
# bin/kube-proxy, bin/kubectl, and the lab nodes' bin/kubelet and the e2e
# suite's pod program bin/agnhost -- from the Go modules pinned in
# hack/tools/go.mod.
#
# Builds only what is needed: every binary when the Kubernetes version in
# hack/tools/go.mod differs from the one recorded in bin/.kube-version, else
# only the binaries that are missing. Quiet on success apart from one line per
# binary built; on failure prints the go command's output and exits non-zero.
# Works from any directory. A cold build (empty Go build cache) takes several
# minutes on 2 cores, most of it kube-apiserver; a no-op run takes well under a
# second.
#
# Environment: GO (default: go).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
TOOLS=$ROOT/hack/tools
BIN=$ROOT/bin
STAMP=$BIN/.kube-version
GO=${GO:-go}
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl kubelet agnhost)
# The package of each binary, under k8s.io/kubernetes.
pkg_of() { [[ $1 == agnhost ]] && echo test/images/agnhost || echo "cmd/$1"; }

# shellcheck source=hack/build-lib.sh
source "$ROOT/hack/build-lib.sh"
build_init kube

# The version to build is the one go.mod selects, so bumping it there is all
# it takes to trigger a rebuild.
version=$("$GO" -C "$TOOLS" list -mod=readonly -m -f '{{.Version}}' k8s.io/kubernetes 2>"$log") ||
	fail "cannot read the k8s.io/kubernetes version from $TOOLS/go.mod"
want="k8s.io/kubernetes $version"

have=
[[ ! -f $STAMP ]] || have=$(<"$STAMP")

todo=()
for b in "${BINARIES[@]}"; do
	if [[ $have != "$want" || ! -x $BIN/$b ]]; then
		todo+=("$b")
	fi
done
((${#todo[@]})) || exit 0

kube_ldflags "$version"

pkgs=()
for b in "${todo[@]}"; do
	echo "building $b ($want)..." >&2
	pkgs+=("k8s.io/kubernetes/$(pkg_of "$b")")
done

# One go build for all of them (one package load, shared compilation), into a
# directory beside bin/ so that a failed or interrupted build leaves no partial
# binary behind and the moves below are renames.
tmp=$(mktemp -d "$BIN/.kube-build.XXXXXX")
"$GO" -C "$TOOLS" build -mod=readonly -buildvcs=false -trimpath -ldflags "$ldflags" -o "$tmp/" "${pkgs[@]}" >"$log" 2>&1 ||
	fail "go build failed"

# Drop the stamp before replacing binaries: an interrupted run then rebuilds
# everything instead of trusting a mix of versions.
rm -f "$STAMP"
for b in "${todo[@]}"; do
	mv -f "$tmp/$b" "$BIN/$b"
done
echo "$want" >"$STAMP"
