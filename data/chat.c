#include "data/chat.h"

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
                strbuf_puts(&b, "<think>\n\n</think>\n\n");
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

ChatStyle chat_style_detect(const char *t) {
    if (!t)
        return CHAT_CHATML;
    if (strstr(t, CHAT_QWEN25_DEFAULT_SYSTEM))
        return CHAT_QWEN25;
    if (strstr(t, "</think>"))
        return CHAT_QWEN3;
    return CHAT_CHATML;
}

// A GGUF model file: its tokenizer.chat_template (the style of a file without one, as for a config without one).
static int chat_style_from_gguf(const char *path, ChatStyle *out) {
    GgufFile f;
    const char *text = NULL;
    ER_TRY(gguf_open(&f, path));
    int rc = gguf_get_str(&f, "tokenizer.chat_template", 1, &text);
    if (rc == ER_OK)
        *out = chat_style_detect(text);
    gguf_close(&f);
    return rc;
}

int chat_style_from_config(const char *config_path, ChatStyle *out) {
    if (gguf_is_path(config_path))
        return chat_style_from_gguf(config_path, out);
    char *joined = NULL;
    if (path_is_dir(config_path) && !(joined = path_join(config_path, "tokenizer_config.json")))
        return er_error(ER_ENOMEM, "%s: out of memory", config_path);
    const char *path = joined ? joined : config_path;
    cJSON *cfg = NULL;
    int rc = ER_OK;
    ER_CHECK(json_parse_file(path, (size_t)64 << 20, &cfg));
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
        if (!text) {
            rc = er_error(ER_EFORMAT, "%s: field \"chat_template\" is a list without a \"default\" template", path);
            goto done;
        }
    } else if (t && !cJSON_IsNull(t)) {
        rc = er_error(ER_EFORMAT, "%s: field \"chat_template\" must be a string or a list of templates", path);
        goto done;
    }
    *out = chat_style_detect(text);
done:
    cJSON_Delete(cfg);
    er_free(joined);
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
