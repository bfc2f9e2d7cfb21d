# Sourced by scripts/helm/build and scripts/jaeger/build: build one command of a tool from the committed Go module
# pin in the calling script's directory (go.mod requires the tool's module at the release we test with, tools.go
# names the command so `go mod tidy` keeps it) with the machine's Go, into <cache>/v<version>-<pin hash>/<name>.
# Nothing happens when that binary exists; a change of the pin, of the calling script or of this file builds
# afresh (builds of other pins stay: another checkout may use them). Go's module and build caches
# ($(go env GOMODCACHE), $(go env GOCACHE)) make a rebuild seconds to a minute.

# The release go.mod in directory $1 requires of module $2, without its leading v (e.g. 3.22.0).
pinned_go_version() { sed -n "s|^require $2 v||p" "$1/go.mod"; }

# build_pinned_go NAME DIR VERSION PACKAGE CACHE COLD [LDFLAGS...]: prints the binary's path on its last line.
# COLD says how long a cold build takes (for the message); LDFLAGS are added to "-s -w" (e.g. a version stamp).
build_pinned_go() {
  local name="$1" dir="$2" version="$3" package="$4" cache="$5" cold="$6"
  shift 6
  command -v go >/dev/null || { echo "$name: needs Go 1.26 or newer (apt-get install golang-go, or go.dev/dl)" >&2; return 1; }
  local key out started
  key="$(cat "${BASH_SOURCE[0]}" "$dir/build" "$dir/go.mod" "$dir/go.sum" "$dir/tools.go" | sha256sum | cut -c1-12)"
  out="$cache/v$version-$key"
  if [ -x "$out/$name" ]; then echo "$out/$name"; return 0; fi
  echo "$name: building v$version into $out ($cold the first time)" >&2
  started=$(date +%s)
  mkdir -p "$out"
  # -mod=readonly: the pin is the whole truth; a build that would change it fails instead. -s -w: no symbol
  # tables or debug information (a third of the size; nobody debugs these binaries here).
  (cd "$dir" && nice -n 10 go build -mod=readonly -trimpath -ldflags "-s -w $*" -o "$out/$name.partial" "$package")
  mv "$out/$name.partial" "$out/$name"
  echo "$name: built in $(( $(date +%s) - started )) s" >&2
  echo "$out/$name"
}
