#!/usr/bin/env bash
# Cold-build time (docs/benchmarks.md §8): builds dplb, dplb-mock-engine and dplb-bench in a fresh build
# folder with no compiler cache, one job, recording each compile's and link's CPU time (user+sys), then
# estimates the wall time on an idle machine of BUILD_TIME_CORES cores by replaying the build graph with
# those times (bench/build_time.py). CPU time hardly depends on what else the machine runs; wall time does.
# Usage: bench/build_time.sh demo|tests   (demo: scripts/demo.sh's flags; tests: scripts/build.sh's)
# Environment: BUILD_TIME_TARGETS (dplb dplb-mock-engine dplb-bench), BUILD_TIME_CORES (2).
set -euo pipefail
cd "$(dirname "$0")/.."
case ${1:-} in
  demo) flags=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" -DDPLB_UNITY_BUILD=ON) ;;
  tests) flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo) ;;
  *) echo "usage: bench/build_time.sh demo|tests" >&2; exit 2 ;;
esac
read -ra targets <<<"${BUILD_TIME_TARGETS:-dplb dplb-mock-engine dplb-bench}"
workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT
# The launcher of every compile and link: the command under /usr/bin/time, one line per output.
cat >"$workdir/timed" <<'LAUNCHER'
#!/usr/bin/env bash
out=unknown prev=
for a in "$@"; do [[ $prev == -o ]] && out=$a; prev=$a; done
exec /usr/bin/time -a -o "$BUILD_TIME_LOG" -f "%U %S %e $out %M" "$@"
LAUNCHER
chmod +x "$workdir/timed"
export BUILD_TIME_LOG=$workdir/times.log
cmake -S . -B "$workdir/build" -G Ninja "${flags[@]}" -DDPLB_BUILD_TESTS=OFF \
  -DCMAKE_CXX_COMPILER_LAUNCHER="$workdir/timed" -DCMAKE_CXX_LINKER_LAUNCHER="$workdir/timed" >/dev/null
cmake --build "$workdir/build" -j 1 --target "${targets[@]}" >"$workdir/build.log" 2>&1 ||
  { tail -n 40 "$workdir/build.log" >&2; exit 1; }
python3 bench/build_time.py "$workdir/build" "$BUILD_TIME_LOG" "${BUILD_TIME_CORES:-2}" "${targets[@]}"
