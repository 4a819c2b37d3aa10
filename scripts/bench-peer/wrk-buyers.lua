-- wrk script for scripts/bench: every request is a new buyer (X-User-Id = prefix .. n, n counting
-- from 0, the ids `loadgen --user-prefix prefix` gives). Run with one thread:
--   wrk -t1 -c64 -d5s -s wrk-buyers.lua http://HOST:PORT -- PATH PREFIX [MAX] [HEADER VALUE]
-- MAX > 0: ids cycle through 0..MAX-1, so a run never reaches a buyer beyond a pre-filled range
-- (wrk cannot stop early: a stopped thread still counts the whole duration). scripts/bench checks
-- that a run stayed under MAX, since a second visit can be answered from memory.
-- done() prints one line `WRKJSON {...}` for scripts/bench to read.
local path, prefix, max, n = "/", "buyer-", 0, 0
local headers = {}

function init(args)
  path = args[1] or path
  prefix = args[2] or prefix
  max = tonumber(args[3]) or 0
  -- One more header on every request (a member's tier, for a sale in phases).
  if args[4] and args[5] then
    headers[args[4]] = args[5]
  end
end

function request()
  headers["X-User-Id"] = prefix .. (max > 0 and n % max or n)
  n = n + 1
  return wrk.format("POST", path, headers, "")
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "connect_errors": %d, "read_errors": %d, '
      .. '"write_errors": %d, "status_errors": %d, "timeouts": %d, "p50_ms": %.3f, "p99_ms": %.3f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000))
end
