// erinfer chat: an interactive conversation through the public API (infer/erinfer.h), with a memory store
// (--memory FILE, erinfer/memory_chat.h) recalled into each turn and tools the model may call on it.
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/strbuf.h"
#include "core/threads.h"
#include "erinfer/cli.h"
#include "erinfer/memory_chat.h"
#include "infer/erinfer.h"

static const char CHAT_HELP[] = "commands: /help this list, /reset start a new conversation (the --system message "
                                "stays), /save keep the conversation in the memory store (--memory), /exit leave (so "
                                "does end of input, or Ctrl-C twice at the prompt); Ctrl-C during a reply stops it; a "
                                "line starting with // sends the rest after one /";

// Ctrl-C in chat. The handler only sets this flag (nothing else is async-signal-safe here): the token
// callback stops the reply when it is set, and the prompt loop reads it after an interrupted read.
static volatile sig_atomic_t chat_interrupted;

static void chat_on_sigint(int sig) {
    (void)sig;
    chat_interrupted = 1;
}

// While a reply streams the handler restarts what it interrupts (a write to the terminal finishes;
// the callback stops the reply at the next token); at the prompt it does not, so the read returns.
static void chat_catch_sigint(int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = chat_on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGINT, &sa, NULL);
}

// At a terminal's prompt: waits until a line can be read or Ctrl-C was pressed (returns 1). SIGINT stays
// blocked from the flag's check until pselect waits, so a Ctrl-C that lands in between wakes the wait; a
// check followed by a blocking read would lose it and the read would wait for the next line.
static int chat_wait_line(void) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &old);
    while (!chat_interrupted) {
        fd_set rd;
        FD_ZERO(&rd);
        FD_SET(fileno(stdin), &rd);
        if (pselect(fileno(stdin) + 1, &rd, NULL, NULL, NULL, &old) >= 0 || errno != EINTR)
            break; // readable (or an error getline will report)
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return chat_interrupted != 0;
}

static int chat_token(void *user, int sample, const char *text, size_t len) {
    (void)user;
    (void)sample;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return chat_interrupted != 0; // non-zero stops the reply; what was streamed stays its text
}

// The conversation: msgs[0..keep) (the --system message) survive /reset; the rest alternate user and
// assistant turns whose texts the chat owns.
typedef struct {
    ErMessage *msgs;
    char **owned;
    int n, cap, keep;
} ChatLog;

static void chat_log_free(ChatLog *c) {
    for (int i = 0; c->owned && i < c->n; i++)
        er_free(c->owned[i]);
    er_free(c->owned);
    er_free(c->msgs);
    memset(c, 0, sizeof *c);
}

// Drops messages [from, to) (owned texts freed), moving the later ones down.
static void chat_log_drop(ChatLog *c, int from, int to) {
    for (int i = from; i < to; i++)
        er_free(c->owned[i]);
    memmove(c->msgs + from, c->msgs + to, sizeof(ErMessage) * (size_t)(c->n - to));
    memmove(c->owned + from, c->owned + to, sizeof(char *) * (size_t)(c->n - to));
    c->n -= to - from;
}

// Appends a message; owned = 1: the chat keeps a copy of text.
static int chat_log_push(ChatLog *c, const char *role, const char *text, int owned) {
    if (c->n + 1 > c->cap) {
        int grown = c->cap ? c->cap * 2 : 8;
        ErMessage *gm = er_realloc_array(c->msgs, (size_t)grown, sizeof(ErMessage));
        if (!gm)
            return ER_ENOMEM;
        c->msgs = gm;
        char **go = er_realloc_array(c->owned, (size_t)grown, sizeof(char *));
        if (!go)
            return ER_ENOMEM;
        c->owned = go;
        c->cap = grown;
    }
    char *copy = owned ? er_strdup(text) : NULL;
    if (owned && !copy)
        return ER_ENOMEM;
    c->owned[c->n] = copy;
    c->msgs[c->n++] = (ErMessage){role, copy ? copy : text};
    return ER_OK;
}

// Generates for the kept messages and the conversation from message `from` on (the older turns left
// out), with `system` (NULL: none) in place of the kept system message; ER_ERANGE when that does not fit in the
// session's context.
static int chat_generate(ErSession *s, const ChatLog *c, int from, const char *system, const ErGenParams *p) {
    ErMessage *view = er_alloc(sizeof(ErMessage) * (size_t)(c->n + 1));
    if (!view)
        return ER_ENOMEM;
    int n = 0;
    if (system)
        view[n++] = (ErMessage){"system", system};
    for (int i = system ? c->keep : 0; i < c->keep; i++)
        view[n++] = c->msgs[i];
    for (int i = from; i < c->n; i++)
        view[n++] = c->msgs[i];
    int rc = er_generate(s, view, n, p, chat_token, NULL);
    er_free(view);
    return rc;
}

// ---- the memory (--memory FILE) ----

typedef struct {
    const char *path;      // NULL: no memory
    int k, tokens, rounds;
    MemStore *store;
    MemChat mc;
    MemChatEmbedder emb;
    ChatStyle style;
    cJSON *tools;          // the memory tools the model is offered (NULL: --memory-rounds 0)
    Tokenizer *tok;
} ChatMemory;

#ifndef ER_NO_MEMORY
static int memory_open(ChatMemory *mem, const char *model_dir, ErModel *m, ErSession *s) {
    if (!mem->path)
        return ER_OK;
    ER_TRY(chat_style_from_config(model_dir, &mem->style));
    ER_TRY(tok_load(&mem->tok, model_dir));
    ER_TRY(mem_open(&mem->store, mem->path, 1, 0, MEM_VEC_INT8));
    if (mem->rounds > 0 && !(mem->tools = mem_chat_tools()))
        return ER_ENOMEM;
    mem->emb = (MemChatEmbedder){m, s, NULL};
    mem->mc = (MemChat){mem->store, NULL, mem_chat_embed, &mem->emb, mem->tok, mem->k};
    const char *why;
    if (!mem_chat_vectors_ok(&mem->mc, er_model_embedding_size(m), &why)) {
        fprintf(stderr, "erinfer chat: warning: %s: %s\n", mem->path, why);
        mem->mc.embed = NULL;
    }
    int64_t n = 0;
    ER_TRY(mem_count(mem->store, &n));
    fprintf(stderr, "erinfer chat: memory %s: %lld entries%s\n", mem->path, (long long)n,
            mem->tools ? "; the model may call memory_search and memory_add" : "");
    return ER_OK;
}

static void memory_close(ChatMemory *mem) {
    mem_close(mem->store);
    cJSON_Delete(mem->tools);
    tok_free(mem->tok);
}

// The entries recalled for the user's message (*block NULL: none, or no memory), said on stderr.
static int memory_recall(ChatMemory *mem, const char *text, char **block) {
    *block = NULL;
    if (!mem->store)
        return ER_OK;
    int64_t ids[256];
    int n = 0;
    ER_TRY(mem_chat_recall(&mem->mc, text, mem->tokens, block, ids, &n));
    if (n > 0) {
        fprintf(stderr, "[memory: recalled");
        for (int i = 0; i < n; i++)
            fprintf(stderr, " %lld", (long long)ids[i]);
        fprintf(stderr, "]\n");
    }
    return ER_OK;
}

// This round's system message (*out NULL: the conversation's own): the --system text, the memory tools announced
// as the chat template does (while tools is set), then the recalled block.
static int memory_system(const ChatMemory *mem, const char *system, const char *block, int tools, char **out) {
    *out = NULL;
    if (!mem->store)
        return ER_OK;
    char *with_tools = NULL;
    if (tools && mem->tools)
        ER_TRY(chat_tools_system(mem->style, system, mem->tools, &with_tools));
    const char *base = with_tools ? with_tools : system ? system : chat_default_system(mem->style);
    StrBuf b = {0};
    strbuf_puts(&b, base ? base : "");
    if (block) {
        strbuf_puts(&b, base && base[0] ? "\n\n" : "");
        strbuf_puts(&b, block);
    }
    er_free(with_tools);
    if (b.oom) {
        er_free(b.p);
        return ER_ENOMEM;
    }
    *out = b.p;
    return ER_OK;
}

// When the reply is calls of the memory tools alone (and rounds are left), runs them (said on stderr) and adds the
// calls and their results to the conversation: 1, the model goes on. 0: the reply is the answer.
static int memory_round(ChatMemory *mem, ChatLog *c, const char *reply, int round) {
    if (!mem->store || !mem->tools || round >= mem->rounds)
        return 0;
    MemChatRound r;
    int rc = mem_chat_round(&mem->mc, reply, strlen(reply), &r);
    if (rc <= 0)
        return rc;
    for (int i = 0; i < r.n; i++)
        fprintf(stderr, "[%s %s -> %s]\n", r.calls[i].name, r.calls[i].arguments, r.results[i]);
    rc = chat_log_push(c, "assistant", r.turn, 1);
    for (int i = 0; rc == ER_OK && i < r.n; i++)
        rc = chat_log_push(c, "tool", r.results[i], 1);
    mem_chat_round_free(&r);
    return rc < 0 ? rc : 1;
}

// /save: the conversation so far as one entry.
static int memory_save(ChatMemory *mem, const ChatLog *c) {
    if (!mem->store) {
        printf("(no memory store: start erinfer chat with --memory FILE)\n");
        return ER_OK;
    }
    ChatMessage *msgs = er_alloc(sizeof *msgs * (size_t)(c->n + 1));
    if (!msgs)
        return ER_ENOMEM;
    for (int i = 0; i < c->n; i++)
        msgs[i] = (ChatMessage){c->msgs[i].role, c->msgs[i].content};
    char *text = NULL;
    int64_t id = 0;
    int rc = mem_chat_transcript(msgs, c->n, &text);
    er_free(msgs);
    if (rc == ER_EINVAL) { // nothing said yet
        er_clear_error();
        printf("(nothing to save yet)\n");
        return ER_OK;
    }
    if (rc == ER_OK)
        rc = mem_chat_save(&mem->mc, text, "{\"source\": \"chat\"}", &id);
    er_free(text);
    ER_TRY(rc);
    printf("(saved as memory entry %lld)\n", (long long)id);
    return ER_OK;
}
#else // the aarch64 build has no memory store (no libsqlite3 there): --memory is refused
static int memory_open(ChatMemory *mem, const char *model_dir, ErModel *m, ErSession *s) {
    return mem->path ? er_error(ER_EUNSUPPORTED, "--memory: this build has no memory store (built without SQLite)")
                     : ER_OK;
}
static void memory_close(ChatMemory *mem) {}
static int memory_recall(ChatMemory *mem, const char *text, char **block) { return *block = NULL, ER_OK; }
static int memory_system(const ChatMemory *mem, const char *system, const char *block, int tools, char **out) {
    return *out = NULL, ER_OK;
}
static int memory_round(ChatMemory *mem, ChatLog *c, const char *reply, int round) { return 0; }
static int memory_save(ChatMemory *mem, const ChatLog *c) {
    printf("(no memory store in this build)\n");
    return ER_OK;
}
#endif

// ---- turns ----

// One turn: the user's text, the streamed reply, the reply kept in the conversation. With a memory store the
// entries recalled for the text go into the system message, and while the model calls the memory tools they run
// and it goes on (their calls and results leave the conversation once it answers). When the conversation no
// longer fits in the context the oldest turns are dropped (and said so); a message too long on its own is
// refused, and the conversation stays as it was. Ctrl-C stops the reply (what was streamed is kept as the
// reply); *stopped says so.
static int chat_turn(ErSession *s, ChatLog *c, ChatMemory *mem, const char *text, const ErGenParams *p, int tty,
                     int *stopped) {
    *stopped = 0;
    ER_TRY(chat_log_push(c, "user", text, 1));
    int user_at = c->n - 1, from = c->keep, rc = ER_OK, more = 1;
    char *block = NULL, *system = NULL;
    chat_interrupted = 0;
    ER_CHECK(memory_recall(mem, text, &block));
    for (int round = 0; more; round++) {
        er_free(system);
        ER_CHECK(memory_system(mem, c->keep ? c->msgs[0].content : NULL, block, round < mem->rounds, &system));
        chat_catch_sigint(1);
        while ((rc = chat_generate(s, c, from, system, p)) == ER_ERANGE && from < user_at)
            from += 2; // one user turn and its reply
        chat_catch_sigint(0);
        if (rc < 0 || chat_interrupted)
            break;
        ER_CHECK(more = memory_round(mem, c, er_result_sample(s, 0)->text, round));
        if (more)
            putchar('\n');
    }
    if (rc == ER_ERANGE) {
        fprintf(stderr, "[not sent: the message does not fit: %s; send a shorter one or raise --context]\n",
                er_last_error());
        chat_log_drop(c, user_at, c->n);
        rc = ER_OK;
        goto done;
    }
    ER_CHECK(rc);
    putchar('\n');
    fflush(stdout);
    *stopped = chat_interrupted != 0;
    chat_interrupted = 0;
    chat_log_drop(c, user_at + 1, c->n); // the memory tools' rounds
    if (from > c->keep) {
        int k = (from - c->keep) / 2;
        if (k == 1)
            fprintf(stderr, "[dropped the oldest turn: the conversation no longer fits in the context]\n");
        else
            fprintf(stderr, "[dropped the %d oldest turns: the conversation no longer fits in the context]\n", k);
        chat_log_drop(c, c->keep, from);
    }
    ER_CHECK(chat_log_push(c, "assistant", er_result_sample(s, 0)->text, 1));
    const ErStats *st = er_result_stats(s);
    if (*stopped)
        fprintf(stderr, "[stopped; Ctrl-C again at the prompt leaves]\n");
    else if (tty)
        fprintf(stderr, "[%d prompt tokens (%d reused), %ld generated, %.1f tokens/s]\n", st->prompt_tokens,
                st->prompt_reused, st->generated_tokens, st->decode_tokens_per_s);
done:
    er_free(block);
    er_free(system);
    return rc;
}

// A command line (starting with '/', not "//"): 1 when it asks to leave.
static int chat_command(ChatLog *c, ChatMemory *mem, const char *line) {
    if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0)
        return 1;
    int rc = ER_OK;
    if (strcmp(line, "/help") == 0) {
        printf("%s\n", CHAT_HELP);
    } else if (strcmp(line, "/reset") == 0) {
        chat_log_drop(c, c->keep, c->n);
        printf("(new conversation)\n");
    } else if (strcmp(line, "/save") == 0) {
        rc = memory_save(mem, c);
    } else {
        printf("unknown command %s (/help lists them)\n", line);
    }
    fflush(stdout);
    return rc;
}

// Interactive multi-turn chat on stdin/stdout. The session keeps the conversation's prompt in its
// KV cache, so each turn computes only its new tokens. Lines starting with '/' are commands. Ctrl-C
// stops a reply; two in a row with nothing typed between (a stopped reply counts) leave.
int cmd_chat(int argc, char **argv) {
    GenFlags f;
    gen_flags_default(&f);
    f.default_max_new = 512;
    ChatMemory mem = {.k = MEM_CHAT_K, .tokens = MEM_CHAT_TOKENS, .rounds = MEM_CHAT_ROUNDS};
    ArgSpec specs[GEN_FLAGS_MAX + 4];
    int ns = gen_flags_specs(&f, specs);
    specs[ns++] = (ArgSpec){"memory", ARG_STR, &mem.path, "a memory store (SQLite; created when missing): each turn "
                            "recalls its best entries, the model may call memory_search / memory_add, /save keeps the "
                            "conversation (docs/memory.md)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"memory-k", ARG_INT, &mem.k, "entries recalled into the system message (0: none)", 0, 0,
                            256};
    specs[ns++] = (ArgSpec){"memory-tokens", ARG_INT, &mem.tokens, "tokens the recalled entries may take", 0, 1,
                            1 << 20};
    specs[ns++] = (ArgSpec){"memory-rounds", ARG_INT, &mem.rounds, "rounds of memory tool calls in one reply (0: no "
                            "memory tools)", 0, 0, 64};
    int rc = args_parse(argc, argv, specs, ns, "erinfer chat --model DIR [--memory FILE] [flags]");
    if (rc == ARGS_HELP)
        return 0;
    ErGenParams p;
    int kv_int8 = 0;
    if (rc < 0 || gen_flags_params(&f, &p, &kv_int8) < 0)
        return cli_fail("chat");
    threads_set(f.threads);
    ErModel *m = NULL;
    ErSession *s = NULL;
    if (gen_flags_open(&f, 1, &m, &s) < 0 || memory_open(&mem, f.model, m, s) < 0) {
        memory_close(&mem);
        er_session_free(s);
        er_model_free(m);
        return cli_fail("chat");
    }
    int tty = isatty(fileno(stdin));
    ChatLog c = {0};
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    if (f.system)
        ER_CHECK(chat_log_push(&c, "system", f.system, 0));
    c.keep = c.n;
    fprintf(stderr, "erinfer chat: %s%s%s, up to %d new tokens a turn; /help for commands\n", f.model,
            f.adapter ? " + " : "", f.adapter ? f.adapter : "", p.max_new_tokens);
    chat_catch_sigint(0);
    int armed = 0; // the last thing was a Ctrl-C: another one leaves
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        // A terminal delivers whole lines, so once one is there getline does not block on it.
        len = (tty ? chat_wait_line() : chat_interrupted) ? -1 : getline(&line, &lcap, stdin);
        if (len < 0 && chat_interrupted) { // Ctrl-C at the prompt (the terminal dropped what was typed)
            chat_interrupted = 0;
            clearerr(stdin);
            if (armed) {
                if (tty)
                    putchar('\n');
                break;
            }
            armed = 1;
            printf("\n(Ctrl-C again, Ctrl-D or /exit leaves)\n");
            continue;
        }
        if (len < 0) { // end of input
            if (tty)
                putchar('\n');
            break;
        }
        armed = 0;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0)
            continue;
        if (line[0] == '/' && line[1] != '/') {
            int leave;
            ER_CHECK(leave = chat_command(&c, &mem, line));
            if (leave)
                break;
            continue;
        }
        ER_CHECK(chat_turn(s, &c, &mem, line[0] == '/' ? line + 1 : line, &p, tty, &armed));
    }
done:
    signal(SIGINT, SIG_DFL);
    chat_log_free(&c);
    free(line);
    memory_close(&mem);
    er_session_free(s);
    er_model_free(m);
    return rc < 0 ? cli_fail("chat") : 0;
}
