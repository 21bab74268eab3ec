// Tokenizer throughput, single thread: encodes the golden texts (English, code, whitespace,
// CJK, emoji, random Unicode, chat markup) over and over until --mb megabytes have gone
// through, one tok_encode call per text, and prints load time and MB/s. bench/tokenizer_node.mjs
// does the same with the JavaScript port of HF tokenizers; bench/run_tokenizer.sh prints the ratio.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "data/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *fx = getenv("ER_FIXTURES");
    char *def_tok = path_join(fx && *fx ? fx : "../shared/fixtures", "qwen-tokenizer");
    const char *tok_path = def_tok, *corpus = "tests/data/golden/qwen_tokenizer.jsonl";
    double mb = 20;
    ArgSpec specs[] = {
        {"tokenizer", ARG_STR, &tok_path, "tokenizer.json or model dir", 0, 0, 0},
        {"corpus", ARG_STR, &corpus, "JSONL with {\"text\": ...} lines", 0, 0, 0},
        {"mb", ARG_FLOAT, &mb, "megabytes of text to encode", 0, 0.001, 1e5},
    };
    int rc = args_parse(argc, argv, specs, 3, "tokenizer_bench [--tokenizer DIR] [--corpus FILE] [--mb N]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0) {
        fprintf(stderr, "tokenizer_bench: %s\n", er_last_error());
        return 1;
    }

    // Load time: best of three (the first also pays for reading the file from disk).
    Tokenizer *tok = NULL;
    double load_best = 1e9;
    for (int k = 0; k < 3; k++) {
        double t0 = now_s();
        if (tok_load(&tok, tok_path) < 0) {
            fprintf(stderr, "tokenizer_bench: %s\n", er_last_error());
            return 1;
        }
        double dt = now_s() - t0;
        if (dt < load_best)
            load_best = dt;
        if (k < 2)
            tok_free(tok);
    }

    JsonlReader r;
    if (jsonl_open(&r, corpus) < 0) {
        fprintf(stderr, "tokenizer_bench: %s\n", er_last_error());
        return 1;
    }
    char **texts = NULL;
    size_t *lens = NULL;
    int n = 0;
    cJSON *rec;
    while ((rc = jsonl_next(&r, &rec)) == 1) {
        const char *s;
        if (json_get_string(rec, "text", &s, corpus) == ER_OK && *s) {
            texts = realloc(texts, (size_t)(n + 1) * sizeof *texts);
            lens = realloc(lens, (size_t)(n + 1) * sizeof *lens);
            texts[n] = strdup(s);
            lens[n] = strlen(s);
            n++;
        }
        cJSON_Delete(rec);
    }
    jsonl_close(&r);
    if (rc < 0 || n == 0) {
        fprintf(stderr, "tokenizer_bench: %s\n", rc < 0 ? er_last_error() : "corpus has no texts");
        return 1;
    }

    size_t target = (size_t)(mb * 1e6), bytes = 0;
    long long tokens = 0, checksum = 0;
    double t0 = now_s();
    for (int i = 0; bytes < target; i = (i + 1) % n) {
        int *ids, m;
        if (tok_encode(tok, texts[i], lens[i], &ids, &m) < 0) {
            fprintf(stderr, "tokenizer_bench: %s\n", er_last_error());
            return 1;
        }
        for (int k = 0; k < m; k++)
            checksum += ids[k];
        tokens += m;
        bytes += lens[i];
        er_free(ids);
    }
    double dt = now_s() - t0;
    printf("ours: load_ms=%.1f mb_per_s=%.2f tokens_per_s=%.0f bytes=%zu tokens=%lld checksum=%lld\n", load_best * 1e3,
           bytes / dt / 1e6, tokens / dt, bytes, tokens, checksum);
    for (int i = 0; i < n; i++)
        free(texts[i]);
    free(texts);
    free(lens);
    tok_free(tok);
    free(def_tok);
    return 0;
}
