# Shared by hack/build-*.sh (sourced): a scratch log, a temporary build
# directory beside bin/ removed on exit, fail(), and a lock so that two
# concurrent runs do not build twice or race on the version stamp.
#
# Usage: build_init NAME   (after setting BIN); then $log, $tmp (set it to
# "$(mktemp -d "$BIN/.NAME-build.XXXXXX")" before building) and fail MSG.

build_init() {
	BUILD_NAME=$1
	export GOWORK=off CGO_ENABLED=0 # tools modules stand alone; static binaries
	log=$(mktemp)
	tmp=
	trap 'rm -f "$log"; [[ -z $tmp ]] || rm -rf "$tmp"' EXIT
	mkdir -p "$BIN"
	exec 9>"$BIN/.$BUILD_NAME-build.lock"
	flock 9
}

fail() {
	echo "build-$BUILD_NAME.sh: $*" >&2
	[[ ! -s $log ]] || cat "$log" >&2
	exit 1
}
