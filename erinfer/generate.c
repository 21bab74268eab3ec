// erinfer generate: text generation through the public API (infer/erinfer.h); erinfer chat is erinfer/chat.c.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
