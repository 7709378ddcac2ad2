-- Prefix affinity with bounded load (consistent hashing with bounded loads): the replica of a pool that
-- already holds a conversation's prompt in its prefix cache gets its next turn, unless it is above its
-- load bound or failing, when the next replica on the ring takes it.
--
-- key() (content phase, from gateway.lua's route()) hashes the request's affinity key into $llm_affinity:
-- the session header, else OpenAI's `user`, else the prompt's head (chat: the messages before the first user
-- message, cut to prefix_chars bytes, and that first user message, cut to prefix_chars bytes on its own;
-- completions: the prompt, cut to prefix_chars bytes).
-- balance() (balancer_by_lua of an affinity upstream) walks the ring from that hash: the first replica that
-- is not ejected, not already tried by this request, and within its bound takes it: ceil(factor x (the
-- pool's in flight + 1) / its healthy replicas), never below floor (min_in_flight). A failed attempt (nginx's
-- proxy_next_upstream) counts against its replica; max_fails of them within fail_timeout eject it for
-- fail_timeout, so its keys go to their ring successors and no other key moves.
-- A drained replica (admin(): POST /admin/drain on the metrics listener, before its container is stopped) is
-- treated as an ejected one until undrained: it gets no new request, its keys go to their ring successors, and
-- the requests it holds finish.
-- A key served elsewhere than its own replica (by the bound or a failure) is remembered for sticky seconds
-- after its last request (lua_shared_dict llm_affinity_moves): its own replica is then the one it moved to,
-- tried first, the ring after it. The moved turn prefilled the whole conversation there; sent back, the next
-- turn would miss the turns in between, and each further spill would cost a whole prefill again.
-- done() (log phase) gives the slot back and counts the outcome:
--   kept      the key's own replica (its ring replica, or the one it moved to) served it
--   load      its replica was above the bound, a later one served it (and keeps it)
--   failure   its replica was ejected or failed this request, a later one served it (and keeps it)
--   drain     its replica was drained (admin()), a later one served it (and keeps it)
--   unkeyed   the request had no key (no session, no prompt): the least busy replica served it
local M = {}

local balancer = require("ngx.balancer")
local cjson = require("cjson.safe")

local var = ngx.var
local crc32 = ngx.crc32_long
local floor, ceil = math.floor, math.ceil
local sub, byte = string.sub, string.byte
local type = type

local VNODES = 160  -- points per replica on the ring: the spread of keys within a few percent
-- lua_shared_dict llm_affinity: "i<addr>" in flight, "f<addr>" recent failures, "e<addr>" ejected; per upstream
-- "t<upstream>" its in flight, "E<upstream>" present while one of its replicas may be ejected; "d<addr>" drained
-- (no expiry) and "D<upstream>" how many of its replicas are
local dict
local moves  -- lua_shared_dict llm_affinity_moves: "<upstream>#<key hash>" -> the address it moved to
-- upstream -> {points = sorted hashes, owner = replica index of each point, addrs, index = addr -> replica,
-- hosts, ports, label}
local rings = {}
local by_pool = {}  -- pool label -> its ring (the admin endpoint names pools)
local cfg
local header_var
local use
local start_at

local function ring_of(addrs)
    local pts = {}
    for i, addr in ipairs(addrs) do
        for v = 1, VNODES do
            pts[#pts + 1] = {crc32(addr .. "#" .. v), i}
        end
    end
    table.sort(pts, function(a, b)
        return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
    end)
    local points, owner = {}, {}
    for n, p in ipairs(pts) do
        points[n], owner[n] = p[1], p[2]
    end
    return points, owner
end

-- The ring of these replicas: sorted point hashes and the replica index owning each (pure: tested alone).
M.ring = ring_of
-- The replica that owns hash h on a ring (the first point at or after it, wrapping).
function M.owner(points, owner, h)
    return owner[start_at(points, h)]
end

-- settings: {factor, floor, sticky, chars, max_fails, fail_timeout, tries, header,
-- upstreams = {name = {label, addrs}}, undrainable = {pool = why it cannot be drained here}}
function M.init(settings)
    cfg = settings
    for name, up in pairs(settings.upstreams) do
        local r = {label = up[1], addrs = up[2], index = {}, hosts = {}, ports = {}, order_all = {},
                   ikeys = {}, fkeys = {}, ekeys = {}, dkeys = {}, total_key = "t" .. name, any_key = "E" .. name,
                   drained_key = "D" .. name}
        for i, addr in ipairs(up[2]) do
            r.order_all[i] = i
            r.index[addr] = i
            r.ikeys[i], r.fkeys[i], r.ekeys[i], r.dkeys[i] = "i" .. addr, "f" .. addr, "e" .. addr, "d" .. addr
            local colon = addr:find(":[^:]*$")
            r.hosts[i], r.ports[i] = sub(addr, 1, colon - 1), tonumber(sub(addr, colon + 1))
        end
        r.points, r.owner = ring_of(up[2])
        rings[name] = r
        by_pool[up[1]] = r
    end
    dict = ngx.shared.llm_affinity
    moves = ngx.shared.llm_affinity_moves
    -- nginx's variable of the header (its first value): no table of every header built per request.
    header_var = "http_" .. settings.header:lower():gsub("-", "_")
end

-- The text of a chat message's content: a string, or the text parts of an array.
local function content_text(c)
    if type(c) == "string" then
        return c
    end
    if type(c) == "table" then
        local parts = {}
        for _, part in ipairs(c) do
            if type(part) == "table" and type(part.text) == "string" then
                parts[#parts + 1] = part.text
            end
        end
        return table.concat(parts, "\n")
    end
    return ""
end

-- The affinity key of a request body (decoded), or nil.
local function head_of(body)
    if type(body) ~= "table" then
        return nil
    end
    if type(body.user) == "string" and body.user ~= "" then
        return "u\0" .. body.user
    end
    local messages = body.messages
    if type(messages) == "table" then
        -- The messages before the first user message (system, developer) cut to chars, then the first user
        -- message cut to chars on its own: a system prompt longer than chars, shared by many conversations,
        -- must not hide the first question that tells them apart (it would pin all of them to one replica).
        local parts, size = {}, 0
        for _, m in ipairs(messages) do
            if type(m) == "table" then
                local text = tostring(m.role) .. "\0" .. content_text(m.content)
                if m.role == "user" then
                    return "m\0" .. sub(table.concat(parts, "\0"), 1, cfg.chars) .. "\0" .. sub(text, 1, cfg.chars)
                end
                if size < cfg.chars then
                    parts[#parts + 1] = text
                    size = size + #text
                end
            end
        end
        return "m\0" .. sub(table.concat(parts, "\0"), 1, cfg.chars)
    end
    local prompt = body.prompt
    if type(prompt) == "table" then
        prompt = prompt[1]
    end
    if type(prompt) == "string" then
        return "p\0" .. sub(prompt, 1, cfg.chars)
    end
    return nil
end

-- content phase: $llm_affinity := the hash of the request's affinity key ("" leaves it to the ring's spread).
function M.key(raw)
    local session = var[header_var]
    local key
    if session and session ~= "" then
        key = "s\0" .. session
    else
        key = head_of(cjson.decode(raw))
    end
    if key then
        var.llm_affinity = crc32(key)
    end
end

-- The ring index of the first point at or after hash h (wrapping).
start_at = function(points, h)
    local lo, hi = 1, #points
    if h > points[hi] then
        return 1
    end
    while lo < hi do
        local mid = floor((lo + hi) / 2)
        if points[mid] < h then
            lo = mid + 1
        else
            hi = mid
        end
    end
    return lo
end

-- Replica k of ring r ejected or drained? (Only looked up while one of the pool's replicas may be.)
local function ejected(r, k)
    return dict:get(r.ekeys[k]) ~= nil or dict:get(r.dkeys[k]) ~= nil
end

local function failed(r, k)
    local n = dict:incr(r.fkeys[k], 1, 0, cfg.fail_timeout)
    if n and n >= cfg.max_fails and cfg.max_fails > 0 then
        dict:set(r.ekeys[k], true, cfg.fail_timeout)
        -- Lives as long as the pool's latest ejection: while it is absent no replica is ejected.
        dict:set(r.any_key, true, cfg.fail_timeout)
        dict:delete(r.fkeys[k])
    end
end

-- The first replica of `order` this request has not tried yet, or nil.
local function first_untried(order, tried)
    for _, o in ipairs(order) do
        if not tried[o] then
            return o
        end
    end
    return nil
end

-- Replica k's slot given back (its in flight and the pool's).
local function release(r, k)
    dict:incr(r.ikeys[k], -1, 0)
    dict:incr(r.total_key, -1, 0)
end

-- The attempt goes to replica `pick`: one more in flight there until done() or the next attempt.
use = function(r, ctx, tried, pick)
    tried[pick] = true
    ctx.aff_peer = pick
    dict:incr(r.ikeys[pick], 1, 0)
    dict:incr(r.total_key, 1, 0)
    local ok, err = balancer.set_current_peer(r.hosts[pick], r.ports[pick])
    if not ok then
        ngx.log(ngx.ERR, "gateway_affinity: ", err)
    end
end

-- balancer_by_lua of an affinity upstream.
function M.balance(name)
    local r = rings[name]
    local ctx = ngx.ctx
    local tried = ctx.aff_tried
    if tried then
        -- A retry: the replica before failed this request (error, timeout or a failure status).
        local last = ctx.aff_peer
        failed(r, last)
        release(r, last)
        ctx.aff_peer = nil
        ctx.aff_failed = true
    else
        tried = {}
        ctx.aff_tried = tried
        ctx.aff_ring = r
        balancer.set_more_tries(cfg.tries - 1)
    end
    local n = #r.addrs
    -- The pool's in flight and healthy replicas from two shared entries; each replica's own entries are read
    -- only as the walk reaches it (the cost stays flat from 4 replicas to 64).
    local any_ejected = dict:get(r.any_key) ~= nil or (dict:get(r.drained_key) or 0) > 0
    local healthy = n
    if any_ejected then
        for k = 1, n do
            if ejected(r, k) then
                healthy = healthy - 1
            end
        end
    end
    local h = tonumber(var.llm_affinity)
    if not h then
        -- No key (no session, no prompt to hash): the least busy replica, ties taken in turn.
        local from = dict:incr("r" .. name, 1, 0) % n
        local pick, least
        for j = 0, n - 1 do
            local o = (from + j) % n + 1
            if not tried[o] and not (any_ejected and ejected(r, o)) then
                local load = dict:get(r.ikeys[o]) or 0
                if not pick or load < least then
                    pick, least = o, load
                end
            end
        end
        pick = pick or first_untried(r.order_all, tried) or 1
        ctx.aff_outcome = ctx.aff_outcome or "unkeyed"
        return use(r, ctx, tried, pick)
    end
    local bound = ceil(cfg.factor * ((dict:get(r.total_key) or 0) + 1) / (healthy > 0 and healthy or n))
    if bound < cfg.floor then
        bound = cfg.floor
    end
    local points, owner = r.points, r.owner
    local np = #points
    -- The replicas in ring order from the key's point, each once (a key that moved: its new replica first),
    -- until one is untried, healthy and within the bound.
    local mkey = cfg.sticky > 0 and (name .. "#" .. h)
    local moved = mkey and r.index[moves:get(mkey) or ""]
    local i = start_at(points, h)
    local own = owner[i]
    local o = moved or own
    if not moved then
        i = i == np and 1 or i + 1
    end
    local order, seen = {}, {}
    local pick, first_healthy, spill
    while true do
        if not seen[o] then
            seen[o] = true
            order[#order + 1] = o
            if not tried[o] and not (any_ejected and ejected(r, o)) then
                first_healthy = first_healthy or o
                if (dict:get(r.ikeys[o]) or 0) + 1 <= bound then
                    pick = o
                    break
                end
                spill = true
            end
            if #order == n then
                break
            end
        end
        o = owner[i]
        i = i == np and 1 or i + 1
    end
    if not pick then
        -- Every replica tried, ejected or above the bound: the first untried one all the same (nginx, too,
        -- tries a pool whose servers are all down rather than answer without trying).
        pick = first_healthy or first_untried(order, tried) or order[1]
        spill = false
    end
    if ctx.aff_outcome == nil then
        local home = order[1]
        if home ~= pick and (tried[home] or (any_ejected and ejected(r, home))) then
            -- Drained (an operator's choice, before a restart) is not failing: counted apart.
            ctx.aff_outcome = not tried[home] and dict:get(r.dkeys[home]) ~= nil and "drain" or "failure"
        elseif spill then
            ctx.aff_outcome = "load"
        else
            ctx.aff_outcome = "kept"
        end
    end
    if mkey then
        -- Where the key lives from now on: its ring replica (nothing to remember) or another, renewed by each
        -- request.
        if pick == own then
            if moved then
                moves:delete(mkey)
            end
        else
            moves:set(mkey, r.addrs[pick], cfg.sticky)
        end
    end
    return use(r, ctx, tried, pick)
end

-- log phase (every request): the slot back, the last attempt's failure counted, the outcome counted.
function M.done(count)
    local ctx = ngx.ctx
    local r = ctx.aff_ring
    if not r then
        return
    end
    local peer = ctx.aff_peer
    if peer then
        release(r, peer)
        local status = var.upstream_status
        -- The last attempt's status ("502", or "502, 200" after a retry: only the last counts here).
        local last = status and status:match("(%d%d%d)$")
        if not last or byte(last, 1) == 53 then
            failed(r, peer)
        end
    end
    local outcome = ctx.aff_failed and "failure" or ctx.aff_outcome or "kept"
    if count then
        count(r.label, outcome)
    end
end

-- The requests in flight on each replica of the affinity upstreams, as Prometheus gauge lines.
function M.in_flight(out, labels)
    for _, r in pairs(rings) do
        for _, addr in ipairs(r.addrs) do
            out[#out + 1] = "llm_gateway_upstream_in_flight" .. labels({"pool", "upstream"}, {r.label, addr})
                .. " " .. (dict:get("i" .. addr) or 0)
        end
    end
end

-- 1 for each replica of the affinity upstreams that is drained, else 0, as Prometheus gauge lines.
function M.drained(out, labels)
    for _, r in pairs(rings) do
        for i, addr in ipairs(r.addrs) do
            out[#out + 1] = "llm_gateway_upstream_drained" .. labels({"pool", "upstream"}, {r.label, addr})
                .. " " .. (dict:get(r.dkeys[i]) and 1 or 0)
        end
    end
end

local function admin_answer(status, body)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.print(cjson.encode(body))
    return ngx.exit(ngx.HTTP_OK)
end

-- The replicas of ring r: {addr = {in_flight, drained}}.
local function replicas_of(r)
    local out = {}
    for i, addr in ipairs(r.addrs) do
        out[addr] = {in_flight = dict:get(r.ikeys[i]) or 0, drained = dict:get(r.dkeys[i]) ~= nil}
    end
    return out
end

-- content_by_lua of the metrics listener's /admin/drain (never the public port):
--   GET                             every affinity pool's replicas: in flight, drained
--   GET    ?pool=P                  that pool's
--   POST   ?pool=P&replica=H:PORT   drain it (no new request; those in flight finish); idempotent
--   DELETE ?pool=P&replica=H:PORT   undrain it; idempotent
-- An unknown pool or replica: 404 with a message naming what there is; a pool nginx balances itself: 409 saying why.
function M.admin()
    local method = ngx.req.get_method()
    local args = ngx.req.get_uri_args()
    local pool, replica = args.pool, args.replica
    if method ~= "GET" and method ~= "POST" and method ~= "DELETE" then
        ngx.header["Allow"] = "GET, POST, DELETE"
        return admin_answer(405, {error = "method " .. method .. " not allowed: GET, POST (drain) or DELETE (undrain)"})
    end
    if type(pool) ~= "string" then
        if method ~= "GET" then
            return admin_answer(400, {error = "pool=<pool>&replica=<host:port> are required to drain or undrain"})
        end
        local all = {}
        for label, r in pairs(by_pool) do
            all[label] = replicas_of(r)
        end
        return admin_answer(200, all)
    end
    local r = by_pool[pool]
    local refused = not r and cfg.undrainable[pool]
    if refused then
        -- A pool nginx balances itself (least_conn, or one instance): nothing here can take a replica out.
        return admin_answer(409, {error = refused})
    end
    if not r then
        local known = {}
        for label in pairs(by_pool) do
            known[#known + 1] = label
        end
        table.sort(known)
        return admin_answer(404, {error = "no pool '" .. pool .. "' routed by prefix affinity here (drain needs "
            .. "routing: prefix); these are: " .. table.concat(known, ", ")})
    end
    if method == "GET" then
        return admin_answer(200, {[pool] = replicas_of(r)})
    end
    local k = type(replica) == "string" and r.index[replica]
    if not k then
        return admin_answer(404, {error = "pool '" .. pool .. "' has no replica '" .. tostring(replica)
            .. "'; its replicas are: " .. table.concat(r.addrs, ", ")})
    end
    if method == "POST" then
        -- add() fails when already drained: the pool's count moves once per replica.
        if dict:add(r.dkeys[k], true) then
            dict:incr(r.drained_key, 1, 0)
        end
    elseif dict:get(r.dkeys[k]) ~= nil then
        dict:delete(r.dkeys[k])
        dict:incr(r.drained_key, -1, 0)
    end
    return admin_answer(200, {[pool] = {[replica] = replicas_of(r)[replica]}})
end

return M
