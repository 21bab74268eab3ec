// fuzz_serve_request: the input is an HTTP request body for erinfer serve (erinfer/server_json.c), read as
// /v1/chat/completions in each chat style (and on a server with a memory store: its "memory" options, its tools
// offered, a recalled block rendered in), as /v1/completions with the tiny base's tokenizer, as /v1/embeddings,
// and as a model's response for the tool-call parser (data/chat.h) and the stream's tool holdback. A refused body
// names a status 400 or 500 and a message; an accepted one has a prompt and parameters within the limits
// (a forced tool_choice: the call's start as the response prefix); parsed tool calls have a name and
// object arguments; the holdback never releases a byte of a call.
#include "tests/fuzz/fuzz_common.h"

#include "core/alloc.h"
#include "core/error.h"
#include "data/chat.h"
#include "erinfer/server.h"

static Tokenizer *tok;
static cJSON *memory_tools; // a server with --memory offers these (the names are what the parser checks)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    if (tok_load(&tok, "models/tiny-base") < 0) {
        fprintf(stderr, "fuzz_serve_request: %s (run from the project root)\n", er_last_error());
        abort();
    }
    memory_tools = cJSON_Parse("[{\"type\": \"function\", \"function\": {\"name\": \"memory_search\"}}, "
                               "{\"type\": \"function\", \"function\": {\"name\": \"memory_add\"}}]");
    return memory_tools ? 0 : -1;
}

static void check_request(const char *body, size_t n, int chat, ChatStyle style, int memory) {
    const ServeLimits lim = {4, 64, 512, 64, 0, 0, 0, memory, memory ? memory_tools : NULL};
    ServeRequest r;
    ServeError e;
    if (serve_parse_request(body, n, chat, style, tok, &lim, &r, &e) < 0) {
        FUZZ_CHECK(e.status == 400 || e.status == 500, "status %d", e.status);
        FUZZ_CHECK(e.message[0], "an error without a message");
        char *j = serve_error_json(&e);
        FUZZ_CHECK(j, "no error JSON");
        er_free(j);
        return;
    }
    FUZZ_CHECK(r.prompt && r.p.n_samples >= 1 && r.p.n_samples <= lim.max_n, "n %d", r.p.n_samples);
    FUZZ_CHECK(r.p.max_new_tokens >= 1 && r.p.max_new_tokens <= lim.max_tokens, "max_tokens %d", r.p.max_new_tokens);
    FUZZ_CHECK(r.prompt_tokens + r.p.max_new_tokens <= lim.context, "over the context");
    FUZZ_CHECK(r.p.n_stop >= 0 && r.p.n_stop <= ER_STOP_MAX, "n_stop %d", r.p.n_stop);
    // A forced tool_choice: the call's start, with tools offered, forced as the response prefix.
    FUZZ_CHECK(!r.tool_prefix || (r.tools && r.p.response_prefix == r.tool_prefix &&
                                  strncmp(r.tool_prefix, "<tool_call>\n", 12) == 0), "tool prefix");
    // The memory tools: only on a server with a store, for one sample, never beside a forced call; a recalled
    // block renders in (or the prompt no longer fits: a 400) and the conversation takes a round's messages.
    FUZZ_CHECK(!r.memory_tools || (memory && r.tools && r.p.n_samples == 1 && !r.tool_prefix), "memory tools");
    FUZZ_CHECK(memory || (!r.memory_tools && !r.memory_recall && !r.memory_save), "memory without a store");
    if (memory && chat) {
        r.memory_block = er_strdup("# Memory\n[1] a note");
        int before = r.prompt_tokens;
        if (r.memory_block && serve_render(&r, style, tok, &lim, &e) == 0)
            FUZZ_CHECK(r.prompt_tokens > before && strstr(r.prompt, "[1] a note"), "the recalled block");
        else
            FUZZ_CHECK(e.status == 400 || e.status == 500 || !r.memory_block, "render status %d", e.status);
        if (serve_conv_push(&r, "assistant", "<tool_call>{}</tool_call>", &e) == 0 &&
            serve_conv_push(&r, "tool", "{\"results\": []}", &e) == 0 && serve_render(&r, style, tok, &lim, &e) == 0)
            FUZZ_CHECK(strstr(r.prompt, "{\"results\": []}"), "the round's result is not in the prompt");
    }
    serve_request_free(&r);
}

// As a /v1/embeddings body: refused with a status and a message, or 1..SERVE_EMBED_MAX_INPUTS texts and dimensions
// within the model's 32.
static void check_embeddings(const char *body, size_t n) {
    static const ServeLimits lim = {4, 64, 512, 64, 0, 0, 0, 0, NULL};
    ServeEmbedRequest r;
    ServeError e;
    if (serve_parse_embeddings(body, n, &lim, 32, &r, &e) < 0) {
        FUZZ_CHECK((e.status == 400 || e.status == 500) && e.message[0], "status %d", e.status);
        FUZZ_CHECK(r.texts == NULL && r.n == 0, "a refused body left texts");
        return;
    }
    FUZZ_CHECK(r.n >= 1 && r.n <= SERVE_EMBED_MAX_INPUTS, "%d inputs", r.n);
    FUZZ_CHECK(r.dimensions >= 0 && r.dimensions <= 32, "dimensions %d", r.dimensions);
    for (int i = 0; i < r.n; i++)
        FUZZ_CHECK(r.texts[i], "input %d is NULL", i);
    serve_embed_request_free(&r);
}

static void check_tool_calls(const char *text, size_t n) {
    ChatToolCall *c;
    int nc;
    size_t clen;
    if (chat_parse_tool_calls(text, n, &c, &nc, &clen) == ER_OK) {
        FUZZ_CHECK(clen <= n, "content %zu of %zu bytes", clen, n);
        for (int i = 0; i < nc; i++) {
            FUZZ_CHECK(c[i].name && c[i].name[0], "call %d has no name", i);
            FUZZ_CHECK(c[i].arguments && c[i].arguments[0] == '{', "call %d: arguments %s", i, c[i].arguments);
        }
        chat_tool_calls_free(c, nc);
    } else {
        FUZZ_CHECK(c == NULL && nc == 0, "a refused parse left calls");
    }
    size_t safe = serve_tool_safe_prefix(text, n);
    const char *tag = memmem(text, n, "<tool_call>", 11);
    FUZZ_CHECK(safe <= n && (!tag || safe == (size_t)(tag - text)), "holdback %zu", safe);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = er_alloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    for (int s = 0; s < 4; s++)
        check_request(text, size, 1, (ChatStyle)s, 0);
    check_request(text, size, 1, CHAT_QWEN25, 1);
    check_request(text, size, 0, CHAT_CHATML, 1);
    check_embeddings(text, size);
    check_tool_calls(text, size);
    er_free(text);
    return 0;
}
