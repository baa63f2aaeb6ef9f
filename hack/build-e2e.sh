#!/usr/bin/env bash
# Build the upstream Kubernetes e2e suite -- bin/e2e.test and bin/ginkgo --
# at the k8s.io/kubernetes version hack/tools/go.mod pins (its e2e.go keeps
# the suite's test-only dependencies in that module). e2e.test embeds its
# manifests and fixtures: it runs with a kubeconfig alone.
#
# Builds only when missing or when the pinned version changed. A cold build
# takes several minutes on 2 cores.
#
# Environment: GO (default: go).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
TOOLS=$ROOT/hack/tools
BIN=$ROOT/bin
STAMP=$BIN/.e2e-version
GO=${GO:-go}

# shellcheck source=hack/build-lib.sh
source "$ROOT/hack/build-lib.sh"
build_init e2e

version=$("$GO" -C "$TOOLS" list -mod=readonly -m -f '{{.Version}}' k8s.io/kubernetes 2>"$log") ||
	fail "cannot read the k8s.io/kubernetes version from $TOOLS/go.mod"
want="k8s.io/kubernetes $version"
if [[ -x $BIN/e2e.test && -x $BIN/ginkgo && -f $STAMP && $(<"$STAMP") == "$want" ]]; then
	exit 0
fi

# The version the suite reports, stamped as the other Kubernetes binaries.
kube_ldflags "$version"

echo "building e2e.test and ginkgo ($want)..." >&2
tmp=$(mktemp -d "$BIN/.e2e-build.XXXXXX")
"$GO" -C "$TOOLS" test -c -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e >"$log" 2>&1 ||
	fail "go test -c k8s.io/kubernetes/test/e2e failed"
"$GO" -C "$TOOLS" build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/ginkgo" github.com/onsi/ginkgo/v2/ginkgo >"$log" 2>&1 ||
	fail "go build ginkgo failed"
rm -f "$STAMP"
mv -f "$tmp/e2e.test" "$tmp/ginkgo" "$BIN/"
echo "$want" >"$STAMP"
