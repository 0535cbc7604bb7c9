-- wrk script: POST with a fresh Idempotency-Key on every request (a counter behind a per-thread
-- random prefix), so every request on a guarded route is a first execution.
--   wrk ... -s fresh.lua URL -- RUN_ID
-- Against an unguarded path it is the same request shape for plain proxying, which separates
-- wrk's own Lua cost from the proxy's idempotency cost.
local prefix, n = "f", 0
local threads = 0

function setup(thread)
    thread:set("thread_index", threads)
    threads = threads + 1
end

function init(args)
    local index = thread_index or 0
    math.randomseed(os.time() + index * 7919)
    prefix = string.format("%s-t%d-%x%x-", args[1] or "run", index,
        math.random(0, 0x3fffffff), math.random(0, 0x3fffffff))
    wrk.method = "POST"
    wrk.body = '{"amount":1000,"currency":"eur","note":"bench"}'
    wrk.headers["Content-Type"] = "application/json"
end

function request()
    n = n + 1
    wrk.headers["Idempotency-Key"] = prefix .. n
    return wrk.format()
end
