#include "data/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/strbuf.h"
#include "core/json.h"

static void put_turn(StrBuf *b, const char *role, const char *content) {
    strbuf_puts(b, "<|im_start|>");
    strbuf_puts(b, role);
    strbuf_puts(b, "\n");
    strbuf_puts(b, content);
    strbuf_puts(b, "<|im_end|>\n");
}

static int starts_with(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }

static int ends_with(const char *s, const char *p) {
    size_t n = strlen(s), m = strlen(p);
    return n >= m && memcmp(s + n - m, p, m) == 0;
}

// Last occurrence of needle in [s, s+n), or NULL.
static const char *find_last(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m > n)
        return NULL;
    for (size_t i = n - m + 1; i-- > 0;)
        if (memcmp(s + i, needle, m) == 0)
            return s + i;
    return NULL;
}

// The Qwen templates wrap consecutive tool messages into one user turn of <tool_response> blocks.
static void put_tool(StrBuf *b, const ChatMessage *msgs, int n, int i) {
    if (i == 0 || strcmp(msgs[i - 1].role, "tool") != 0)
        strbuf_puts(b, "<|im_start|>user");
    strbuf_puts(b, "\n<tool_response>\n");
    strbuf_puts(b, msgs[i].content);
    strbuf_puts(b, "\n</tool_response>");
    if (i == n - 1 || strcmp(msgs[i + 1].role, "tool") != 0)
        strbuf_puts(b, "<|im_end|>\n");
}

// Qwen3 assistant turn. Mirrors the Jinja template: content is what follows the last </think>
// (leading newlines dropped); reasoning is what precedes the first </think>, after the last <think>,
// with newlines trimmed.
static void put_qwen3_assistant(StrBuf *b, const char *content, int after_last_query, int is_last) {
    const char *c = content, *r = "";
    size_t clen = strlen(content), rlen = 0;
    const char *close = strstr(content, "</think>");
    if (close) {
        const char *last_close = find_last(content, clen, "</think>");
        c = last_close + strlen("</think>");
        while (*c == '\n')
            c++;
        clen = strlen(c);
        r = content;
        rlen = (size_t)(close - content);
        while (rlen && r[rlen - 1] == '\n')
            rlen--;
        const char *open = find_last(r, rlen, "<think>");
        if (open) {
            rlen -= (size_t)(open + strlen("<think>") - r);
            r = open + strlen("<think>");
        }
        while (rlen && *r == '\n') {
            r++;
            rlen--;
        }
    }
    strbuf_puts(b, "<|im_start|>assistant\n");
    if (after_last_query && (is_last || rlen > 0)) {
        while (rlen && *r == '\n') {
            r++;
            rlen--;
        }
        while (rlen && r[rlen - 1] == '\n')
            rlen--;
        while (clen && *c == '\n') {
            c++;
            clen--;
        }
        strbuf_puts(b, "<think>\n");
        strbuf_put(b, r, rlen);
        strbuf_puts(b, "\n</think>\n\n");
    }
    strbuf_put(b, c, clen);
    strbuf_puts(b, "<|im_end|>\n");
}

static int known_role(const char *role) {
    return strcmp(role, "system") == 0 || strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0 ||
           strcmp(role, "tool") == 0;
}

int chat_render(ChatStyle style, const ChatMessage *msgs, int n, int flags, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (n < 0 || (n > 0 && !msgs))
        return er_error(ER_EINVAL, "chat: bad message list (n = %d)", n);
    if (style != CHAT_CHATML && style != CHAT_QWEN25 && style != CHAT_QWEN3 && style != CHAT_PLAIN)
        return er_error(ER_EINVAL, "chat: unknown style %d", (int)style);
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return er_error(ER_EINVAL, "chat: message %d has no %s", i, msgs[i].role ? "content" : "role");
        if (!known_role(msgs[i].role))
            return er_error(ER_EUNSUPPORTED, "chat: message %d has role \"%s\" (expected system, user, "
                            "assistant or tool)", i, msgs[i].role);
    }
    StrBuf b = {0};
    strbuf_puts(&b, ""); // an empty conversation still yields a valid empty string
    if (style == CHAT_PLAIN) {
        for (int i = 0; i < n; i++) {
            strbuf_puts(&b, msgs[i].role);
            strbuf_puts(&b, ": ");
            strbuf_puts(&b, msgs[i].content);
            strbuf_puts(&b, "\n");
        }
        if (flags & CHAT_ADD_GENERATION_PROMPT)
            strbuf_puts(&b, "assistant: ");
    } else if (style == CHAT_CHATML) {
        for (int i = 0; i < n; i++)
            put_turn(&b, msgs[i].role, msgs[i].content);
        if (flags & CHAT_ADD_GENERATION_PROMPT)
            strbuf_puts(&b, "<|im_start|>assistant\n");
    } else {
        int first_system = n > 0 && strcmp(msgs[0].role, "system") == 0;
        if (first_system)
            put_turn(&b, "system", msgs[0].content);
        else if (style == CHAT_QWEN25)
            put_turn(&b, "system", CHAT_QWEN25_DEFAULT_SYSTEM);
        // Qwen3: the last user message that is not a wrapped tool response.
        int last_query = n - 1;
        for (int i = n - 1; i >= 0; i--) {
            const char *c = msgs[i].content;
            if (strcmp(msgs[i].role, "user") == 0 &&
                !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
                last_query = i;
                break;
            }
        }
        for (int i = 0; i < n; i++) {
            const char *role = msgs[i].role;
            if (strcmp(role, "system") == 0 && i == 0)
                continue;
            if (strcmp(role, "tool") == 0)
                put_tool(&b, msgs, n, i);
            else if (strcmp(role, "assistant") == 0 && style == CHAT_QWEN3)
                put_qwen3_assistant(&b, msgs[i].content, i > last_query, i == n - 1);
            else
                put_turn(&b, role, msgs[i].content);
        }
        if (flags & CHAT_ADD_GENERATION_PROMPT) {
            strbuf_puts(&b, "<|im_start|>assistant\n");
            if (style == CHAT_QWEN3 && (flags & CHAT_NO_THINKING))
                strbuf_puts(&b, CHAT_THINK_OFF);
        }
    }
    if (b.oom) {
        er_free(b.p);
        return er_error(ER_ENOMEM, "chat: out of memory rendering %d messages", n);
    }
    *out = b.p;
    if (out_len)
        *out_len = b.n;
    return ER_OK;
}

int chat_style_hybrid(ChatStyle style) { return style == CHAT_QWEN3; }

ChatStyle chat_style_detect(const char *t) {
    if (!t)
        return CHAT_CHATML;
    if (strstr(t, CHAT_QWEN25_DEFAULT_SYSTEM))
        return CHAT_QWEN25;
    if (strstr(t, "</think>"))
        return CHAT_QWEN3;
    return CHAT_CHATML;
}

int chat_style_from_gguf(const GgufFile *f, ChatStyle *out) {
    const char *text = NULL;
    ER_TRY(gguf_get_str(f, "tokenizer.chat_template", 1, &text));
    *out = chat_style_detect(text);
    return ER_OK;
}

// The style of a parsed tokenizer_config.json (`path` names it).
static int style_from_doc(const char *path, const cJSON *cfg, ChatStyle *out) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *text = NULL;
    if (cJSON_IsString(t)) {
        text = t->valuestring;
    } else if (cJSON_IsArray(t)) {
        // Some configs ship several named templates; "default" is the one transformers uses.
        const cJSON *e;
        cJSON_ArrayForEach(e, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (cJSON_IsString(name) && strcmp(name->valuestring, "default") == 0 && cJSON_IsString(tmpl))
                text = tmpl->valuestring;
        }
        if (!text)
            return er_error(ER_EFORMAT, "%s: field \"chat_template\" is a list without a \"default\" template", path);
    } else if (t && !cJSON_IsNull(t)) {
        return er_error(ER_EFORMAT, "%s: field \"chat_template\" must be a string or a list of templates", path);
    }
    *out = chat_style_detect(text);
    return ER_OK;
}

int chat_style_from_config(const char *config_path, ChatStyle *out) {
    if (gguf_is_path(config_path)) {
        GgufFile f;
        ER_TRY(gguf_open(&f, config_path));
        int rc = chat_style_from_gguf(&f, out);
        gguf_close(&f);
        return rc;
    }
    char *joined = NULL;
    if (path_is_dir(config_path) && !(joined = path_join(config_path, "tokenizer_config.json")))
        return er_error(ER_ENOMEM, "%s: out of memory", config_path);
    const char *path = joined ? joined : config_path;
    cJSON *cfg = NULL;
    int rc = json_parse_file(path, (size_t)64 << 20, &cfg);
    if (rc == ER_OK)
        rc = style_from_doc(path, cfg, out);
    cJSON_Delete(cfg);
    er_free(joined);
    return rc;
}

int chat_style_from_text(const JsonText *config, ChatStyle *out) {
    if (!config || !config->text) {
        *out = chat_style_detect(NULL);
        return ER_OK;
    }
    cJSON *cfg = NULL;
    int rc = json_parse_text(config, (size_t)64 << 20, &cfg);
    if (rc == ER_OK)
        rc = style_from_doc(config->name, cfg, out);
    cJSON_Delete(cfg);
    return rc;
}

static const char *const style_names[] = {"chatml", "qwen2.5", "qwen3", "plain"};

int chat_style_parse(const char *name, ChatStyle *out) {
    for (int i = 0; i < 4; i++)
        if (name && strcmp(name, style_names[i]) == 0) {
            *out = (ChatStyle)i;
            return ER_OK;
        }
    return er_error(ER_EINVAL, "chat template \"%s\": expected chatml, qwen2.5, qwen3 or plain", name ? name : "(null)");
}

const char *chat_style_name(ChatStyle style) {
    return (unsigned)style < 4 ? style_names[style] : "unknown";
}

int chat_set_system(ChatMessage *out, int cap, const ChatMessage *in, int n, const char *system) {
    int k = 0, has_sys = n > 0 && strcmp(in[0].role, "system") == 0;
    if (system && k < cap)
        out[k++] = (ChatMessage){"system", system};
    for (int i = (system && has_sys) ? 1 : 0; i < n && k < cap; i++)
        out[k++] = in[i];
    return k;
}

// ---- tools ----

static void dumps_string(StrBuf *b, const char *s) {
    strbuf_puts(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!esc && c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            esc = u;
        }
        if (esc)
            strbuf_puts(b, esc);
        else
            strbuf_put(b, s, 1);
    }
    strbuf_puts(b, "\"");
}

// Python prints integral numbers without a fraction and others as the shortest text that reads back.
static void dumps_number(StrBuf *b, double x) {
    char t[40];
    if (x > -1e16 && x < 1e16 && x == (double)(long long)x) { // in range before the cast (UB outside)
        snprintf(t, sizeof t, "%lld", (long long)x);
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(t, sizeof t, "%.*g", prec, x);
            if (strtod(t, NULL) == x)
                break;
        }
    }
    strbuf_puts(b, t);
}

static void dumps_value(StrBuf *b, const cJSON *v) {
    if (cJSON_IsNull(v) || !v) {
        strbuf_puts(b, "null");
    } else if (cJSON_IsBool(v)) {
        strbuf_puts(b, cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNumber(v)) {
        dumps_number(b, v->valuedouble);
    } else if (cJSON_IsString(v)) {
        dumps_string(b, v->valuestring);
    } else {
        int obj = cJSON_IsObject(v);
        strbuf_puts(b, obj ? "{" : "[");
        const cJSON *e;
        int first = 1;
        cJSON_ArrayForEach(e, v) {
            strbuf_puts(b, first ? "" : ", ");
            first = 0;
            if (obj) {
                dumps_string(b, e->string);
                strbuf_puts(b, ": ");
            }
            dumps_value(b, e);
        }
        strbuf_puts(b, obj ? "}" : "]");
    }
}

static int strbuf_finish(StrBuf *b, char **out, const char *what) {
    if (b->oom) {
        er_free(b->p);
        *out = NULL;
        return er_error(ER_ENOMEM, "chat: out of memory writing %s", what);
    }
    *out = b->p;
    return ER_OK;
}

int chat_json_dumps(const cJSON *v, char **out) {
    StrBuf b = {0};
    dumps_value(&b, v);
    return strbuf_finish(&b, out, "JSON");
}

const char *chat_default_system(ChatStyle style) { return style == CHAT_QWEN25 ? CHAT_QWEN25_DEFAULT_SYSTEM : NULL; }

int chat_tools_system(ChatStyle style, const char *system, const cJSON *tools, char **out) {
    *out = NULL;
    if (style == CHAT_PLAIN)
        return er_error(ER_EUNSUPPORTED, "chat: the plain template has no tool format");
    if (!cJSON_IsArray(tools))
        return er_error(ER_EINVAL, "chat: tools must be a JSON array");
    if (!system)
        system = chat_default_system(style);
    StrBuf b = {0};
    strbuf_puts(&b, "");
    if (system) {
        strbuf_puts(&b, system);
        strbuf_puts(&b, "\n\n");
    }
    strbuf_puts(&b, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        strbuf_puts(&b, "\n");
        dumps_value(&b, t);
    }
    strbuf_puts(&b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                    "\"arguments\": <args-json-object>}\n</tool_call>");
    return strbuf_finish(&b, out, "the tools");
}

int chat_tool_calls_text(const char *content, const char *const *names, const char *const *arguments, int n,
                         char **out) {
    StrBuf b = {0};
    strbuf_puts(&b, content ? content : "");
    for (int i = 0; i < n; i++) {
        if (i > 0 || (content && content[0]))
            strbuf_puts(&b, "\n");
        strbuf_puts(&b, "<tool_call>\n{\"name\": \"");
        strbuf_puts(&b, names[i]);
        strbuf_puts(&b, "\", \"arguments\": ");
        cJSON *a = cJSON_ParseWithOpts(arguments[i], NULL, 1); // "{} junk" is not JSON: kept as given
        if (a)
            dumps_value(&b, a);
        else
            strbuf_puts(&b, arguments[i]);
        cJSON_Delete(a);
        strbuf_puts(&b, "}\n</tool_call>");
    }
    return strbuf_finish(&b, out, "tool calls");
}

void chat_tool_calls_free(ChatToolCall *calls, int n) {
    for (int i = 0; calls && i < n; i++) {
        er_free(calls[i].name);
        er_free(calls[i].arguments);
    }
    er_free(calls);
}

static const char *skip_space(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

// One "<tool_call>JSON</tool_call>" block's JSON (inner, n bytes) into *c.
static int parse_one_call(const char *inner, size_t n, int k, ChatToolCall *c) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(inner, n, &end, 0);
    int rc = ER_OK;
    if (!j || skip_space(end, inner + n) != inner + n)
        ER_CHECK(er_error(ER_EFORMAT, "tool call %d: not one JSON object", k));
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !name->valuestring[0])
        ER_CHECK(er_error(ER_EFORMAT, "tool call %d: no \"name\" string", k));
    if (!cJSON_IsObject(args))
        ER_CHECK(er_error(ER_EFORMAT, "tool call %d: \"arguments\" is not a JSON object", k));
    c->name = er_strdup(name->valuestring);
    c->arguments = cJSON_PrintUnformatted(args);
    if (!c->name || !c->arguments)
        ER_CHECK(er_error(ER_ENOMEM, "tool call %d: out of memory", k));
done:
    cJSON_Delete(j);
    return rc;
}

int chat_parse_tool_calls(const char *text, size_t len, ChatToolCall **calls, int *n, size_t *content_len) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    *calls = NULL;
    *n = 0;
    const char *end = text + len, *p = memmem(text, len, open, sizeof open - 1);
    *content_len = p ? (size_t)(p - text) : len;
    if (!p)
        return ER_OK;
    int rc = ER_OK, k = 0, cap = 0;
    ChatToolCall *c = NULL;
    while (p < end) {
        if ((size_t)(end - p) < sizeof open - 1 || memcmp(p, open, sizeof open - 1) != 0)
            ER_CHECK(er_error(ER_EFORMAT, "tool calls: text after tool call %d", k));
        const char *inner = p + sizeof open - 1;
        const char *q = memmem(inner, (size_t)(end - inner), close, sizeof close - 1);
        if (!q)
            ER_CHECK(er_error(ER_EFORMAT, "tool call %d: no closing </tool_call>", k));
        if (k == cap) {
            cap = cap ? 2 * cap : 2;
            ChatToolCall *g = er_realloc_array(c, (size_t)cap, sizeof *c);
            if (!g)
                ER_CHECK(er_error(ER_ENOMEM, "tool calls: out of memory"));
            c = g;
        }
        c[k] = (ChatToolCall){0};
        rc = parse_one_call(inner, (size_t)(q - inner), k, &c[k]);
        k++;
        ER_CHECK(rc);
        p = skip_space(q + sizeof close - 1, end);
    }
    *calls = c;
    *n = k;
done:
    if (rc < 0)
        chat_tool_calls_free(c, k);
    return rc;
}
