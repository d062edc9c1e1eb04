-- wrk script of the HTTP load run in docs/PERFORMANCE.md: POST /api/v1/check
-- over 1000 client ids, round robin, against examples/load.yaml.
--
--   wrk -t1 -c12 -d10s --latency -s scripts/wrk-check.lua http://127.0.0.1:8080
local n = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  n = n + 1
  return wrk.format(nil, "/api/v1/check", nil, '{"client_id":"c' .. (n % 1000) .. '","resource":"/api/load"}')
end
