#!/usr/bin/env bash
# Build bin/coredns, the peer test/bench/dnsbench measures weft-dns against,
# from the CoreDNS version pinned in hack/coredns/go.mod.
#
# Builds only when bin/coredns is missing or the version in hack/coredns/go.mod
# differs from the one recorded in bin/.coredns-version. Quiet on success
# apart from one line when it builds; on failure prints the go command's
# output and exits non-zero. A cold build takes a few minutes on 2 cores; a
# no-op run well under a second. Only `make bench` runs it.
#
# Environment: GO (default: go).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
MOD=$ROOT/hack/coredns
BIN=$ROOT/bin
STAMP=$BIN/.coredns-version
GO=${GO:-go}

# shellcheck source=hack/build-lib.sh
source "$ROOT/hack/build-lib.sh"
build_init coredns

version=$("$GO" -C "$MOD" list -mod=readonly -m -f '{{.Version}}' github.com/coredns/coredns 2>"$log") ||
	fail "cannot read the github.com/coredns/coredns version from $MOD/go.mod"
want="github.com/coredns/coredns $version"
have=
[[ ! -f $STAMP ]] || have=$(<"$STAMP")
[[ $have != "$want" || ! -x $BIN/coredns ]] || exit 0

echo "building coredns ($want)..." >&2
# Into a directory beside bin/: an interrupted build leaves no partial binary.
tmp=$(mktemp -d "$BIN/.coredns-build.XXXXXX")
"$GO" -C "$MOD" build -mod=readonly -buildvcs=false -trimpath -ldflags "-s -w" -o "$tmp/coredns" github.com/coredns/coredns >"$log" 2>&1 ||
	fail "go build failed"
rm -f "$STAMP"
mv -f "$tmp/coredns" "$BIN/coredns"
echo "$want" >"$STAMP"
