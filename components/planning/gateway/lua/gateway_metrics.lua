-- The gateway's usage record and Prometheus metrics, inside nginx (module `gateway_metrics`).
--
-- log_by_lua at http level calls record() for every request: routed, refused, and the errors nginx
-- answers itself. record() only appends to per-worker Lua tables (the JSON usage line, the counts);
-- a timer in each worker (start(), from init_worker_by_lua) writes the lines to the day's usage file
-- with one write() per second and merges the counts into the lua_shared_dict that serve() renders on
-- GET /metrics, and stop() (exit_worker_by_lua) does the same at worker exit, so a reload or a stop
-- loses no line and no count. The shared dict outlives reloads: counters start with the container.
-- Each flush merges the counts before it counts the lines written (llm_gateway_log_lines_total moves
-- last): a scrape that sees N lines sees the counts of those N requests, never a line ahead of its count.
--
-- Metrics (labels are what the usage line carries; the line holds API key ids, never keys):
--   llm_gateway_requests_total{key_id,model,pool,status}   requests answered
--   llm_gateway_upstream_failures_total{pool,upstream}     failed attempts on a replica
--   llm_gateway_tokens_total{key_id,model,kind}            usage the engine reported, prompt|completion
--   llm_gateway_request_duration_seconds{pool}             histogram of $request_time (streams whole)
--   llm_gateway_log_lines_total / _log_write_errors_total  usage lines written / lost by a failed write
--   llm_gateway_series_overflow_total                      observations dropped at the label-set cap
-- A failed attempt is an entry of $upstream_status that is 500, 502, 503 or 504 (the statuses the
-- gateway retries elsewhere); when no replica of the pool is live nginx logs the group's name as the
-- address, counted as upstream="none". `model` is labelled only for routed requests (pool non-empty):
-- refused requests' names are whatever clients send. The label sets are capped (maxSeries).
local ffi = require "ffi"

local byte, char, find, sub, format = string.byte, string.char, string.find, string.sub, string.format
local concat, sort = table.concat, table.sort
local tonumber, tostring, pairs, ipairs = tonumber, tostring, pairs, ipairs
local var = ngx.var
local get_request = require("resty.core.base").get_request
local new_table = require("table.new")

ffi.cdef [[
int open(const char *path, int flags, int mode);
long write(int fd, const void *buf, size_t count);
int close(int fd);
typedef struct llm_dir LLM_DIR;
LLM_DIR *opendir(const char *name);
int closedir(LLM_DIR *dir);
struct llm_dirent { uint64_t d_ino; int64_t d_off; unsigned short d_reclen; unsigned char d_type; char d_name[256]; };
struct llm_dirent *readdir(LLM_DIR *dir);
int unlink(const char *path);
char *strerror(int errnum);
]]
local C = ffi.C
-- Linux's values (x86-64 and arm64 alike).
local O_WRONLY_APPEND_CREAT = 0x1 + 0x400 + 0x40
local EINTR = 4

-- Shared-dict keys: a family letter, then label values separated by spaces (key ids, pool names,
-- statuses, replica addresses and token kinds hold none), the model last (it may hold spaces):
--   r<key id> <pool> <status> <model>   t<key id> <kind> <model>   f<pool> <upstream>
--   h<pool> (the histogram's count; its buckets h<pool> <i>, its sum h<pool> sum)
local SERIES, OVERFLOW, LINES, WRITE_ERRORS = "#series", "#overflow", "#lines", "#write_errors"
local FAILED = {["500"] = true, ["502"] = true, ["503"] = true, ["504"] = true}
local KINDS = {"prompt", "completion"}
local CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
local HELP = {
    llm_gateway_requests_total = "Requests the gateway answered, by API key id, routed model, pool and HTTP status.",
    llm_gateway_upstream_failures_total = "Attempts on a replica that failed (upstream status 500, 502, 503 or "
        .. "504: engine error or not ready, connect error, broken response, timeout); upstream=none: no live replica.",
    llm_gateway_tokens_total = "Tokens in the usage the engine reported, by API key id, model and kind (prompt, completion).",
    llm_gateway_request_duration_seconds = "Time from the request's first byte to the response's last, streams whole.",
    llm_gateway_log_lines_total = "Usage log lines written to the daily usage files.",
    llm_gateway_log_write_errors_total = "Usage log lines lost because the day's usage file could not be written "
        .. "(nginx's error log says why).",
    llm_gateway_series_overflow_total = "Observations dropped because the gateway already holds maxSeries label sets.",
    llm_gateway_routing_total = "Requests of pools routed by prefix affinity, by pool and outcome: kept (the key's own "
        .. "replica), load (it was above its load bound), failure (it was ejected or failed the request), drain (it was "
        .. "drained at /admin/drain), unkeyed (no session or prompt to hash: the least busy replica).",
    llm_gateway_upstream_in_flight = "Requests in flight on each replica of a pool routed by prefix affinity.",
    llm_gateway_upstream_drained = "1 while a replica of a pool routed by prefix affinity is drained (no new request).",
}

local M = {}

-- Set by start(); the worker's state between two flushes.
local cfg, dict, bounds, nbounds
local field_max
local plain_paths = {}             -- the paths the gateway serves (settings.plain_paths) -> true
-- The usage lines not yet written, oldest first, as the pieces that make them (each line's last
-- piece ends with its newline): table.concat joins them once per write, where making each line a
-- string of its own cost 2.8k instructions a request.
local PIECES_PER_LINE = 17          -- at most (record() with a budget's field)
local pieces, npieces = {}, 0       -- (sized by start() and each write: no table growth per line)
local line_at, nlines = {}, 0       -- where each line's pieces begin
local max_pending                   -- lines held before they are written without waiting for the timer

-- Empty tables for the lines of the next write, sized for max_pending of them.
local function empty_pending()
    return new_table(PIECES_PER_LINE * max_pending, 0), new_table(max_pending, 0)
end
local day_from, day_name, ndays, last_day = {}, {}, 0, nil  -- where each day's lines begin in line_at
local counts, seen = {}, {}        -- shared-dict key -> amount to add; -> observations behind it
local hists = {}                   -- pool -> {bucket counts..., [n+1] = sum, [n+2] = count}
local known = {}                   -- keys this worker found in the shared dict (no cap check again)
local last_prune = 0
local flush                        -- defined with the writer below; record() calls it

-- JSON's escapes of the bytes a string cannot hold as they are.
local ESCAPES = {[8] = "\\b", [9] = "\\t", [10] = "\\n", [12] = "\\f", [13] = "\\r", [34] = '\\"', [92] = "\\\\"}

-- The position after the UTF-8 character whose first byte (b, 0x80 or more) is at i, or nil when
-- the bytes there are not a well-formed one (RFC 3629: no overlong form, surrogate or value past U+10FFFF).
local function char_end(s, i, b)
    local n, lo, hi
    if b >= 0xC2 and b <= 0xDF then
        n, lo, hi = 1, 0x80, 0xBF
    elseif b == 0xE0 then
        n, lo, hi = 2, 0xA0, 0xBF
    elseif b == 0xED then
        n, lo, hi = 2, 0x80, 0x9F
    elseif b >= 0xE1 and b <= 0xEF then
        n, lo, hi = 2, 0x80, 0xBF
    elseif b == 0xF0 then
        n, lo, hi = 3, 0x90, 0xBF
    elseif b >= 0xF1 and b <= 0xF3 then
        n, lo, hi = 3, 0x80, 0xBF
    elseif b == 0xF4 then
        n, lo, hi = 3, 0x80, 0x8F
    else
        return nil
    end
    local c = byte(s, i + 1)
    if not c or c < lo or c > hi then
        return nil
    end
    for k = 2, n do
        c = byte(s, i + k)
        if not c or c < 0x80 or c > 0xBF then
            return nil
        end
    end
    return i + n + 1
end

-- s as UTF-8: each byte that is no part of a well-formed character replaced by `bad` (U+FFFD), the
-- rest as it is; and with `escapes`, the bytes JSON must escape in a string escaped.
local function clean(s, i, escapes, bad)
    local n, out, from = #s, {}, 1
    while i <= n do
        local b = byte(s, i)
        if b < 128 then
            if escapes and (b < 32 or b == 34 or b == 92) then
                out[#out + 1] = sub(s, from, i - 1)
                out[#out + 1] = ESCAPES[b] or format("\\u%04x", b)
                from = i + 1
            end
            i = i + 1
        else
            local e = char_end(s, i, b)
            if e then
                i = e
            else
                out[#out + 1] = sub(s, from, i - 1)
                out[#out + 1] = bad
                i = i + 1
                from = i
            end
        end
    end
    out[#out + 1] = sub(s, from)
    return concat(out)
end

-- A JSON string's contents as nginx's escape=json writes them (" \ and control bytes escaped), and
-- UTF-8 as JSON text must be: a byte that is no part of a character is written \ufffd (the client's
-- path and model are whatever bytes it sent). The loop is what LuaJIT compiles; string patterns it does not.
local function json_text(s)
    for i = 1, #s do
        local b = byte(s, i)
        if b < 32 or b == 34 or b == 92 or b >= 128 then
            return clean(s, i, true, "\\ufffd")
        end
    end
    return s
end
M.json_text = json_text  -- gateway.lua's too, for the model it logs
-- s as valid UTF-8, each byte that is no part of a character as U+FFFD (gateway.lua's error messages,
-- which echo a client's model name).
function M.utf8(s)
    for i = 1, #s do
        if byte(s, i) >= 128 then
            return clean(s, i, false, "\239\191\189")
        end
    end
    return s
end

-- What the request path knows of a request, by the request's address, from the router (gateway.lua
-- route(), once it has the model) to the log phase: rid (the request id), model (as logged), pool
-- ('' until routed), counts (the usage text) and prompt / completion / total (numbers) from the
-- usage filter, events (a stream's), whole (the answer ended), the filter's own carry, and head()'s marks
-- (not_http; said and status of an error that is not JSON). A Lua table, not ngx.ctx (its
-- first use costs 1.5k instructions, and ngx.exec clears it) nor nginx variables (0.4k a write).
-- record() reads and forgets the entry: every request of the API server runs it (log_by_lua at
-- http level, which no location there overrides), so no entry outlives its request and a later
-- request at the same address starts without one.
local routed = {}
M.routed = routed
local uintptr_t = ffi.typeof("uintptr_t")
function M.request_key()
    return tonumber(ffi.cast(uintptr_t, get_request()))
end
local request_key = M.request_key
-- The key id gateway.key_id() found for each request that presented a known key (set_by_lua, in
-- every request before its location), read by route(), the budgets and record() where an ngx.var
-- read of $llm_key_id costs 0.6k instructions; record() forgets it, as it forgets `routed`.
local key_ids = {}
M.key_ids = key_ids
function M.key_id()
    return key_ids[request_key()] or ""
end
-- Entries record() is done with, every field nil again, for the next requests: a table that has
-- held a field keeps its slot, so a request's fields need no new keys, and no table is made or
-- collected (2.1k instructions a request less than a new table each). At most SPARE_MAX are kept.
local spare, nspare, SPARE_MAX = {}, 0, 1024

-- This request's entry (the router's): a spare one, or a new one sized for every field the filter
-- adds (a table that grows is rehashed: 1.3k instructions a request).
function M.route_state(rid, model)
    local st
    if nspare > 0 then
        st = spare[nspare]
        spare[nspare] = nil
        nspare = nspare - 1
    else
        st = new_table(0, 16)
    end
    st.rid, st.model, st.pool, st.events = rid, model, "", 0
    routed[request_key()] = st
    return st
end

-- Every field an entry may hold (route_state(), gateway.lua's usage filter and head()) set to nil,
-- the entry kept for another request: a field left here would reach a later request
-- (tests/test_gateway_metrics.py checks this list against every field the modules use).
local function retire(st)
    st.rid, st.model, st.pool, st.events, st.stream, st.whole, st.carry, st.before = nil, nil, nil, nil, nil,
        nil, nil, nil
    st.counts, st.prompt, st.completion, st.total, st.said, st.status, st.not_http = nil, nil, nil, nil, nil,
        nil, nil
    if nspare < SPARE_MAX then
        nspare = nspare + 1
        spare[nspare] = st
    end
end

local function add(key, amount)
    local c = counts[key]
    if c then
        counts[key] = c + amount
    else
        counts[key] = amount
    end
    if not known[key] then
        seen[key] = (seen[key] or 0) + 1
    end
end

-- The entries of $upstream_addr / $upstream_status: attempts separated by ", ", internal redirects by " : ".
local function attempts(s)
    local out, from = {}, 1
    while true do
        local comma, colon = find(s, ", ", from, true), find(s, " : ", from, true)
        local at, width = comma, 2
        if colon and (not comma or colon < comma) then
            at, width = colon, 3
        end
        if not at then
            out[#out + 1] = sub(s, from)
            return out
        end
        out[#out + 1] = sub(s, from, at - 1)
        from = at + width
    end
end

-- An attempt's address (host:port, [v6]:port, unix:path), or "none" for the group name nginx logs
-- when the pool had no live replica.
local function replica(addr)
    if find(addr, "unix:", 1, true) == 1 then
        return addr
    end
    local n, i = #addr, #addr
    while i > 0 and byte(addr, i) >= 48 and byte(addr, i) <= 57 do
        i = i - 1
    end
    if i < n and i > 1 and byte(addr, i) == 58 then
        return addr
    end
    return "none"
end

local function count_failures(pool)
    local addrs, statuses = attempts(var.upstream_addr or ""), attempts(var.upstream_status or "")
    for i, status in ipairs(statuses) do
        if FAILED[status] and addrs[i] then
            add("f" .. pool .. " " .. replica(addrs[i]), 1)
        end
    end
end

local function observe(pool, seconds)
    local h = hists[pool]
    if not h then
        h = {}
        for i = 1, nbounds + 2 do
            h[i] = 0
        end
        hists[pool] = h
    end
    local i = 1
    while i <= nbounds and seconds > bounds[i] do
        i = i + 1
    end
    if i <= nbounds then
        h[i] = h[i] + 1
    end
    h[nbounds + 1] = h[nbounds + 1] + seconds
    h[nbounds + 2] = h[nbounds + 2] + 1
end

-- At most max bytes of s, never a UTF-8 character cut in two (at most 3 bytes back, UTF-8's
-- longest; bytes that are not UTF-8 are cut where they are). gateway.lua's too, for the model.
local function utf8_cut(s, max)
    if #s <= max then
        return s
    end
    local at = max
    while at > max - 3 and byte(s, at + 1) >= 0x80 and byte(s, at + 1) < 0xC0 do
        at = at - 1
    end
    return sub(s, 1, at)
end
M.utf8_cut = utf8_cut

-- Whether bytes from..to of s stand in a JSON string as they are: no `"`, `\`, control byte or
-- byte past ASCII (UTF-8 or not: json_text tells).
local function json_safe(s, from, to)
    for i = from, to do
        local b = byte(s, i)
        if b < 32 or b == 34 or b == 92 or b >= 128 then
            return false
        end
    end
    return true
end

-- Whether bytes from..to of s (a client's field) go into a usage line as they are: not over
-- field_max bytes, and JSON as they are.
local function logged_as_is(s, from, to)
    return to - from < field_max and json_safe(s, from, to)
end

-- The token counts' fields of a request whose response had no usage (gateway.py NO_USAGE_COUNTS).
local NO_COUNTS = '"prompt_tokens":null,"completion_tokens":null,"total_tokens":null'
-- Where record() reads nginx's part of the line (LOG_FORMAT's order): $time_iso8601 is 25 bytes,
-- $status 3 digits, so the day, the status and the request time start at fixed offsets.
local DAY_AT = #'"time":"' + 1
local STATUS_AT = #'"time":"YYYY-MM-DDThh:mm:ss+hh:mm","status":' + 1
local REQUEST_TIME_AT = STATUS_AT + #'200,"request_time":'
local UPSTREAM_STATUS = ',"upstream_status":"'
local COMPLETED_OK = '"completed":"OK"'

-- The number nginx wrote as "<seconds>.<3 digits>" ($request_time) at from..to - 1 of s, read as
-- whole milliseconds: tonumber() of a fraction takes LuaJIT's exact decimal path (1.4k instructions a
-- request), and no loop (one here would cut record()'s trace). One division of an exact integer
-- gives the very double tonumber() does.
local function seconds_of(s, from, to)
    local whole = to - 4 == from + 1 and byte(s, from) - 48 or tonumber(sub(s, from, to - 5)) or 0
    return (whole * 1000 + (byte(s, to - 3) - 48) * 100 + (byte(s, to - 2) - 48) * 10 + byte(s, to - 1) - 48)
        / 1000
end
M.seconds_of = seconds_of  -- tests/test_gateway_metrics.py

-- log_by_lua: the request's usage line and counts, kept in this worker until the next flush.
-- The line (gateway.py LOG_FORMAT) is the request path's fields, from its entry in `routed` (the
-- requests that reached the router) or their defaults, then nginx's, which nginx composes in C
-- ($llm_usage_line) in a fixed order: "time" (25 bytes), "status" (3 digits) at fixed offsets, the
-- rest each found by a search for the one byte that ends it. The path, the client's own bytes, ends
-- the line: cut to field_max bytes and escaped here when JSON needs that.
-- `charge` (token budgets, when a key has one): charge(key_id, prompt, completion, total, events)
-- with the counts as numbers or nil; it returns the tokens charged to the key's budget, logged as
-- budget_tokens (null: none).
function M.record(charge)
    local k = request_key()
    local st = routed[k]
    if st then
        routed[k] = nil
    end
    local key_id = key_ids[k]
    if key_id then
        key_ids[k] = nil
    else
        key_id = ""
    end
    local tail = var.llm_usage_line
    -- "time":"<25>","status":<3>,"request_time":<t>,"upstream_status":"<s>",...,"path":"<path>"
    local status = sub(tail, STATUS_AT, STATUS_AT + 2)
    local q = find(tail, ",", REQUEST_TIME_AT, true)
    local request_time = seconds_of(tail, REQUEST_TIME_AT, q)
    local from = q + #UPSTREAM_STATUS
    q = find(tail, '"', from, true)
    local five = find(tail, "5", from, true)
    local failed = five and five < q
    local path_at = find(tail, 'path":"', q, true) + 7
    -- A path the gateway serves, as it was routed, is JSON as it is: looked up, not scanned (a loop
    -- here cuts record()'s trace; with gateway.lua's logged_names, 0.6k instructions a request).
    if not plain_paths[sub(tail, path_at, -2)] and not logged_as_is(tail, path_at, #tail - 1) then
        tail = sub(tail, 1, path_at - 1) .. json_text(utf8_cut(sub(tail, path_at, -2), field_max)) .. '"'
    end
    if st and st.stream ~= nil and not st.whole then
        -- The replica's answer began (the usage filter saw it) and never ended: nginx closed the
        -- client's connection without the last chunk, yet $request_completion says "OK".
        local c = find(tail, COMPLETED_OK, q, true)
        if c then
            tail = sub(tail, 1, c + #COMPLETED_OK - 4) .. sub(tail, c + #COMPLETED_OK - 1)  -- "OK" out
        end
    end
    if byte(tail, STATUS_AT) == 48 then
        -- $status is 3 digits, "009" for an answer nginx took for HTTP/0.9: not a JSON number, and
        -- not what the client got (the usage filter answered 502 in its place).
        status = (st and st.not_http) and "502" or tostring(tonumber(status))
        tail = sub(tail, 1, STATUS_AT - 1) .. status .. sub(tail, STATUS_AT + 3)
    end
    local rid, pool, model, logged, counted, events = nil, "", "", "", NO_COUNTS, 0
    local prompt, completion, total
    if st then
        rid, pool, logged, events = st.rid, st.pool, st.model, st.events
        if st.counts then
            counted, prompt, completion, total = st.counts, st.prompt, st.completion, st.total
        end
        if pool ~= "" then
            model = logged  -- a refused request's model is whatever the client sent: never a label
        end
        retire(st)  -- read whole: nothing below looks at it
    else
        rid = var.request_id
    end
    local n = npieces
    nlines = nlines + 1
    line_at[nlines] = n + 1
    pieces[n + 1] = '{"request_id":"'
    pieces[n + 2] = rid
    pieces[n + 3] = '","key_id":"'
    pieces[n + 4] = key_id
    pieces[n + 5] = '","pool":"'
    pieces[n + 6] = pool
    pieces[n + 7] = '","model":"'
    pieces[n + 8] = logged
    pieces[n + 9] = '",'
    pieces[n + 10] = counted
    pieces[n + 11] = ',"events":'
    pieces[n + 12] = events == 0 and "0" or events  -- (a number table.concat formats: 0.2k instructions)
    pieces[n + 13] = ","
    pieces[n + 14] = tail
    if charge then
        pieces[n + 15] = ',"budget_tokens":'
        pieces[n + 16] = charge(key_id, prompt, completion, total, events) or "null"
        pieces[n + 17] = "}\n"
        npieces = n + 17
    else
        pieces[n + 15] = "}\n"
        npieces = n + 15
    end
    -- "time":"YYYY-MM-DD: the day of this line, the same as the last one's unless midnight passed.
    if not last_day or find(tail, last_day, DAY_AT, true) ~= DAY_AT then
        last_day = sub(tail, DAY_AT, DAY_AT + 9)
        ndays = ndays + 1
        day_from[ndays], day_name[ndays] = nlines, last_day
    end

    add("r" .. key_id .. " " .. pool .. " " .. status .. " " .. model, 1)
    if failed then
        count_failures(pool)
    end
    if prompt then
        add("t" .. key_id .. " prompt " .. model, prompt)
    end
    if completion then
        add("t" .. key_id .. " completion " .. model, completion)
    end
    observe(pool, request_time)
    if nlines >= max_pending then
        flush()
    end
end

local function log_error(...)
    ngx.log(ngx.ERR, "llm-cluster gateway: ", ...)
end

local function errno_text()
    return ffi.string(C.strerror(ffi.errno()))
end

-- Append one day's lines with a single write() (O_APPEND: another worker's lines never land inside it).
local function append(day, text)
    local path = cfg.usage_dir .. "/usage-" .. day .. ".log"
    local fd = C.open(path, O_WRONLY_APPEND_CREAT, 420)  -- 0644, as nginx makes its logs
    if fd < 0 then
        return "cannot open " .. path .. ": " .. errno_text(), 0
    end
    local at, n, err = 0, #text, nil
    while at < n do
        local wrote = tonumber(C.write(fd, ffi.cast("const char *", text) + at, n - at))
        if wrote < 0 then
            if ffi.errno() ~= EINTR then
                err = "cannot write " .. path .. ": " .. errno_text()
                break
            end
        else
            at = at + wrote
        end
    end
    C.close(fd)
    return err, at
end

-- The usage lines kept so far, to their days' files; the number written and the number lost.
local function write_lines()
    if nlines == 0 then
        return 0, 0
    end
    local pending, n, starts, from, names, days = pieces, nlines, line_at, day_from, day_name, ndays
    starts[n + 1] = npieces + 1
    pieces, line_at = empty_pending()
    npieces, nlines, day_from, day_name, ndays, last_day = 0, 0, {}, {}, 0, nil
    if not cfg.usage_dir then
        return 0, 0  -- a layout without a usage log: the counts only
    end
    local written, lost = 0, 0
    for d = 1, days do
        local first, last = from[d], (from[d + 1] or n + 1) - 1
        local err, wrote = append(names[d], concat(pending, "", starts[first], starts[last + 1] - 1))
        if err then
            log_error(err)
            -- A line cut by a failed write is lost too: count the whole lines that made it.
            local kept, size = 0, 0
            for i = first, last do
                size = size + #concat(pending, "", starts[i], starts[i + 1] - 1)
                if size > wrote then
                    break
                end
                kept = kept + 1
            end
            written, lost = written + kept, lost + (last - first + 1 - kept)
        else
            written = written + (last - first + 1)
        end
    end
    return written, lost
end

-- Nothing here evicts an entry. A full zone would otherwise drop its least recently used counters
-- (what lua_shared_dict's add and an incr that creates do), and the next time their label set came
-- it would start again from zero: a count gone back, requests lost. Entries are made by safe_add
-- only (it fails instead) and counted by incr without init (it never makes one); a label set that
-- finds the zone full is dropped and counted as overflow, as one over maxSeries is.
local zone_full_said = false

local function drop(observations, made)
    for _, k in ipairs(made) do
        dict:delete(k)
    end
    dict:incr(SERIES, -1)
    dict:incr(OVERFLOW, observations)
    if not zone_full_said then
        zone_full_said = true
        log_error("the metrics zone ", cfg.zone, " is full: new label sets are dropped and counted in ",
                  "llm_gateway_series_overflow_total (the zone is sized for gateway.metricsMaxSeries = ",
                  cfg.max_series, " label sets of up to 512 bytes; these are longer)")
    end
    return false
end

-- Add `amount` to a label set's counter; a new label set only while fewer than max_series exist
-- and the zone has room for it. A histogram's label set is its count's key: its buckets and sum
-- are made with it, before it (a scrape never sees a count without them).
local function merge(key, amount, observations, histogram)
    if dict:incr(key, amount) then
        known[key] = true
        return true
    end
    local series = dict:incr(SERIES, 1)
    if series > cfg.max_series then
        dict:incr(SERIES, -1)
        dict:incr(OVERFLOW, observations)
        return false
    end
    local made = {}
    if histogram then
        for i = 0, nbounds do
            local k = key .. (i == 0 and " sum" or " " .. i)
            local ok, err = dict:safe_add(k, 0)
            if ok then
                made[#made + 1] = k
            elseif err ~= "exists" then
                return drop(observations, made)
            end
        end
    end
    local ok, err = dict:safe_add(key, amount)
    if not ok then
        if err ~= "exists" then
            return drop(observations, made)
        end
        dict:incr(SERIES, -1)  -- another worker made it meanwhile
        dict:incr(key, amount)
    end
    known[key] = true
    return true
end

local function merge_counts()
    local pending, observations = counts, seen
    counts, seen = {}, {}
    for key, amount in pairs(pending) do
        merge(key, amount, observations[key] or 0)
    end
    local pools = hists
    hists = {}
    for pool, h in pairs(pools) do
        local key = "h" .. pool
        if merge(key, h[nbounds + 2], h[nbounds + 2], true) then
            for i = 1, nbounds do
                if h[i] > 0 then
                    dict:incr(key .. " " .. i, h[i])
                end
            end
            dict:incr(key .. " sum", h[nbounds + 1])
        end
    end
end

local USAGE_FILE_LEN = #"usage-YYYY-MM-DD.log"

-- The daily files by day, and their sizes.
local function usage_files()
    local dir = C.opendir(cfg.usage_dir)
    if dir == nil then
        return nil, "cannot list " .. cfg.usage_dir .. ": " .. errno_text()
    end
    local days = {}
    while true do
        local entry = C.readdir(dir)
        if entry == nil then
            break
        end
        local name = ffi.string(entry.d_name)
        if #name == USAGE_FILE_LEN and find(name, "usage-", 1, true) == 1 and sub(name, -4) == ".log" then
            days[#days + 1] = sub(name, 7, 16)
        end
    end
    C.closedir(dir)
    sort(days)
    return days
end

local function file_size(path)
    local f = io.open(path, "rb")
    if not f then
        return 0
    end
    local size = f:seek("end") or 0
    f:close()
    return size
end

-- Delete the daily files older than the retention, then the oldest while the rest exceed
-- max_bytes; today's file is never deleted. Returns the names deleted, oldest first.
local function prune(today)
    local days, err = usage_files()
    if not days then
        log_error(err)
        return {}
    end
    local sizes, total = {}, 0
    for i, day in ipairs(days) do
        sizes[i] = file_size(cfg.usage_dir .. "/usage-" .. day .. ".log")
        total = total + sizes[i]
    end
    local y, m, d = tonumber(sub(today, 1, 4)), tonumber(sub(today, 6, 7)), tonumber(sub(today, 9, 10))
    local cutoff = os.date("%Y-%m-%d", os.time({year = y, month = m, day = d, hour = 12}) - cfg.retention_days * 86400)
    local deleted = {}
    for i, day in ipairs(days) do
        if day >= today then
            break
        end
        if day < cutoff or total > cfg.max_bytes then
            local name = "usage-" .. day .. ".log"
            if C.unlink(cfg.usage_dir .. "/" .. name) == 0 then
                deleted[#deleted + 1] = name
            end
            total = total - sizes[i]
        end
    end
    return deleted
end

-- The lines held, to their files, and what that made of them counted.
local function write_pending()
    local written, lost = write_lines()
    if written > 0 then
        dict:incr(LINES, written)
    end
    if lost > 0 then
        dict:incr(WRITE_ERRORS, lost)
    end
end

-- The counts first: the lines' total is what tells a reader (a scrape, the tests) that the requests
-- behind those lines are counted, so it moves only once they are.
flush = function()
    merge_counts()
    write_pending()
end

-- Each second: flush; hourly (one worker), prune the old days.
local function tick(premature)
    flush()
    if cfg.usage_dir and not premature and ngx.worker.id() == 0 and ngx.now() - last_prune >= cfg.prune_seconds then
        last_prune = ngx.now()
        for _, name in ipairs(prune(ngx.today())) do
            -- Not an error, but the operator's record going: said at the level nginx.conf logs.
            ngx.log(ngx.WARN, "llm-cluster gateway: deleted usage log ", name)
        end
    end
end

-- init_worker_by_lua: the settings (rendered by gateway.py) and this worker's flush timer.
function M.start(settings)
    cfg = settings
    field_max = settings.field_max
    max_pending = settings.max_pending
    plain_paths = {}
    for _, path in ipairs(settings.plain_paths) do
        if logged_as_is(path, 1, #path) then
            plain_paths[path] = true
        end
    end
    pieces, line_at = empty_pending()
    dict = ngx.shared[settings.zone]
    bounds, nbounds = {}, #settings.buckets
    for i, bucket in ipairs(settings.buckets) do
        bounds[i] = bucket[1]
    end
    -- The totals, made once (merge() and write_pending() count them without init: never an eviction).
    for _, k in ipairs({SERIES, OVERFLOW, LINES, WRITE_ERRORS}) do
        dict:safe_add(k, 0)
    end
    local ok, err = ngx.timer.every(settings.flush_seconds, tick)
    if not ok then
        log_error("cannot start the usage flush timer: ", err)
    end
end

-- exit_worker_by_lua: what this worker still holds (the requests it finished since the last tick).
function M.stop()
    if cfg then
        flush()
    end
end

-- --- GET /metrics ------------------------------------------------------------------------------

-- A number as Prometheus' clients write it: integers whole, others in the fewest digits that read back.
local function number(v)
    if v == math.floor(v) and v > -1e15 and v < 1e15 then
        return format("%d", v)
    end
    for digits = 15, 17 do
        local s = format("%." .. digits .. "g", v)
        if tonumber(s) == v then
            return s
        end
    end
    return tostring(v)
end

local function label(s)
    if not find(s, '[\\"\n]') then
        return s
    end
    return (s:gsub("\\", "\\\\"):gsub('"', '\\"'):gsub("\n", "\\n"))
end

-- A shared-dict key's label values: `fields` space-separated ones after the family letter, then the rest.
local function split(key, fields)
    local out, from = {}, 2
    for i = 1, fields do
        local at = find(key, " ", from, true)
        if not at then
            return nil
        end
        out[i] = sub(key, from, at - 1)
        from = at + 1
    end
    out[fields + 1] = sub(key, from)
    return out
end

-- name: the metric; names: its labels in exposition order; order: where each comes from in split().
local FAMILIES = {
    {"r", "llm_gateway_requests_total", {"key_id", "model", "pool", "status"}, 3, {1, 4, 2, 3}},
    {"f", "llm_gateway_upstream_failures_total", {"pool", "upstream"}, 1, {1, 2}},
    {"t", "llm_gateway_tokens_total", {"key_id", "model", "kind"}, 2, {1, 3, 2}},
    {"a", "llm_gateway_routing_total", {"pool", "outcome"}, 1, {1, 2}},
}

local function head(out, name, kind)
    out[#out + 1] = "# HELP " .. name .. " " .. HELP[name]
    out[#out + 1] = "# TYPE " .. name .. " " .. kind
end

local function labels(names, values, extra)
    local pairs_ = {}
    for i, name in ipairs(names) do
        pairs_[i] = name .. '="' .. label(values[i]) .. '"'
    end
    if extra then
        pairs_[#pairs_ + 1] = extra
    end
    return "{" .. concat(pairs_, ",") .. "}"
end

-- A family's series: {label text, key} sorted by label values, as Prometheus' clients write them.
local function series(keys, family)
    local out = {}
    for _, key in ipairs(keys) do
        local values = split(key, family[4])
        if values then
            local ordered = {}
            for i, from in ipairs(family[5]) do
                ordered[i] = values[from]
            end
            out[#out + 1] = {concat(ordered, "\0"), labels(family[3], ordered), key}
        end
    end
    sort(out, function(a, b) return a[1] < b[1] end)
    return out
end

-- Every metric in the Prometheus text format 0.0.4.
local function render()
    -- The totals read before any count, written last: a worker's flush may land while this renders,
    -- and it counts its lines after its counts, so the counts read below hold at least these lines'.
    local totals = {}
    for i, total in ipairs({{"llm_gateway_log_lines_total", LINES}, {"llm_gateway_log_write_errors_total", WRITE_ERRORS},
                            {"llm_gateway_series_overflow_total", OVERFLOW}}) do
        totals[i] = {total[1], dict:get(total[2]) or 0}
    end
    local by_family = {r = {}, f = {}, t = {}, a = {}, h = {}}
    for _, key in ipairs(dict:get_keys(0)) do
        local family = by_family[sub(key, 1, 1)]
        -- A histogram's label set is its count's key (no space: pool names hold none).
        if family and (family ~= by_family.h or not find(key, " ", 2, true)) then
            family[#family + 1] = key
        end
    end
    local out = {}
    for _, f in ipairs(FAMILIES) do
        head(out, f[2], "counter")
        for _, s in ipairs(series(by_family[f[1]], f)) do
            out[#out + 1] = f[2] .. s[2] .. " " .. number(dict:get(s[3]) or 0)
        end
    end
    local name = "llm_gateway_request_duration_seconds"
    head(out, name, "histogram")
    local pools = by_family.h
    sort(pools)
    for _, key in ipairs(pools) do
        local pool = {sub(key, 2)}
        local count = dict:get(key) or 0
        local cumulative = 0
        for i, bucket in ipairs(cfg.buckets) do
            cumulative = cumulative + (dict:get(key .. " " .. i) or 0)
            out[#out + 1] = name .. "_bucket" .. labels({"pool"}, pool, 'le="' .. bucket[2] .. '"') .. " " .. number(cumulative)
        end
        out[#out + 1] = name .. "_bucket" .. labels({"pool"}, pool, 'le="+Inf"') .. " " .. number(count)
        out[#out + 1] = name .. "_sum" .. labels({"pool"}, pool) .. " " .. number(dict:get(key .. " sum") or 0)
        out[#out + 1] = name .. "_count" .. labels({"pool"}, pool) .. " " .. number(count)
    end
    local affinity = package.loaded.gateway_affinity
    if affinity then
        head(out, "llm_gateway_upstream_in_flight", "gauge")
        affinity.in_flight(out, labels)
        head(out, "llm_gateway_upstream_drained", "gauge")
        affinity.drained(out, labels)
    end
    for _, total in ipairs(totals) do
        head(out, total[1], "counter")
        out[#out + 1] = total[1] .. " " .. number(total[2])
    end
    out[#out + 1] = ""
    return concat(out, "\n")
end

-- gateway_affinity.done(): one request of an affinity pool routed with this outcome.
function M.count_route(pool, outcome)
    add("a" .. pool .. " " .. outcome, 1)
end

-- content_by_lua of the metrics listener's /metrics.
function M.serve()
    ngx.header["Content-Type"] = CONTENT_TYPE
    ngx.print(render())
end

return M
