// The memory store in a conversation (erinfer/memory_chat.h): recall into the system message, the built-in
// memory tools, saving a conversation.
#include "erinfer/memory_chat.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/strbuf.h"

static void lock(MemChat *m) {
    if (m->lock)
        pthread_mutex_lock(m->lock);
}

static void unlock(MemChat *m) {
    if (m->lock)
        pthread_mutex_unlock(m->lock);
}

int mem_chat_embed(void *ctx, const char *text, int query, float **vec, int *dim) {
    const MemChatEmbedder *e = ctx;
    ErEmbedParams p;
    er_embed_params_init(&p);
    p.query = query && er_model_query_prompt(e->model) != NULL;
    *dim = er_model_embedding_size(e->model);
    if (!(*vec = er_alloc(sizeof(float) * (size_t)*dim)))
        return ER_ENOMEM;
    if (e->lock)
        pthread_mutex_lock(e->lock);
    int rc = er_embed(e->session, &text, 1, &p, *vec, (size_t)*dim);
    if (e->lock)
        pthread_mutex_unlock(e->lock);
    if (rc < 0) {
        er_free(*vec);
        *vec = NULL;
        return rc;
    }
    return ER_OK;
}

int mem_chat_vectors_ok(const MemChat *m, int dim, const char **why) {
    int have = mem_dim(m->store);
    *why = NULL;
    if (have == 0 || have == dim)
        return 1;
    *why = "its vectors have another dimension than this model's embeddings: it is searched by BM25 alone, and new "
           "entries are stored without vectors";
    return 0;
}

// text's vector where m embeds (*vec NULL: none, or a text too long to embed).
static int embed(MemChat *m, const char *text, int query, float **vec, int *dim) {
    *vec = NULL;
    *dim = 0;
    int rc = m->embed ? m->embed(m->embed_ctx, text, query, vec, dim) : ER_OK;
    if (rc == ER_ERANGE) {
        er_clear_error();
        *vec = NULL, *dim = 0;
        return ER_OK;
    }
    return rc;
}

// The best k hits for query (text, and its vector where m embeds), store locked only around the search.
static int search(MemChat *m, const char *query, MemHit *hits, int k, int *n) {
    float *vec = NULL;
    int dim = 0;
    ER_TRY(embed(m, query, 1, &vec, &dim));
    MemQuery q = {query, vec, dim, NULL, 0};
    lock(m);
    int rc = mem_search(m->store, &q, hits, k, n);
    unlock(m);
    er_free(vec);
    return rc;
}

int mem_chat_recall(MemChat *m, const char *query, int tokens, char **block, int64_t *ids, int *n) {
    *block = NULL;
    *n = 0;
    if (m->k <= 0 || tokens <= 0 || !query || !query[0])
        return ER_OK;
    MemHit *hits = er_calloc((size_t)m->k, sizeof *hits);
    if (!hits)
        return ER_ENOMEM;
    int nh = 0, rc = search(m, query, hits, m->k, &nh);
    StrBuf b = {0};
    strbuf_puts(&b, "# Memory\nEntries from the user's memory on this device that may help (cite them by id):\n");
    size_t head = b.n;
    // Entries go in best first while the block's tokens stay within the budget (an entry that does not fit is
    // left out; a shorter one after it may still fit).
    for (int i = 0; rc == ER_OK && i < nh; i++) {
        size_t at = b.n;
        char id[32];
        snprintf(id, sizeof id, "[%lld] ", (long long)hits[i].id);
        strbuf_puts(&b, id);
        strbuf_puts(&b, hits[i].text);
        strbuf_puts(&b, "\n");
        int *tids = NULL, nt = 0;
        if (b.oom || tok_encode(m->tok, b.p, b.n, &tids, &nt) < 0)
            rc = ER_ENOMEM;
        er_free(tids);
        if (rc == ER_OK && nt > tokens) {
            b.n = at;
            b.p[at] = 0;
        } else if (rc == ER_OK) {
            ids[(*n)++] = hits[i].id;
        }
    }
    mem_hits_free(hits, nh);
    er_free(hits);
    if (rc == ER_OK && b.oom)
        rc = ER_ENOMEM;
    if (rc < 0 || b.n == head) {
        er_free(b.p);
        *n = 0;
        return rc;
    }
    b.p[--b.n] = 0; // the last newline: the template ends the message itself
    *block = b.p;
    return ER_OK;
}

static const char tools_json[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"memory_search\", \"description\": \"Search the user's "
    "memory on this device (saved notes, documents and past conversations) for entries about a topic. Returns the "
    "best entries with their ids.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": "
    "\"string\", \"description\": \"what to look for\"}, \"k\": {\"type\": \"integer\", \"description\": \"how many "
    "entries (default 4, at most 20)\"}}, \"required\": [\"query\"]}}}, "
    "{\"type\": \"function\", \"function\": {\"name\": \"memory_add\", \"description\": \"Save a note to the user's "
    "memory on this device, for later conversations.\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"text\": {\"type\": \"string\", \"description\": \"the note\"}, \"metadata\": {\"type\": \"object\", "
    "\"description\": \"optional tags, e.g. {\\\"topic\\\": \\\"travel\\\"}\"}}, \"required\": [\"text\"]}}}]";

cJSON *mem_chat_tools(void) { return cJSON_Parse(tools_json); }

int mem_chat_is_tool(const char *name) {
    return strcmp(name, "memory_search") == 0 || strcmp(name, "memory_add") == 0;
}

static int result_error(char **result, const char *message) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", message);
    *result = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return *result ? ER_OK : ER_ENOMEM;
}

// created (unix seconds) as "YYYY-MM-DDTHH:MM:SSZ": the model reads a date better than a count of seconds.
static void iso_time(double t, char *out, size_t cap) {
    time_t s = (time_t)t;
    struct tm tm;
    if (!isfinite(t) || !gmtime_r(&s, &tm) || !strftime(out, cap, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(out, cap, "%.0f", t);
}

static int call_search(MemChat *m, const cJSON *args, char **result) {
    const cJSON *query = cJSON_GetObjectItemCaseSensitive(args, "query");
    const cJSON *kv = cJSON_GetObjectItemCaseSensitive(args, "k");
    if (!cJSON_IsString(query) || !query->valuestring[0])
        return result_error(result, "memory_search needs a non-empty string 'query'");
    int k = 4;
    if (kv && !cJSON_IsNull(kv)) {
        if (!cJSON_IsNumber(kv) || kv->valuedouble != floor(kv->valuedouble) || kv->valuedouble < 1 ||
            kv->valuedouble > MEM_CHAT_TOOL_K_MAX)
            return result_error(result, "memory_search's 'k' must be an integer from 1 to 20");
        k = (int)kv->valuedouble;
    }
    MemHit hits[MEM_CHAT_TOOL_K_MAX];
    int n = 0;
    ER_TRY(search(m, query->valuestring, hits, k, &n));
    cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "results");
    for (int i = 0; i < n; i++) {
        cJSON *h = cJSON_CreateObject(), *meta = cJSON_Parse(hits[i].metadata);
        char when[40];
        iso_time(hits[i].created, when, sizeof when);
        cJSON_AddNumberToObject(h, "id", (double)hits[i].id);
        cJSON_AddStringToObject(h, "text", hits[i].text);
        cJSON_AddItemToObject(h, "metadata", meta ? meta : cJSON_CreateObject());
        cJSON_AddStringToObject(h, "created", when);
        cJSON_AddItemToArray(a, h);
    }
    mem_hits_free(hits, n);
    *result = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return *result ? ER_OK : ER_ENOMEM;
}

static int call_add(MemChat *m, const cJSON *args, char **result) {
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(args, "text");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(args, "metadata");
    if (!cJSON_IsString(text) || !text->valuestring[0])
        return result_error(result, "memory_add needs a non-empty string 'text'");
    if (meta && !cJSON_IsNull(meta) && !cJSON_IsObject(meta))
        return result_error(result, "memory_add's 'metadata' must be an object");
    char *meta_text = meta && cJSON_IsObject(meta) ? cJSON_PrintUnformatted(meta) : NULL;
    int64_t id = 0;
    int rc = mem_chat_save(m, text->valuestring, meta_text, &id);
    cJSON_free(meta_text);
    if (rc == ER_EINVAL) // the text or metadata the store refuses (too long, not UTF-8): the model's to fix
        return result_error(result, er_last_error());
    ER_TRY(rc);
    char out[48];
    snprintf(out, sizeof out, "{\"id\":%lld}", (long long)id);
    return (*result = er_strdup(out)) ? ER_OK : ER_ENOMEM;
}

int mem_chat_call(MemChat *m, const ChatToolCall *call, char **result) {
    *result = NULL;
    cJSON *args = cJSON_Parse(call->arguments);
    int rc;
    if (!cJSON_IsObject(args))
        rc = result_error(result, "the arguments must be a JSON object");
    else if (strcmp(call->name, "memory_search") == 0)
        rc = call_search(m, args, result);
    else if (strcmp(call->name, "memory_add") == 0)
        rc = call_add(m, args, result);
    else
        rc = er_error(ER_EINVAL, "%s is not a memory tool", call->name);
    cJSON_Delete(args);
    return rc;
}

void mem_chat_round_free(MemChatRound *r) {
    for (int i = 0; r->results && i < r->n; i++)
        er_free(r->results[i]);
    er_free(r->results);
    er_free(r->turn);
    chat_tool_calls_free(r->calls, r->n);
    memset(r, 0, sizeof *r);
}

int mem_chat_round(MemChat *m, const char *reply, size_t len, MemChatRound *out) {
    memset(out, 0, sizeof *out);
    if (chat_parse_tool_calls(reply, len, &out->calls, &out->n, &out->content_len) < 0) {
        er_clear_error(); // not a call: the reply is text
        return 0;
    }
    int own = 0;
    for (int i = 0; i < out->n; i++)
        own += !mem_chat_is_tool(out->calls[i].name);
    if (out->n == 0 || own) {
        mem_chat_round_free(out);
        return 0;
    }
    const char **names = er_calloc((size_t)out->n, sizeof *names), **args = er_calloc((size_t)out->n, sizeof *args);
    char *content = er_alloc(out->content_len + 1);
    int rc = (out->results = er_calloc((size_t)out->n, sizeof *out->results)) && names && args && content
                 ? ER_OK
                 : ER_ENOMEM;
    for (int i = 0; rc == ER_OK && i < out->n; i++) {
        rc = mem_chat_call(m, &out->calls[i], &out->results[i]);
        names[i] = out->calls[i].name, args[i] = out->calls[i].arguments;
    }
    if (rc == ER_OK) {
        memcpy(content, reply, out->content_len);
        content[out->content_len] = 0;
        rc = chat_tool_calls_text(content, names, args, out->n, &out->turn);
    }
    er_free(names), er_free(args), er_free(content);
    if (rc < 0) {
        mem_chat_round_free(out);
        return rc;
    }
    return 1;
}

int mem_chat_save(MemChat *m, const char *text, const char *metadata, int64_t *id) {
    float *vec = NULL;
    int dim = 0;
    ER_TRY(embed(m, text, 0, &vec, &dim));
    MemItem it = {text, metadata, vec, dim, -1.0};
    lock(m);
    int rc = mem_add_items(m->store, &it, 1, id);
    unlock(m);
    er_free(vec);
    return rc;
}

int mem_chat_transcript(const ChatMessage *msgs, int n, char **out) {
    StrBuf b = {0};
    for (int i = 0; i < n; i++) {
        if (strcmp(msgs[i].role, "user") != 0 && strcmp(msgs[i].role, "assistant") != 0)
            continue;
        if (b.n)
            strbuf_puts(&b, "\n");
        strbuf_puts(&b, msgs[i].role);
        strbuf_puts(&b, ": ");
        strbuf_puts(&b, msgs[i].content ? msgs[i].content : "");
    }
    if (b.oom || !b.p) {
        er_free(b.p);
        return b.oom ? ER_ENOMEM : er_error(ER_EINVAL, "the conversation has no user or assistant message to save");
    }
    *out = b.p;
    return ER_OK;
}
