-- wrk script of the benchmark harness: requests every object
-- WRK_PATHS_PREFIX .. id .. WRK_PATHS_SUFFIX, id in [0, WRK_PATHS_COUNT),
-- exactly once, then stops (warms a cache with many URLs at wrk's speed).
-- Thread i of WRK_SWEEP_THREADS (wrk's -t) takes ids i, i + T, i + 2T, ...
-- When a thread has had an answer to each of its requests it prints
--
--   WRK_SWEEP_DONE <thread> <ids sent> <extra requests> <answers> <answers not 200>
--
-- and stops. wrk itself only ends after -d, so the caller (loadgen.py)
-- sends SIGINT once every thread has printed its line.
--
--   WRK_PATHS_COUNT=100000 WRK_PATHS_PREFIX='/static/177?id=' WRK_SWEEP_THREADS=2 \
--     wrk -t2 -c64 -d300s -s loadtests/bench/wrk/sweep.lua http://127.0.0.1:6081/

local count = assert(tonumber(os.getenv("WRK_PATHS_COUNT") or ""), "WRK_PATHS_COUNT is required")
local threads = assert(tonumber(os.getenv("WRK_SWEEP_THREADS") or ""), "WRK_SWEEP_THREADS is required")
local prefix = os.getenv("WRK_PATHS_PREFIX") or "/static/177?id="
local suffix = os.getenv("WRK_PATHS_SUFFIX") or ""

local threads_made = 0
function setup(thread)
  thread:set("thread_index", threads_made)
  threads_made = threads_made + 1
end

local next_id, sent, extra, answered, bad, finished
-- wrk calls request() once on its first thread to check the request's
-- syntax and never sends that one: it must not use up an id.
local unsent_checks

function init(_args)
  next_id = thread_index
  sent, extra, answered, bad, finished = 0, 0, 0, 0, false
  unsent_checks = thread_index == 0 and 1 or 0
end

-- A connection with nothing left to ask for waits (an hour: until the thread stops).
function delay()
  if next_id >= count then
    return 3600000
  end
  return 0
end

function request()
  if unsent_checks > 0 then
    unsent_checks = unsent_checks - 1
    return wrk.format(nil, prefix .. "0" .. suffix)
  end
  if next_id >= count then
    -- Another connection took the last id between this one's delay() and
    -- request(): ask again for an object already asked for.
    extra = extra + 1
    return wrk.format(nil, prefix .. (count - 1) .. suffix)
  end
  local id = next_id
  next_id = next_id + threads
  sent = sent + 1
  return wrk.format(nil, prefix .. id .. suffix)
end

function response(status, _headers, _body)
  answered = answered + 1
  if status ~= 200 then
    bad = bad + 1
  end
  -- One request in flight per connection: every request sent has its answer.
  if not finished and next_id >= count and answered == sent + extra then
    finished = true
    io.write(string.format("WRK_SWEEP_DONE %d %d %d %d %d\n", thread_index, sent, extra, answered, bad))
    io.flush()
    wrk.thread:stop()
  end
end
