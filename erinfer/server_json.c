// erinfer serve's JSON side: request bodies checked field by field into a ServeRequest, and the
// OpenAI response objects, stream chunks and errors (erinfer/server.h).
#include "erinfer/server.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/json.h"
#include "core/utf8.h"
#include "infer/runner.h"

int serve_fail(ServeError *e, int status, const char *type, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    // Both may echo a client's field name, cut anywhere (or not UTF-8 at all): they end before the
    // first byte that is not valid UTF-8, so the error JSON stays valid text.
    e->message[utf8_invalid_at(e->message, strlen(e->message))] = 0;
    e->param[utf8_invalid_at(e->param, strlen(e->param))] = 0;
    return -1;
}

char *serve_error_json(const ServeError *e) {
    cJSON *j = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code)
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

int serve_json_depth(const char *s, size_t n) { return (int)json_nesting(s, n, n, NULL, NULL); }

// ---- headers ----

static const char *skip_ows(const char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

int serve_content_type_ok(const char *ct) {
    static const char json[] = "application/json";
    if (!ct)
        return 0;
    ct = skip_ows(ct);
    if (strncasecmp(ct, json, sizeof json - 1) != 0)
        return 0;
    ct = skip_ows(ct + sizeof json - 1);
    // Parameters: "; name=value" (value maybe quoted); a charset names UTF-8 (RFC 8259 JSON is UTF-8).
    while (*ct == ';') {
        const char *name = skip_ows(ct + 1), *eq = strchr(name, '=');
        if (!eq)
            return 0;
        const char *v = skip_ows(eq + 1), *end = v;
        int quoted = *v == '"';
        end = quoted ? strchr(v + 1, '"') : v + strcspn(v, "; \t");
        if (!end)
            return 0;
        size_t vn = (size_t)(end - v) - (size_t)quoted;
        const char *val = v + quoted;
        int charset = (size_t)(eq - name) >= 7 && strncasecmp(name, "charset", 7) == 0 &&
                      skip_ows(name + 7) == eq;
        int utf8 = (vn == 5 && strncasecmp(val, "utf-8", 5) == 0) || (vn == 4 && strncasecmp(val, "utf8", 4) == 0);
        if (charset && !utf8)
            return 0;
        ct = skip_ows(end + quoted);
    }
    return *ct == 0;
}

// The name of a Host value, lowercased into out (cap bytes): the port cut off, an IPv6 literal with its
// brackets. -1 when it is not "name[:port]" or "[v6][:port]".
static int host_name(const char *h, char *out, size_t cap) {
    size_t n;
    const char *rest;
    if (*h == '[') {
        const char *close = strchr(h, ']');
        if (!close)
            return -1;
        n = (size_t)(close - h) + 1;
        rest = close + 1;
    } else {
        n = strcspn(h, ":");
        rest = h + n;
    }
    if (*rest == ':') {
        rest++;
        if (!*rest || strspn(rest, "0123456789") != strlen(rest))
            return -1;
    } else if (*rest) {
        return -1;
    }
    if (n == 0 || n >= cap)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)h[i];
        if (!isalnum(c) && !strchr(".-_[]:", c))
            return -1;
        out[i] = (char)tolower(c);
    }
    out[n] = 0;
    return 0;
}

int serve_host_allowed(const char *host, const ServeHosts *hs, const char *local) {
    if (hs->any)
        return 1;
    char name[256];
    if (!host || host_name(host, name, sizeof name) < 0)
        return 0;
    // An address of this host's own (the one the connection arrived on) is no DNS name an attacker
    // could point here: only names need the list.
    if (local && strcmp(name, local) == 0)
        return 1;
    for (int i = 0; i < hs->n; i++)
        if (strcmp(name, hs->names[i]) == 0)
            return 1;
    return 0;
}

void serve_hosts_free(ServeHosts *hs) {
    for (int i = 0; i < hs->n; i++)
        er_free(hs->names[i]);
    er_free(hs->names);
    memset(hs, 0, sizeof *hs);
}

static int hosts_add(ServeHosts *hs, const char *name, size_t n) {
    char **names = er_realloc_array(hs->names, (size_t)hs->n + 1, sizeof *names);
    if (!names)
        return ER_ENOMEM;
    hs->names = names;
    if (!(names[hs->n] = er_alloc(n + 1)))
        return ER_ENOMEM;
    for (size_t i = 0; i < n; i++)
        names[hs->n][i] = (char)tolower((unsigned char)name[i]);
    names[hs->n++][n] = 0;
    return ER_OK;
}

int serve_hosts_init(ServeHosts *hs, const char *list, int loopback_names) {
    memset(hs, 0, sizeof *hs);
    int rc = ER_OK;
    static const char *const local[] = {"localhost", "127.0.0.1", "[::1]"};
    for (size_t i = 0; loopback_names && i < sizeof local / sizeof *local; i++)
        ER_CHECK(hosts_add(hs, local[i], strlen(local[i])));
    if (list && !*skip_ows(list))
        ER_CHECK(er_error(ER_EINVAL, "--allowed-hosts is empty (give names, comma-separated; * allows any)"));
    for (const char *p = list; p && *p;) {
        size_t n = strcspn(p, ",");
        const char *s = skip_ows(p);
        size_t k = n - (size_t)(s - p);
        while (k > 0 && (s[k - 1] == ' ' || s[k - 1] == '\t'))
            k--;
        char name[256];
        if (k == 1 && s[0] == '*') {
            hs->any = 1;
        } else {
            char entry[256];
            snprintf(entry, sizeof entry, "%.*s", (int)(k < 255 ? k : 255), s);
            if (k == 0 || k >= sizeof entry || host_name(entry, name, sizeof name) < 0 || strlen(name) != k)
                ER_CHECK(er_error(ER_EINVAL, "--allowed-hosts: \"%.64s\" is not a host name or address (give names "
                                  "without a port, comma-separated; * allows any)", entry));
            ER_CHECK(hosts_add(hs, name, k));
        }
        p += n + (p[n] == ',');
    }
done:
    if (rc < 0)
        serve_hosts_free(hs);
    return rc;
}

void serve_request_free(ServeRequest *r) {
    er_free(r->prompt);
    for (int i = 0; i < r->n_conv; i++)
        er_free((char *)r->conv[i].content);
    er_free(r->conv);
    cJSON_Delete(r->tools_json);
    er_free(r->memory_block);
    er_free(r->before.p);
    cJSON_Delete(r->memory_log);
    for (int i = 0; i < ER_STOP_MAX; i++)
        er_free(r->stop[i]);
    er_free(r->route);
    er_free(r->tool_prefix);
    memset(r, 0, sizeof *r);
}

#define BAD(param, ...) serve_fail(e, 400, "invalid_request_error", param, __VA_ARGS__)

// A number field in [lo, hi] (absent or null: *out untouched).
static int opt_number(const cJSON *o, const char *key, double lo, double hi, double *out, ServeError *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return BAD(key, "'%s' must be a number", key);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return BAD(key, "'%s' must be between %.15g and %.15g", key, lo, hi); // integers in full, not 1.07374e+09
    *out = v->valuedouble;
    return 0;
}

static int opt_int(const cJSON *o, const char *key, double lo, double hi, int64_t *out, ServeError *e) {
    double d = NAN;
    if (opt_number(o, key, lo, hi, &d, e) < 0)
        return -1;
    if (isnan(d))
        return 0;
    if (d != floor(d))
        return BAD(key, "'%s' must be an integer", key);
    *out = (int64_t)d;
    return 0;
}

static int opt_bool(const cJSON *o, const char *key, int *out, ServeError *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsBool(v))
        return BAD(key, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

// The fields a request may have; anything else is refused by name (a typo must not pass silently).
static int check_fields(const cJSON *root, int chat, ServeError *e) {
    static const char *const common[] = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop",
                                         "seed", "stream", "stream_options", "user", "reasoning_budget", "route",
                                         "logprobs", "reasoning"};
    static const char *const chat_only[] = {"messages", "max_completion_tokens", "tools", "tool_choice",
                                            "parallel_tool_calls", "top_logprobs", "chat_template_kwargs", "memory"};
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        int known = chat ? 0 : strcmp(f->string, "prompt") == 0;
        for (size_t i = 0; !known && i < sizeof common / sizeof *common; i++)
            known = strcmp(f->string, common[i]) == 0;
        for (size_t i = 0; chat && !known && i < sizeof chat_only / sizeof *chat_only; i++)
            known = strcmp(f->string, chat_only[i]) == 0;
        if (!known)
            return BAD(f->string, "unknown field '%.64s'", f->string);
    }
    return 0;
}

// "stop": a string or an array of up to ER_STOP_MAX non-empty strings.
static int parse_stop(const cJSON *root, ServeRequest *r, ServeError *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop"), *s;
    if (!v || cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return BAD("stop", "'stop' must be a string or an array of strings");
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > ER_STOP_MAX)
        return BAD("stop", "'stop' holds at most %d strings", ER_STOP_MAX);
    int n = 0;
    for (s = cJSON_IsString(v) ? v : v->child; s; s = cJSON_IsString(v) ? NULL : s->next) {
        if (!cJSON_IsString(s) || !s->valuestring[0] || strlen(s->valuestring) > ER_STOP_MAX_LEN)
            return BAD("stop", "each stop string must be a non-empty string of at most %d bytes", ER_STOP_MAX_LEN);
        if (!(r->stop[n++] = er_strdup(s->valuestring)))
            return serve_fail(e, 500, "server_error", NULL, "out of memory");
    }
    r->p.stop = (const char *const *)r->stop;
    r->p.n_stop = n;
    return 0;
}

// "logprobs": chat: a boolean, with "top_logprobs" (0..20) alternatives at each token; completions: the
// number of alternatives (0..20; OpenAI's legacy field). Absent or null: none.
static int parse_logprobs(const cJSON *root, ServeRequest *r, ServeError *e) {
    int64_t top = -1, n = -1;
    if (opt_int(root, "top_logprobs", 0, ER_TOP_LOGPROBS_MAX, &top, e) < 0)
        return -1;
    if (r->chat) {
        if (opt_bool(root, "logprobs", &r->logprobs, e) < 0)
            return -1;
        if (top >= 0 && !r->logprobs)
            return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    } else {
        if (opt_int(root, "logprobs", 0, ER_TOP_LOGPROBS_MAX, &n, e) < 0)
            return -1;
        r->logprobs = n >= 0;
        top = n;
    }
    r->p.top_logprobs = top > 0 ? (int)top : 0;
    return 0;
}

// A thinking switch: `obj` (the request's field `field`, NULL or null: absent) must be an object whose
// only key is `key`, a boolean; *on = 1 / 0, or -1 when absent.
static int opt_switch(const cJSON *root, const char *field, const char *key, int *on, ServeError *e) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, field), *k;
    *on = -1;
    if (!o || cJSON_IsNull(o))
        return 0;
    if (!cJSON_IsObject(o))
        return BAD(field, "'%s' must be an object such as {\"%s\": true}", field, key);
    cJSON_ArrayForEach(k, o) {
        char name[136];
        snprintf(name, sizeof name, "%s.%.64s", field, k->string);
        if (strcmp(k->string, key) != 0)
            return BAD(name, "unknown field '%s' (only '%s.%s' is read)", name, field, key);
        if (!cJSON_IsBool(k))
            return BAD(name, "'%s' must be a boolean", name);
        *on = cJSON_IsTrue(k);
    }
    return 0;
}

// The route: "route" ("auto", "direct", "reasoning"), or the thinking switch as vLLM and llama-server take
// it, "reasoning": {"enabled": B} and "chat_template_kwargs": {"enable_thinking": B} (true = "reasoning",
// false = "direct"); fields that say different routes are refused. A forced route needs an adapter or a
// hybrid-thinking model (Qwen3); on a server with neither, thinking false is what it does anyway and is
// accepted as it is, thinking true is refused.
static int parse_route(const cJSON *root, const ServeLimits *lim, ServeRequest *r, ServeError *e) {
    const cJSON *rv = cJSON_GetObjectItemCaseSensitive(root, "route");
    const char *route = NULL, *said = "route";
    if (rv && !cJSON_IsNull(rv)) {
        if (!cJSON_IsString(rv) || (strcmp(rv->valuestring, "auto") != 0 && strcmp(rv->valuestring, "direct") != 0 &&
                                    strcmp(rv->valuestring, "reasoning") != 0))
            return BAD("route", "'route' must be \"auto\", \"direct\" or \"reasoning\"");
        route = rv->valuestring;
    }
    int on[2];
    static const char *const fields[2][2] = {{"reasoning", "enabled"}, {"chat_template_kwargs", "enable_thinking"}};
    for (int i = 0; i < 2; i++) {
        if (opt_switch(root, fields[i][0], fields[i][1], &on[i], e) < 0)
            return -1;
        const char *want = on[i] < 0 ? NULL : on[i] ? "reasoning" : "direct";
        if (want && route && strcmp(want, route) != 0)
            return BAD(fields[i][0], "'%s.%s' (%s) conflicts with '%s' (\"%s\"): give one", fields[i][0],
                       fields[i][1], on[i] ? "true" : "false", said, route);
        if (want && !route) {
            route = want;
            said = i ? "chat_template_kwargs.enable_thinking" : "reasoning.enabled";
        }
    }
    if (!route || strcmp(route, "auto") == 0)
        return 0;
    int thinking = strcmp(said, "route") != 0;
    if (!lim->adapter && !lim->hybrid) { // refused now, not after queueing
        if (thinking && strcmp(route, "direct") == 0)
            return 0; // thinking off on a model that does not think: nothing to switch
        return BAD(thinking ? said : "route", "'%s' %s needs a hybrid-thinking model (Qwen3) or a server started with "
                   "--adapter", thinking ? said : "route", thinking ? "true" : route);
    }
    if (!(r->route = er_strdup(route)))
        return serve_fail(e, 500, "server_error", NULL, "out of memory");
    r->p.route = r->route;
    return 0;
}

// Sampling, lengths, n, seed, stream and the extensions (reasoning_budget, route and the thinking switch).
static int parse_params(const cJSON *root, const ServeLimits *lim, ServeRequest *r, ServeError *e) {
    ErGenParams *p = &r->p;
    double t = 1.0, top_p = 1.0, min_p = 0;
    int64_t top_k = 0, n = 1, seed = 0, max_tokens = lim->max_tokens, mct = -1, budget = 0;
    if (opt_number(root, "temperature", 0, 2, &t, e) < 0 || opt_number(root, "top_p", 0, 1, &top_p, e) < 0 ||
        opt_number(root, "min_p", 0, 1, &min_p, e) < 0 || opt_int(root, "top_k", 0, 1 << 24, &top_k, e) < 0 ||
        opt_int(root, "n", 1, lim->max_n, &n, e) < 0 || opt_int(root, "seed", -9.2e18, 9.2e18, &seed, e) < 0 ||
        opt_int(root, "max_tokens", 1, 1 << 30, &max_tokens, e) < 0 ||
        opt_int(root, "max_completion_tokens", 1, 1 << 30, &mct, e) < 0 ||
        opt_int(root, "reasoning_budget", 0, 1 << 30, &budget, e) < 0 || opt_bool(root, "stream", &r->stream, e) < 0)
        return -1;
    if (top_p <= 0)
        return BAD("top_p", "'top_p' must be greater than 0");
    if (min_p >= 1) // a min_p of 1 keeps only tokens as probable as the most probable: refused by the sampler
        return BAD("min_p", "'min_p' must be at least 0 and less than 1");
    const cJSON *sv = cJSON_GetObjectItemCaseSensitive(root, "seed");
    r->seeded = sv && !cJSON_IsNull(sv);
    if (mct > 0)
        max_tokens = mct;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so) && (!cJSON_IsObject(so) || opt_bool(so, "include_usage", &r->include_usage, e) < 0))
        return e->status ? -1 : BAD("stream_options", "'stream_options' must be an object");
    if (parse_route(root, lim, r, e) < 0)
        return -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsString(model))
        return BAD("model", "'model' must be a string");
    p->temperature = (float)t;
    p->top_p = (float)top_p;
    p->min_p = (float)min_p;
    p->top_k = (int)top_k;
    p->n_samples = (int)n;
    p->seed = (uint64_t)seed;
    // The session's room caps every request: a larger max_tokens is cut to the cap.
    p->max_new_tokens = max_tokens < lim->max_tokens ? (int)max_tokens : lim->max_tokens;
    p->budget = (int)budget;
    if (budget > 0 && budget + p->answer_tokens > lim->max_tokens)
        return BAD("reasoning_budget", "'reasoning_budget' (%lld) and the %d answer tokens after it exceed this "
                   "server's --max-tokens (%d): at most %d", (long long)budget, p->answer_tokens, lim->max_tokens,
                   lim->max_tokens - p->answer_tokens);
    if (budget > 0 && p->max_new_tokens < budget + p->answer_tokens)
        p->max_new_tokens = (int)(budget + p->answer_tokens < lim->max_tokens ? budget + p->answer_tokens
                                                                               : lim->max_tokens);
    return parse_logprobs(root, r, e) < 0 ? -1 : parse_stop(root, r, e);
}

// A message's content: a string, null, or an array of {"type": "text", "text": ...} parts (joined).
static int message_content(const cJSON *m, int i, StrBuf *b, ServeError *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content"), *part;
    strbuf_puts(b, "");
    if (!c || cJSON_IsNull(c))
        return 0;
    if (cJSON_IsString(c)) {
        strbuf_puts(b, c->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(c))
        return BAD("messages", "messages[%d].content must be a string or an array of text parts", i);
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text))
            return BAD("messages", "messages[%d].content: only text parts are supported", i);
        strbuf_puts(b, text->valuestring);
    }
    return 0;
}

// An assistant message's tool_calls folded into its content, as the template renders them.
static int message_tool_calls(const cJSON *calls, int i, StrBuf *b, ServeError *e) {
    int n = cJSON_GetArraySize(calls), rc = 0;
    const char **names = er_calloc((size_t)n + 1, sizeof *names), **args = er_calloc((size_t)n + 1, sizeof *args);
    if (!names || !args) {
        er_free(names);
        er_free(args);
        return serve_fail(e, 500, "server_error", NULL, "out of memory");
    }
    const cJSON *c;
    int k = 0;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsString(name) || !cJSON_IsString(a)) {
            rc = BAD("messages", "messages[%d].tool_calls[%d] needs function.name and function.arguments strings", i,
                     k);
            break;
        }
        names[k] = name->valuestring;
        args[k++] = a->valuestring;
    }
    char *text = NULL;
    if (rc == 0 && chat_tool_calls_text(b->p, names, args, n, &text) < 0)
        rc = serve_fail(e, 500, "server_error", NULL, "out of memory");
    if (text) {
        b->n = 0;
        strbuf_puts(b, text);
    }
    er_free(text);
    er_free(names);
    er_free(args);
    return rc;
}

// "tool_choice": "auto" (the default) leaves the call to the model; "none" leaves the tools out of the
// prompt. "required" and {"type": "function", "function": {"name": N}} are enforced the way a server
// without a grammar engine can: the answer's start is forced (ErGenParams.response_prefix; the engine
// prefills it, so it is not in the sample's text: each choice's text is r->tool_prefix + the sample's).
// The bytes are those Qwen2.5's (and Qwen3's) tool template writes for a call: "<tool_call>\n" for
// "required"; for a name, "<tool_call>\n{\"name\": \"N\", \"arguments\":" (N JSON-escaped), cut
// before the space that the model's own next token (" {") carries. What follows is the model's own: it
// is parsed like an unforced call, and an unclosed call or invalid JSON is returned as text, flagged.
// With an adapter or heads loaded the route decides how the answer starts (the adapter's reasoning
// prefix; the pipeline's direct route forces nothing), so forcing is refused there rather than
// silently dropped or put in place of the reasoning; so is a reasoning budget with it.
static int parse_tool_choice(const cJSON *tools, const cJSON *choice, const ServeLimits *lim, ServeRequest *r,
                             ServeError *e) {
    int n_tools = cJSON_IsArray(tools) ? cJSON_GetArraySize(tools) : 0;
    r->tools = n_tools > 0;
    if (!choice || cJSON_IsNull(choice))
        return 0;
    const char *s = cJSON_IsString(choice) ? choice->valuestring : NULL;
    if (s && strcmp(s, "none") == 0)
        r->tools = 0;
    if (s && (strcmp(s, "none") == 0 || strcmp(s, "auto") == 0))
        return 0;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    int named = cJSON_IsObject(choice) && cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0 &&
                cJSON_IsString(name) && name->valuestring[0];
    if (!named && !(s && strcmp(s, "required") == 0))
        return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                  "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (n_tools == 0)
        return BAD("tool_choice", "'tool_choice' %s needs a non-empty 'tools'",
                   named ? "naming a function" : "\"required\"");
    int found = !named;
    for (const cJSON *t = named ? tools->child : NULL; t && !found; t = t->next) {
        const cJSON *tn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        found = cJSON_IsString(tn) && strcmp(tn->valuestring, name->valuestring) == 0;
    }
    if (!found)
        return BAD("tool_choice", "'tool_choice' names the function '%.64s', which is not in 'tools'",
                   name->valuestring);
    if (lim->routed)
        return BAD("tool_choice", "'tool_choice' %s is enforced by forcing the start of the answer, which a server "
                                  "with an adapter or heads leaves to the route; use \"auto\"",
                   named ? "naming a function" : "\"required\"");
    if (r->p.route && strcmp(r->p.route, "auto") != 0) // the route forces the answer's start itself
        return BAD("tool_choice", "'tool_choice' %s cannot be combined with a forced route or thinking switch",
                   named ? "naming a function" : "\"required\"");
    if (r->p.budget > 0) // its forced "</think> ... Final answer: " would land inside the call
        return BAD("tool_choice", "'tool_choice' %s cannot be combined with 'reasoning_budget'",
                   named ? "naming a function" : "\"required\"");
    StrBuf b = {0};
    strbuf_puts(&b, "<tool_call>\n");
    if (named) {
        char *quoted = NULL;
        if (chat_json_dumps(name, &quoted) < 0)
            b.oom = 1;
        strbuf_puts(&b, "{\"name\": ");
        strbuf_puts(&b, quoted ? quoted : "");
        strbuf_puts(&b, ", \"arguments\":");
        er_free(quoted);
    }
    if (b.oom) {
        er_free(b.p);
        return serve_fail(e, 500, "server_error", NULL, "out of memory");
    }
    r->tool_prefix = b.p;
    r->p.response_prefix = r->tool_prefix;
    return 0;
}

static const char *const roles[] = {"system", "user", "assistant", "tool"};

// The role's static name (NULL: not one of the four).
static const char *known_role(const char *r) {
    for (size_t i = 0; i < sizeof roles / sizeof *roles; i++)
        if (strcmp(r, roles[i]) == 0)
            return roles[i];
    return NULL;
}

int serve_conv_push(ServeRequest *r, const char *role, const char *content, ServeError *e) {
    if (r->n_conv == r->cap_conv) {
        int cap = r->cap_conv ? 2 * r->cap_conv : 8;
        ChatMessage *g = er_realloc_array(r->conv, (size_t)cap, sizeof *g);
        if (!g)
            return serve_fail(e, 500, "server_error", NULL, "out of memory");
        r->conv = g;
        r->cap_conv = cap;
    }
    char *copy = er_strdup(content ? content : "");
    const char *name = known_role(role);
    if (!copy || !name) {
        er_free(copy);
        return serve_fail(e, 500, "server_error", NULL, name ? "out of memory" : "a message of an unknown role");
    }
    r->conv[r->n_conv++] = (ChatMessage){name, copy};
    return 0;
}

const char *serve_last_user(const ServeRequest *r) {
    for (int i = r->n_conv - 1; i >= 0; i--)
        if (strcmp(r->conv[i].role, "user") == 0)
            return r->conv[i].content;
    return NULL;
}

// Whether name is one of the server's memory tools (an OpenAI tools array).
static int mem_tool_name(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *tn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(tn) && strcmp(tn->valuestring, name) == 0)
            return 1;
    }
    return 0;
}

// "memory": {"recall": B, "tools": B, "save": B} (each optional) on a server with --memory; a request without it
// gets recall and the tools, and no save.
static int parse_memory(const cJSON *root, const ServeLimits *lim, ServeRequest *r, ServeError *e) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "memory"), *f;
    r->memory_recall = lim->memory;
    r->memory_tools = lim->memory_tools != NULL;
    if (!m || cJSON_IsNull(m))
        return 0;
    if (!lim->memory)
        return BAD("memory", "'memory' needs a server with a memory store (erinfer serve --memory FILE)");
    if (!cJSON_IsObject(m))
        return BAD("memory", "'memory' must be an object of booleans: recall, tools, save");
    cJSON_ArrayForEach(f, m) {
        if (strcmp(f->string, "recall") != 0 && strcmp(f->string, "tools") != 0 && strcmp(f->string, "save") != 0)
            return BAD("memory", "unknown field 'memory.%.64s' (recall, tools, save)", f->string);
        if (!cJSON_IsBool(f))
            return BAD("memory", "'memory.%s' must be a boolean", f->string);
    }
    return opt_bool(m, "recall", &r->memory_recall, e) < 0 || opt_bool(m, "tools", &r->memory_tools, e) < 0 ||
                   opt_bool(m, "save", &r->memory_save, e) < 0
               ? -1
               : 0;
}

// The messages into r->conv (tool calls folded into their assistant's content), the tools and tool_choice, and
// which memory the request uses. The memory tools are offered with tool_choice "auto" to a request of one sample
// (each round of calls continues that sample's answer), beside its own tools, which must not take their names.
static int collect_messages(const cJSON *root, const ServeLimits *lim, ServeRequest *r, ServeError *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages"), *m;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) < 1)
        return BAD("messages", "'messages' must be a non-empty array");
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools))
        return BAD("tools", "'tools' must be an array");
    if (parse_tool_choice(tools, choice, lim, r, e) < 0 || parse_memory(root, lim, r, e) < 0)
        return -1;
    const cJSON *t, *own = cJSON_IsArray(tools) && lim->memory_tools ? tools : NULL; // their names are taken
    int choice_none = cJSON_IsString(choice) && strcmp(choice->valuestring, "none") == 0;
    cJSON_ArrayForEach(t, own) {
        const cJSON *tn = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(tn) && mem_tool_name(lim->memory_tools, tn->valuestring))
            return BAD("tools", "the tool name '%s' is the server's own memory tool (erinfer serve --memory)",
                       tn->valuestring);
    }
    r->memory_tools = r->memory_tools && r->p.n_samples == 1 && !choice_none && !r->tool_prefix;
    if (r->tools && !(r->tools_json = cJSON_Duplicate(tools, 1)))
        return serve_fail(e, 500, "server_error", NULL, "out of memory");
    r->tools |= r->memory_tools; // the output's calls are parsed (and held back from a stream)
    int k = 0;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role) || !known_role(role->valuestring))
            return BAD("messages", "messages[%d] needs a role of system, user, assistant or tool", k);
        StrBuf text = {0};
        int rc = message_content(m, k, &text, e);
        if (rc == 0 && cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0)
            rc = message_tool_calls(calls, k, &text, e);
        if (rc == 0 && text.oom)
            rc = serve_fail(e, 500, "server_error", NULL, "out of memory");
        if (rc == 0)
            rc = serve_conv_push(r, role->valuestring, text.p, e);
        er_free(text.p);
        if (rc < 0)
            return -1;
        k++;
    }
    return 0;
}

// r->conv rendered with the chat template into r->prompt, its system text replaced by the one that announces the
// tools offered and followed by the recalled memory. The memory goes last: requests with the same system text and
// tools share the prompt's start, which the batch's prefix cache reuses, while each request recalls its own.
static int render_conv(ServeRequest *r, ChatStyle style, const ServeLimits *lim, ServeError *e) {
    int n = r->n_conv, has_sys = n > 0 && strcmp(r->conv[0].role, "system") == 0, rc = 0;
    const char *own = has_sys ? r->conv[0].content : NULL;
    cJSON *tools = NULL;
    int offer = r->memory_tools && lim->memory_tools;
    if (r->tools_json || offer) {
        tools = r->tools_json ? cJSON_Duplicate(r->tools_json, 1) : cJSON_CreateArray();
        const cJSON *t, *builtin = offer ? lim->memory_tools : NULL;
        cJSON_ArrayForEach(t, builtin) cJSON_AddItemToArray(tools, cJSON_Duplicate(t, 1));
    }
    char *with_tools = NULL;
    if (tools && chat_tools_system(style, own, tools, &with_tools) < 0)
        rc = BAD("tools", "this model's chat template has no tool format");
    cJSON_Delete(tools);
    StrBuf sys = {0};
    const char *base = with_tools ? with_tools : own ? own : chat_default_system(style);
    if (rc == 0 && r->memory_block) {
        strbuf_puts(&sys, base ? base : "");
        strbuf_puts(&sys, base && base[0] ? "\n\n" : "");
        strbuf_puts(&sys, r->memory_block);
    }
    const char *system = sys.p ? sys.p : with_tools;
    ChatMessage *all = rc == 0 ? er_calloc((size_t)n + 1, sizeof *all) : NULL;
    if (rc == 0 && (!all || sys.oom))
        rc = serve_fail(e, 500, "server_error", NULL, "out of memory");
    int n_use = rc == 0 ? (system ? chat_set_system(all, n + 1, r->conv, n, system) : n) : 0;
    if (rc == 0 && !system)
        memcpy(all, r->conv, sizeof *all * (size_t)n);
    er_free(r->prompt);
    r->prompt = NULL;
    if (rc == 0 && chat_render(style, all, n_use, CHAT_ADD_GENERATION_PROMPT, &r->prompt, NULL) < 0)
        rc = BAD("messages", "the messages cannot be rendered with this model's chat template");
    er_free(all);
    er_free(with_tools);
    er_free(sys.p);
    return rc;
}

// /v1/completions: "prompt" is a string (or an array holding one string).
static int completion_prompt(const cJSON *root, ServeRequest *r, ServeError *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1)
        p = p->child;
    if (!cJSON_IsString(p))
        return BAD("prompt", "'prompt' must be a string");
    if (!p->valuestring[0]) // no token to start from
        return BAD("prompt", "'prompt' must not be empty");
    if (!(r->prompt = er_strdup(p->valuestring)))
        return serve_fail(e, 500, "server_error", NULL, "out of memory");
    return 0;
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

// A key given twice in one object, anywhere in the request, is refused by name: parsers disagree on which
// one counts (Python and JavaScript take the last, cJSON the first), so a proxy that checks the request
// could read another value than the server. top: the top-level field holding o (NULL: o is the request).
static int check_duplicates(const cJSON *o, const char *top, ServeError *e) {
    int n = cJSON_GetArraySize(o), rc = 0;
    const cJSON *c;
    if (cJSON_IsObject(o) && n > 1) {
        const char **names = er_alloc(sizeof *names * (size_t)n);
        if (!names)
            return serve_fail(e, 500, "server_error", NULL, "out of memory");
        int k = 0;
        cJSON_ArrayForEach(c, o) names[k++] = c->string;
        qsort(names, (size_t)n, sizeof *names, name_cmp);
        for (int i = 1; i < n && rc == 0; i++)
            if (strcmp(names[i], names[i - 1]) == 0)
                rc = top ? BAD(top, "the key '%.64s' appears twice in an object of '%.64s'", names[i], top)
                         : BAD(names[i], "the key '%.64s' appears twice in the request", names[i]);
        er_free(names);
    }
    cJSON_ArrayForEach(c, o) {
        if (rc < 0)
            break;
        if (cJSON_IsObject(c) || cJSON_IsArray(c))
            rc = check_duplicates(c, top ? top : c->string, e);
    }
    return rc;
}

// A request body as a JSON object (*root; cJSON_Delete it, also after a refusal): nested at most lim->json_depth,
// nothing after it, no key twice.
static int parse_body(const char *body, size_t n, const ServeLimits *lim, cJSON **root, ServeError *e) {
    if (serve_json_depth(body, n) > lim->json_depth)
        return BAD(NULL, "the request nests deeper than %d levels", lim->json_depth);
    const char *end = NULL;
    *root = cJSON_ParseWithLengthOpts(body, n, &end, 0);
    if (!*root || json_trailing_at(body, n, end) >= 0)
        return BAD(NULL, "the request body is not valid JSON");
    if (!cJSON_IsObject(*root))
        return BAD(NULL, "the request body must be a JSON object");
    return check_duplicates(*root, NULL, e);
}

// ---- /v1/embeddings ----

void serve_embed_request_free(ServeEmbedRequest *r) {
    for (int i = 0; i < r->n; i++)
        er_free(r->texts[i]);
    er_free(r->texts);
    memset(r, 0, sizeof *r);
}

static int embed_input(const cJSON *in, ServeEmbedRequest *r, ServeError *e) {
    if (cJSON_IsString(in)) {
        r->texts = er_calloc(1, sizeof(char *));
        if (!r->texts || !(r->texts[0] = er_strdup(in->valuestring)))
            return serve_fail(e, 500, "server_error", NULL, "out of memory");
        r->n = 1;
        return 0;
    }
    if (!cJSON_IsArray(in) || cJSON_GetArraySize(in) == 0)
        return BAD("input", "'input' must be a string or a non-empty array of strings");
    int n = cJSON_GetArraySize(in), i = 0;
    if (n > SERVE_EMBED_MAX_INPUTS)
        return BAD("input", "'input' has %d entries, at most %d", n, SERVE_EMBED_MAX_INPUTS);
    const cJSON *it;
    if (!(r->texts = er_calloc((size_t)n, sizeof(char *))))
        return serve_fail(e, 500, "server_error", NULL, "out of memory");
    cJSON_ArrayForEach(it, in) {
        if (cJSON_IsNumber(it) || cJSON_IsArray(it))
            return BAD("input", "'input' as token ids is not supported: send the text");
        if (!cJSON_IsString(it))
            return BAD("input", "'input[%d]' must be a string", i);
        if (!(r->texts[i] = er_strdup(it->valuestring)))
            return serve_fail(e, 500, "server_error", NULL, "out of memory");
        r->n = ++i;
    }
    return 0;
}

static int embed_fields(const cJSON *root, int embed_size, ServeEmbedRequest *r, ServeError *e) {
    static const char *const known[] = {"model", "input", "encoding_format", "dimensions", "user"};
    const cJSON *f;
    cJSON_ArrayForEach(f, root) {
        size_t k = 0;
        while (k < sizeof known / sizeof *known && strcmp(f->string, known[k]) != 0)
            k++;
        if (k == sizeof known / sizeof *known)
            return BAD(f->string, "unknown field '%.64s'", f->string);
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsString(model))
        return BAD("model", "'model' must be a string");
    const cJSON *user = cJSON_GetObjectItemCaseSensitive(root, "user");
    if (user && !cJSON_IsNull(user) && !cJSON_IsString(user))
        return BAD("user", "'user' must be a string");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "encoding_format");
    if (fmt && !cJSON_IsNull(fmt)) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") != 0 && strcmp(fmt->valuestring, "base64") != 0))
            return BAD("encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->base64 = strcmp(fmt->valuestring, "base64") == 0;
    }
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dimensions");
    if (dims && !cJSON_IsNull(dims)) {
        double d = dims->valuedouble;
        if (!cJSON_IsNumber(dims) || d != (double)(int)d || d < 1 || d > embed_size)
            return BAD("dimensions", "'dimensions' must be an integer in 1..%d (the model's embedding size)",
                       embed_size);
        r->dimensions = (int)d;
    }
    const cJSON *in = cJSON_GetObjectItemCaseSensitive(root, "input");
    if (!in)
        return BAD("input", "'input' is required");
    return embed_input(in, r, e);
}

int serve_parse_embeddings(const char *body, size_t n, const ServeLimits *lim, int embed_size, ServeEmbedRequest *r,
                           ServeError *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    cJSON *root = NULL;
    int rc = parse_body(body, n, lim, &root, e);
    if (rc == 0)
        rc = embed_fields(root, embed_size, r, e);
    cJSON_Delete(root);
    if (rc < 0)
        serve_embed_request_free(r);
    return rc;
}

// n bytes as base64 (RFC 4648, with padding).
static void put_base64(StrBuf *out, const unsigned char *p, size_t n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {abc[v >> 18 & 63], abc[v >> 12 & 63], i + 1 < n ? abc[v >> 6 & 63] : '=', i + 2 < n ? abc[v & 63] : '='};
        strbuf_put(out, q, 4);
    }
}

void serve_embeddings_json(StrBuf *out, const ServeEmbedRequest *r, const float *v, int dims, const char *model,
                           int tokens) {
    char num[32];
    strbuf_puts(out, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < r->n; i++) {
        const float *x = v + (size_t)i * dims;
        strbuf_puts(out, i ? ",{\"object\":\"embedding\",\"index\":" : "{\"object\":\"embedding\",\"index\":");
        strbuf_int(out, i);
        strbuf_puts(out, ",\"embedding\":");
        if (r->base64) { // the float32 values' bytes, little-endian, as OpenAI's clients decode them
            unsigned char *le = er_alloc((size_t)dims * 4);
            if (!le) {
                out->oom = 1;
                return;
            }
            for (int k = 0; k < dims; k++) {
                uint32_t u;
                memcpy(&u, &x[k], 4);
                for (int b = 0; b < 4; b++)
                    le[4 * k + b] = (unsigned char)(u >> 8 * b);
            }
            strbuf_puts(out, "\"");
            put_base64(out, le, (size_t)dims * 4);
            strbuf_puts(out, "\"");
            er_free(le);
        } else {
            strbuf_puts(out, "[");
            for (int k = 0; k < dims; k++) {
                snprintf(num, sizeof num, k ? ",%.9g" : "%.9g", x[k]);
                strbuf_puts(out, num);
            }
            strbuf_puts(out, "]");
        }
        strbuf_puts(out, "}");
    }
    strbuf_puts(out, "],\"model\":");
    cJSON *m = cJSON_CreateString(model ? model : "");
    char *ms = m ? cJSON_PrintUnformatted(m) : NULL;
    strbuf_puts(out, ms ? ms : "\"\"");
    cJSON_free(ms);
    cJSON_Delete(m);
    strbuf_puts(out, ",\"usage\":{\"prompt_tokens\":");
    strbuf_int(out, tokens);
    strbuf_puts(out, ",\"total_tokens\":");
    strbuf_int(out, tokens);
    strbuf_puts(out, "}}");
}

int serve_render(ServeRequest *r, ChatStyle style, const Tokenizer *tok, const ServeLimits *lim, ServeError *e) {
    if (r->chat && render_conv(r, style, lim, e) < 0)
        return -1;
    int *ids = NULL, rc = 0;
    if (tok_encode(tok, r->prompt, strlen(r->prompt), &ids, &r->prompt_tokens) < 0)
        rc = BAD(r->chat ? "messages" : "prompt", "the prompt is not valid UTF-8 text");
    er_free(ids);
    ids = NULL;
    // A forced tool call start takes positions too (the engine prefills it after the prompt). Its bytes
    // are in the prompt (the tools' names), which encoded: only memory can fail here.
    int forced = 0;
    if (rc == 0 && r->tool_prefix && tok_encode(tok, r->tool_prefix, strlen(r->tool_prefix), &ids, &forced) < 0)
        rc = serve_fail(e, 500, "server_error", NULL, "out of memory");
    er_free(ids);
    int used = r->prompt_tokens + forced;
    // Without max_tokens the answer may take what the context leaves (up to the cap).
    r->p.max_new_tokens = r->max_tokens ? r->max_tokens : lim->max_tokens;
    if (rc == 0 && !r->max_tokens && used < lim->context && r->p.max_new_tokens > lim->context - used)
        r->p.max_new_tokens = lim->context - used;
    if (rc == 0 && r->p.budget > 0 && r->p.max_new_tokens < r->p.budget + r->p.answer_tokens)
        rc = BAD("reasoning_budget", "'reasoning_budget' (%d) and the %d answer tokens after it do not fit the %d "
                 "positions the prompt (%d tokens) leaves of the context", r->p.budget, r->p.answer_tokens,
                 lim->context - used > 0 ? lim->context - used : 0, used);
    if (rc == 0 && used + r->p.max_new_tokens > lim->context)
        rc = BAD(r->chat ? "messages" : "prompt",
                 "the prompt (%d tokens%s) and max_tokens (%d) exceed the context of %d positions", used,
                 forced ? ", the forced tool call start included" : "", r->p.max_new_tokens, lim->context);
    return rc;
}

int serve_parse_request(const char *body, size_t n, int chat, ChatStyle style, const Tokenizer *tok,
                        const ServeLimits *lim, ServeRequest *r, ServeError *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    er_gen_params_init(&r->p);
    r->chat = chat;
    cJSON *root = NULL;
    int rc = parse_body(body, n, lim, &root, e);
    if (rc == 0)
        rc = check_fields(root, chat, e);
    if (rc == 0)
        rc = parse_params(root, lim, r, e);
    if (rc == 0)
        rc = chat ? collect_messages(root, lim, r, e) : completion_prompt(root, r, e);
    const cJSON *mt = rc == 0 ? cJSON_GetObjectItemCaseSensitive(root, "max_tokens") : NULL;
    const cJSON *mct = rc == 0 ? cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens") : NULL;
    if ((mt && !cJSON_IsNull(mt)) || (mct && !cJSON_IsNull(mct)))
        r->max_tokens = r->p.max_new_tokens;
    cJSON_Delete(root);
    if (rc == 0)
        rc = serve_render(r, style, tok, lim, e);
    if (rc < 0)
        serve_request_free(r);
    return rc;
}

// ---- responses ----

static const char *finish_name(int f) { return f == ER_FINISH_LENGTH ? "length" : "stop"; }

static cJSON *usage_json(const ServeResult *s) {
    const ErStats *st = s->stats;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)st->generated_tokens);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(st->prompt_tokens + st->generated_tokens));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", st->prompt_reused);
    return u;
}

static cJSON *response_head(const ServeRequest *r, const ServeIds *ids, int chunk) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", ids->id);
    cJSON_AddStringToObject(j, "object", !r->chat ? "text_completion" : chunk ? "chat.completion.chunk"
                                                                                : "chat.completion");
    cJSON_AddNumberToObject(j, "created", (double)ids->created);
    cJSON_AddStringToObject(j, "model", ids->model);
    return j;
}

// A JSON string of n bytes holding NUL bytes, as a raw item: the pieces between them escaped by cJSON,
// each NUL as \u0000 (NULL text: out of memory).
static cJSON *string_nul(const char *text, size_t n) {
    StrBuf b = {0};
    strbuf_puts(&b, "\"");
    for (size_t at = 0, len; at <= n; at += len + 1) { // the pieces before, between and after the NULs
        const char *z = memchr(text + at, 0, n - at);
        len = z ? (size_t)(z - (text + at)) : n - at;
        char *piece = er_alloc(len + 1), *q = NULL;
        if (piece) {
            memcpy(piece, text + at, len);
            piece[len] = 0;
        }
        cJSON *s = piece ? cJSON_CreateString(piece) : NULL;
        if (s && (q = cJSON_PrintUnformatted(s)))
            strbuf_put(&b, q + 1, strlen(q) - 2);
        else
            b.oom = 1;
        cJSON_free(q);
        cJSON_Delete(s);
        er_free(piece);
        if (z)
            strbuf_puts(&b, "\\u0000");
    }
    strbuf_puts(&b, "\"");
    cJSON *r = b.oom ? cJSON_CreateNull() : cJSON_CreateRaw(b.p);
    er_free(b.p);
    return r;
}

// A string of n bytes (text is not NUL-terminated there).
static cJSON *string_n(const char *text, size_t n) {
    if (n && memchr(text, 0, n)) // a model may write a NUL byte: escaped, where a cJSON string would end
        return string_nul(text, n);
    char *t = er_alloc(n + 1);
    if (!t)
        return cJSON_CreateNull();
    if (n) // an empty text may be NULL
        memcpy(t, text, n);
    t[n] = 0;
    cJSON *s = cJSON_CreateString(t);
    er_free(t);
    return s;
}

// [{"index": k, "id": ..., "type": "function", "function": {"name", "arguments"}}, ...]
static cJSON *tool_calls_json(const ChatToolCall *c, int n, const ServeIds *ids, int choice, int with_index) {
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; k < n; k++) {
        cJSON *o = cJSON_CreateObject();
        char id[64];
        snprintf(id, sizeof id, "call_%s_%d_%d", ids->id + strlen("chatcmpl-"), choice, k);
        if (with_index)
            cJSON_AddNumberToObject(o, "index", k);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddStringToObject(o, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(o, "function");
        cJSON_AddStringToObject(f, "name", c[k].name);
        cJSON_AddStringToObject(f, "arguments", c[k].arguments);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

// ---- logprobs ----

int serve_walk(ServeWalk *w, const Tokenizer *tok, const ErSample *x) {
    for (; w->n < x->n_tokens; w->n++) {
        if (w->n == w->cap) {
            int cap = w->cap * 2 + 64;
            size_t *at = er_realloc_array(w->at, (size_t)cap, sizeof *at);
            if (at)
                w->at = at;
            long *ac = at ? er_realloc_array(w->at_chars, (size_t)cap, sizeof *ac) : NULL;
            if (!ac)
                return -1;
            w->at_chars = ac;
            w->cap = cap;
        }
        size_t nb = 0;
        const char *b = tok_token_bytes(tok, x->tokens[w->n], &nb);
        w->at[w->n] = w->bytes;
        w->at_chars[w->n] = w->chars;
        if (w->npend > 0 && b && nb > 0) {
            // A token that does not go on with the pending character starts after it: the pending bytes, a
            // maximal ill-formed subpart then, become one U+FFFD (3 bytes, 1 code point) before its text.
            unsigned char next[sizeof w->pend + 1];
            memcpy(next, w->pend, (size_t)w->npend);
            next[w->npend] = (unsigned char)b[0];
            int len = utf8_next(next, (size_t)w->npend + 1);
            if ((len < 0 ? -len : len) <= w->npend) {
                w->at[w->n] += 3;
                w->at_chars[w->n] += 1;
            }
        }
        size_t len = (size_t)w->npend + (b ? nb : 0);
        char *buf = er_alloc(len + 1);
        if (!buf)
            return -1;
        memcpy(buf, w->pend, (size_t)w->npend);
        if (b)
            memcpy(buf + w->npend, b, nb);
        size_t c = tok_utf8_complete(buf, len);
        if (len - c > sizeof w->pend) // cannot happen (an incomplete character has at most 3 bytes)
            c = len;
        char *t = NULL;
        size_t tl = 0;
        if (c > 0 && tok_text_from_bytes(buf, c, &t, &tl) < 0) {
            er_free(buf);
            return -1;
        }
        w->bytes += tl;
        for (size_t i = 0; i < tl; i++)
            w->chars += ((unsigned char)t[i] & 0xc0) != 0x80;
        w->npend = (int)(len - c);
        memcpy(w->pend, buf + c, (size_t)w->npend);
        er_free(t);
        er_free(buf);
    }
    return 0;
}

int serve_walk_count(const ServeWalk *w, size_t end) {
    int k = 0;
    while (k < w->n && w->at[k] < end)
        k++;
    return k;
}

void serve_walk_free(ServeWalk *w) {
    er_free(w->at);
    er_free(w->at_chars);
    memset(w, 0, sizeof *w);
}

// -inf (a token the model rules out) as OpenAI writes it: JSON has no infinity.
static double lp_value(float v) { return isfinite(v) ? (double)v : -9999.0; }

// A token's text (its raw bytes converted, a lone piece of a character as U+FFFD) and its length; NULL
// out of memory.
static char *token_text(const Tokenizer *tok, int id, const char **raw, size_t *nb, size_t *tl) {
    *nb = *tl = 0;
    *raw = tok_token_bytes(tok, id, nb);
    if (!*raw)
        *raw = "", *nb = 0;
    char *t = NULL;
    if (tok_text_from_bytes(*raw, *nb, &t, tl) < 0)
        t = NULL, *tl = 0;
    return t;
}

// {"token", "logprob", "bytes"} of the chat shape.
static cJSON *chat_token(const Tokenizer *tok, int id, float lp) {
    const char *raw;
    size_t nb, tl;
    char *t = token_text(tok, id, &raw, &nb, &tl);
    cJSON *o = cJSON_CreateObject(), *bytes = cJSON_CreateArray();
    cJSON_AddItemToObject(o, "token", string_n(t, tl));
    cJSON_AddNumberToObject(o, "logprob", lp_value(lp));
    for (size_t i = 0; i < nb; i++)
        cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)raw[i]));
    cJSON_AddItemToObject(o, "bytes", bytes);
    er_free(t);
    return o;
}

// {text: logprob} of the completions shape, a text already there kept (the more probable token's).
static void dict_add(cJSON *d, const Tokenizer *tok, int id, float lp) {
    const char *raw;
    size_t nb, tl;
    char *t = token_text(tok, id, &raw, &nb, &tl); // a NUL byte ends the key: cJSON keys are C strings
    if (!cJSON_GetObjectItemCaseSensitive(d, t ? t : ""))
        cJSON_AddNumberToObject(d, t ? t : "", lp_value(lp));
    er_free(t);
}

cJSON *serve_logprobs_json(const ServeRequest *r, const Tokenizer *tok, const ErSample *x, const ServeWalk *w,
                           int from, int to) {
    cJSON *o = cJSON_CreateObject();
    int m = x->n_top;
    if (r->chat) {
        cJSON *content = cJSON_AddArrayToObject(o, "content");
        for (int k = from; k < to; k++) {
            cJSON *t = chat_token(tok, x->tokens[k], x->logprobs[k]), *top = cJSON_AddArrayToObject(t, "top_logprobs");
            for (int j = 0; j < m; j++)
                cJSON_AddItemToArray(top, chat_token(tok, x->top_tokens[k * m + j], x->top_logprobs[k * m + j]));
            cJSON_AddItemToArray(content, t);
        }
        cJSON_AddNullToObject(o, "refusal");
        return o;
    }
    cJSON *tokens = cJSON_AddArrayToObject(o, "tokens"), *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs"), *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int k = from; k < to; k++) {
        const char *raw;
        size_t nb, tl;
        char *t = token_text(tok, x->tokens[k], &raw, &nb, &tl);
        cJSON_AddItemToArray(tokens, string_n(t, tl));
        er_free(t);
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_value(x->logprobs[k])));
        cJSON *d = cJSON_CreateObject();
        int drawn = 0;
        for (int j = 0; j < m; j++) {
            dict_add(d, tok, x->top_tokens[k * m + j], x->top_logprobs[k * m + j]);
            drawn |= x->top_tokens[k * m + j] == x->tokens[k];
        }
        if (!drawn) // OpenAI: the drawn token is always there, so up to logprobs + 1 entries
            dict_add(d, tok, x->tokens[k], x->logprobs[k]);
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)w->at_chars[k]));
    }
    return o;
}

// The logprobs of the tokens of x its text shows, from token `from` on (NULL: none left, or out of
// memory: null).
static cJSON *sample_logprobs(const ServeRequest *r, const Tokenizer *tok, const ErSample *x, int from) {
    ServeWalk w = {0};
    cJSON *lp = NULL;
    if (serve_walk(&w, tok, x) == 0) {
        int to = serve_walk_count(&w, x->text_len);
        if (from < to || (from == 0 && !r->stream)) // a whole choice has its logprobs, if empty
            lp = serve_logprobs_json(r, tok, x, &w, from, to);
    }
    serve_walk_free(&w);
    return lp;
}

// The sample order of the choices: with a vote winner and n > 1, the winner's first voter is choice 0,
// the others follow in sample order.
static void choice_order(const ServeResult *s, int *order) {
    int n = s->n, w = -1;
    const ErRoute *rt = s->route;
    for (int i = 0; rt && rt->answer && rt->answers && w < 0 && i < n; i++)
        if (rt->answers[i] && strcmp(rt->answers[i], rt->answer) == 0)
            w = i;
    int k = 0;
    if (w >= 0)
        order[k++] = w;
    for (int i = 0; i < n; i++)
        if (i != w)
            order[k++] = i;
}

// Choice text of sample x into t: the content of earlier rounds of memory tool calls, the forced start of a
// tool call (the engine prefilled it: it is not in the sample's text) and the sample's text. 0, or -1 out of
// memory (t freed).
static int choice_text(const ServeRequest *r, const ErSample *x, StrBuf *t) {
    *t = (StrBuf){0};
    strbuf_put(t, r->before.p ? r->before.p : "", r->before.n);
    strbuf_puts(t, r->tool_prefix ? r->tool_prefix : "");
    strbuf_put(t, x->text ? x->text : "", x->text_len);
    if (!t->oom)
        return 0;
    er_free(t->p);
    *t = (StrBuf){0};
    return -1;
}

// One non-streamed choice of sample x.
static cJSON *choice_json(const ServeRequest *r, const ServeIds *ids, const ServeResult *s, const ErSample *x,
                          int index) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", index);
    const char *finish = finish_name(x->finish);
    cJSON *lp = r->logprobs ? sample_logprobs(r, s->tok, x, 0) : NULL;
    if (!r->chat) {
        cJSON_AddItemToObject(c, "text", string_n(x->text, x->text_len));
        cJSON_AddItemToObject(c, "logprobs", lp ? lp : cJSON_CreateNull());
        cJSON_AddStringToObject(c, "finish_reason", finish);
        return c;
    }
    cJSON *m = cJSON_AddObjectToObject(c, "message");
    cJSON_AddStringToObject(m, "role", "assistant");
    StrBuf t;
    if (choice_text(r, x, &t) < 0) {
        cJSON_Delete(lp);
        cJSON_Delete(c);
        return NULL;
    }
    ChatToolCall *calls = NULL;
    int nc = 0;
    size_t clen = t.n;
    int bad = r->tools && chat_parse_tool_calls(t.p, t.n, &calls, &nc, &clen) < 0;
    if (bad)
        clen = t.n;
    if (nc > 0 && clen == 0)
        cJSON_AddNullToObject(m, "content");
    else
        cJSON_AddItemToObject(m, "content", string_n(t.p, clen));
    er_free(t.p);
    if (nc > 0) {
        cJSON_AddItemToObject(m, "tool_calls", tool_calls_json(calls, nc, ids, index, 0));
        finish = "tool_calls";
    }
    if (bad) // the model wrote a <tool_call> that does not parse: returned as text, flagged
        cJSON_AddTrueToObject(c, "invalid_tool_call");
    chat_tool_calls_free(calls, nc);
    cJSON_AddItemToObject(c, "logprobs", lp ? lp : cJSON_CreateNull());
    cJSON_AddStringToObject(c, "finish_reason", finish);
    return c;
}

// The erinfer extension: the request's seed (drawn by the server when the request gave none) and, with
// the pipeline, its route, switcher score, verifier scores and votes (as `erinfer generate --json`
// reports them) and each choice's sample.
static cJSON *extension_json(const ServeRequest *r, const ServeResult *s, const int *order) {
    cJSON *x = s->route ? runner_route_json(s->route, s->samples, s->n) : cJSON_CreateObject();
    if (!x)
        return NULL;
    // As an integer: cJSON prints a double with 15 digits when they read back within a relative epsilon,
    // which drops the last digit of a 16-digit seed; the value the request sent (or the server drew).
    char seed[24];
    snprintf(seed, sizeof seed, "%" PRId64, (int64_t)r->p.seed);
    cJSON_AddRawToObject(x, "seed", seed);
    if (r->memory_log)
        cJSON_AddItemToObject(x, "memory", cJSON_Duplicate(r->memory_log, 1));
    if (!s->route)
        return x;
    cJSON *a = cJSON_AddArrayToObject(x, "choice_samples");
    for (int i = 0; a && i < s->n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(order ? order[i] : i));
    return x;
}

static char *print_free(cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

char *serve_response_json(const ServeRequest *r, const ServeIds *ids, const ServeResult *s) {
    int n = s->n;
    int *order = er_calloc((size_t)n + 1, sizeof *order);
    if (!order)
        return NULL;
    choice_order(s, order);
    cJSON *j = response_head(r, ids, 0), *cs = cJSON_AddArrayToObject(j, "choices");
    int whole = 1;
    for (int i = 0; i < n; i++) {
        cJSON *c = choice_json(r, ids, s, s->samples[order[i]], i);
        whole &= c != NULL;
        cJSON_AddItemToArray(cs, c);
    }
    cJSON_AddItemToObject(j, "usage", usage_json(s));
    cJSON *x = extension_json(r, s, order);
    if (x)
        cJSON_AddItemToObject(j, "erinfer", x);
    er_free(order);
    if (whole)
        return print_free(j);
    cJSON_Delete(j);
    return NULL;
}

static void put_event(StrBuf *out, cJSON *j) {
    char *s = print_free(j);
    strbuf_puts(out, "data: ");
    strbuf_puts(out, s ? s : "{}");
    strbuf_puts(out, "\n\n");
    er_free(s);
}

// A chunk with one choice: its delta (chat) or text (completions) and finish reason (NULL: null).
static cJSON *chunk_choice(const ServeRequest *r, const ServeIds *ids, int i, cJSON *delta, const char *finish,
                           cJSON *lp) {
    cJSON *j = response_head(r, ids, 1), *cs = cJSON_AddArrayToObject(j, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", i);
    if (r->chat) {
        cJSON_AddItemToObject(c, "delta", delta);
    } else { // the content moves (a raw string when it holds a NUL byte)
        cJSON *t = cJSON_DetachItemFromObjectCaseSensitive(delta, "content");
        cJSON_AddItemToObject(c, "text", t ? t : cJSON_CreateString(""));
        cJSON_Delete(delta);
    }
    cJSON_AddItemToObject(c, "logprobs", lp ? lp : cJSON_CreateNull());
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(cs, c);
    return j;
}

void serve_chunk_delta(StrBuf *out, const ServeRequest *r, const ServeIds *ids, int i, const char *text, size_t n,
                       int role, cJSON *lp) {
    cJSON *d = cJSON_CreateObject();
    if (role)
        cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddItemToObject(d, "content", string_n(text, n));
    put_event(out, chunk_choice(r, ids, i, d, NULL, lp));
}

// The end of choice i: the text not streamed yet (content, then its tool calls) and the finish reason;
// the logprobs not streamed yet (tokens from lp_sent on) with the last content delta, or else the finish chunk.
static cJSON *chunk_end(StrBuf *out, const ServeRequest *r, const ServeIds *ids, const ServeResult *s, int i,
                        size_t streamed, int roled, int lp_sent) {
    const ErSample *x = s->samples[i];
    cJSON *lp = r->logprobs ? sample_logprobs(r, s->tok, x, lp_sent) : NULL;
    StrBuf t;
    if (choice_text(r, x, &t) < 0) { // the job answers 500 (out.oom)
        out->oom = 1;
        return chunk_choice(r, ids, i, cJSON_CreateObject(), finish_name(x->finish), lp);
    }
    ChatToolCall *calls = NULL;
    int nc = 0;
    size_t clen = t.n;
    int bad = r->chat && r->tools && chat_parse_tool_calls(t.p, t.n, &calls, &nc, &clen) < 0;
    if (bad || clen < streamed)
        clen = t.n;
    if (clen > streamed || !roled) {
        serve_chunk_delta(out, r, ids, i, t.p + streamed, clen > streamed ? clen - streamed : 0, !roled, lp);
        lp = NULL;
    }
    er_free(t.p);
    const char *finish = finish_name(x->finish);
    if (nc > 0) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddItemToObject(d, "tool_calls", tool_calls_json(calls, nc, ids, i, 1));
        put_event(out, chunk_choice(r, ids, i, d, NULL, NULL));
        finish = "tool_calls";
    }
    chat_tool_calls_free(calls, nc);
    cJSON *end = chunk_choice(r, ids, i, cJSON_CreateObject(), finish, lp);
    if (bad)
        cJSON_AddTrueToObject(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(end, "choices"), 0),
                              "invalid_tool_call");
    return end;
}

void serve_chunk_final(StrBuf *out, const ServeRequest *r, const ServeIds *ids, const ServeResult *s,
                       const size_t *streamed, const int *roled, const int *lp_sent) {
    int n = s->n;
    for (int i = 0; i < n; i++) {
        cJSON *end = chunk_end(out, r, ids, s, i, streamed[i], roled[i], lp_sent[i]);
        cJSON *x = i == n - 1 ? extension_json(r, s, NULL) : NULL;
        if (x)
            cJSON_AddItemToObject(end, "erinfer", x);
        put_event(out, end);
    }
    if (r->include_usage) {
        cJSON *j = response_head(r, ids, 1);
        cJSON_AddArrayToObject(j, "choices");
        cJSON_AddItemToObject(j, "usage", usage_json(s));
        put_event(out, j);
    }
    strbuf_puts(out, "data: [DONE]\n\n");
}

void serve_chunk_error(StrBuf *out, const ServeError *e) {
    char *s = serve_error_json(e);
    strbuf_puts(out, "data: ");
    strbuf_puts(out, s ? s : "{}");
    strbuf_puts(out, "\n\ndata: [DONE]\n\n");
    er_free(s);
}

size_t serve_tool_safe_prefix(const char *text, size_t n) {
    static const char tag[] = "<tool_call>";
    const size_t m = sizeof tag - 1;
    const char *p = memmem(text, n, tag, m);
    if (p)
        return (size_t)(p - text);
    // The longest tail that is a beginning of the tag waits for the next bytes.
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (memcmp(text + n - k, tag, k) == 0)
            return n - k;
    return n;
}

size_t serve_stream_safe(const ServeRequest *r, const char *text, size_t n) {
    return !r->tools ? n : r->tool_prefix ? 0 : serve_tool_safe_prefix(text, n);
}
