// fuzz_gguf: the input is a whole .gguf file, written to a scratch file and opened with gguf_open
// (core/gguf.h). When it opens, the promises of the reader are checked (every key and tensor found again,
// tensor data inside the mapping and aligned, typed getters that either work or refuse), then the file
// goes through the model loader and the tokenizer builder (model/gguf_model.h, data/tokenizer.h), which
// must load it or refuse it with a message.
#include "tests/fuzz/fuzz_common.h"

#include "core/error.h"
#include "core/gguf.h"
#include "data/tokenizer.h"
#include "model/model.h"

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[FUZZ_PATH_MAX];
    fuzz_write("in.gguf", data, size);
    fuzz_path(path, "in.gguf");
    GgufFile f;
    if (gguf_open(&f, path) < 0)
        return fuzz_refused("refused");
    check_open_file(&f);
    gguf_close(&f);
    Model m;
    if (model_load(&m, path, 0) == ER_OK)
        model_free(&m);
    else
        FUZZ_CHECK(er_last_error()[0] != 0, "the model loader refused without a message");
    Tokenizer *tok;
    if (tok_load(&tok, path) == ER_OK)
        tok_free(tok);
    else
        FUZZ_CHECK(er_last_error()[0] != 0, "the tokenizer refused without a message");
    return 0;
}
