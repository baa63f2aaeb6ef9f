#!/usr/bin/env bash
# Build the network-policy-api conformance suite -- bin/npapi-conformance.test
# -- at the sigs.k8s.io/network-policy-api version hack/npapi/go.mod pins (its
# conformance_test.go is the driver; the tests, base manifests and probes
# are the module's). The binary embeds its manifests: it runs with a
# kubeconfig alone.
#
# Builds only when missing or when the pinned version or the driver changed.
#
# Environment: GO (default: go).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
MOD=$ROOT/hack/npapi
BIN=$ROOT/bin
STAMP=$BIN/.npapi-version
GO=${GO:-go}

# shellcheck source=hack/build-lib.sh
source "$ROOT/hack/build-lib.sh"
build_init npapi

version=$("$GO" -C "$MOD" list -mod=readonly -m -f '{{.Version}}' sigs.k8s.io/network-policy-api 2>"$log") ||
	fail "cannot read the sigs.k8s.io/network-policy-api version from $MOD/go.mod"
want="sigs.k8s.io/network-policy-api $version $(cat "$MOD"/go.mod "$MOD"/*.go | sha256sum | cut -c1-16)"
if [[ -x $BIN/npapi-conformance.test && -f $STAMP && $(<"$STAMP") == "$want" ]]; then
	exit 0
fi

echo "building npapi-conformance.test (sigs.k8s.io/network-policy-api $version)..." >&2
tmp=$(mktemp -d "$BIN/.npapi-build.XXXXXX")
"$GO" -C "$MOD" test -c -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/npapi-conformance.test" . >"$log" 2>&1 ||
	fail "go test -c $MOD failed"
rm -f "$STAMP"
mv -f "$tmp/npapi-conformance.test" "$BIN/"
echo "$want" >"$STAMP"
