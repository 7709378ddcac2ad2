-- llm-cluster gateway, module `gateway` (ngx_http_lua_module + LuaJIT): API key -> key id, routing by
-- the request's `model`, GET /v1/models, the refusals, and the usage body filter.
--
-- Data comes from two files read once per nginx start (init_by_lua), so neither this file nor
-- nginx.conf holds a key:
--   routes.json       generated from the stack (auth, models, pools, prefixes, allowlists)
--   key-hashes.json   sha256(key) -> key id, made on the gateway host or from the stack's secret
--                     (absent when auth is off)
-- Per-request state crosses ngx.exec (which clears ngx.ctx) in gateway_metrics.routed, the request's
-- entry from route() to the log phase (model, pool, token counts, stream events), and in the nginx
-- variables nginx itself reads: $llm_key_id (limits), $llm_body (an alias's body), $llm_request_id
-- (X-Request-Id).
--
-- The request path runs for every request: no regular expression, no string work on a response
-- body beyond plain searches, each ngx.var read once.
local cjson = require("cjson.safe").new()  -- this module's own instance: its settings are ours alone
local ffi = require("ffi")

ffi.cdef [[
typedef struct evp_md_st EVP_MD;
typedef struct evp_md_ctx_st EVP_MD_CTX;
EVP_MD *EVP_MD_fetch(void *libctx, const char *algorithm, const char *properties);
EVP_MD_CTX *EVP_MD_CTX_new(void);
int EVP_DigestInit_ex2(EVP_MD_CTX *ctx, const EVP_MD *type, const void *params);
int EVP_DigestUpdate(EVP_MD_CTX *ctx, const void *d, size_t cnt);
int EVP_DigestFinal_ex(EVP_MD_CTX *ctx, unsigned char *md, unsigned int *s);
int RAND_bytes(unsigned char *buf, int num);
]]
local C = ffi.C  -- nginx links libcrypto (OpenSSL 3): its sha256, no Lua library needed
-- Fetched once and one context reused (a worker runs one request's Lua at a time, and key_id never
-- yields): EVP_Digest with a looked-up digest fetches the implementation and makes a context on
-- every call, 2.0k instructions of the 4.7k a key's digest cost (bench figures in the commit).
local SHA256 = C.EVP_MD_fetch(nil, "SHA256", nil)
local md_ctx = C.EVP_MD_CTX_new()
assert(SHA256 ~= nil and md_ctx ~= nil, "libcrypto: no SHA256")
local digest = ffi.new("unsigned char[32]")
local ffi_string = ffi.string
local metrics = require("gateway_metrics")
local json_text = metrics.json_text  -- nginx's escape=json, as the usage line's path
local utf8 = metrics.utf8  -- bytes that are not UTF-8 as U+FFFD, for the messages that echo a client's model name
local utf8_cut = metrics.utf8_cut  -- a client's field cut to a length, never inside a character
local routed, request_key, route_state = metrics.routed, metrics.request_key, metrics.route_state
local key_ids, request_key_id = metrics.key_ids, metrics.key_id

local ngx = ngx
local var = ngx.var
local byte, sub, find, concat = string.byte, string.sub, string.find, table.concat
local bor, tohex = bit.bor, bit.tohex

-- JSON only: NaN, Infinity and hex numbers are refused as JSON.parse and the engines' parsers do.
cjson.decode_invalid_numbers(false)

local LOG_FIELD_MAX = 256  -- gateway.py LOG_FIELD_MAX
-- A usage object longer than this is not one an engine sends: it is not carried on to be finished.
local USAGE_WINDOW = 400
-- What a client gets for an answer that is not HTTP, whole (status line and headers included): nginx
-- sends such an answer's bytes as they come (head(), usage()), and closes the connection after them.
local NOT_HTTP_BODY = '{"error": {"message": "The replica\'s answer was not HTTP; retry later.", "type": '
    .. '"server_error", "param": null, "code": "upstream_invalid_response"}}'
local NOT_HTTP_ANSWER = "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: "
    .. #NOT_HTTP_BODY .. "\r\nConnection: close\r\n\r\n" .. NOT_HTTP_BODY
-- The counts read from a response's `usage` (gateway.py USAGE_COUNTS), as the usage line's fields.
local COUNT_KEYS = {'"prompt_tokens"', '"completion_tokens"', '"total_tokens"'}

local M = {}
local routes
local has_allowlists  -- whether any key has one (routes.allow)
local affinity_of = {}  -- named location -> its pool, for the pools routed by prefix affinity (routes.affinity)
local keys = {}  -- raw 32-byte sha256 -> key id
-- Each name routes.json routes -> the model as the usage line holds it: json_text's loop, which would
-- cut route()'s trace, runs once per name, at start (with record()'s path lookup, 0.6k instructions a
-- request).
local logged_names = {}

-- A client's model name as logged: at most LOG_FIELD_MAX bytes, never a UTF-8 character cut in two.
local function log_field(s)
    return utf8_cut(s, LOG_FIELD_MAX)
end

local function read(path)
    local f = assert(io.open(path, "rb"))
    local text = f:read("*a")
    f:close()
    return text
end

local function unhex(c)
    return string.char(tonumber(c, 16))
end

-- init_by_lua: the routing table and, with auth, the digests (hex sha256 -> key id). A missing or
-- unreadable file stops nginx from starting (`nginx -t` says which), never a gateway without keys.
function M.init(routes_file, digests_file)
    routes = assert(cjson.decode(read(routes_file)), routes_file .. ": not JSON")
    has_allowlists = next(routes.allow) ~= nil
    affinity_of = routes.affinity or {}
    for name in pairs(routes.models) do
        logged_names[name] = json_text(log_field(name))
    end
    if routes.auth then
        local digests = assert(cjson.decode(read(digests_file)), digests_file .. ": not JSON")
        for hex, id in pairs(digests) do
            keys[hex:gsub("..", unhex)] = id
        end
    end
end

-- Authorization headers that carried a known key -> its id, so a client's next request costs a table
-- lookup, not a digest (2.0k instructions a request less: gateway_instructions.py). Only known keys
-- are kept, at most HEADER_CACHE_MAX headers (emptied when full: a client varying the blanks before
-- its key cannot grow it past that). What it adds to timing: a hit says this exact header held a
-- valid key before, which its sender knows; a miss costs the digest as before. LuaJIT already holds
-- each header as a string it compared with the others it holds (the var read interns it), cache or not.
local HEADER_CACHE_MAX = 4096
local id_of_header, cached_headers = {}, 0

-- set_by_lua $llm_key_id: the id of the presented key, '' when it is missing or unknown, or auth is off.
function M.key_id()
    if not routes.auth then
        return ""
    end
    local auth = var.http_authorization
    -- Only the Bearer scheme (any case, RFC 7235) carries a key. Bytes compared, not a pattern
    -- (string.match would abort LuaJIT's trace; nginx's regex map cost 2k instructions more).
    if not auth or #auth < 8 then
        return ""
    end
    local known = id_of_header[auth]
    if known then
        key_ids[request_key()] = known
        return known
    end
    local b, e, a, r, e2, r2, space = byte(auth, 1, 7)
    if bor(b, 32) ~= 98 or bor(e, 32) ~= 101 or bor(a, 32) ~= 97 or bor(r, 32) ~= 114 or bor(e2, 32) ~= 101
            or bor(r2, 32) ~= 114 or space ~= 32 then
        return ""
    end
    -- Blanks around the key are not part of it.
    local i, j = 8, #auth
    while i <= j and (byte(auth, i) == 32 or byte(auth, i) == 9) do
        i = i + 1
    end
    while j >= i and (byte(auth, j) == 32 or byte(auth, j) == 9) do
        j = j - 1
    end
    if i > j then
        return ""
    end
    local key = sub(auth, i, j)
    -- Looking up the digest, not the key: the lookup time says nothing about the key.
    C.EVP_DigestInit_ex2(md_ctx, SHA256, nil)
    C.EVP_DigestUpdate(md_ctx, key, #key)
    C.EVP_DigestFinal_ex(md_ctx, digest, nil)
    local id = keys[ffi_string(digest, 32)]
    if not id then
        return ""
    end
    if cached_headers == HEADER_CACHE_MAX then
        id_of_header, cached_headers = {}, 0
    end
    id_of_header[auth], cached_headers = id, cached_headers + 1
    key_ids[request_key()] = id
    return id
end

-- The id of a routed request ($llm_request_id: the usage line's, and X-Request-Id to the replica),
-- 32 hex digits as nginx's $request_id: 96 random bits drawn once per worker, then a count. nginx's
-- own draws 128 bits per request from OpenSSL's generator (3.0k instructions and a getpid() system
-- call, for its fork check) where this is a counter's increment; the requests the gateway refuses
-- before routing keep nginx's (the variable's default). Unique, not secret: nothing trusts it.
local id_prefix, id_count
local function request_id()
    if not id_prefix or id_count == 0xffffffff then
        -- Drawn in the worker (never in the master: every worker would share it), again after 2^32.
        local random = ffi.new("unsigned char[12]")
        assert(C.RAND_bytes(random, 12) == 1, "libcrypto: RAND_bytes failed")
        local hex = {}
        for i = 0, 11 do
            hex[i + 1] = tohex(random[i], 2)
        end
        id_prefix, id_count = concat(hex), -1
    end
    id_count = id_count + 1
    return id_prefix .. tohex(id_count, 8)
end

-- A JSON string. cjson writes '/' as '\/': every backslash before a '/' in its output is that
-- escape (a backslash of the text is written '\\'), so dropping them gives back plain slashes.
local function json_string(s)
    return (cjson.encode(s):gsub("\\/", "/"))
end

-- cjson's names of the tokens it found, in its parse errors, as a client reads them.
local TOKENS = {T_OBJ_BEGIN = "'{'", T_OBJ_END = "'}'", T_ARR_BEGIN = "'['", T_ARR_END = "']'",
                T_STRING = "a string", T_NUMBER = "a number", T_BOOLEAN = "a boolean", T_NULL = "null",
                T_COLON = "':'", T_COMMA = "','", T_END = "the end of the body", T_WHITESPACE = "a blank",
                T_ERROR = "an error", T_UNKNOWN = "an unknown token"}

-- An OpenAI-style error; every error Lua answers is the client's (4xx). Fields in OpenAI's order.
-- The message as UTF-8 (JSON text is; cjson writes any byte as it is): it may echo a client's model name.
local function fail(status, message, code, param, allow)
    local body = '{"error": {"message": ' .. json_string(utf8(message)) .. ', "type": "invalid_request_error", "param": '
        .. (param and json_string(param) or "null") .. ', "code": ' .. json_string(code) .. "}}"
    ngx.status = status
    local header = ngx.header
    header["Content-Type"] = "application/json"
    header["Content-Length"] = #body
    if allow then
        header["Allow"] = allow
    end
    ngx.print(body)
    return ngx.exit(ngx.HTTP_OK)  -- the answer is out: end the request, no error page
end

-- '/smart/v1/chat/completions' -> '/smart/v1/'; the endpoints themselves never contain '/v1/'.
local function prefix_of(uri)
    local last, at = 1, find(uri, "/v1/", 1, true)
    while at do
        last = at
        at = find(uri, "/v1/", at + 1, true)
    end
    return sub(uri, 1, last + 3)
end

-- Model names a key may see under a prefix: the prefix's pool only, or every pool in list order.
local function visible_names(prefix, id)
    local fixed = routes.prefixes[prefix]
    local allow = routes.allow[id]
    local names, seen = {}, {}  -- pools that share a model list its names once
    for _, pool in ipairs(routes.order) do
        if not fixed or pool == fixed then
            for _, name in ipairs(routes.listing[pool]) do
                if (not allow or allow[name]) and not seen[name] then
                    seen[name] = true
                    names[#names + 1] = name
                end
            end
        end
    end
    return names
end

-- The position of the first byte from i on that is not one of JSON's blanks.
local function skip_blanks(s, i)
    local c = byte(s, i)
    while c == 32 or c == 9 or c == 10 or c == 13 do
        i = i + 1
        c = byte(s, i)
    end
    return i
end

-- The position after the JSON string that starts at i (a quote not escaped by a backslash ends it).
local function string_end(s, i)
    local q = find(s, '"', i + 1, true)
    while true do
        local k = q - 1
        while byte(s, k) == 92 do
            k = k - 1
        end
        if (q - 1 - k) % 2 == 0 then
            return q + 1
        end
        q = find(s, '"', q + 1, true)
    end
end

-- The position after the JSON value that starts at i (strings skipped whole, brackets counted).
local function value_end(s, i)
    local c = byte(s, i)
    if c == 34 then
        return string_end(s, i)
    end
    if c ~= 123 and c ~= 91 then
        return find(s, "[,}%]%s]", i) or #s + 1  -- a number, true, false or null
    end
    local depth, j = 0, i
    while true do
        j = find(s, '[%[%]{}"]', j)
        c = byte(s, j)
        if c == 34 then
            j = string_end(s, j)
        else
            depth = depth + ((c == 123 or c == 91) and 1 or -1)
            j = j + 1
            if depth == 0 then
                return j
            end
        end
    end
end

-- The object body with each top-level `model` member's value replaced by `name`, every other byte
-- as the client sent it (numbers, key order, escapes: the body is not encoded again). For a body
-- cjson has parsed only: the scan assumes valid JSON. Aliases only, never the hot path.
local function with_model(s, name)
    local out, from = {}, 1
    local i = skip_blanks(s, skip_blanks(s, 1) + 1)  -- the first key, or the '}' of `{}`
    while byte(s, i) == 34 do
        local key_end = string_end(s, i)
        local key = sub(s, i, key_end - 1)
        local at = skip_blanks(s, skip_blanks(s, key_end) + 1)  -- the value, after the ':'
        local stop = value_end(s, at)
        if key == '"model"' or (find(key, "\\", 1, true) and cjson.decode(key) == "model") then
            out[#out + 1] = sub(s, from, at - 1)
            out[#out + 1] = json_string(name)
            from = stop
        end
        i = skip_blanks(s, stop)  -- ',' or '}'
        if byte(s, i) ~= 44 then
            break
        end
        i = skip_blanks(s, i + 1)
    end
    out[#out + 1] = sub(s, from)
    return concat(out)
end

-- The escapes cjson takes besides \u, by the byte after the backslash: " \ / b f n r t.
local ESCAPES = {[34] = true, [92] = true, [47] = true, [98] = true, [102] = true, [110] = true, [114] = true,
                 [116] = true}
-- cjson reads a string byte by byte (about 18 instructions a byte: 143k for an 8 KB prompt), so a
-- string this long is checked here with plain searches and left out of what cjson reads.
local LONG_STRING = 256

-- The hex digits, by byte; and whether a \u escape's first two digits make it a UTF-16 surrogate
-- (D8-DB high, DC-DF low): cjson takes a high one only before a low one, and no low one alone.
local HEX = {}
for c in ("0123456789abcdefABCDEF"):gmatch(".") do
    HEX[byte(c)] = true
end
local HIGH = {[56] = true, [57] = true, [97] = true, [98] = true, [65] = true, [66] = true}  -- d8-db
local LOW = {[99] = true, [100] = true, [101] = true, [102] = true, [67] = true, [68] = true, [69] = true,
             [70] = true}  -- dc-df

local function hex4(s, at)
    local a, b, c, d = byte(s, at, at + 3)
    return HEX[a] and HEX[b] and HEX[c] and HEX[d]
end

-- Containers open while plain_model reads a body, by depth: the byte that closes each (reused: a
-- worker reads one body at a time, and plain_model never yields). Deeper bodies are cjson's.
local closers = {}
local MAX_DEPTH = 64
-- The first backslash at or after where plain_model reads (#s + 1: none): found once per backslash,
-- so a body full of strings is searched once, whatever their number.
local next_slash

-- The position after the JSON string that starts at q, and whether it holds an escape; nil for
-- what cjson judges itself: an escape it might refuse, a surrogate, a string without an end.
local function string_after(s, q)
    local e = find(s, '"', q + 1, true)
    if not e then
        return nil
    end
    if next_slash <= q then
        next_slash = find(s, "\\", q + 1, true) or #s + 1
    end
    if next_slash > e then
        return e + 1, false
    end
    while next_slash < e do
        local at = next_slash
        local c = byte(s, at + 1)
        local width = 2
        if c == 117 then  -- \uXXXX: four hex digits; a surrogate pair whole
            if not hex4(s, at + 2) then
                return nil
            end
            local d1, d2 = byte(s, at + 2, at + 3)
            if d1 == 100 or d1 == 68 then
                if LOW[d2] then
                    return nil
                end
                if HIGH[d2] then
                    local b1, b2, l1, l2 = byte(s, at + 6, at + 9)
                    if b1 ~= 92 or b2 ~= 117 or not (l1 == 100 or l1 == 68) or not LOW[l2] or not hex4(s, at + 8) then
                        return nil
                    end
                    width = 12
                else
                    width = 6
                end
            else
                width = 6
            end
        elseif not ESCAPES[c] then
            return nil
        end
        next_slash = find(s, "\\", at + width, true) or #s + 1
        if e < at + width then
            -- That escape was the quote taken for the end (\"): the string goes on.
            e = find(s, '"', at + width, true)
            if not e then
                return nil
            end
        end
    end
    return e + 1, true
end

-- The position after the run of digits at i (one at least), or nil.
local function digits_after(s, i)
    local c = byte(s, i)
    if not c or c < 48 or c > 57 then
        return nil
    end
    repeat
        i = i + 1
        c = byte(s, i)
    until not c or c < 48 or c > 57
    return i
end

-- The position after the JSON number at i (RFC 8259's grammar; cjson reads more, and judges it), or nil.
local function number_after(s, i)
    if byte(s, i) == 45 then  -- '-'
        i = i + 1
    end
    if byte(s, i) == 48 then  -- a lone '0' before any fraction
        i = i + 1
    else
        i = digits_after(s, i)
        if not i then
            return nil
        end
    end
    local c = byte(s, i)
    if c == 46 then  -- '.'
        i = digits_after(s, i + 1)
        if not i then
            return nil
        end
        c = byte(s, i)
    end
    if c == 101 or c == 69 then  -- 'e', 'E'
        i = i + 1
        c = byte(s, i)
        if c == 43 or c == 45 then
            i = i + 1
        end
        return digits_after(s, i)
    end
    return i
end

-- The position after `true`, `false` or `null` at i, or nil.
local function literal_after(s, i)
    local a, b, c, d, e = byte(s, i, i + 4)
    if (a == 116 and b == 114 and c == 117 and d == 101) or (a == 110 and b == 117 and c == 108 and d == 108) then
        return i + 4
    end
    if a == 102 and b == 97 and c == 108 and d == 115 and e == 101 then
        return i + 5
    end
    return nil
end

-- The body with every string of LONG_STRING bytes or more replaced by "" once string_after has read
-- it as cjson would (so cjson takes the result exactly when it takes the body, and reads the same
-- structure, numbers and short strings); nil when cjson must judge the body itself: a NUL byte, an
-- escape string_after leaves to cjson, an unterminated string. Every search moves forward: linear
-- in the body whatever its strings.
local function skeleton(s)
    if #s < LONG_STRING + 2 then
        return s  -- no string that long fits: cjson reads the body as it is (2.5k instructions spared)
    end
    if find(s, "\0", 1, true) then
        return nil
    end
    next_slash = 0
    local out, pos = nil, 1  -- the pieces so far; the first byte not yet in them
    local q = find(s, '"', 1, true)
    while q do
        local after = string_after(s, q)
        if not after then
            return nil
        end
        if after - q >= LONG_STRING then
            out = out or {}
            out[#out + 1] = sub(s, pos, q - 1)
            out[#out + 1] = '""'
            pos = after
        end
        q = find(s, '"', after, true)
    end
    if not out then
        return s
    end
    out[#out + 1] = sub(s, pos)
    return concat(out)
end

-- The request's model, read without cjson, from the bodies nearly every client sends: a JSON object
-- whose last top-level `model` is a non-empty string without escapes. nil for any other body, which
-- route() gives to cjson to judge (and to word its refusal): so this only ever takes a body cjson
-- takes, and returns the model cjson would read from it (tests/test_gateway_body.py compares the two
-- on generated and broken bodies). cjson builds a Lua table of the whole body: 8.7k instructions for
-- bench/gateway.py's 110 bytes, where this costs about 1.1k (7.6k less a request: gateway_instructions.py).
local function plain_model(s)
    if find(s, "\0", 1, true) then
        return nil  -- cjson ends its strings at a NUL: its verdict
    end
    local i = skip_blanks(s, 1)
    if byte(s, i) ~= 123 then
        return nil
    end
    next_slash = 0
    local depth, model, is_model = 0, nil, false
    local c = 123
    while true do
        -- A value starts at i (its first byte c); e: the position after it.
        local e
        if c == 123 or c == 91 then
            if is_model then
                model = false  -- an object or array: not a name
            end
            depth = depth + 1
            if depth > MAX_DEPTH then
                return nil
            end
            local closer = c + 2  -- '}' or ']'
            closers[depth] = closer
            i = skip_blanks(s, i + 1)
            c = byte(s, i)
            if c == closer then
                depth = depth - 1
                e = i + 1
            elseif closer == 93 then
                is_model = false
                goto value
            else
                goto member
            end
        elseif c == 34 then
            local escaped
            e, escaped = string_after(s, i)
            if not e then
                return nil
            end
            if is_model then
                model = not escaped and e - i > 2 and sub(s, i + 1, e - 2)
            end
        else
            e = (c == 45 or (c and c >= 48 and c <= 57)) and number_after(s, i) or literal_after(s, i)
            if not e then
                return nil
            end
            if is_model then
                model = false
            end
        end
        -- After a value: ',' and the next, or the containers it closes.
        while true do
            i = skip_blanks(s, e)
            c = byte(s, i)
            if depth == 0 then
                return c == nil and model or nil  -- the top object closed: nothing may follow it
            end
            if c == 44 then
                i = skip_blanks(s, i + 1)
                c = byte(s, i)
                if closers[depth] == 93 then
                    is_model = false
                    goto value
                end
                goto member
            end
            if c ~= closers[depth] then
                return nil
            end
            depth = depth - 1
            e = i + 1
        end
        ::member::
        do
            -- An object's member: its name (a string), ':', then its value at i.
            if c ~= 34 then
                return nil
            end
            local after, escaped = string_after(s, i)
            if not after then
                return nil
            end
            if escaped and depth == 1 then
                local u = find(s, "\\u", i, true)
                if u and u < after then
                    return nil  -- a top-level name with a \u escape may spell `model`: cjson's to read
                end
            end
            local m, o, d, e2, l = byte(s, i + 1, i + 5)
            is_model = depth == 1 and after == i + 7 and m == 109 and o == 111 and d == 100 and e2 == 101
                and l == 108
            i = skip_blanks(s, after)
            if byte(s, i) ~= 58 then
                return nil
            end
            i = skip_blanks(s, i + 1)
            c = byte(s, i)
        end
        ::value::
    end
end

-- content_by_lua of POST /v1/{chat/completions,completions,embeddings} and the path-route prefixes:
-- each location passes its engine endpoint ("/v1/chat/completions") and the pool a path route pins
-- (nil under /v1/), so neither costs a variable read.
function M.route(endpoint, pin)
    local method = ngx.req.get_method()
    if method ~= "POST" then
        local uri = var.uri
        return fail(405, "Method " .. method .. " is not allowed on " .. uri .. "; use POST.",
                    "method_not_allowed", nil, "POST")
    end
    ngx.req.read_body()  -- in memory, whole (client_body_buffer_size = client_max_body_size)...
    local raw = ngx.req.get_body_data()
    if not raw then
        -- ...but for a chunked body whose encoding (each chunk's size line, its CRLFs) fills that
        -- buffer before its data does: nginx wrote it to a temp file, which nginx also proxies from.
        local file = ngx.req.get_body_file()
        raw = file and read(file) or ""
    end
    local model = plain_model(raw)
    if not model then
        -- cjson judges the body, and words the refusal.
        local short = skeleton(raw)
        local body, err = cjson.decode(short or raw)
        if err and short and short ~= raw then
            body, err = cjson.decode(raw)  -- the reason, and its position, in the client's own bytes
        end
        if err then
            return fail(400, "We could not parse the JSON body of your request: " .. err:gsub("T_[%u_]+", TOKENS),
                        "invalid_json")
        end
        -- An array decodes to a table too: the first byte tells an object ('{').
        if type(body) ~= "table" or byte(raw, skip_blanks(raw, 1)) ~= 123 then
            return fail(400, "The request body must be a JSON object.", "invalid_json")
        end
        model = body.model
        if model == "" and short ~= raw then
            model = cjson.decode(raw).model  -- a long string left out: the model itself, or another's
        end
        if type(model) ~= "string" or model == "" then
            return fail(400, "You must provide a model parameter (a string).", "missing_model", "model")
        end
    end
    -- The model as the usage line holds it: cut (the line stays short whatever the client sends)
    -- and escaped; from here on the line is this request's, refused or routed.
    local st = route_state(request_id(), logged_names[model] or json_text(log_field(model)))
    -- entry: {pool, or `a+b` for pools sharing the model; {pool = true}; named location;
    --         served name to rewrite to ('' = none)}
    local entry = routes.models[model]
    if not entry or (pin and not entry[2][pin]) then
        local prefix = prefix_of(var.uri)
        return fail(404, "The model '" .. model .. "' does not exist under " .. prefix .. ". Available models: "
                    .. concat(visible_names(prefix, request_key_id()), ", "), "model_not_found", "model")
    end
    -- The key id only where a key has an allowlist (each ngx.var read costs ~0.6k instructions).
    local id = has_allowlists and request_key_id()
    local allow = id and routes.allow[id]
    if allow and not allow[model] then
        return fail(403, "The API key '" .. id .. "' may not use the model '" .. model .. "'. Allowed models: "
                    .. concat(visible_names(prefix_of(var.uri), id), ", "), "model_not_allowed", "model")
    end
    local location = entry[3]
    local rewrite = entry[4]
    st.pool = pin or entry[1]
    if pin then
        -- A path route pins its pool, even for a model other pools serve too.
        location = (rewrite ~= "" and "@llm_alias_" or "@llm_pool_") .. pin
    end
    if rewrite ~= "" then
        -- An alias: the engine only knows its served names, so the body goes out with the real one.
        var.llm_body = with_model(raw, rewrite)
    end
    -- The endpoint that was routed, never the raw request line: proxy_pass without variables (they
    -- cost 3.1k instructions a request) sends the client's own bytes unless the URI was set, so it
    -- is set when those differ (`/metrics/../v1/…`, `%65`, `//`, a path route's prefix).
    local raw_uri = var.request_uri
    local n = #endpoint
    if raw_uri ~= endpoint and not (byte(raw_uri, n + 1) == 63 and sub(raw_uri, 1, n) == endpoint) then
        ngx.req.set_uri(endpoint)  -- the query string stays as sent
    end
    var.llm_request_id = st.rid  -- X-Request-Id
    if affinity_of[location] then
        -- A pool routed by prefix affinity: its balancer reads the request's key ($llm_affinity).
        package.loaded.gateway_affinity.key(raw)
    end
    return ngx.exec(location)
end

-- content_by_lua of GET /v1/models (and <prefix>models): the models this key may use, OpenAI-style.
function M.models()
    local method = ngx.req.get_method()
    if method ~= "GET" and method ~= "HEAD" then
        return fail(405, "Method " .. method .. " is not allowed on " .. var.uri .. "; use GET.",
                    "method_not_allowed", nil, "GET, HEAD")
    end
    local created = ngx.time()
    local data = {}
    for i, name in ipairs(visible_names(prefix_of(var.uri), request_key_id())) do
        local meta = routes.meta[name]
        -- Written out in order (a Lua table has none): the fields as clients had them before.
        data[i] = '{"id": ' .. json_string(name) .. ', "object": "model", "created": ' .. created
            .. ', "owned_by": "llm-cluster", "root": ' .. json_string(meta[1]) .. ', "max_model_len": '
            .. meta[2] .. "}"
    end
    local body = '{"object": "list", "data": [' .. concat(data, ", ") .. "]}"
    ngx.header["Content-Type"] = "application/json"
    ngx.header["Content-Length"] = #body
    ngx.print(body)
end

-- header_filter_by_lua of the pool locations: a replica's error (4xx, 5xx) that is not JSON (a
-- server's own error page: Starlette's text/plain "Internal Server Error", uvicorn's 400, an HTML
-- page) is answered as an OpenAI error of the same status, with what the replica said in its
-- message; usage() collects that text and writes the answer at its end. JSON errors, the engines'
-- own, pass as they are. An answer without a status line is marked for usage() to answer a 502.
-- A routed answer costs one status read here.
function M.head()
    local status = ngx.status
    if status < 400 then
        if status == 9 then
            -- No status line: not HTTP (another service on the replica's port), which nginx takes
            -- for HTTP/0.9 and would pass on raw; usage() answers a 502 in its place.
            local st = routed[request_key()]
            if st then
                st.not_http = true
            end
        end
        return
    end
    local header = ngx.header
    local ctype = header["Content-Type"]
    if ctype and find(ctype, "json", 1, true) then
        return
    end
    local st = routed[request_key()]
    if not st then
        return
    end
    st.said, st.status = "", status
    -- With its charset: nginx would add the replica's own (`text/html; charset=iso-8859-1`) to a
    -- type without one, and the answer is UTF-8 whatever the replica's was.
    header["Content-Type"] = "application/json; charset=utf-8"
    header["Content-Length"] = nil  -- the answer's own length is known at its end: chunked
end

-- The answer to a replica's error that was not JSON (head()), from what it said.
local function not_json_answer(st)
    local said = log_field(st.said)
    return '{"error": {"message": ' .. json_string(utf8("The model's replica answered " .. st.status
        .. " with this, not JSON: " .. (said ~= "" and said or "(no body)"))) .. ', "type": "'
        .. (st.status >= 500 and "server_error" or "invalid_request_error") .. '", "param": null, "code": '
        .. '"upstream_error"}}'
end

-- The digits (at most 15) of the member `key: <digits>` of the object that spans i..j, and their
-- value (read with them: tonumber() costs LuaJIT's number scanner), or nil.
local function count_in(buf, key, i, j)
    local at = find(buf, key, i, true)
    if not at or at > j then
        return nil
    end
    local k = skip_blanks(buf, at + #key)
    if byte(buf, k) ~= 58 then  -- ':'
        return nil
    end
    k = skip_blanks(buf, k + 1)
    local d, value = k, 0
    while d < k + 15 do
        local c = byte(buf, d)
        if not c or c < 48 or c > 57 then
            break
        end
        value = value * 10 + c - 48
        d = d + 1
    end
    if d > k then
        return sub(buf, k, d - 1), value
    end
end

-- The '}' that closes the '{' at open, nil while it has not arrived: a usage object may hold objects
-- (llama.cpp's prompt_tokens_details and completion_tokens_details, its keys in sorted order, so before
-- total_tokens), and its first '}' is then not its end.
local function object_end(buf, open)
    local depth, at = 0, open
    while at do
        if byte(buf, at) == 123 then
            depth = depth + 1
        else
            depth = depth - 1
            if depth == 0 then
                return at
            end
        end
        at = find(buf, "[{}]", at + 1)
    end
end

-- The token counts of the usage object whose `"usage"` starts at u and whose last '}' is at close
-- (`"usage": null`, as every event of a stream with include_usage but the last has, sets nothing).
local function read_counts(st, buf, u, close)
    local open = skip_blanks(buf, u + 7)
    if byte(buf, open) ~= 58 then
        return
    end
    open = skip_blanks(buf, open + 1)
    if byte(buf, open) ~= 123 then
        return
    end
    local prompt, p = count_in(buf, COUNT_KEYS[1], open, close)
    local completion, c = count_in(buf, COUNT_KEYS[2], open, close)
    local total, t = count_in(buf, COUNT_KEYS[3], open, close)
    if prompt or completion or total then
        st.counts = COUNT_KEYS[1] .. ":" .. (prompt or "null") .. "," .. COUNT_KEYS[2] .. ":"
            .. (completion or "null") .. "," .. COUNT_KEYS[3] .. ":" .. (total or "null")
        st.prompt, st.completion, st.total = p, c, t
    end
end

-- body_filter_by_lua of the pool locations: pass every chunk on untouched, count the stream events
-- sent (so a stream the client cut off still says what it was served), and read the token counts of
-- the response's `usage` (the JSON response's, or a stream's last chunk with include_usage) once
-- its object is whole, into the request's entry the log phase reads (nginx's regex maps over the
-- bytes cost 10k instructions per request; these searches a tenth of that).
--
-- Plain searches only, counts set only when something was found. A marker cut by a chunk
-- boundary is found by carrying the few bytes that could start one (or, while a usage object is
-- unfinished, the bytes from its start) into the next chunk. Per-request state in the request's
-- gateway_metrics.routed entry.
function M.usage()
    local chunk = ngx.arg[1]
    if chunk == "" then
        -- (the last call, or a flush): nothing new, and the carried bytes wait for more. The last
        -- buffer comes only after the replica's whole answer: one it cut ends with a flush instead,
        -- which nginx still calls a complete request; record() tells them apart by `whole`.
        if ngx.arg[2] then
            local st = routed[request_key()]
            if st then
                st.whole = true
                if st.said then
                    ngx.arg[1] = not_json_answer(st)
                end
            end
        end
        return
    end
    local st = routed[request_key()]  -- route() made it: this filter runs only after its ngx.exec
    if not st then
        return  -- (never: a Lua error here would cut the response; the line would say no usage)
    end
    if st.not_http and st.stream == nil then
        -- No status line from the replica (head()): nginx sends the bytes of what it takes for an
        -- HTTP/0.9 answer as they are, without a status line or headers of its own, so the whole
        -- answer is written here, and the replica's bytes end with it.
        st.stream, st.whole = false, true
        ngx.arg[1] = NOT_HTTP_ANSWER
        ngx.arg[2] = true
        return
    end
    local said = st.said
    if said then
        -- A replica's error that is not JSON (head()): its text is kept for the answer, sent at its end.
        st.stream = false
        if #said <= LOG_FIELD_MAX then
            st.said = said .. sub(chunk, 1, LOG_FIELD_MAX + 1 - #said)
        end
        if ngx.arg[2] then
            st.whole = true
            ngx.arg[1] = not_json_answer(st)
        else
            ngx.arg[1] = ""
        end
        return
    end
    local buf, from = chunk, 0  -- from: bytes of buf scanned already, as part of the previous chunk
    local carry = st.carry
    if carry then
        from = #carry
        buf = carry .. chunk
        st.carry = nil
    end
    local n = #buf
    local stream = st.stream
    if stream == nil then
        stream = byte(buf, 1) ~= 123  -- a JSON body starts with '{'; an event stream never does
        st.stream = stream
    end
    if stream then
        -- Events start at a line start; one wholly inside the carried bytes was counted already.
        local events = st.events
        local before = st.before or 10  -- the byte before buf (a body starts a line)
        local at = find(buf, "data:", from > 4 and from - 3 or 1, true)
        while at do
            if at + 4 > from and (at > 1 and byte(buf, at - 1) or before) == 10 then
                events = events + 1
            end
            at = find(buf, "data:", at + 5, true)
        end
        st.events = events
    end
    local keep = n
    -- The last `"usage"`, found by its letters: a search for a quote stops at every quote (1.5k
    -- instructions a JSON response more).
    local u, f = nil, find(buf, 'usage"', 2, true)
    while f do
        if byte(buf, f - 1) == 34 then
            u = f - 1
        end
        f = find(buf, 'usage"', f + 6, true)
    end
    if u then
        local close = find(buf, "}", u, true)
        local open = close and find(buf, "{", u, true)
        if open and open < close then
            close = object_end(buf, open)  -- `"usage": {`: its own '}', past any object inside it
        end
        if close then
            read_counts(st, buf, u, close)
        elseif n - u < USAGE_WINDOW then
            keep = u - 1  -- no '}' yet: the counts go on in the next chunk, read them then
        end
    end
    if keep == n and byte(buf, n) ~= 10 then
        -- The last bytes may begin a marker ('"usage"', 'data:') that the next chunk finishes.
        local edge = n > 6 and n - 6 or 0
        if find(buf, '"', edge + 1, true) or (stream and find(buf, "d", edge + 1, true)) then
            keep = edge
        end
    end
    if keep < n then
        if keep > 0 then
            st.before = byte(buf, keep)
        end
        st.carry = sub(buf, keep + 1)
    else
        st.before = byte(buf, n)
    end
end

M.plain_model = plain_model  -- tests/test_gateway_body.py compares it with cjson

return M
