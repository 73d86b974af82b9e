-- bench/triggers_dup.lua — duplicate triggers: every request repeats one of
-- the BENCH_DUPS executions bench/triggers.sh created beforehand (order ids
-- dup-0 .. dup-<BENCH_DUPS-1>, same payload), so every answer must be 200.
local common = dofile((os.getenv("BENCH_DIR") or "bench") .. "/triggers_common.lua")

local dups = tonumber(os.getenv("BENCH_DUPS") or "100")
local bodies = {}
local n = 0

function init(args)
   local headers = {["Content-Type"] = "application/json"}
   for i = 0, dups - 1 do
      -- Prebuilt: the client should cost the same per request as for the ceiling.
      bodies[i] = wrk.format("POST", nil, headers, common.order("dup-" .. i))
   end
   n = tid * 7 -- threads start at different executions
end

function request()
   n = n + 1
   return bodies[n % dups]
end

common.install(200)
