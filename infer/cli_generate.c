// erinfer generate and erinfer chat: text generation through the public API (infer/erinfer.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/json.h"
#include "core/threads.h"
#include "infer/cli.h"
#include "infer/erinfer.h"

// Flags shared by generate and chat.
typedef struct {
    const char *model, *prompt, *messages, *system, *kv, *stop, *prefix, *suffix;
    int max_new, top_k, samples, budget, answer_tokens, seed, threads, raw, json;
    double temperature, top_p, min_p;
} GenFlags;

#define GEN_FLAG_SPECS(f)                                                                                       \
    {"model", ARG_STR, &(f).model, "model dir (config.json, safetensors, tokenizer.json)", 1, 0, 0},            \
    {"max-new", ARG_INT, &(f).max_new, "new tokens per sample", 0, 1, 1 << 20},                                \
    {"temperature", ARG_FLOAT, &(f).temperature, "sampling temperature (0 = greedy)", 0, 0, 100},               \
    {"top-k", ARG_INT, &(f).top_k, "keep the k most likely tokens (0 = off)", 0, 0, 1 << 24},                   \
    {"top-p", ARG_FLOAT, &(f).top_p, "nucleus sampling mass (1 = off)", 0, 1e-9, 1},                            \
    {"min-p", ARG_FLOAT, &(f).min_p, "drop tokens below min-p x the top probability (0 = off)", 0, 0, 0.999999}, \
    {"seed", ARG_INT, &(f).seed, "sampling seed (sample i uses stream i)", 0, 0, 2147483647},                   \
    {"kv", ARG_STR, &(f).kv, "KV cache type: f32 or int8", 0, 0, 0},                                            \
    {"budget", ARG_INT, &(f).budget, "hard budget: force the answer suffix after this many tokens (0 = off)", 0, \
     0, 1 << 20},                                                                                               \
    {"answer-tokens", ARG_INT, &(f).answer_tokens, "tokens allowed after the budget, suffix included", 0, 1,     \
     1 << 20},                                                                                                  \
    {"budget-suffix", ARG_STR, &(f).suffix, "forced-answer text [\\n</think>\\n\\nFinal answer: ]", 0, 0, 0},   \
    {"prefix", ARG_STR, &(f).prefix, "text forced at the start of the response (e.g. \"<think>\\n\")", 0, 0, 0}, \
    {"stop", ARG_STR, &(f).stop, "stop string (cut from the output)", 0, 0, 0},                                 \
    {"system", ARG_STR, &(f).system, "system message", 0, 0, 0},                                                \
    {"threads", ARG_INT, &(f).threads, "threads (0 = all cores)", 0, 0, 4096}

static void gen_flags_default(GenFlags *f) {
    memset(f, 0, sizeof *f);
    f->max_new = 256;
    f->temperature = 0;
    f->top_p = 1;
    f->samples = 1;
    f->answer_tokens = 32;
    f->kv = "f32";
}

static int params_from_flags(const GenFlags *f, ErGenParams *p, int *kv_int8) {
    er_gen_params_init(p);
    p->max_new_tokens = f->max_new;
    p->n_samples = f->samples;
    p->temperature = (float)f->temperature;
    p->top_k = f->top_k;
    p->top_p = (float)f->top_p;
    p->min_p = (float)f->min_p;
    p->seed = (uint64_t)f->seed;
    p->budget = f->budget;
    p->answer_tokens = f->answer_tokens;
    p->budget_suffix = f->suffix;
    p->response_prefix = f->prefix;
    p->stop[0] = f->stop;
    if (strcmp(f->kv, "f32") == 0)
        *kv_int8 = 0;
    else if (strcmp(f->kv, "int8") == 0)
        *kv_int8 = 1;
    else
        return er_error(ER_EINVAL, "--kv must be f32 or int8, got \"%s\"", f->kv);
    return ER_OK;
}

static int stream_token(void *user, int sample, const char *text, size_t len) {
    (void)user;
    (void)sample;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static const char *finish_name(int f) {
    return f == ER_FINISH_EOS ? "eos" : f == ER_FINISH_STOP ? "stop" : "length";
}

static void print_json_result(const ErSession *s) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(j, "samples");
    for (int i = 0; i < er_result_count(s); i++) {
        const ErSample *x = er_result_sample(s, i);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "text", x->text);
        cJSON_AddItemToObject(o, "tokens", cJSON_CreateIntArray(x->tokens, x->n_tokens));
        cJSON_AddStringToObject(o, "finish", finish_name(x->finish));
        cJSON_AddBoolToObject(o, "budget_cut", x->budget_cut);
        cJSON_AddItemToArray(arr, o);
    }
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

int cmd_generate(int argc, char **argv) {
    GenFlags f;
    gen_flags_default(&f);
    int max_tokens = 0;
    ArgSpec specs[] = {
        GEN_FLAG_SPECS(f),
        {"prompt", ARG_STR, &f.prompt, "user message (or raw text with --raw)", 0, 0, 0},
        {"messages", ARG_STR, &f.messages, "JSON file: [{\"role\", \"content\"}, ...]", 0, 0, 0},
        {"samples", ARG_INT, &f.samples, "parallel samples sharing the prompt", 0, 1, 256},
        {"raw", ARG_FLAG, &f.raw, "feed --prompt as is, without the chat template", 0, 0, 0},
        {"json", ARG_FLAG, &f.json, "print one JSON object with every sample and the stats", 0, 0, 0},
        {"context", ARG_INT, &max_tokens, "positions per sample, prompt included (0 = 4096 + --max-new)", 0, 0, 1 << 22},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer generate --model DIR (--prompt TEXT | --messages FILE.json) [flags]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc == ER_OK && !!f.prompt == !!f.messages)
        rc = er_error(ER_EINVAL, "give exactly one of --prompt and --messages");
    if (rc == ER_OK && f.raw && !f.prompt)
        rc = er_error(ER_EINVAL, "--raw needs --prompt");
    ErGenParams p;
    int kv_int8 = 0;
    if (rc == ER_OK)
        rc = params_from_flags(&f, &p, &kv_int8);
    if (rc < 0)
        return cli_fail("generate");
    threads_set(f.threads);

    ErModel *m = NULL;
    ErSession *s = NULL;
    cJSON *doc = NULL;
    ErMessage *msgs = NULL, one[2];
    int n = 0;
    rc = er_model_load(&m, f.model);
    if (rc == ER_OK && f.messages) {
        rc = load_messages(f.messages, &doc, &msgs, &n);
    } else if (rc == ER_OK) {
        msgs = one;
        if (f.system)
            one[n++] = (ErMessage){"system", f.system};
        one[n++] = (ErMessage){"user", f.prompt};
    }
    if (rc == ER_OK && f.system && f.messages)
        rc = er_error(ER_EINVAL, "--system goes with --prompt; put the system message in the --messages file");
    if (rc == ER_OK) {
        // The prompt length is known only after rendering: size for a generous prompt plus the output.
        if (max_tokens == 0)
            max_tokens = 4096 + f.max_new;
        rc = er_session_open(&s, m, f.samples, max_tokens, kv_int8);
    }
    int stream = rc == ER_OK && !f.json && f.samples == 1 && isatty(fileno(stdout));
    if (rc == ER_OK)
        rc = f.raw ? er_generate_raw(s, f.prompt, &p, stream ? stream_token : NULL, NULL)
                   : er_generate(s, msgs, n, &p, stream ? stream_token : NULL, NULL);
    if (rc == ER_OK) {
        if (f.json) {
            print_json_result(s);
        } else if (stream) {
            putchar('\n');
        } else {
            for (int i = 0; i < er_result_count(s); i++) {
                if (f.samples > 1)
                    printf("--- sample %d (%s, %d tokens)\n", i, finish_name(er_result_sample(s, i)->finish),
                           er_result_sample(s, i)->n_tokens);
                printf("%s\n", er_result_sample(s, i)->text);
            }
        }
        const ErStats *st = er_result_stats(s);
        fprintf(stderr, "[%d prompt tokens, %ld generated, TTFT %.3f s, %.1f tokens/s, KV %.1f KiB]\n",
                st->prompt_tokens, st->generated_tokens, st->ttft_s, st->decode_tokens_per_s, st->kv_bytes / 1024.0);
    }
    if (msgs != one)
        er_free(msgs);
    cJSON_Delete(doc);
    er_session_free(s);
    er_model_free(m);
    return rc < 0 ? cli_fail("generate") : 0;
}

// Interactive multi-turn chat on stdin/stdout. The session keeps the conversation's prompt in its
// KV cache, so each turn computes only its new tokens.
int cmd_chat(int argc, char **argv) {
    GenFlags f;
    gen_flags_default(&f);
    f.max_new = 512;
    int max_tokens = 8192;
    ArgSpec specs[] = {
        GEN_FLAG_SPECS(f),
        {"context", ARG_INT, &max_tokens, "positions the conversation may use", 0, 16, 1 << 20},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0], "erinfer chat --model DIR [flags]");
    if (rc == ARGS_HELP)
        return 0;
    ErGenParams p;
    int kv_int8 = 0;
    if (rc == ER_OK)
        rc = params_from_flags(&f, &p, &kv_int8);
    if (rc < 0)
        return cli_fail("chat");
    threads_set(f.threads);
    ErModel *m = NULL;
    ErSession *s = NULL;
    rc = er_model_load(&m, f.model);
    if (rc == ER_OK)
        rc = er_session_open(&s, m, 1, max_tokens, kv_int8);
    if (rc < 0) {
        er_model_free(m);
        return cli_fail("chat");
    }
    int tty = isatty(fileno(stdin));
    ErMessage *msgs = NULL;
    char **owned = NULL;
    int n = 0, cap = 0;
    if (f.system) {
        cap = 8;
        msgs = er_calloc((size_t)cap, sizeof(ErMessage));
        owned = er_calloc((size_t)cap, sizeof(char *));
        msgs[n++] = (ErMessage){"system", f.system};
    }
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while (rc == ER_OK) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        if ((len = getline(&line, &lcap, stdin)) < 0)
            break;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0)
            continue;
        if (n + 2 > cap) {
            cap = cap ? cap * 2 : 8;
            msgs = er_realloc_array(msgs, (size_t)cap, sizeof(ErMessage));
            owned = er_realloc_array(owned, (size_t)cap, sizeof(char *));
            if (!msgs || !owned) {
                rc = ER_ENOMEM;
                break;
            }
        }
        owned[n] = er_strdup(line);
        msgs[n] = (ErMessage){"user", owned[n]};
        n++;
        rc = er_generate(s, msgs, n, &p, stream_token, NULL);
        if (rc < 0)
            break;
        putchar('\n');
        const ErSample *x = er_result_sample(s, 0);
        owned[n] = er_strdup(x->text);
        msgs[n] = (ErMessage){"assistant", owned[n]};
        n++;
        const ErStats *st = er_result_stats(s);
        if (tty)
            fprintf(stderr, "[%d prompt tokens (%d reused), %ld generated, %.1f tokens/s]\n", st->prompt_tokens,
                    st->prompt_reused, st->generated_tokens, st->decode_tokens_per_s);
    }
    for (int i = 0; i < n; i++)
        if (owned && owned[i])
            er_free(owned[i]);
    er_free(owned);
    er_free(msgs);
    free(line);
    er_session_free(s);
    er_model_free(m);
    return rc < 0 ? cli_fail("chat") : 0;
}
