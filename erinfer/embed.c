// erinfer embed: text -> embedding vectors (er_embed), one JSON line per text.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/threads.h"
#include "erinfer/cli.h"
#include "infer/erinfer.h"

typedef struct {
    const char *model, *text, *input, *output, *pooling;
    int query, dimensions, no_normalize, max_tokens, threads;
} EmbedOpts;

// One {"embedding": [...], "tokens": n} line; %.9g keeps every float's bits.
static void write_embedding(FILE *fp, const float *v, int dims, int tokens) {
    fputs("{\"embedding\":[", fp);
    for (int i = 0; i < dims; i++)
        fprintf(fp, i ? ",%.9g" : "%.9g", v[i]);
    fprintf(fp, "],\"tokens\":%d}\n", tokens);
}

static int embed_one(ErSession *s, const char *text, const ErEmbedParams *p, float *v, int dims, FILE *fp) {
    int tokens = er_embed(s, &text, 1, p, v, (size_t)dims);
    if (tokens < 0)
        return tokens;
    write_embedding(fp, v, dims, tokens);
    return ferror(fp) ? er_error(ER_EIO, "write failed") : ER_OK;
}

static int run_embed(const EmbedOpts *o) {
    ErModel *m = NULL;
    ErSession *s = NULL;
    JsonlReader r = {0};
    AtomicFile out = {0};
    cJSON *rec;
    float *v = NULL;
    int rc = ER_OK;
    ErEmbedParams p;
    er_embed_params_init(&p);
    p.query = o->query;
    p.dimensions = o->dimensions;
    p.normalize = !o->no_normalize;
    if (strcmp(o->pooling, "model") == 0)
        p.pooling = ER_POOL_MODEL;
    else if (strcmp(o->pooling, "mean") == 0)
        p.pooling = ER_POOL_MEAN;
    else if (strcmp(o->pooling, "last") == 0)
        p.pooling = ER_POOL_LAST;
    else
        return er_error(ER_EINVAL, "--pooling must be model, mean or last, got \"%s\"", o->pooling);
    if (!!o->text == !!o->input)
        return er_error(ER_EINVAL, "give exactly one of --text and --input");
    ER_CHECK(file_output_check(o->output));
    if (o->input)
        ER_CHECK(file_output_not_input(o->output, o->input, "--input"));
    ER_CHECK(er_model_load(&m, o->model));
    ErSessionParams sp;
    er_session_params_init(&sp);
    sp.max_tokens = o->max_tokens ? o->max_tokens : er_model_max_positions(m);
    ER_CHECK(er_session_open(&s, m, &sp));
    int dims = o->dimensions ? o->dimensions : er_model_embedding_size(m);
    if (!(v = er_alloc(sizeof(float) * (size_t)dims)))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(atomic_open(&out, o->output));
    if (o->text) {
        ER_CHECK(embed_one(s, o->text, &p, v, dims, out.fp));
    } else {
        ER_CHECK(jsonl_open(&r, o->input));
        while ((rc = jsonl_next(&r, &rec)) == 1) {
            char ctx[600];
            const char *text;
            snprintf(ctx, sizeof ctx, "%s:%ld", r.path, r.lineno);
            rc = json_get_string(rec, "text", &text, ctx);
            if (rc == ER_OK && (rc = embed_one(s, text, &p, v, dims, out.fp)) < 0)
                rc = er_error_prefix(rc, "%s", ctx);
            cJSON_Delete(rec);
            ER_CHECK(rc);
        }
        ER_CHECK(rc);
    }
    rc = atomic_commit(&out);
done:
    atomic_abort(&out); // a failed run leaves no partial file
    jsonl_close(&r);
    er_free(v);
    er_session_free(s);
    er_model_free(m);
    return rc;
}

int cmd_embed(int argc, char **argv) {
    EmbedOpts o = {.output = "-", .pooling = "model"};
    ArgSpec specs[] = {
        {"model", ARG_STR, &o.model, "model dir (an embedding model such as Qwen3-Embedding, or any model) or .gguf", 1,
         0, 0},
        {"text", ARG_STR, &o.text, "one text to embed", 0, 0, 0},
        {"input", ARG_STR, &o.input, "JSONL of {\"text\": \"...\"} lines (- for stdin)", 0, 0, 0},
        {"output", ARG_STR, &o.output,
         "JSONL of {\"embedding\": [...], \"tokens\": n} lines: a file (written atomically), - for stdout, or a fifo "
         "or character device (written in place)", 0, 0, 0},
        {"query", ARG_FLAG, &o.query,
         "prepend the model's query prompt (Qwen3-Embedding's instruction): for search queries, not documents", 0, 0,
         0},
        {"pooling", ARG_STR, &o.pooling, "model (as the model dir says), mean or last [model]", 0, 0, 0},
        {"dimensions", ARG_INT, &o.dimensions, "keep the first N values, normalised after the cut (0 = all)", 0, 0,
         1 << 24},
        {"no-normalize", ARG_FLAG, &o.no_normalize, "leave the vectors as pooled (not L2-normalised)", 0, 0, 0},
        {"max-tokens", ARG_INT, &o.max_tokens, "longest text in tokens (0 = the model's positions)", 0, 0, 1 << 24},
        {"threads", ARG_INT, &o.threads, "threads (0 = all cores)", 0, 0, 4096},
    };
    int rc = args_parse(argc, argv, specs, sizeof specs / sizeof specs[0],
                        "erinfer embed --model DIR (--text TEXT | --input TEXT.jsonl) [--output FILE.jsonl] [flags]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0)
        return cli_fail("embed");
    threads_set(o.threads);
    if (run_embed(&o) < 0)
        return cli_fail("embed");
    return 0;
}
