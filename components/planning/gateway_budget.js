/*
 * llm-cluster gateway (njs >= 0.8.0): token budgets per API key per window.
 *
 * Loaded only when a key has a budget (gateway.apiKeys[].tokenBudget, defaultTokenBudget), so a
 * gateway without budgets pays nothing for them. The counts live in the shared dict `llm_tokens`
 * (js_shared_dict_zone): one number per key and window, the same for every nginx worker, kept
 * across reloads. Windows are fixed, counted from the Unix epoch (86400 s: UTC days).
 *
 *   admit   js_set, referenced by the model endpoints' `if` before anything else runs: '' admits
 *           (and remembers the window to charge), '1' refuses (nginx answers 429 from the error
 *           page, with the headers set here). A request is admitted while its window's count is
 *           below the budget.
 *   charge  js_set, referenced by the usage log line, so it runs once when the request ends: adds
 *           the tokens the response's usage reports (nginx's maps read them from the body filter's
 *           bytes) to the window the request was admitted in. A stream cut before its usage chunk,
 *           or sent without stream_options.include_usage, is charged one token per event sent.
 *
 * budgets: routes.json's `budgets`, key id -> [tokens, window seconds].
 */

/* OpenAI's spelling of a duration in x-ratelimit-reset-*: "50ms", "1s", "1m0s" (gateway.py reset_interval). */
function duration(ms) {
    if (ms < 1000) {
        return Math.max(1, Math.ceil(ms)) + 'ms';
    }
    var s = Math.ceil(ms / 1000);
    return s >= 60 ? Math.floor(s / 60) + 'm' + (s % 60) + 's' : s + 's';
}

function admit(r) {
    var id = r.variables.llm_key_id;
    var budget = llm_routes.budgets[id];
    if (!budget) {
        return '';
    }
    var windowMs = budget[1] * 1000;
    var now = Date.now();
    var n = Math.floor(now / windowMs);
    var key = id + ':' + n;
    var used = ngx.shared.llm_tokens.get(key) || 0;
    var resetMs = (n + 1) * windowMs - now;
    var v = r.variables;
    v.llm_tb_limit = '' + budget[0];
    v.llm_tb_remaining = '' + (used < budget[0] ? budget[0] - used : 0);
    v.llm_tb_reset = duration(resetMs);
    if (used >= budget[0]) {
        v.llm_tb_retry_after = '' + Math.max(1, Math.ceil(resetMs / 1000));
        return '1';
    }
    v.llm_budget_key = key;
    return '';
}

function charge(r) {
    var v = r.variables;
    var key = v.llm_budget_key;
    if (!key) {
        return 'null';  // no budget, or not admitted
    }
    // nginx's maps give digits, or 'null' when the response had no usage (+'null' is NaN).
    var tokens = +v.llm_total_tokens;
    if (!(tokens >= 0)) {
        var prompt = +v.llm_prompt_tokens;
        var completion = +v.llm_completion_tokens;
        tokens = (prompt >= 0 ? prompt : 0) + (completion >= 0 ? completion : 0);
        if (!(prompt >= 0) && !(completion >= 0)) {
            tokens = +v.llm_events;
        }
    }
    if (tokens > 0) {
        try {
            ngx.shared.llm_tokens.incr(key, tokens, 0);
        } catch (e) {
            // A full zone: the request is served and logged, the miss said in the error log.
            r.error('token budget: ' + tokens + ' tokens of ' + key + ' not counted: ' + e.message);
            return 'null';
        }
    }
    return '' + tokens;
}

export default {admit: admit, charge: charge};
