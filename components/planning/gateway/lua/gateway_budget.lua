-- llm-cluster gateway, module `gateway_budget` (ngx_http_lua_module + LuaJIT): token budgets per API
-- key per window.
--
-- Loaded only when a key has a budget (gateway.apiKeys[].tokenBudget, defaultTokenBudget), so a
-- gateway without budgets pays nothing for them. The counts live in a lua_shared_dict: the same
-- numbers for every nginx worker, kept across `nginx -s reload` (nginx keeps a zone whose name and
-- size are unchanged). Windows are fixed, counted from the Unix epoch (86400 s: UTC days).
--
-- A key's count is ONE entry ("<key id>/<window seconds>") whose time to live ends with the window
-- it was made in: a live entry is always the current window's count, an ended window's count is
-- gone without a sweep, and the zone holds one entry per key whatever the traffic (gateway.py sizes
-- it from the keys). Every change is one atomic operation of the dict (incr, else safe_add for a
-- window's first tokens): no lock, no read-modify-write between workers.
--
--   admit   set_by_lua $llm_budget_refused in the model endpoints, after the key check and before
--           the limits: '' admits, '1' refuses (nginx answers 429 from the error page). Sets the
--           headers' variables $llm_tb_limit, $llm_tb_remaining, $llm_tb_reset (and $llm_tb_retry_after).
--   charge  from the log phase (gateway_metrics.record): adds the tokens the response's usage
--           reports, else one per stream event sent, to the count of the window the request ENDS
--           in, so every token is counted once, a stream that outlasts its window's end included.
local ngx = ngx
local var = ngx.var
local now = ngx.now
local key_id = require("gateway_metrics").key_id  -- the request's, as gateway.key_id() found it
local floor, ceil = math.floor, math.ceil
local tonumber = tonumber

local M = {}
local budgets = {}  -- key id -> {tokens, window in ms, dict key, tokens as text}
local dict, zone
local reported = {}  -- dict key -> end (ms) of the window whose uncounted tokens this worker logged

-- init_by_lua: the zone and key id -> {tokens, window seconds}, from nginx.conf (gateway.py).
function M.init(zone_name, by_key)
    zone = zone_name
    dict = assert(ngx.shared[zone_name], "no lua_shared_dict " .. zone_name)
    for id, b in pairs(by_key) do
        budgets[id] = {b[1], b[2] * 1000, id .. "/" .. b[2], ("%d"):format(b[1])}
    end
end

-- OpenAI's spelling of a duration in x-ratelimit-reset-*: "50ms", "1s", "1m0s" (gateway.py reset_interval).
local function duration(ms)
    if ms < 1000 then
        return ms .. "ms"
    end
    local s = ceil(ms / 1000)
    if s >= 60 then
        return floor(s / 60) .. "m" .. s % 60 .. "s"
    end
    return s .. "s"
end

-- Now in whole milliseconds (nginx's cached time, the clock the dict's expiry reads), and the
-- milliseconds left in the window of length `window`.
local function clock(window)
    local t = floor(now() * 1000 + 0.5)
    return t, window - t % window
end

-- set_by_lua $llm_budget_refused: '' admits (the window's count is below the budget), '1' refuses.
function M.admit()
    local b = budgets[key_id()]
    if not b then
        return ""
    end
    local limit = b[1]
    local _, left = clock(b[2])
    local used = dict:get(b[3]) or 0
    var.llm_tb_limit = b[4]
    var.llm_tb_reset = duration(left)
    if used >= limit then
        var.llm_tb_remaining = "0"
        var.llm_tb_retry_after = ceil(left / 1000)
        return "1"
    end
    var.llm_tb_remaining = ("%d"):format(limit - used)
    return ""
end

-- Adds to the window's count in one atomic step. A dict entry lives until the last millisecond of
-- its window (the dict treats an entry as live up to and including its expiry time).
local function add(key, tokens, ttl_ms)
    for _ = 1, 3 do
        local ok, err = dict:incr(key, tokens)
        if ok then
            return true
        end
        -- Not found: the window's first tokens. safe_add never evicts another key's count (incr with
        -- init would, and it would evict the least recently charged: a key refused for having used
        -- its budget up). "exists": another worker added it first; add to its count.
        -- (+0.5: resty.core multiplies by 1000 and truncates.)
        ok, err = dict:safe_add(key, tokens, (ttl_ms + 0.5) / 1000)
        if ok then
            return true
        end
        if err ~= "exists" then
            return false, err
        end
    end
    return false, "the count kept changing"
end

-- prompt, completion, total: the usage's counts (digits, or nil when the response had none);
-- events: the stream events sent. Returns the tokens added to the key's count, nil when none were.
function M.charge(key_id, prompt, completion, total, events)
    local b = budgets[key_id]
    if not b then
        return nil
    end
    local tokens = tonumber(total)
    if not tokens then
        local p, c = tonumber(prompt), tonumber(completion)
        if p or c then
            tokens = (p or 0) + (c or 0)
        else
            tokens = events or 0  -- no usage came back (cut, or no include_usage): the events sent
        end
    end
    if tokens <= 0 then
        return nil  -- refused before a replica, or nothing served
    end
    local window = b[2]
    local t, left = clock(window)
    local ttl = left - 1
    if ttl < 1 then
        ttl = ttl + window  -- the window's last millisecond: counted in the next one
    end
    local ok, err = add(b[3], tokens, ttl)
    if ok then
        return tokens
    end
    -- A full zone fails open: the request was served, the key is admitted without a count until the
    -- zone has room, and every existing count stays exact. Said once per key and window per worker.
    local ends = t + ttl
    if reported[b[3]] ~= ends then
        reported[b[3]] = ends
        ngx.log(ngx.ERR, "token budget: ", tokens, " tokens of key '", key_id, "' not counted (", err,
                "): the lua_shared_dict ", zone, " (", dict:capacity(), " bytes, sized from the keys with ",
                "gateway.apiKeys[].tokenBudget or gateway.defaultTokenBudget) has no room for its count; ",
                "the key's requests are admitted without one until it has")
    end
    return nil
end

return M
