-- bench/triggers_hello.lua — the ceiling: POST the same ~100-byte JSON body a
-- trigger carries to bench/hello, which must answer 200 every time.
local common = dofile((os.getenv("BENCH_DIR") or "bench") .. "/triggers_common.lua")

wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = common.order("ceiling-0")

common.install(200)
