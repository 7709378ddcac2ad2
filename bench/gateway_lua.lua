-- A measured alternative, not deployed: the gateway's routed request path (gateway.js's keyId,
-- route and usage) in Lua on ngx_http_lua_module + LuaJIT, for bench/gateway_instructions.py.
-- Same work per request as the njs version: the key's sha256 looked up among the digests, the body
-- parsed and routed to the pool's named location (its own timeouts), the usage filter's search with
-- its carry across chunks. GET /v1/models and the refusals' full messages are not ported.
local cjson = require "cjson.safe"
local ffi = require "ffi"
ffi.cdef [[
typedef struct evp_md_st EVP_MD;
const EVP_MD *EVP_get_digestbyname(const char *name);
int EVP_Digest(const void *data, size_t count, unsigned char *md, unsigned int *size,
               const EVP_MD *type, void *impl);
]]
local C = ffi.C  -- nginx links libcrypto
local SHA256 = C.EVP_get_digestbyname("sha256")
local md = ffi.new("unsigned char[32]")
local USAGE_WINDOW = 400  -- gateway.py USAGE_WINDOW
local LOG_FIELD_MAX = 256  -- gateway.py LOG_FIELD_MAX

local M = {}
local routes, keys = nil, {}

local function read(path)
    local f = assert(io.open(path))
    local s = f:read("*a")
    f:close()
    return s
end

-- init_by_lua: the routing table and the digests (hex sha256 -> key id), once per nginx start.
function M.init(routes_file, digests_file)
    routes = cjson.decode(read(routes_file))
    if digests_file then
        for digest, id in pairs(cjson.decode(read(digests_file))) do
            keys[digest:gsub("..", function(c) return string.char(tonumber(c, 16)) end)] = id
        end
    end
end

-- set_by_lua $llm_key_id: the id of the key in $llm_bearer (gateway.py's map), '' when unknown.
function M.key_id()
    if not routes.auth then
        return ""
    end
    local key = ngx.var.llm_bearer
    -- Trimmed byte by byte: string.match is not compiled by LuaJIT (its trace would abort each time).
    local i, j = 1, #key
    while i <= j and (key:byte(i) == 32 or key:byte(i) == 9) do
        i = i + 1
    end
    while j >= i and (key:byte(j) == 32 or key:byte(j) == 9) do
        j = j - 1
    end
    if i > j then
        return ""
    end
    if i > 1 or j < #key then
        key = key:sub(i, j)
    end
    C.EVP_Digest(key, #key, md, nil, SHA256, nil)
    return keys[ffi.string(md, 32)] or ""
end

local function fail(status, message, code, param)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    ngx.print(cjson.encode({error = {message = message, type = "invalid_request_error", param = param, code = code}}))
    return ngx.exit(status)
end

-- content_by_lua of the model endpoints: gateway.js's route().
function M.route()
    if ngx.req.get_method() ~= "POST" then
        return fail(405, "Method not allowed; use POST.", "method_not_allowed")
    end
    ngx.req.read_body()
    local body = cjson.decode(ngx.req.get_body_data() or "")
    if type(body) ~= "table" then
        return fail(400, "We could not parse the JSON body of your request.", "invalid_json")
    end
    local model = body.model
    if type(model) ~= "string" or model == "" then
        return fail(400, "You must provide a model parameter (a string).", "missing_model", "model")
    end
    ngx.var.llm_model = #model > LOG_FIELD_MAX and model:sub(1, LOG_FIELD_MAX) or model
    local fixed = ngx.var.llm_pin
    if fixed == "" then
        fixed = nil
    end
    local entry = routes.models[model]
    if not entry or (fixed and not entry[2][fixed]) then
        return fail(404, "The model '" .. model .. "' does not exist.", "model_not_found", "model")
    end
    local allow = routes.allow[ngx.var.llm_key_id]
    if allow and not allow[model] then
        return fail(403, "This API key may not use the model '" .. model .. "'.", "model_not_allowed", "model")
    end
    local location = entry[3]
    ngx.var.llm_pool = fixed or entry[1]
    if fixed then
        location = (entry[4] ~= "" and "@llm_alias_" or "@llm_pool_") .. fixed
    end
    if entry[4] ~= "" then
        body.model = entry[4]
        ngx.var.llm_body = cjson.encode(body)
    end
    return ngx.exec(location)
end

-- body_filter_by_lua of the pool locations: gateway.js's usage(), per-request state in ngx.ctx.
function M.usage()
    local ctx = ngx.ctx
    local buf, from = ngx.arg[1], 0
    if ctx.carry then
        from = #ctx.carry
        buf = ctx.carry .. buf
        ctx.carry = nil
    end
    local n = #buf
    if n == from then
        return
    end
    local stream = ctx.stream
    if stream == nil then
        stream = buf:byte(1) ~= 123  -- a JSON body starts with '{'; an event stream never does
        ctx.stream = stream
    end
    if stream then
        local events = ctx.events or 0
        local seen = events
        local at = buf:find("data:", from > 4 and from - 3 or 1, true)
        while at do
            if at + 4 > from and (at > 1 and buf:byte(at - 1) or ctx.before or 10) == 10 then
                events = events + 1
            end
            at = buf:find("data:", at + 5, true)
        end
        if events ~= seen then
            ctx.events = events
            ngx.var.llm_events = events
        end
    end
    local keep = n
    local u, f = nil, buf:find('"usage"', 1, true)
    while f do
        u = f
        f = buf:find('"usage"', f + 1, true)
    end
    if u then
        ngx.var.llm_usage = buf:sub(u, u + USAGE_WINDOW - 1)
        if not buf:find("}", u, true) then
            keep = u - 1  -- the counts may go on in the next chunk
        end
    end
    if keep == n and buf:byte(n) ~= 10 then
        local edge = n > 6 and n - 6 or 0  -- the last bytes may begin a marker
        if buf:find('"', edge + 1, true) or (stream and buf:find("d", edge + 1, true)) then
            keep = edge
        end
    end
    if keep < n then
        ctx.before = keep > 0 and buf:byte(keep) or ctx.before
        ctx.carry = buf:sub(keep + 1)
    else
        ctx.before = buf:byte(n)
    end
end

return M
