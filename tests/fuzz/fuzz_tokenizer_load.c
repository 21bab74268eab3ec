// fuzz_tokenizer_load: the input is tokenizer.json [FUZZ_SEP tokenizer_config.json [FUZZ_SEP
// generation_config.json]], written into a scratch model dir and loaded with tok_load (data/tokenizer.h).
// A tokenizer that loads encodes and decodes a few fixed strings and answers every per-id query, so the
// tables built from a hostile file are all read.
#include "tests/fuzz/fuzz_common.h"

#include "core/alloc.h"
#include "core/error.h"
#include "data/tokenizer.h"

static const char *const texts[] = {
    "Hello world! 12345 don't",
    "<|im_start|>user\nWhat is 7*6?<|im_end|>\n<|im_start|>assistant\n<think>\n",
    "  leading\t\ttabs\n\n\nand   spaces  ",
    "caf\xc3\xa9 e\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82 \xef\xac\x81", // NFC / NFKC work
    "</think>\n\nThe answer is 42.<|endoftext|>",
};

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("tokenizer_load");
    fuzz_mkdir("tok");
    return 0;
}

static void exercise(const Tokenizer *t) {
    int V = tok_vocab_size(t);
    FUZZ_CHECK(V >= 0, "negative vocab size");
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++)
        for (int special_as_text = 0; special_as_text < 2; special_as_text++) {
            int *ids = NULL, n = 0;
            if (tok_encode_ex(t, texts[k], strlen(texts[k]), special_as_text, &ids, &n) < 0)
                continue; // a vocabulary without some bytes cannot encode everything
            for (int i = 0; i < n; i++)
                FUZZ_CHECK(ids[i] >= 0 && ids[i] < V, "encode gave id %d of %d", ids[i], V);
            char *text = NULL;
            size_t len = 0;
            if (tok_decode(t, ids, n, &text, &len) == ER_OK) {
                FUZZ_CHECK(text && strlen(text) <= len, "decode length");
                er_free(text);
            }
            er_free(ids);
        }
    // Every per-id query on a bounded range (ids reach 2^24: do not walk all of them).
    int lim = V < 4096 ? V : 4096;
    for (int id = -1; id <= lim; id++) {
        size_t n;
        (void)tok_token_bytes(t, id, &n);
        const char *s = tok_token_str(t, id);
        if (s)
            FUZZ_CHECK(tok_token_id(t, s) >= 0, "token string of %d is not found again", id);
        (void)tok_is_special(t, id);
        (void)tok_is_eos(t, id);
    }
    const int *eos;
    int ne = tok_eos_ids(t, &eos);
    for (int i = 0; i < ne; i++)
        FUZZ_CHECK(eos[i] >= 0 && eos[i] < V, "eos id %d of %d", eos[i], V);
    (void)tok_eos_id(t), (void)tok_pad_id(t), (void)tok_bos_id(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[3];
    size_t len[3];
    static const char *const names[3] = {"tok/tokenizer.json", "tok/tokenizer_config.json",
                                         "tok/generation_config.json"};
    fuzz_write_parts(data, size, names, 3, part, len);
    char path[FUZZ_PATH_MAX];
    Tokenizer *t = NULL;
    // Odd sizes name the dir, even ones the file: both ways of finding the config files.
    int rc = tok_load(&t, fuzz_path(path, (size & 1) ? "tok" : "tok/tokenizer.json"));
    if (rc < 0) {
        FUZZ_CHECK(t == NULL, "failed load left a tokenizer");
        return fuzz_refused("refused");
    }
    exercise(t);
    tok_free(t);
    return 0;
}
