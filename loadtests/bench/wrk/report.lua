-- wrk script of the benchmark harness: prints one JSON line with the totals
-- and latency percentiles when the run ends (parsed by loadgen.py), and,
-- when WRK_PATHS_COUNT is set, asks for objects
-- WRK_PATHS_PREFIX .. id .. WRK_PATHS_SUFFIX with id in [0, count) instead
-- of the URL's path: uniformly at random (the disk-tier vs memory-tier
-- ceiling), or, with WRK_PATHS_ZIPF=s, Zipf-distributed with exponent s
-- (id 0 the most requested; P(id = k - 1) is proportional to 1 / k^s), as
-- real traffic spreads over a site's URLs. WRK_SEED fixes the draws (each
-- thread adds its index); by default they are seeded from the clock.
--
--   wrk -t2 -c64 -d5s -s loadtests/bench/wrk/report.lua http://127.0.0.1:6081/static/177
--   WRK_PATHS_COUNT=100000 WRK_PATHS_PREFIX='/static/177?id=' WRK_PATHS_ZIPF=0.99 \
--     wrk -t2 -c64 -d5s -s loadtests/bench/wrk/report.lua http://127.0.0.1:6081/

local count = tonumber(os.getenv("WRK_PATHS_COUNT") or "")
local zipf_s = tonumber(os.getenv("WRK_PATHS_ZIPF") or "")

-- setup runs in wrk's main Lua state, once per thread in creation order;
-- each thread then has its own state, where `thread_index` is set.
local threads_made = 0
function setup(thread)
  thread:set("thread_index", threads_made)
  threads_made = threads_made + 1
end

-- cdf[k] = P(rank <= k) for ranks 1..n under Zipf(s); cdf[n] is exactly 1.
local function zipf_cdf(n, s)
  local cdf, total = {}, 0
  for k = 1, n do
    total = total + k ^ -s
    cdf[k] = total
  end
  for k = 1, n do
    cdf[k] = cdf[k] / total
  end
  cdf[n] = 1
  return cdf
end

-- The smallest rank k with u < cdf[k], for u in [0, 1): binary search.
local function zipf_rank(cdf, n, u)
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if u < cdf[mid] then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

if count then
  local prefix = os.getenv("WRK_PATHS_PREFIX") or "/static/16384?id="
  local suffix = os.getenv("WRK_PATHS_SUFFIX") or ""
  local cdf = nil
  -- Formatted once per id and kept: a Zipf mix repeats its head, and the
  -- Lua work per request competes with the server for the same cores.
  local requests = {}

  function init(_args)
    local seed = tonumber(os.getenv("WRK_SEED") or "")
      or (os.time() + math.floor(os.clock() * 1000000))
    math.randomseed(seed + 7919 * (thread_index or 0))
    if zipf_s then
      cdf = zipf_cdf(count, zipf_s)
    end
  end

  function request()
    local id
    if cdf then
      id = zipf_rank(cdf, count, math.random()) - 1
    else
      id = math.random(0, count - 1)
    end
    local req = requests[id]
    if not req then
      req = wrk.format(nil, prefix .. id .. suffix)
      requests[id] = req
    end
    return req
  end
end

function done(summary, latency, _rates)
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
