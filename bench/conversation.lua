-- wrk driver for bench/load.py's conversation modes: each wrk thread holds one connection and
-- plays held-out conversations turn by turn, as a chat app's user would. The user's lines are the
-- conversation's turns at even positions; the bot's are the service's own answers.
--   session:   {"session_id": ..., "message": turn}: the service keeps the context
--   stateless: {"context": [...]}: the client keeps it, its own lines and the answers it got,
--              and sends the newest KEEP turns each time
-- Each line of the file is one conversation: its user turns, JSON-escaped, separated by tabs.
-- Every conversation is played once in a run; past the file's end a thread starts over with a
-- tag on each line, so no run replays a conversation the cache has seen whole.
--   wrk -t32 -c32 -d20s -s bench/conversation.lua URL -- FILE MODE RUN_TAG THREADS
local conversations = {}
local mode = "session"
local tag = "r"
local keep = 10
local threads = 1
local created = 0
local conv, turn, round, context, session = 0, 0, 0, {}, ""

function setup(thread)
  thread:set("thread_id", created)
  created = created + 1
end

function init(args)
  for line in io.lines(args[1]) do
    local turns = {}
    for t in string.gmatch(line, "[^\t]+") do turns[#turns + 1] = t end
    if #turns > 0 then conversations[#conversations + 1] = turns end
  end
  mode = args[2] or mode
  tag = args[3] or tag
  threads = tonumber(args[4] or "1")
  conv = thread_id
end

local function next_conversation()
  conv = conv + threads  -- thread k plays conversations k, k + threads, ...
  turn, context = 0, {}
end

local function current()
  local i = (conv % #conversations) + 1
  round = math.floor(conv / #conversations)
  return conversations[i], i
end

function request()
  local turns, i = current()
  if turn >= #turns then
    next_conversation()
    turns, i = current()
  end
  turn = turn + 1
  local message = turns[turn]
  if round > 0 then message = message .. " ~" .. round end
  session = string.format("%s-t%d-c%d-%d", tag, thread_id, i, round)
  local body
  if mode == "session" then
    body = string.format('{"session_id":"%s","message":"%s"}', session, message)
  else
    context[#context + 1] = message
    while #context > keep do table.remove(context, 1) end
    body = '{"context":["' .. table.concat(context, '","') .. '"]}'
  end
  return wrk.format("POST", "/reply", { ["Content-Type"] = "application/json" }, body)
end

-- The answer's text as it came, JSON-escaped: it goes back into a JSON string as it is.
local function reply_of(body)
  local s = body:find('"reply":"', 1, true)
  if not s then return nil end
  local i = s + 9
  local j = i
  while true do
    local c = body:sub(j, j)
    if c == "" then return nil end
    if c == "\\" then j = j + 2 elseif c == '"' then break else j = j + 1 end
  end
  return body:sub(i, j - 1)
end

function response(status, headers, body)
  if mode ~= "session" and status == 200 then
    local answer = reply_of(body)
    if answer then context[#context + 1] = answer end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":%d,"non_2xx":%d,"p50_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.status + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99), latency.max))
end
