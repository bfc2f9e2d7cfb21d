# Sourced by the control plane's scripts: where things live and which versions they are.
# ZS_K8S_HOME (default ~/.cache/zeroscale-k8s) holds builds (build/<version>-<pin hash>/bin) and the
# running plane's state (run/: certificates, kubeconfigs, logs, PIDs; replaced by each `up`).
# K8S_VERSION picks another release than the pinned one (any served v1.33+; its module graph is resolved
# on first use and cached by version). ZS_K8S_PORT: the apiserver's port (default 16443).
K8S_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ZS_K8S_HOME="${ZS_K8S_HOME:-$HOME/.cache/zeroscale-k8s}"
ZS_K8S_PORT="${ZS_K8S_PORT:-16443}"
RUN_DIR="$ZS_K8S_HOME/run"
PKI="$RUN_DIR/pki"

# The release the committed pin (kubernetes/go.mod) names, e.g. 1.37.2.
pinned_version() { sed -n 's/^require k8s\.io\/kubernetes v//p' "$K8S_DIR/kubernetes/go.mod"; }
K8S_VERSION="${K8S_VERSION:-$(pinned_version)}"
K8S_VERSION="${K8S_VERSION#v}"
K8S_MINOR="$(echo "$K8S_VERSION" | cut -d. -f2)"

# The module directory to build Kubernetes from: the committed pin, or a resolved one for another release.
kube_module_dir() {
  if [ "$K8S_VERSION" = "$(pinned_version)" ]; then echo "$K8S_DIR/kubernetes"; else echo "$ZS_K8S_HOME/modules/v$K8S_VERSION"; fi
}

# A short hash of files' contents (pins and recipes): what a build directory is keyed by.
content_key() { cat "$@" | sha256sum | cut -c1-12; }

# Bumped when the build recipe (flags, what is built) changes, so that builds of the old recipe are not reused.
RECIPE=1
# The build directory: keyed by the version and a hash of every pin and of the recipe's number, so a change to
# either builds afresh and nothing else does. Builds of other pins stay (another checkout may use them):
# remove $ZS_K8S_HOME/build/<dir> by hand when no checkout needs it.
build_dir() {
  local key kube_mod
  kube_mod="$(kube_module_dir)"
  key=$( { echo "recipe $RECIPE"; cat "$kube_mod/go.mod" "$kube_mod/go.sum" "$K8S_DIR/etcd/go.mod" "$K8S_DIR/etcd/go.sum"; } \
    2>/dev/null | sha256sum | cut -c1-12)
  echo "$ZS_K8S_HOME/build/v$K8S_VERSION-$key"
}
