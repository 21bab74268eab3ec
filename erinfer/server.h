// erinfer serve: the OpenAI-compatible HTTP server over the routed pipeline. The HTTP side (GNU
// libmicrohttpd) is erinfer/server.c; this header is what it shares with erinfer/server_json.c, which
// reads requests and writes the OpenAI JSON (responses, stream chunks, errors). CLI-side code: the
// erinfer program links it, liberinfer does not (nothing in the library needs an HTTP library).
#ifndef ERINFER_SERVER_H
#define ERINFER_SERVER_H

#include <cjson/cJSON.h>

#include "core/strbuf.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "infer/erinfer.h"

// Limits of one server, from its flags.
typedef struct {
    int max_n;          // samples per request (at most the batch's rows)
    int max_tokens;     // cap on max_tokens (and its default)
    int context;        // positions per sample, prompt included
    int json_depth;     // deepest nesting accepted in a request body
    int adapter;        // an adapter is loaded: a request may force a route ("direct", "reasoning")
    int routed;         // an adapter or heads are loaded: the route decides how an answer starts, so a
                        // tool_choice that would force it ("required", a named function) is refused
    int hybrid;         // a hybrid-thinking model (Qwen3): a request may force a route, its thinking switch
    int memory;                // erinfer serve --memory: a memory store (a chat request's "memory" options apply)
    const cJSON *memory_tools; // the built-in memory tools (an OpenAI tools array) a chat request is offered beside
                               // its own; NULL: none (no store, or --memory-rounds 0)
} ServeLimits;

// A request that passed every check, ready for the batch.
typedef struct {
    int chat;                  // /v1/chat/completions; 0: /v1/completions
    char *prompt;              // the rendered prompt (chat template applied for chat requests)
    ErGenParams p;             // stop, route point into the strings below
    char *stop[ER_STOP_MAX];
    char *route;
    int stream, include_usage;
    int logprobs;              // report the tokens' log-probs (p.top_logprobs alternatives at each)
    int seeded;                // the request gave a seed (otherwise the server draws one: p.seed)
    int tools;                 // the request gave tools: the output's <tool_call> blocks become tool_calls
    char *tool_prefix;         // tool_choice "required" or a named function: the call's start, forced
                               // (p.response_prefix points here) and the start of each choice's text; NULL: none
    int prompt_tokens;
    int max_tokens;            // max_tokens as asked (0: not given): each rendering fits it to the context again
    // Chat: the conversation as the template gets it (an assistant's tool calls folded into its content), kept
    // so that it can be rendered again with recalled memory and with each round of the memory tools.
    ChatMessage *conv;         // (n_conv) roles static, contents owned
    int n_conv, cap_conv;
    cJSON *tools_json;         // the request's own tools, as the prompt announces them (NULL: none, or "none")
    // erinfer serve --memory: the request's "memory" options and what the server adds for them.
    int memory_recall;         // recall entries into the system message (default on)
    int memory_tools;          // offer the memory tools (on by default for n = 1 with tool_choice "auto")
    int memory_save;           // save the conversation with its answer as an entry (off by default)
    char *memory_block;        // the recalled entries, after the system text (NULL: none)
    StrBuf before;             // the content the model wrote in earlier rounds of memory tool calls (outside the
                               // calls): the choice's text starts with it
    cJSON *memory_log;         // what the server did with its memory, the response's erinfer.memory: "recalled"
                               // (ids), "tool_rounds" (each round's calls and results), "saved" (id); NULL: nothing
} ServeRequest;

void serve_request_free(ServeRequest *r);

// The OpenAI error of a refused request: HTTP status, message (never internals: no paths, no library
// messages), type and the offending parameter (NULL: none).
typedef struct {
    int status;
    char message[256];
    const char *type;
    char param[72];   // "" = none
    const char *code;
} ServeError;

// Records an error in e and returns -1.
int serve_fail(ServeError *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
// {"error": {...}} as a new string (er_free).
char *serve_error_json(const ServeError *e);

// A /v1/embeddings request that passed every check: input as one text or an array of texts.
enum { SERVE_EMBED_MAX_INPUTS = 2048 }; // OpenAI's limit on the inputs of one request
typedef struct {
    char **texts;   // (n)
    int n;
    int base64;     // encoding_format "base64": each vector as base64 of its little-endian float32 values
    int dimensions; // 0 = the model's embedding size
} ServeEmbedRequest;

// Parses a /v1/embeddings body (model, input, encoding_format, dimensions, user); embed_size bounds dimensions.
// Token-id inputs are refused (send text). Free with serve_embed_request_free (also after a failure).
int serve_parse_embeddings(const char *body, size_t n, const ServeLimits *lim, int embed_size, ServeEmbedRequest *r,
                           ServeError *e);
void serve_embed_request_free(ServeEmbedRequest *r);
// The response: {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}], "model",
// "usage": {"prompt_tokens", "total_tokens"}} for v (n, dims) into out.
void serve_embeddings_json(StrBuf *out, const ServeEmbedRequest *r, const float *v, int dims, const char *model,
                           int tokens);

// Whether a POST body's Content-Type is JSON: application/json, any case, with parameters (a charset
// only when it is UTF-8). NULL (no header) is not.
int serve_content_type_ok(const char *ct);

// The Host names a server answers (the DNS-rebinding defence: a page of another site that resolves its
// name to this host still sends its own name in Host): lowercase names and address literals without a
// port ("[::1]" bracketed). any: every Host, and none, is accepted.
typedef struct {
    char **names;
    int n, any;
} ServeHosts;

// The names of --allowed-hosts (`list`: comma-separated names or address literals without a port, "*" =
// any; NULL = none) and, with loopback_names, localhost, 127.0.0.1 and [::1]. ER_EINVAL names a bad entry.
int serve_hosts_init(ServeHosts *hs, const char *list, int loopback_names);
void serve_hosts_free(ServeHosts *hs);
// Whether a request with this Host header (NULL: none) may be served: its name (the port is not
// compared: an SSH tunnel or port forward changes it, and a rebinding page cannot choose the name) is
// one of hs's, or local, the connection's own local address as text (an address literal is no name an
// attacker could point here).
int serve_host_allowed(const char *host, const ServeHosts *hs, const char *local);

// Deepest nesting of the JSON text (brackets outside strings), counted without parsing it.
int serve_json_depth(const char *s, size_t n);

// Parses and checks a request body for /v1/chat/completions (chat = 1) or /v1/completions. The chat
// template is `style`; tok counts the prompt's tokens against the limits.
int serve_parse_request(const char *body, size_t n, int chat, ChatStyle style, const Tokenizer *tok,
                        const ServeLimits *lim, ServeRequest *r, ServeError *e);
// r->prompt from r's conversation (chat), the memory block and the tools offered (its own and, with
// r->memory_tools, lim->memory_tools), counted against the context: max_new_tokens is fitted to what is left
// when max_tokens was not given, and a prompt that leaves no room is refused (400). serve_parse_request runs it;
// the server again after recalling memory and after each round of memory tool calls.
int serve_render(ServeRequest *r, ChatStyle style, const Tokenizer *tok, const ServeLimits *lim, ServeError *e);
// Appends a message to r's conversation (content copied). -1 out of memory (e says so).
int serve_conv_push(ServeRequest *r, const char *role, const char *content, ServeError *e);
// The content of r's last user message (NULL: none).
const char *serve_last_user(const ServeRequest *r);

// One response's identity, shared by its chunks.
typedef struct {
    char id[40];
    long created;
    const char *model;
} ServeIds;

// What a finished generation gives the response: a batched request's results, with the routed
// pipeline's side when it ran one.
typedef struct {
    int n;
    const ErSample *const *samples; // (n)
    const ErStats *stats;
    const ErRoute *route;           // NULL = no pipeline
    const Tokenizer *tok;           // the model's: the logprobs' token texts and bytes
} ServeResult;

// Where each token of a sample starts in its text, walked token by token as they come: the text is the
// tokens' raw bytes converted as the engine converts them (tok_text_from_bytes, invalid sequences replaced),
// so a token's start is known once its bytes are walked.
typedef struct {
    int n;             // tokens walked
    size_t bytes;      // bytes of the text the walked tokens' complete characters make
    long chars;        // the same in code points
    char pend[4];      // the bytes of a character not complete yet
    int npend;
    size_t *at;        // (n) the byte of the text where token k starts
    long *at_chars;    // (n) the same in code points (OpenAI's text_offset)
    int cap;
} ServeWalk;

// Walks the tokens of x not walked yet. -1 out of memory.
int serve_walk(ServeWalk *w, const Tokenizer *tok, const ErSample *x);
// How many of the walked tokens start before byte `end` of the text: the tokens a text of `end` bytes
// shows (a final EOS, which adds no text, and the tokens after a stop string's start are left out).
int serve_walk_count(const ServeWalk *w, size_t end);
void serve_walk_free(ServeWalk *w);
// The "logprobs" of tokens [from, to) of x (walked by w) as the request's endpoint shapes them: chat
// {"content": [{"token", "logprob", "bytes", "top_logprobs"}], "refusal": null}; completions {"tokens",
// "token_logprobs", "top_logprobs" (the top tokens and the drawn one, by text), "text_offset"}.
cJSON *serve_logprobs_json(const ServeRequest *r, const Tokenizer *tok, const ErSample *x, const ServeWalk *w,
                           int from, int to);

// The whole non-streamed response of a finished generation (choices, usage, the erinfer extension),
// as a new string.
char *serve_response_json(const ServeRequest *r, const ServeIds *ids, const ServeResult *s);

// Stream chunks, each appended to out as one SSE event ("data: {...}\n\n").
// A content delta of choice i (role: the first chunk, which carries the role).
// lp: the chunk's "logprobs" (taken over; NULL = null).
void serve_chunk_delta(StrBuf *out, const ServeRequest *r, const ServeIds *ids, int i, const char *text, size_t n,
                       int role, cJSON *lp);
// The end of every choice (tool calls, finish reasons, the erinfer extension on the last), the usage
// chunk when asked for, and [DONE]. streamed[i]: the bytes of choice i's text already streamed (the rest
// may hold tool calls; with a tool_prefix the text starts with it, and nothing was streamed);
// roled[i]: its first chunk, which carries the role, is out; lp_sent[i]: the tokens whose logprobs were
// streamed (the rest come with the choice's last content delta, or its finish chunk).
void serve_chunk_final(StrBuf *out, const ServeRequest *r, const ServeIds *ids, const ServeResult *s,
                       const size_t *streamed, const int *roled, const int *lp_sent);
// An error inside a stream (the status line is already sent): one error event and [DONE].
void serve_chunk_error(StrBuf *out, const ServeError *e);

// How many of the n bytes of a sample's text may be streamed as content now, with a request that has
// tools: everything before a "<tool_call>" (or before a tail that may still become one).
size_t serve_tool_safe_prefix(const char *text, size_t n);
// The same for request r, whatever it has: all of the text without tools, none with a forced tool call
// (r->tool_prefix: the text is all call, held back for the final chunk, which parses the whole choice).
size_t serve_stream_safe(const ServeRequest *r, const char *text, size_t n);

// erinfer serve (erinfer/server.c).
int cmd_serve(int argc, char **argv);

#endif
