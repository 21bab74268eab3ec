// fuzz_gguf: the input is a whole .gguf file, written to a scratch file and opened with gguf_open (core/gguf.h), and
// loaded from an exact-size buffer through er_model_load_from_buffer. When it opens, the promises of the reader are
// checked (every key and tensor found again, tensor data inside the mapping and aligned, typed getters that either work
// or refuse), then the file goes through the model loader and the tokenizer builder (model/gguf_model.h,
// data/tokenizer.h), which must load it or refuse it with a message. A model it loads must decode every row of its
// block-format matrices (q8_0 .. q6_K, quant/blocks.h) to finite values: the loader refuses NaN and infinite block
// scales, and finite fp16 scales times codes stay finite in fp32.
#include "tests/fuzz/fuzz_common.h"

#include <math.h>

#include "core/bytes.h"
#include "core/error.h"
#include "core/gguf.h"
#include "data/tokenizer.h"
#include "infer/erinfer.h"
#include "model/model.h"
#include "quant/blocks.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("gguf");
    return 0;
}

static void check_open_file(const GgufFile *f) {
    const char *lo = f->map, *hi = (const char *)f->map + f->map_size;
    for (int i = 0; i < f->n_kv; i++) {
        const GgufKV *kv = &f->kv[i];
        FUZZ_CHECK(gguf_find(f, kv->key) == kv, "key %s not found again", kv->key);
        int64_t v;
        double d;
        const char *s;
        int b;
        // Getters of every type on every key: each either succeeds or refuses, never reads out of bounds.
        (void)gguf_get_int(f, kv->key, 0, INT64_MIN, INT64_MAX, &v);
        (void)gguf_get_float(f, kv->key, 0, &d);
        (void)gguf_get_str(f, kv->key, 0, &s);
        (void)gguf_get_bool(f, kv->key, 0, &b);
        if (kv->type == GGUF_ARRAY && kv->arr_type != GGUF_STRING && kv->arr_type != GGUF_F32 &&
            kv->arr_type != GGUF_F64 && kv->arr_type != GGUF_BOOL)
            for (uint64_t k = 0; k < kv->n; k++)
                (void)gguf_array_int(kv, k);
        if (kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING)
            for (uint64_t k = 0; k < kv->n; k++)
                FUZZ_CHECK(kv->strs[k] != NULL, "key %s: string %llu missing", kv->key, (unsigned long long)k);
    }
    for (int i = 0; i < f->n_tensors; i++) {
        const GgufTensor *t = &f->tensors[i];
        FUZZ_CHECK(gguf_find_tensor(f, t->name) == t, "tensor %s not found again", t->name);
        FUZZ_CHECK(t->ndim >= 1 && t->ndim <= GGUF_MAX_DIMS, "tensor %s ndim %d", t->name, t->ndim);
        FUZZ_CHECK(((const char *)t->data - lo) % f->alignment == 0, "tensor %s misaligned", t->name);
        FUZZ_CHECK((const char *)t->data >= lo && (const char *)t->data + t->nbytes <= hi,
                   "tensor %s lies outside the mapping", t->name);
        volatile uint8_t sum = 0; // touch every byte the reader vouched for
        for (size_t k = 0; k < t->nbytes; k++)
            sum += ((const uint8_t *)t->data)[k];
        (void)sum;
    }
}

// The same bytes through the public loader from memory (er_model_load_from_buffer, borrowing a heap block of
// exactly their size: ASan sees a read past the end that a mapping's last page would hide): the file's
// verdict from gguf_open, then a model or one line.
static void load_from_memory(const uint8_t *data, size_t size, int file_rc) {
    uint8_t *exact = malloc(size ? size : 1);
    FUZZ_CHECK(exact != NULL, "out of memory");
    memcpy(exact, data, size);
    ByteRange r;
    GgufFile g;
    FUZZ_CHECK(bytes_from_buffer(&r, exact, size, "<buffer>", 1) == ER_OK, "bytes_from_buffer failed");
    int rc = gguf_open_bytes(&g, &r);
    FUZZ_CHECK((rc < 0) == (file_rc < 0), "the file %s but the same bytes in memory %s",
               file_rc < 0 ? "is refused" : "opens", rc < 0 ? "are refused" : "open");
    gguf_close(&g);
    ErModelSource src;
    er_model_source_init(&src);
    src.flags = ER_MODEL_SOURCE_BORROW;
    ErModel *m = NULL;
    if (er_model_load_from_buffer(&m, exact, size, &src) == ER_OK)
        er_model_free(m);
    else
        FUZZ_CHECK(er_last_error()[0] != 0 && !strchr(er_last_error(), '\n'),
                   "er_model_load_from_buffer refused without a one-line message");
    free(exact);
}

// Every row of each block-format matrix of m as fp32, each value finite.
static void check_block_rows(const Model *m) {
    for (int i = 0; i < m->n_params; i++) {
        const Weight *w = m->params[i].w;
        if (!w || !blocks_format(w->fmt))
            continue;
        float *row = malloc((size_t)w->cols * sizeof(float));
        FUZZ_CHECK(row != NULL, "out of memory");
        for (int r = 0; r < w->rows; r++) {
            weight_row_f32(row, w, r);
            for (int k = 0; k < w->cols; k++)
                FUZZ_CHECK(isfinite(row[k]), "%s (%s) row %d decodes to %g at %d", m->params[i].name,
                           weight_format_name(w->fmt), r, row[k], k);
        }
        free(row);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[FUZZ_PATH_MAX];
    fuzz_write("in.gguf", data, size);
    fuzz_path(path, "in.gguf");
    GgufFile f;
    int file_rc = gguf_open(&f, path);
    load_from_memory(data, size, file_rc);
    if (file_rc < 0)
        return fuzz_refused("refused");
    check_open_file(&f);
    gguf_close(&f);
    Model m;
    if (model_load(&m, path, 0) == ER_OK) {
        check_block_rows(&m);
        model_free(&m);
    } else {
        FUZZ_CHECK(er_last_error()[0] != 0, "the model loader refused without a message");
    }
    Tokenizer *tok;
    if (tok_load(&tok, path) == ER_OK)
        tok_free(tok);
    else
        FUZZ_CHECK(er_last_error()[0] != 0, "the tokenizer refused without a message");
    return 0;
}
