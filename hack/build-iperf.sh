#!/usr/bin/env bash
# Build bin/node/iperf, the iperf 2 of the lab's agnhost image
# (internal/image.BuildTestImages), from the source Debian ships as
# IPERF_ORIG: iperf 2.2.1, Debian trixie's (Debian 13's) version.
#
# Why not Debian bookworm's package, as the image's other tools: the e2e
# spec "Networking IPerf2 should run iperf2" runs
# `iperf -e -p 6789 --reportstyle C -i 1 -c iperf2-server`, skips the first
# line of its output and wants 17 comma-separated fields on every other one:
# what iperf 2.2.0 and later print (a header line, then time, addresses and
# ports, transfer id, interval start and end, bytes, speed and the enhanced
# write and TCP fields). bookworm's 2.1.8 prints no header and 9 fields
# (the interval as one "0.0-1.0" field), and has no option that prints
# more. trixie's binary package needs trixie's libc (>= 2.38); the image's
# root filesystem is bookworm's, so this builds the same source here,
# against bookworm's libraries (libstdc++6, which BuildTestImages installs).
#
# The source is Debian's upstream tarball of the package (iperf_*.orig,
# repacked +dfsg without the Windows service code, src/service.c and
# include/service.h), fetched with apt's own downloader from the mirror
# this machine's apt uses for Debian, and checked against the SHA-256 in
# Debian's Sources index. The Debian part of trixie's source package
# (.debian.tar.xz) is not served by the mirror here; the build does what
# bookworm's (2.1.8's) does to the same repack: service.c left out of the
# program (its 013-delete-service.patch), configure --enable-fastsampling
# (its debian/rules). Its other patches touch the manual page, spelling
# and configure's -g.
#
# Builds only when bin/node/iperf is missing or was built from another
# tarball or by another version of this script (bin/node/.iperf-source).
# Quiet on success apart from one line when it builds (about 15 s on 2
# cores, more on a busy machine); a no-op run well under a second.
#
# Environment: CC, CXX (default: gcc, g++).
set -euo pipefail

# To bump: a version Debian's archive holds (apt-cache showsrc iperf, with
# a deb-src line of a suite that has it) and that tarball's SHA-256 from
# its Checksums-Sha256.
IPERF_ORIG=iperf_2.2.1+dfsg.orig.tar.xz
IPERF_SHA256=9cbbcb3c8489913871ad1855199a6c03e5d402837c9210b7baf7997aa064cd2c

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
BIN=$ROOT/bin
OUT=$BIN/node
CACHE=$BIN/.debs
STAMP=$OUT/.iperf-source

# shellcheck source=hack/build-lib.sh
source "$ROOT/hack/build-lib.sh"
build_init iperf
mkdir -p "$OUT" "$CACHE"

# The tarball and this script: a change to how it builds rebuilds too.
want="$IPERF_ORIG sha256:$IPERF_SHA256 build-iperf.sh sha256:$(sha256sum <"${BASH_SOURCE[0]}" | cut -d' ' -f1)"
[[ $(cat "$STAMP" 2>/dev/null) != "$want" || ! -x $OUT/iperf ]] || exit 0
echo "building iperf (${IPERF_ORIG%.orig.tar.*})..." >&2

# The Debian mirror apt uses here (its bookworm entry; the pool is shared by
# all suites). A machine that never ran apt-get update lists none yet.
mirror() {
	apt-get indextargets --format '$(REPO_URI)' 'Label: Debian' 'Identifier: Packages' 2>/dev/null | head -n 1
}
uri=$(mirror)
if [[ -z $uri ]]; then
	apt-get update -qq >"$log" 2>&1 || fail "apt-get update failed"
	uri=$(mirror)
fi
[[ -n $uri ]] || fail "apt lists no Debian repository (apt-get indextargets)"

src=$CACHE/$IPERF_ORIG
if ! echo "$IPERF_SHA256  $src" | sha256sum --quiet -c - >/dev/null 2>&1; then
	pkg=${IPERF_ORIG%%_*}
	/usr/lib/apt/apt-helper -o APT::Sandbox::User=root download-file "${uri%/}/pool/main/${pkg:0:1}/$pkg/$IPERF_ORIG" "$src" "SHA256:$IPERF_SHA256" >"$log" 2>&1 ||
		fail "downloading $IPERF_ORIG (Debian's archive may no longer hold it: bump IPERF_ORIG)"
fi

tmp=$(mktemp -d "$BIN/.iperf-build.XXXXXX")
tar -xf "$src" -C "$tmp" --strip-components=1 || fail "unpacking $src"
# The repack removed src/service.c (Windows only, as its one caller in
# main.cpp is): leave its object out of the program.
sed -i 's/ service\.\$(OBJEXT)//' "$tmp/src/Makefile.in"
! grep -q 'service\.\$(OBJEXT)' "$tmp/src/Makefile.in" || fail "src/Makefile.in still builds service.c"
(
	cd "$tmp"
	./configure --prefix=/usr --enable-fastsampling CC="${CC:-gcc}" CXX="${CXX:-g++}" CFLAGS=-O2 CXXFLAGS=-O2 LDFLAGS=-s
	make -j"$(nproc)"
) >"$log" 2>&1 || fail "building iperf failed"
"$tmp/src/iperf" -v 2>&1 | grep -q '^iperf version 2\.' || fail "the built iperf does not report an iperf 2 version: $("$tmp/src/iperf" -v 2>&1)"
rm -f "$STAMP"
mv -f "$tmp/src/iperf" "$OUT/iperf"
echo "$want" >"$STAMP"
