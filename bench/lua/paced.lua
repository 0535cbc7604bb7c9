-- wrk script: paced GET for the "half of peak load" latency figure. wrk is closed-loop (each
-- connection sends as fast as answers come), so on its own it always measures saturation. Here
-- each connection waits DELAY_MS between requests, which holds the offered rate near
--   connections * 1000 / (DELAY_MS + latency)   requests per second.
--   wrk ... -s paced.lua URL -- DELAY_MS
local delay_ms = 1

function init(args)
    delay_ms = tonumber(args[1]) or 1
end

function delay()
    return delay_ms
end
