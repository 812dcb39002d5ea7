#!/usr/bin/env bash
# Installs what dplb needs, in two sets. `scripts/setup.sh demo` installs only what building dplb, the mock
# engine and the bench client and running the demo need (scripts/demo.sh). `scripts/setup.sh` (no
# argument) installs everything building and testing need on top: Catch2, the real clients of the
# ecosystem tests (Debian packages) and their npm packages (tests/ecosystem: the OpenAI SDK, a Chromium
# driver, Kubernetes schemas) from the npm registry, pinned by tests/ecosystem/package-lock.json.
# Idempotent; run as root. Set DPLB_SETUP_BENCH=1 to also install the benchmark peers, DPLB_SETUP_FUZZ=1
# the fuzzing toolchain (scripts/fuzz.sh), DPLB_SETUP_PROFILE=1 the profilers of bench/profile.sh.
set -euo pipefail

set_name=${1:-all}
if [[ $set_name != demo && $set_name != all ]]; then
  echo "usage: scripts/setup.sh [demo|all]   (demo: only what scripts/demo.sh needs; all, the default: everything)" >&2
  exit 2
fi

# Building dplb and its tools (the demo needs nothing else: it talks to them with curl).
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libboost1.81-dev libboost-program-options1.81-dev libboost-url1.81-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev prometheus-cpp-dev
  libssl-dev  # libcrypto: the admin token's SHA-256 and constant-time comparison
  # KV-cache events (issue 20, src/kv/): xxHash's XXH3 for dplb's own block chains (header-only use), ZeroMQ and
  # its C++ binding for the engines' event publishers. The events' msgpack is read by dplb's own bounded reader:
  # Debian 12's libmsgpack-cxx-dev depends on libboost-dev (1.74), which conflicts with libboost1.81-dev.
  libxxhash-dev libzmq3-dev cppzmq-dev
  # The shared ledger (issue 29, src/ledger/): hiredis, Redis's own C client, driven by dplb's Asio adapter.
  libhiredis-dev
  curl
)
if [[ $set_name == all ]]; then
  packages+=(
    catch2 python3
    # The shared ledger's tests start a redis-server of their own on an ephemeral port (its service is never
    # relied on).
    redis-server
    # The real clients of the ecosystem tests: Prometheus and promtool, headless Chromium for the status
    # page, docker-compose to validate deploy/compose.yaml, Node.js and npm for the SDK and the schemas.
    prometheus chromium docker-compose python3-yaml
  )
  # The machine's own Node.js (with its npm) serves; Debian's otherwise.
  command -v npm >/dev/null || packages+=(nodejs npm)
fi
if [[ "${DPLB_SETUP_BENCH:-0}" == 1 ]]; then
  packages+=(haproxy nginx-light wrk gnuplot-nox)
fi
if [[ "${DPLB_SETUP_PROFILE:-0}" == 1 ]]; then
  # valgrind for callgrind (instructions per request), strace for system calls per request.
  packages+=(valgrind strace)
fi
if [[ "${DPLB_SETUP_FUZZ:-0}" == 1 ]]; then
  # clang 14 with libFuzzer and the sanitizer runtimes (libclang-rt), llvm for llvm-symbolizer.
  packages+=(clang libclang-rt-14-dev llvm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing packages: ${missing[*]}; run this script as root (it uses apt-get)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[[ $set_name == all ]] || exit 0
# The ecosystem tests' npm packages, installed again only when the lock file changed.
ecosystem=$(cd "$(dirname "$0")/../tests/ecosystem" && pwd)
stamp=$ecosystem/node_modules/.dplb-lock-sha256
want=$(sha256sum "$ecosystem/package-lock.json" | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  (cd "$ecosystem" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
fi
