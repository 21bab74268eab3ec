// The memory store in a conversation (erinfer chat|serve --memory FILE, docs/memory.md): what is recalled into
// the system message before an answer, the built-in tools the model may call (memory_search, memory_add) and
// saving a conversation as an entry. Part of the erinfer program, like the store (erinfer/memory.h).
#ifndef ERINFER_MEMORY_CHAT_H
#define ERINFER_MEMORY_CHAT_H

#include <pthread.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "data/chat.h"
#include "data/tokenizer.h"
#include "erinfer/memory.h"
#include "infer/erinfer.h"

enum {
    MEM_CHAT_K = 4,          // entries recalled before an answer (--memory-k)
    MEM_CHAT_TOKENS = 512,   // tokens the recalled entries may take in the system message (--memory-tokens)
    MEM_CHAT_ROUNDS = 4,     // rounds of memory tool calls before the tools are withdrawn (--memory-rounds)
    MEM_CHAT_TOOL_K_MAX = 20 // memory_search's k at most
};

// A text's embedding for the store: dim floats owned by the caller (er_free). query: a search query (the model's
// query prompt first, where it has one), else a document.
typedef int (*MemChatEmbedFn)(void *ctx, const char *text, int query, float **vec, int *dim);

// The embedding of a session's base model (er_embed, pooled as the model says): mem_chat_embed is a MemChatEmbedFn
// on a MemChatEmbedder, which takes lock (NULL: none) around er_embed.
typedef struct {
    ErModel *model;
    ErSession *session;
    pthread_mutex_t *lock;
} MemChatEmbedder;
int mem_chat_embed(void *ctx, const char *text, int query, float **vec, int *dim);

typedef struct {
    MemStore *store;
    pthread_mutex_t *lock; // taken around each use of the store (NULL: one thread only)
    MemChatEmbedFn embed;  // NULL, or a store of another dimension than the model's: text only (BM25). A text too
                           // long to embed (ER_ERANGE) is searched or stored as text only.
    void *embed_ctx;
    const Tokenizer *tok;  // counts the recalled text's tokens
    int k;                 // entries recalled before an answer
} MemChat;

// Whether the model's embeddings (dim values) can search the store: it has no vectors yet, or vectors of dim.
// Where they cannot (another model's vectors), the caller drops embed, and *why says so (a static string).
int mem_chat_vectors_ok(const MemChat *m, int dim, const char **why);

// The system text recalling the best entries for query (a user's message), as many of the best m->k as fit
// `tokens` tokens, each with its id:
//   "# Memory\nEntries from the user's memory on this device that may help (cite them by id):\n[12] text\n..."
// *block NULL when nothing matches. ids (room for m->k) gets the entries', *n their count.
int mem_chat_recall(MemChat *m, const char *query, int tokens, char **block, int64_t *ids, int *n);

// The built-in tools as an OpenAI "tools" array (a new cJSON array): memory_search(query, k) and
// memory_add(text, metadata).
cJSON *mem_chat_tools(void);
int mem_chat_is_tool(const char *name); // memory_search or memory_add

// Runs a call of a built-in tool: *result (er_free) is the JSON the tool message carries back to the model:
// {"results": [{"id", "text", "metadata", "created"}]} for a search, {"id": N} for an add. Arguments the model got
// wrong are a result too ({"error": "..."}), for the model to read; only the store's failures are errors.
int mem_chat_call(MemChat *m, const ChatToolCall *call, char **result);

// A reply that is calls of the memory tools alone, run: what the conversation gets next is the assistant's turn
// (its content and the calls, as the chat template writes them) and one tool message per result.
typedef struct {
    ChatToolCall *calls;  // (n) as the model wrote them
    int n;
    size_t content_len;   // the reply's content before its calls (bytes)
    char *turn;           // the assistant's turn
    char **results;       // (n) each call's result (mem_chat_call)
} MemChatRound;

// Runs the reply's calls when it has some and all are memory tools' (1: *out filled, mem_chat_round_free it);
// 0: the reply is the answer (no call, one that does not parse, or a call of another tool, the client's to run).
int mem_chat_round(MemChat *m, const char *reply, size_t len, MemChatRound *out);
void mem_chat_round_free(MemChatRound *r);

// Adds text (a saved conversation, a note) as an entry with metadata (a JSON object or NULL), embedded as a
// document where m embeds. *id (may be NULL) gets its id.
int mem_chat_save(MemChat *m, const char *text, const char *metadata, int64_t *id);

// A conversation as one entry's text: "role: content" per message, system and tool messages left out.
int mem_chat_transcript(const ChatMessage *msgs, int n, char **out);

#endif
