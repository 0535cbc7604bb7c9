-- wrk script: POST to a guarded route, cycling round-robin through a fixed pool of keys that
-- bench/run.sh recorded beforehand, so every request is a replay.
--   wrk ... -s replay.lua URL -- PREFIX POOL_SIZE
-- Keys are PREFIX1 .. PREFIX<POOL_SIZE>; each thread starts at a different offset.
local prefix, pool, i = "k", 1000, 0
local threads = 0

function setup(thread)
    thread:set("thread_index", threads)
    threads = threads + 1
end

function init(args)
    prefix = args[1] or prefix
    pool = tonumber(args[2]) or pool
    i = ((thread_index or 0) * 97) % pool
    wrk.method = "POST"
    wrk.body = '{"amount":1000,"currency":"eur","note":"bench"}'
    wrk.headers["Content-Type"] = "application/json"
end

function request()
    i = i % pool + 1
    wrk.headers["Idempotency-Key"] = prefix .. i
    return wrk.format()
end
