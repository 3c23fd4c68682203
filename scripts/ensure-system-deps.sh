#!/usr/bin/env bash
# System packages the test suite needs beyond PyPI: PostgreSQL's server binaries (for the
# SQL store and events tests), curl (the broker tutorial's HTTP steps, tests/e2e), podman
# and debootstrap (the images, built and run by tests/integration/test_images.py), a Java
# runtime (pyspark, for the Spark source's tests), Prometheus (promtool checks the chart's
# alert rules; a live server scrapes a test cluster) and Chromium (the console's browser
# tests, driven by Playwright from PyPI: no browser download). `ensure-system-deps.sh images`: only
# what `make images` needs (a Docker daemon will do).
# Installs them with apt when missing and we are root; otherwise says what to install. Fast (a few file checks) when everything is present.
set -euo pipefail

# An image builder for `make images` and tests/integration/test_images.py: podman (builds
# with --isolation chroot: no daemon or OCI runtime needed) and debootstrap (a Python base
# where no registry is reachable). `make images` is also content with a Docker daemon.
if ! { command -v podman >/dev/null && command -v debootstrap >/dev/null; } \
   && ! { [ "${1:-}" = images ] && command -v docker >/dev/null && docker info >/dev/null 2>&1; }; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing an image builder (apt-get install podman debootstrap)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman debootstrap >/dev/null
  else
    echo "No image builder: install 'podman' and 'debootstrap' (or run a Docker daemon)." >&2
    exit 1
  fi
fi
[ "${1:-}" = images ] && exit 0

have_pg() {
  [ -n "${PG_BIN:-}" ] && [ -x "$PG_BIN/initdb" ] && return 0
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && return 0
  command -v initdb >/dev/null
}

if ! have_pg; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing PostgreSQL server binaries (apt-get install postgresql)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "PostgreSQL server binaries (initdb) not found: install the 'postgresql' package" \
         "or set PG_BIN to the folder holding initdb and postgres." >&2
    exit 1
  fi
fi

if [ ! -x /usr/bin/curl ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing curl (apt-get install curl)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq curl >/dev/null
  else
    echo "curl not found at /usr/bin/curl: install the 'curl' package." >&2
    exit 1
  fi
fi

# A Java runtime for pyspark (the Spark source's tests run Spark in local mode).
if ! command -v java >/dev/null && [ -z "${JAVA_HOME:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing a Java runtime for Spark (apt-get install openjdk-17-jre-headless)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "java not found: install 'openjdk-17-jre-headless' (Spark's tests need a JRE 17)." >&2
    exit 1
  fi
fi

# Prometheus (its promtool tests the chart's alert rules; the server scrapes a test
# cluster) and Chromium (the console's browser tests). Debian's packages: no download at
# test time; without recommends (Prometheus would bring node-exporter and its timers).
missing=()
command -v prometheus >/dev/null && command -v promtool >/dev/null || missing+=(prometheus)
[ -x /usr/bin/chromium ] || missing+=(chromium fonts-liberation)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "Installing ${missing[*]} (apt-get install --no-install-recommends)..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  else
    echo "Not found: ${missing[*]}: install those Debian packages (the chart's alert" \
         "tests need promtool and prometheus, the console's browser tests /usr/bin/chromium)." >&2
    exit 1
  fi
fi
