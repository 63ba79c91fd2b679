-- wrk driver for bench/load.py: POSTs one multi-turn context per request and
-- makes every request unique, however many wrk sends: each line of the file
-- is a JSON body cut open inside its last turn ('{"context": [..., "...'),
-- and each request closes it with a tag no other request carries (the run,
-- the wrk thread and a counter), so neither the context nor the last
-- utterance is ever served from an embedding cache. Prints wrk's figures as
-- one JSON line.
--   wrk -t1 -c32 -d20s -s bench/load.lua URL -- BODIES_FILE RUN_TAG
local prefixes = {}
local tag = "r"
local sent = 0
local threads = 0

function setup(thread)
  thread:set("thread_id", threads)
  threads = threads + 1
end

function init(args)
  for line in io.lines(args[1]) do
    prefixes[#prefixes + 1] = line
  end
  tag = args[2] or tag
end

function request()
  sent = sent + 1
  local prefix = prefixes[(sent - 1) % #prefixes + 1]
  local body = string.format('%s #%st%dn%d"]}', prefix, tag, thread_id or 0, sent)
  return wrk.format("POST", "/reply", { ["Content-Type"] = "application/json" }, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
