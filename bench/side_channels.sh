#!/usr/bin/env bash
# Side channels and the request path (not CI): the p99 latency that reading and parsing a 16 MiB engine
# /metrics page adds to proxied requests, with one worker thread. Writes bench/results/side_channels.{md,json}.
# The method is in bench/side_channels.py's header.
#
#   bench/side_channels.sh [--dplb before=/path/to/old/dplb --dplb after=build/dplb] [--seconds 10]
#
# Everything listens on 127.0.0.1 on ephemeral ports; every process started is stopped by its pid.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/side_channels.py "$@"
