// erinfer tokenize / detokenize: JSONL text <-> token ids with a Hugging Face tokenizer.json.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/tokenizer.h"
#include "erinfer/cli.h"

static void write_json_string(FILE *fp, const char *s, size_t n) {
    fputc('"', fp);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", fp); break;
        case '\\': fputs("\\\\", fp); break;
        case '\n': fputs("\\n", fp); break;
        case '\r': fputs("\\r", fp); break;
        case '\t': fputs("\\t", fp); break;
        case '\b': fputs("\\b", fp); break;
        case '\f': fputs("\\f", fp); break;
        default:
            if (c < 0x20 || c == 0x7F)
                fprintf(fp, "\\u%04x", c);
            else
                fputc(c, fp);
        }
    }
    fputc('"', fp);
}

typedef struct {
    const char *tokenizer, *input, *output;
    int special_as_text;
} Opts;

// One {"text"} record as an {"ids"} line.
static int tokenize_record(const Tokenizer *tok, const cJSON *rec, const char *ctx, int special_as_text, FILE *fp) {
    const char *s;
    int *ids, n;
    ER_TRY(json_get_string(rec, "text", &s, ctx));
    int rc = tok_encode_ex(tok, s, strlen(s), special_as_text, &ids, &n);
    if (rc < 0)
        return er_error_prefix(rc, "%s", ctx);
    fputs("{\"ids\":[", fp);
    for (int i = 0; i < n; i++)
        fprintf(fp, i ? ",%d" : "%d", ids[i]);
    fputs("]}\n", fp);
    er_free(ids);
    return ER_OK;
}

// One {"ids"} record as a {"text"} line.
static int detokenize_record(const Tokenizer *tok, const cJSON *rec, const char *ctx, FILE *fp) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(rec, "ids");
    if (!cJSON_IsArray(arr))
        return er_error(ER_EFORMAT, "%s: expected {\"ids\": [token ids...]}", ctx);
    int V = tok_vocab_size(tok), n = cJSON_GetArraySize(arr), i = 0, rc = ER_OK;
    char *text = NULL;
    size_t len = 0;
    int *ids = er_alloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!ids)
        return ER_ENOMEM;
    for (const cJSON *e = arr->child; e; e = e->next, i++) {
        double d = e->valuedouble;
        if (!cJSON_IsNumber(e) || d != (double)(int)d || d < 0 || d >= V) {
            rc = er_error(ER_EFORMAT, "%s: ids[%d] must be an integer token id in [0, %d)", ctx, i, V);
            goto done;
        }
        ids[i] = (int)d;
    }
    rc = tok_decode(tok, ids, n, &text, &len);
    if (rc < 0) {
        rc = er_error_prefix(rc, "%s", ctx);
        goto done;
    }
    fputs("{\"text\":", fp);
    write_json_string(fp, text, len);
    fputs("}\n", fp);
done:
    er_free(ids);
    er_free(text);
    return rc;
}

static int run_tokenize(const Opts *o, int detok) {
    int rc = ER_OK;
    Tokenizer *tok = NULL;
    JsonlReader r = {0};
    AtomicFile out = {0}; // "-": stdout, through a stream of its own
    cJSON *rec;
    // The output is checked before any work: a wrong kind of path, or an input itself, fails now.
    ER_CHECK(file_output_check(o->output));
    ER_CHECK(file_output_not_input(o->output, o->input, "--input"));
    ER_CHECK(file_output_not_input(o->output, o->tokenizer, "--tokenizer"));
    ER_CHECK(tok_load(&tok, o->tokenizer));
    ER_CHECK(jsonl_open(&r, o->input));
    ER_CHECK(atomic_open(&out, o->output));
    while ((rc = jsonl_next(&r, &rec)) == 1) {
        char ctx[600];
        snprintf(ctx, sizeof ctx, "%s:%ld", r.path, r.lineno);
        rc = detok ? detokenize_record(tok, rec, ctx, out.fp)
                   : tokenize_record(tok, rec, ctx, o->special_as_text, out.fp);
        cJSON_Delete(rec);
        ER_CHECK(rc);
        if (ferror(out.fp)) {
            rc = er_error(ER_EIO, "%s: write failed", out.path);
            goto done;
        }
    }
    if (rc >= 0)
        rc = atomic_commit(&out);
done:
    atomic_abort(&out); // nothing left after a commit; a failed run leaves no partial file
    jsonl_close(&r);
    tok_free(tok);
    return rc;
}

static int cmd_run(int argc, char **argv, int detok) {
    const char *name = detok ? "detokenize" : "tokenize";
    Opts o = {NULL, NULL, "-", 0};
    ArgSpec specs[] = {
        {"tokenizer", ARG_STR, &o.tokenizer, "tokenizer.json, or a model dir holding one", 1, 0, 0},
        {"input", ARG_STR, &o.input,
         detok ? "JSONL of {\"ids\": [...]} lines (- for stdin)" : "JSONL of {\"text\": \"...\"} lines (- for stdin)", 1, 0,
         0},
        {"output", ARG_STR, &o.output,
         detok ? "JSONL of {\"text\": \"...\"} lines: a file (written atomically), - for stdout, or a fifo or "
               "character device (written in place)"
             : "JSONL of {\"ids\": [...]} lines: a file (written atomically), - for stdout, or a fifo or character "
               "device (written in place)", 0,
         0, 0},
        {"special-as-text", ARG_FLAG, &o.special_as_text,
         "treat special tokens written in the text (<|im_end|>, ...) as plain text", 0, 0, 0},
    };
    int nspecs = detok ? 3 : 4;
    int rc = args_parse(argc, argv, specs, nspecs,
                        detok ? "erinfer detokenize --tokenizer FILE_OR_DIR --input IDS.jsonl [--output TEXT.jsonl]"
                              : "erinfer tokenize --tokenizer FILE_OR_DIR --input TEXT.jsonl [--output IDS.jsonl]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || run_tokenize(&o, detok) < 0)
        return cli_fail(name);
    return 0;
}

int cmd_tokenize(int argc, char **argv) { return cmd_run(argc, argv, 0); }
int cmd_detokenize(int argc, char **argv) { return cmd_run(argc, argv, 1); }
