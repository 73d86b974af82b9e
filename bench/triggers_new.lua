-- bench/triggers_new.lua — new triggers: every request carries an order id no
-- other request uses (run tag, wrk thread id, per-thread counter), so every
-- answer must be 201 and every 201 is one new durable execution.
local common = dofile((os.getenv("BENCH_DIR") or "bench") .. "/triggers_common.lua")

local headers = {["Content-Type"] = "application/json"}
local n = 0

function request()
   n = n + 1
   local id = string.format("new-r%s-t%d-%d", common.run, tid, n)
   return wrk.format("POST", nil, headers, common.order(id))
end

common.install(201)
