#!/usr/bin/env bash
# Builds dplb's Debian package: configures BUILD_DIR to install under /usr (binaries in /usr/bin, the
# configuration in /etc/dplb, the systemd unit in /usr/lib/systemd/system), builds, and runs CPack.
# Prints the package's path on its last line. Install it with `dpkg -i` (as root).
# Usage: scripts/package.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
./scripts/build.sh "$build_dir" dplb dplb-mock-engine dplb-bench >/dev/null
cmake -S . -B "$build_dir" -DCMAKE_INSTALL_PREFIX=/usr >/dev/null
(cd "$build_dir" && cpack -G DEB >&2)
ls -t "$build_dir"/dplb_*.deb | head -n 1
