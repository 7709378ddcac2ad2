/*
 * llm-cluster gateway (njs): API key -> key id, routing by the request's `model`, token usage.
 *
 * Runs on njs 0.7.9 (Debian's nginx 1.22, where the tests run it) and njs 0.8.x (the official
 * nginx 1.27 image): ES5 plus `import`, and only features both have (js_set, js_var,
 * js_preload_object, js_body_filter, r.internalRedirect to a named location).
 *
 * Data comes from two preloaded objects, so neither this file nor nginx.conf holds a key:
 *   llm_routes  routes.json, generated from the stack (auth, models, pools, prefixes, allowlists)
 *   llm_keys    sha256(key) -> key id, made on the gateway host or from the stack's secret
 *               (absent when auth is off)
 * Each request runs in its own VM (two when proxied: the internal redirect to the pool location
 * starts a new one for the body filter), so module-level variables are per request and global
 * code is kept to a minimum: it runs for every VM.
 */
import crypto from 'crypto';

var LOG_FIELD_MAX = 256;  // gateway.py LOG_FIELD_MAX

/* An OpenAI-style error; every error njs answers is the client's (4xx). */
function fail(r, status, message, code, param, allow) {
    r.headersOut['Content-Type'] = 'application/json';
    if (allow) {
        r.headersOut['Allow'] = allow;
    }
    r.return(status, JSON.stringify({error: {message: message, type: 'invalid_request_error',
                                             param: param || null, code: code || null}}));
}

/* js_set $llm_key_id: the id of the presented key, '' when it is missing or unknown, or auth is off. */
function keyId(r) {
    if (!llm_routes.auth) {
        return '';  // no key file is loaded then: llm_keys is not defined
    }
    // nginx's map $llm_bearer holds what follows `Bearer ` (any case): one read, no string work.
    var key = r.variables.llm_bearer.trim();
    if (!key) {
        return '';
    }
    // Looking up the digest, not the key: the lookup time says nothing about the key.
    var id = llm_keys[crypto.createHash('sha256').update(key).digest('hex')];
    return typeof id === 'string' ? id : '';
}

/* '/smart/v1/chat/completions' -> '/smart/v1/'; the endpoints themselves never contain '/v1/'. */
function prefixOf(r) {
    var uri = r.uri;
    return uri.slice(0, uri.lastIndexOf('/v1/') + 4);
}

/* Model names a key may see under a prefix: the prefix's pool only, or every pool in list order. */
function visibleNames(prefix, id) {
    var fixed = llm_routes.prefixes[prefix];
    var allow = llm_routes.allow[id];
    var names = [];
    var seen = {};  // pools that share a model list its names once
    var order = llm_routes.order;
    for (var i = 0; i < order.length; i++) {
        if (fixed && order[i] !== fixed) {
            continue;
        }
        var listed = llm_routes.listing[order[i]];
        for (var j = 0; j < listed.length; j++) {
            if ((!allow || allow[listed[j]]) && !seen[listed[j]]) {
                seen[listed[j]] = true;
                names.push(listed[j]);
            }
        }
    }
    return names;
}

/* js_content of POST /v1/{chat/completions,completions,embeddings} and the path-route prefixes. */
function route(r) {
    if (r.method !== 'POST') {
        return fail(r, 405, 'Method ' + r.method + ' is not allowed on ' + r.uri + '; use POST.',
                    'method_not_allowed', null, 'POST');
    }
    var body;
    try {
        body = JSON.parse(r.requestText);
    } catch (e) {
        return fail(r, 400, 'We could not parse the JSON body of your request: ' + e.message,
                    'invalid_json');
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) {
        return fail(r, 400, 'The request body must be a JSON object.', 'invalid_json');
    }
    var model = body.model;
    if (typeof model !== 'string' || model === '') {
        return fail(r, 400, 'You must provide a model parameter (a string).', 'missing_model', 'model');
    }
    // The log line must fit one datagram whatever the client sends: the logged name is cut.
    r.variables.llm_model = model.length > LOG_FIELD_MAX ? model.slice(0, LOG_FIELD_MAX) : model;
    var id = r.variables.llm_key_id;
    var fixed = r.variables.llm_pin;  // the pool a path route pins, '' under /v1/ (nginx's map)
    // entry: [pool, or `a+b` for pools sharing the model; {pool: true}; named location;
    //         served name to rewrite to ('' = none)] (njs 0.7's preloaded arrays have no methods)
    var entry = llm_routes.models[model];
    if (!entry || (fixed && !entry[1][fixed])) {
        var prefix = prefixOf(r);
        return fail(r, 404, 'The model \'' + model + '\' does not exist under ' + prefix
                    + '. Available models: ' + visibleNames(prefix, id).join(', '),
                    'model_not_found', 'model');
    }
    var allow = llm_routes.allow[id];
    if (allow && !allow[model]) {
        return fail(r, 403, 'The API key \'' + id + '\' may not use the model \'' + model
                    + '\'. Allowed models: ' + visibleNames(prefixOf(r), id).join(', '),
                    'model_not_allowed', 'model');
    }
    var location = entry[2];
    r.variables.llm_pool = fixed || entry[0];
    if (fixed) {
        // A path route pins its pool, even for a model other pools serve too.
        location = (entry[3] ? '@llm_alias_' : '@llm_pool_') + fixed;
    }
    if (entry[3]) {
        // An alias: vLLM only knows its served names, so the body goes out with the real one.
        body.model = entry[3];
        r.variables.llm_body = JSON.stringify(body);
    }
    r.internalRedirect(location);
}

/* js_content of GET /v1/models (and <prefix>models): the models this key may use, OpenAI-style. */
function models(r) {
    if (r.method !== 'GET' && r.method !== 'HEAD') {
        return fail(r, 405, 'Method ' + r.method + ' is not allowed on ' + r.uri + '; use GET.',
                    'method_not_allowed', null, 'GET, HEAD');
    }
    var names = visibleNames(prefixOf(r), r.variables.llm_key_id);
    var created = Math.floor(Date.now() / 1000);
    var data = [];
    for (var i = 0; i < names.length; i++) {
        var m = llm_routes.meta[names[i]];
        data.push({id: names[i], object: 'model', created: created, owned_by: 'llm-cluster',
                   root: m[0], max_model_len: m[1]});
    }
    r.headersOut['Content-Type'] = 'application/json';
    r.return(200, JSON.stringify({object: 'list', data: data}));
}

/*
 * js_body_filter of the pool locations: pass every chunk on untouched, count the stream events sent
 * (so a stream the client cut off still says what it was served), and hand nginx the bytes after the
 * response's `usage` (the JSON response's, or a stream's last chunk with include_usage) as
 * $llm_usage, whose counts nginx's own maps read at log time.
 *
 * Every njs operation costs about a thousand instructions on njs 0.7.9 (the filter runs on every
 * chunk of every response), so the filter does native searches on the Buffer and sets variables
 * only when something was found: no string conversion of the body, no regular expression, no
 * parsing here. A marker cut by a chunk boundary is found by carrying the few bytes that could
 * start one (or, while a usage object is unfinished, the bytes from its start) into the next chunk.
 */
var USAGE_WINDOW = 400;  // bytes after "usage" that hold its counts (gateway.py USAGE_WINDOW)
var stream = -1;         // -1 before the first bytes; 1 for an event stream, 0 for a JSON body
var before = 10;         // the byte before the first carried or new byte (a body starts a line)
var carry = null;        // bytes of the previous chunk a marker may continue from
var events = 0;

function usage(r, data, flags) {
    r.sendBuffer(data, flags);
    var buf = data;
    var from = 0;  // bytes of buf that were scanned as part of the previous chunk
    if (carry !== null) {
        from = carry.length;
        buf = Buffer.concat([carry, data]);
        carry = null;
    }
    var n = buf.length;
    if (n === from) {
        return;
    }
    if (stream < 0) {
        stream = buf[0] === 123 ? 0 : 1;  // a JSON body starts with '{'; an event stream never does
    }
    if (stream) {
        // Events start at a line start; one wholly inside the carried bytes was counted already.
        var seen = events;
        for (var at = buf.indexOf('data:', from > 4 ? from - 4 : 0); at >= 0; at = buf.indexOf('data:', at + 5)) {
            if (at + 5 > from && (at ? buf[at - 1] : before) === 10) {
                events++;
            }
        }
        if (events !== seen) {
            r.variables.llm_events = '' + events;
        }
    }
    var keep = n;
    var u = buf.lastIndexOf('"usage"');
    if (u >= 0) {
        r.variables.llm_usage = buf.subarray(u, u + USAGE_WINDOW);
        if (buf.indexOf(125, u) < 0) {
            keep = u;  // no '}' yet: the counts may go on in the next chunk, read them again then
        }
    }
    if (keep === n && buf[n - 1] !== 10) {
        // The last bytes may begin a marker ('"usage"', 'data:') that the next chunk finishes.
        var edge = n > 6 ? n - 6 : 0;
        if (buf.indexOf(34, edge) >= 0 || (stream && buf.indexOf(100, edge) >= 0)) {
            keep = edge;
        }
    }
    if (keep < n) {
        before = keep ? buf[keep - 1] : before;
        carry = Buffer.from(buf.subarray(keep));
    } else {
        before = buf[n - 1];
    }
}

export default {keyId: keyId, route: route, models: models, usage: usage};
