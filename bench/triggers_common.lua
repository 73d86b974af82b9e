-- bench/triggers_common.lua — shared by the triggers_*.lua wrk scripts.
--
-- Gives every wrk thread a distinct id, counts response statuses per thread
-- (the `response` hook), and at the end prints ONE machine-readable line that
-- bench/triggers.sh parses:
--
--   RESULT rps=<req/s> p50_ms=<> p99_ms=<> requests=<> expected=<n with the
--          expected status> unexpected=<others> non2xx=<> sockerr=<> statuses=<code:n,...>
--
-- A scenario script sets `expected_status` and defines `request`, then calls
-- common.install().  Environment: BENCH_RUN (a tag that keeps ids unique
-- across runs over the same database).

local M = {}

local threads = {}
local next_tid = 0

function M.install(expected_status)
   function setup(thread)
      next_tid = next_tid + 1
      thread:set("tid", next_tid)
      table.insert(threads, thread)
   end

   -- Per-thread state (each thread runs its own copy of the script).
   statuses = {}

   function response(status, headers, body)
      statuses[status] = (statuses[status] or 0) + 1
   end

   function done(summary, latency, requests)
      local all = {}
      for _, t in ipairs(threads) do
         local s = t:get("statuses")
         for code, n in pairs(s) do
            all[code] = (all[code] or 0) + n
         end
      end
      local expected, unexpected, non2xx, parts = 0, 0, 0, {}
      for code, n in pairs(all) do
         if code == expected_status then
            expected = expected + n
         else
            unexpected = unexpected + n
         end
         if code < 200 or code > 299 then
            non2xx = non2xx + n
         end
         table.insert(parts, code .. ":" .. n)
      end
      table.sort(parts)
      local e = summary.errors
      local secs = summary.duration / 1e6
      io.write(string.format(
         "RESULT rps=%.1f p50_ms=%.3f p99_ms=%.3f requests=%d expected=%d unexpected=%d" ..
         " non2xx=%d sockerr=%d statuses=%s\n",
         summary.requests / secs, latency:percentile(50) / 1000, latency:percentile(99) / 1000,
         summary.requests, expected, unexpected, non2xx,
         e.connect + e.read + e.write + e.timeout, table.concat(parts, ",")))
   end
end

-- A ~100-byte order payload; `id` is the business key the workflow dedups on.
function M.order(id)
   return string.format(
      '{"order":{"id":"%s","amount":1250,"currency":"EUR"},"customer":"c-0042","note":"bench"}', id)
end

M.run = os.getenv("BENCH_RUN") or "0"

return M
