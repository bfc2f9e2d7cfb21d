#!/usr/bin/env bash
# Installs the Debian packages Zeroscale's tests and demo run for real: Redis (server, Sentinel),
# nginx and wrk (benchmark baselines), nghttp2's h2load and nghttp (HTTP/2 clients for tests and benchmarks), Prometheus, kubectl, a JDK and Maven (Apache Kafka), and nftables and
# iproute2 (the network namespace where tests/e2e runs a real kube-proxy).
# Run as root or with sudo; does nothing when everything is already there.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have redis-server || need+=(redis-server)
have redis-sentinel || need+=(redis-sentinel)
have nginx || need+=(nginx-light)
have wrk || need+=(wrk)
have h2load || need+=(nghttp2-client)
have prometheus || need+=(prometheus)
have kubectl || need+=(kubernetes-client)
have java || need+=(default-jre-headless)
have mvn || need+=(maven)
have openssl || need+=(openssl)
have python3 || need+=(python3 python3-venv)
have nft || need+=(nftables)
have ip || need+=(iproute2)

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian starts these as services on install; the tests start their own on free ports.
for service in redis-server nginx prometheus; do
  $sudo systemctl disable --now "$service" >/dev/null 2>&1 || $sudo service "$service" stop >/dev/null 2>&1 || true
done
