#!/usr/bin/env bash
# Installs the Debian packages edgeinfer builds and tests with, and nothing else.
#
# Idempotent: packages already installed are left alone and `apt-get update` runs at most
# once, only when something is missing. Non-interactive. Exits non-zero naming the package
# that could not be installed.
#
#   deploy/install-deps.sh           install what is missing
#   deploy/install-deps.sh --check   list what is missing, install nothing (exit 1 if any)
set -euo pipefail

packages=(
  build-essential cmake pkg-config git curl ca-certificates
  libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev
  libsimdjson-dev
  prometheus-cpp-dev
  doctest-dev
  libssl-dev
  libsqlite3-dev sqlite3
  libpq-dev postgresql
  libcli11-dev
  libpcre2-dev libicu-dev
  libtomlplusplus-dev
  libhiredis-dev redis-server
  prometheus yamllint systemd
  nginx wrk
  clang libclang-rt-14-dev
  chromium chromium-driver
  python3 python3-numpy
)

# Node.js and npm may come from a non-Debian build that already provides both commands; the
# Debian packages are only needed where the commands are absent.
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
# kubectl renders the Kubernetes manifests in the deploy test (`kubectl kustomize`).
command -v kubectl >/dev/null 2>&1 || packages+=(kubernetes-client)

check_only=0
[[ "${1:-}" == "--check" ]] && check_only=1

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
  [[ "$status" == ii* ]] || missing+=("$pkg")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [[ $check_only -eq 1 ]]; then
  echo "install-deps: missing: ${missing[*]}"
  exit 1
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq || { echo "install-deps: apt-get update failed" >&2; exit 1; }

# One transaction first (fast); if it fails, one package at a time so the error names it.
if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  for pkg in "${missing[@]}"; do
    if ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; then
      echo "install-deps: could not install Debian package '$pkg'" >&2
      exit 1
    fi
  done
fi

# Debian starts redis-server and prometheus as services on install; tests start their own
# instances on free loopback ports, so the system-wide ones are stopped where a service
# manager runs. Failure here is harmless (containers often have none).
if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
  "${sudo[@]}" systemctl disable --now redis-server prometheus prometheus-node-exporter >/dev/null 2>&1 || true
fi
echo "install-deps: done"
