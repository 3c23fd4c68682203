#!/usr/bin/env bash
# System packages the benchmarks need beyond PyPI and scripts/ensure-system-deps.sh:
# nats-server (benchmarks/consumer_bench.py runs its NATS JetStream baseline against it;
# benchmarks/peers.py runs our broker side by side with it and redis-server)
# and redis-server.
# Installs them with apt when missing and we are root; otherwise says what to install. Fast (a few file checks) when everything is present.
set -euo pipefail

missing=()
command -v nats-server >/dev/null || missing+=(nats-server)
command -v redis-server >/dev/null || missing+=(redis-server)

if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing ${missing[*]} (apt-get install ${missing[*]})..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "${missing[*]} not found: install the package(s) '${missing[*]}'" \
         "(Debian: apt-get install ${missing[*]})." >&2
    exit 1
  fi
fi
