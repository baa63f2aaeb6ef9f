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

# kube_ldflags VERSION sets ldflags to stamp a build of k8s.io/kubernetes
# at VERSION as upstream's hack/lib/version.sh does, so that `--version`
# reports the release rather than v0.0.0-master. The commit is unknown
# here: the source comes from module zips, not a git tree. "archive" is
# upstream's tree state for builds from a source archive; the build date
# is the module's publication time, keeping builds reproducible. Needs GO
# and TOOLS (the module pinning k8s.io/kubernetes).
kube_ldflags() {
	local version=$1 major minor date pkg
	[[ $version =~ ^v([0-9]+)\.([0-9]+)(\.[0-9]+)?([-].*)?([+].*)?$ ]] ||
		fail "k8s.io/kubernetes version $version is not a release version"
	major=${BASH_REMATCH[1]}
	minor=${BASH_REMATCH[2]}
	[[ -z ${BASH_REMATCH[4]} ]] || minor+="+"
	date=$("$GO" -C "$TOOLS" list -mod=readonly -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes 2>"$log") ||
		fail "cannot read the k8s.io/kubernetes module time"
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		ldflags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=archive"
		[[ -z $date ]] || ldflags+=" -X $pkg.buildDate=$date"
	done
}
