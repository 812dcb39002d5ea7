-- wrk script for bench/overhead.sh: the smallest realistic proxied request, a non-streaming completion
-- of one token (the mock answers it at once with --ttft-ms 0), and a machine-readable summary line.
wrk.method = "POST"
wrk.path = "/v1/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"mock-model","prompt":"hi","max_tokens":1}'

-- One line the script parses (wrk's own text output rounds and changes units). Latencies in microseconds.
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "OVERHEAD requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout))
end
