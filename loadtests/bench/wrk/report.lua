-- wrk script of the benchmark harness: prints one JSON line with the totals
-- and latency percentiles when the run ends (parsed by loadgen.py), and,
-- when WRK_PATHS_COUNT is set, asks for random objects
-- WRK_PATHS_PREFIX .. id .. WRK_PATHS_SUFFIX with id in [0, count) instead
-- of the URL's path (the disk-tier vs memory-tier ceiling).
--
--   wrk -t2 -c64 -d5s -s loadtests/bench/wrk/report.lua http://127.0.0.1:6081/static/177

local count = tonumber(os.getenv("WRK_PATHS_COUNT") or "")
if count then
  local prefix = os.getenv("WRK_PATHS_PREFIX") or "/static/16384?id="
  local suffix = os.getenv("WRK_PATHS_SUFFIX") or ""
  local seeded = false
  request = function()
    if not seeded then
      -- each wrk thread has its own Lua state; seed once per thread
      math.randomseed(os.time() + math.floor(os.clock() * 1000000))
      seeded = true
    end
    return wrk.format(nil, prefix .. math.random(0, count - 1) .. suffix)
  end
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\nWRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"mean":%.1f,"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), latency.max))
end
