-- Requests for bench/gateway.sh: wrk sends one POST per call, with an
-- Idempotency-Key chosen by the mode given after `--`, and prints one
-- machine-readable line at the end so the script never parses wrk's
-- human units.
--
-- Arguments: MODE PREFIX KEYS TENANT BODY_FILE
--   fresh  every request a key never sent before: PREFIX-THREAD-COUNTER
--          (PREFIX holds the run's nonce, so reruns never replay)
--   hot    every request the one key PREFIX (sent once before the run)
--   many   the KEYS keys PREFIX-1 .. PREFIX-KEYS (sent once before the
--          run), cycled; each thread starts at a different one

local thread_count = 0

function setup(thread)
   thread_count = thread_count + 1
   thread:set("thread_id", thread_count)
end

local mode, prefix, headers, requests, next_index, counter

local function read_body(path)
   local file = assert(io.open(path, "rb"), "cannot open the body file " .. tostring(path))
   local body = file:read("*a")
   file:close()
   return body
end

local function format(key)
   headers["Idempotency-Key"] = key
   return wrk.format("POST", nil, headers, wrk.body)
end

function init(args)
   mode = args[1]
   prefix = args[2]
   local keys = tonumber(args[3])
   wrk.body = read_body(args[5])
   headers = {
      ["Content-Type"] = "application/json",
      ["x-tenant-id"] = args[4],
   }
   counter = 0
   -- Requests that never change are formatted once, so the load generator
   -- spends its time sending, not building strings.
   if mode == "hot" then
      requests = { format(prefix) }
   elseif mode == "many" then
      requests = {}
      for i = 1, keys do
         requests[i] = format(prefix .. "-" .. i)
      end
   elseif mode ~= "fresh" then
      error("unknown mode " .. tostring(mode))
   end
   if requests then
      next_index = ((thread_id or 1) * 7919) % #requests + 1
   end
end

function request()
   if mode == "fresh" then
      counter = counter + 1
      return format(prefix .. "-" .. (thread_id or 1) .. "-" .. counter)
   end
   local r = requests[next_index]
   next_index = next_index % #requests + 1
   return r
end

function done(summary, latency, requests)
   local errors = summary.errors
   io.write(string.format("BENCH requests=%d duration_us=%d p50_us=%d p99_us=%d p999_us=%d max_us=%d non2xx=%d socket_errors=%d\n",
      summary.requests, summary.duration,
      latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max,
      errors.status, errors.connect + errors.read + errors.write + errors.timeout))
end
