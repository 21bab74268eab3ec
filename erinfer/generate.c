// erinfer generate and erinfer chat: text generation through the public API (infer/erinfer.h).
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
#include "core/json.h"
#include "core/threads.h"
#include "erinfer/cli.h"
#include "infer/erinfer.h"
#include "infer/runner.h"

static int stream_token(void *user, int sample, const char *text, size_t len) {
    (void)user;
    (void)sample;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static void print_json_result(const ErSession *s) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "samples");
    for (int i = 0; i < er_result_count(s); i++) {
        const ErSample *x = er_result_sample(s, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "text", x->text);
        cJSON_AddItemToObject(o, "tokens", cJSON_CreateIntArray(x->tokens, x->n_tokens));
        cJSON_AddStringToObject(o, "finish", runner_finish_name(x->finish));
        cJSON_AddBoolToObject(o, "budget_cut", x->budget_cut);
        cJSON_AddItemToArray(arr, o);
    }
    cJSON *route = runner_session_route_json(s);
    if (route)
        cJSON_AddItemToObject(j, "pipeline", route);
    const ErStats *st = er_result_stats(s);
    cJSON *o = cJSON_AddObjectToObject(j, "stats");
    cJSON_AddNumberToObject(o, "prompt_tokens", st->prompt_tokens);
    cJSON_AddNumberToObject(o, "prompt_reused", st->prompt_reused);
    cJSON_AddNumberToObject(o, "generated_tokens", (double)st->generated_tokens);
    cJSON_AddNumberToObject(o, "ttft_s", st->ttft_s);
    cJSON_AddNumberToObject(o, "decode_tokens_per_s", st->decode_tokens_per_s);
    cJSON_AddNumberToObject(o, "total_s", st->total_s);
    cJSON_AddNumberToObject(o, "kv_bytes", (double)st->kv_bytes);
    char *txt = cJSON_PrintUnformatted(j);
    if (txt)
        puts(txt);
    cJSON_free(txt);
    cJSON_Delete(j);
}

// --messages FILE.json: [{"role": ..., "content": ...}, ...]
static int load_messages(const char *path, cJSON **doc, ErMessage **msgs, int *n) {
    ER_TRY(json_parse_file(path, 64u << 20, doc));
    if (!cJSON_IsArray(*doc))
        return er_error(ER_EFORMAT, "%s: expected a JSON array of {\"role\", \"content\"} objects", path);
    *n = cJSON_GetArraySize(*doc);
    *msgs = er_calloc((size_t)(*n + 1), sizeof(ErMessage));
    if (!*msgs)
        return ER_ENOMEM;
    int i = 0;
    for (cJSON *e = (*doc)->child; e; e = e->next, i++) {
        char ctx[600];
        snprintf(ctx, sizeof ctx, "%s: message %d", path, i);
        ER_TRY(json_get_string(e, "role", &(*msgs)[i].role, ctx));
        ER_TRY(json_get_string(e, "content", &(*msgs)[i].content, ctx));
    }
    return ER_OK;
}

// The route and the stats on stderr, after the text.
static void print_route_stats(const ErSession *s, int json) {
    const ErRoute *r = er_result_route(s);
    if (r && !json) {
        fprintf(stderr, "[route %s", r->route == ER_ROUTE_REASONING ? "reasoning" : "direct");
        if (r->switcher_score >= 0)
            fprintf(stderr, " (switcher %.3f vs threshold %.3f)", r->switcher_score, r->switcher_threshold);
        fprintf(stderr, ", answer %s", r->answer ? r->answer : "(none)");
        for (int k = 0; k < r->n_votes; k++)
            fprintf(stderr, "%s%s: %.3f (%d)", k ? ", " : "; votes ", r->vote_answers[k], r->vote_weights[k],
                    r->vote_counts[k]);
        fprintf(stderr, "]\n");
    }
    const ErStats *st = er_result_stats(s);
    fprintf(stderr, "[%d prompt tokens, %ld generated, TTFT %.3f s, %.1f tokens/s, KV %.1f KiB]\n", st->prompt_tokens,
            st->generated_tokens, st->ttft_s, st->decode_tokens_per_s, st->kv_bytes / 1024.0);
}

// The flags generate adds to the shared ones, checked together.
static int generate_check(const GenFlags *f, const char *prompt, const char *messages, int raw) {
    if (!!prompt == !!messages)
        return er_error(ER_EINVAL, "give exactly one of --prompt and --messages");
    if (raw && !prompt)
        return er_error(ER_EINVAL, "--raw needs --prompt");
    if (f->system && messages)
        return er_error(ER_EINVAL, "--system goes with --prompt; put the system message in the --messages file");
    return ER_OK;
}

int cmd_generate(int argc, char **argv) {
    GenFlags f;
    gen_flags_default(&f);
    const char *prompt = NULL, *messages = NULL;
    int raw = 0, json = 0;
    ArgSpec specs[GEN_FLAGS_MAX + 5];
    int ns = gen_flags_specs(&f, specs);
    specs[ns++] = (ArgSpec){"prompt", ARG_STR, &prompt, "user message (or raw text with --raw)", 0, 0, 0};
    specs[ns++] = (ArgSpec){"messages", ARG_STR, &messages, "JSON file: [{\"role\", \"content\"}, ...]", 0, 0, 0};
    specs[ns++] = (ArgSpec){"samples", ARG_INT, &f.samples, "parallel samples sharing the prompt", 0, 1, 256};
    specs[ns++] = (ArgSpec){"raw", ARG_FLAG, &raw, "feed --prompt as is, without the chat template", 0, 0, 0};
    specs[ns++] = (ArgSpec){"json", ARG_FLAG, &json, "print one JSON object with every sample and the stats", 0, 0, 0};
    int rc = args_parse(argc, argv, specs, ns, "erinfer generate --model DIR (--prompt TEXT | --messages FILE.json) [flags]");
    if (rc == ARGS_HELP)
        return 0;
    ErGenParams p;
    int kv_int8 = 0;
    if (rc < 0 || generate_check(&f, prompt, messages, raw) < 0 || gen_flags_params(&f, &p, &kv_int8) < 0)
        return cli_fail("generate");
    threads_set(f.threads);

    ErModel *m = NULL;
    ErSession *s = NULL;
    cJSON *doc = NULL;
    ErMessage *msgs = NULL, one[2];
    int n = 0;
    ER_CHECK(gen_flags_open(&f, f.samples, &m, &s));
    if (messages) {
        ER_CHECK(load_messages(messages, &doc, &msgs, &n));
    } else {
        msgs = one;
        if (f.system)
            one[n++] = (ErMessage){"system", f.system};
        one[n++] = (ErMessage){"user", prompt};
    }
    int stream = !json && f.samples == 1 && isatty(fileno(stdout));
    ER_CHECK(raw ? er_generate_raw(s, prompt, &p, stream ? stream_token : NULL, NULL)
                 : er_generate(s, msgs, n, &p, stream ? stream_token : NULL, NULL));
    if (json) {
        print_json_result(s);
    } else if (stream) {
        putchar('\n');
    } else {
        for (int i = 0; i < er_result_count(s); i++) {
            if (f.samples > 1)
                printf("--- sample %d (%s, %d tokens)\n", i, runner_finish_name(er_result_sample(s, i)->finish),
                       er_result_sample(s, i)->n_tokens);
            printf("%s\n", er_result_sample(s, i)->text);
        }
    }
    // The text is the result: a stdout that cannot take it (a full disk, a closed pipe) fails the command.
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout))
        ER_CHECK(er_error(ER_EIO, "stdout: write failed: %s", errno ? strerror(errno) : "output error"));
    print_route_stats(s, json);
done:
    if (msgs != one)
        er_free(msgs);
    cJSON_Delete(doc);
    er_session_free(s);
    er_model_free(m);
    return rc < 0 ? cli_fail("generate") : 0;
}

static const char CHAT_HELP[] = "commands: /help this list, /reset start a new conversation (the --system message "
                                "stays), /exit leave (so does end of input, or Ctrl-C twice at the prompt); Ctrl-C "
                                "during a reply stops it; a line starting with // sends the rest after one /";

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
    stream_token(user, sample, text, len);
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
// out); ER_ERANGE when that does not fit in the session's context.
static int chat_generate(ErSession *s, const ChatLog *c, int from, const ErGenParams *p) {
    ErMessage *view = er_alloc(sizeof(ErMessage) * (size_t)c->n);
    if (!view)
        return ER_ENOMEM;
    int n = 0;
    for (int i = 0; i < c->keep; i++)
        view[n++] = c->msgs[i];
    for (int i = from; i < c->n; i++)
        view[n++] = c->msgs[i];
    int rc = er_generate(s, view, n, p, chat_token, NULL);
    er_free(view);
    return rc;
}

// One turn: the user's text, the streamed reply, the reply kept in the conversation. When the
// conversation no longer fits in the context the oldest turns are dropped (and said so); a message
// too long on its own is refused, and the conversation stays as it was. Ctrl-C stops the reply (what
// was streamed is kept as the reply); *stopped says so.
static int chat_turn(ErSession *s, ChatLog *c, const char *text, const ErGenParams *p, int tty, int *stopped) {
    *stopped = 0;
    ER_TRY(chat_log_push(c, "user", text, 1));
    int from = c->keep, rc;
    chat_interrupted = 0;
    chat_catch_sigint(1);
    while ((rc = chat_generate(s, c, from, p)) == ER_ERANGE && from < c->n - 1)
        from += 2; // one user turn and its reply
    chat_catch_sigint(0);
    if (rc == ER_ERANGE) {
        fprintf(stderr, "[not sent: the message does not fit: %s; send a shorter one or raise --context]\n",
                er_last_error());
        chat_log_drop(c, c->n - 1, c->n);
        return ER_OK;
    }
    ER_TRY(rc);
    putchar('\n');
    fflush(stdout);
    *stopped = chat_interrupted != 0;
    chat_interrupted = 0;
    if (from > c->keep) {
        int k = (from - c->keep) / 2;
        if (k == 1)
            fprintf(stderr, "[dropped the oldest turn: the conversation no longer fits in the context]\n");
        else
            fprintf(stderr, "[dropped the %d oldest turns: the conversation no longer fits in the context]\n", k);
        chat_log_drop(c, c->keep, from);
    }
    ER_TRY(chat_log_push(c, "assistant", er_result_sample(s, 0)->text, 1));
    const ErStats *st = er_result_stats(s);
    if (*stopped)
        fprintf(stderr, "[stopped; Ctrl-C again at the prompt leaves]\n");
    else if (tty)
        fprintf(stderr, "[%d prompt tokens (%d reused), %ld generated, %.1f tokens/s]\n", st->prompt_tokens,
                st->prompt_reused, st->generated_tokens, st->decode_tokens_per_s);
    return ER_OK;
}

// A command line (starting with '/', not "//"): 1 when it asks to leave.
static int chat_command(ChatLog *c, const char *line) {
    if (strcmp(line, "/exit") == 0 || strcmp(line, "/quit") == 0)
        return 1;
    if (strcmp(line, "/help") == 0) {
        printf("%s\n", CHAT_HELP);
    } else if (strcmp(line, "/reset") == 0) {
        chat_log_drop(c, c->keep, c->n);
        printf("(new conversation)\n");
    } else {
        printf("unknown command %s (/help lists them)\n", line);
    }
    fflush(stdout);
    return 0;
}

// Interactive multi-turn chat on stdin/stdout. The session keeps the conversation's prompt in its
// KV cache, so each turn computes only its new tokens. Lines starting with '/' are commands. Ctrl-C
// stops a reply; two in a row with nothing typed between (a stopped reply counts) leave.
int cmd_chat(int argc, char **argv) {
    GenFlags f;
    gen_flags_default(&f);
    f.default_max_new = 512;
    ArgSpec specs[GEN_FLAGS_MAX];
    int ns = gen_flags_specs(&f, specs);
    int rc = args_parse(argc, argv, specs, ns, "erinfer chat --model DIR [flags]");
    if (rc == ARGS_HELP)
        return 0;
    ErGenParams p;
    int kv_int8 = 0;
    if (rc < 0 || gen_flags_params(&f, &p, &kv_int8) < 0)
        return cli_fail("chat");
    threads_set(f.threads);
    ErModel *m = NULL;
    ErSession *s = NULL;
    if (gen_flags_open(&f, 1, &m, &s) < 0)
        return cli_fail("chat");
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
            if (chat_command(&c, line))
                break;
            continue;
        }
        ER_CHECK(chat_turn(s, &c, line[0] == '/' ? line + 1 : line, &p, tty, &armed));
    }
done:
    signal(SIGINT, SIG_DFL);
    chat_log_free(&c);
    free(line);
    er_session_free(s);
    er_model_free(m);
    return rc < 0 ? cli_fail("chat") : 0;
}
