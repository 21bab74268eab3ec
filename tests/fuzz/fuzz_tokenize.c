// fuzz_tokenize: arbitrary bytes through a real tokenizer loaded once (models/tiny-base, or the Qwen
// tokenizer under $ER_FIXTURES/qwen-tokenizer when ER_FIXTURES is set): tok_encode / tok_encode_ex on the
// input, tok_decode of the result, tok_text_from_bytes, and tok_decode of an id array read from the input
// (data/tokenizer.h). ASCII text must come back byte for byte; bad UTF-8 and bad ids must be refused.
#include "tests/fuzz/fuzz_common.h"

#include "core/alloc.h"
#include "core/error.h"
#include "data/tokenizer.h"

static Tokenizer *tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *fx = getenv("ER_FIXTURES");
    char path[FUZZ_PATH_MAX];
    if (fx && *fx)
        snprintf(path, sizeof path, "%s/qwen-tokenizer", fx);
    else
        snprintf(path, sizeof path, "models/tiny-base");
    if (tok_load(&tok, path) < 0) {
        fprintf(stderr, "fuzz_tokenize: %s (run from the project root)\n", er_last_error());
        abort();
    }
    return 0;
}

static int is_ascii(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] >= 0x80 || s[i] == 0) // NUL: encoded fine, but keep the check about printable text
            return 0;
    return 1;
}

// encode -> decode of text; 1 when it encoded.
static int check_encode(const char *text, size_t n, int special_as_text, int ascii) {
    int *ids = NULL, nids = 0;
    if (tok_encode_ex(tok, text, n, special_as_text, &ids, &nids) < 0)
        return 0;
    int V = tok_vocab_size(tok);
    for (int i = 0; i < nids; i++)
        FUZZ_CHECK(ids[i] >= 0 && ids[i] < V, "id %d of %d", ids[i], V);
    char *out = NULL;
    size_t len = 0;
    int rc = tok_decode(tok, ids, nids, &out, &len);
    FUZZ_CHECK(rc == ER_OK, "decoding what was just encoded: %s", er_last_error());
    // ASCII is NFC-stable and every byte has a token: the text must survive exactly.
    if (ascii)
        FUZZ_CHECK(len == n && memcmp(out, text, n) == 0, "ASCII round trip (special_as_text %d): %zu bytes -> %zu",
                   special_as_text, n, len);
    er_free(out);
    er_free(ids);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    int ascii = is_ascii(data, size);
    int ok = check_encode(text, size, 0, ascii);
    (void)check_encode(text, size, 1, ascii);
    if (ascii)
        FUZZ_CHECK(ok, "ASCII text refused: %s", er_last_error());

    // Lossy repair gives valid UTF-8, which the encoder must accept; valid UTF-8 is left alone.
    char *fixed = NULL;
    size_t flen = 0;
    if (tok_text_from_bytes(text, size, &fixed, &flen) == ER_OK) {
        FUZZ_CHECK(strlen(fixed) <= flen, "repair length");
        int *ids = NULL, n = 0;
        FUZZ_CHECK(tok_encode(tok, fixed, flen, &ids, &n) == ER_OK, "repaired text refused: %s", er_last_error());
        er_free(ids);
        if (ok)
            FUZZ_CHECK(flen == size && memcmp(fixed, text, size) == 0, "repair changed valid UTF-8");
        er_free(fixed);
    }

    // The input as little-endian 16-bit ids, spread a little past both ends of the vocabulary.
    int V = tok_vocab_size(tok);
    int n = (int)(size / 2);
    int *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids)
        return 0;
    int all_valid = 1;
    for (int i = 0; i < n; i++) {
        unsigned v = (unsigned)data[2 * i] | (unsigned)data[2 * i + 1] << 8;
        ids[i] = V > 65535 ? (int)(v * 3u) - 4 : (int)(v % (unsigned)(V + 8)) - 4;
        if (!tok_token_bytes(tok, ids[i], NULL))
            all_valid = 0;
    }
    char *out = NULL;
    size_t len = 0;
    int rc = tok_decode(tok, ids, n, &out, &len);
    FUZZ_CHECK((rc == ER_OK) == all_valid, "decode rc %d but ids all valid = %d", rc, all_valid);
    if (rc == ER_OK) {
        int *back = NULL, nb = 0;
        FUZZ_CHECK(tok_encode(tok, out, len, &back, &nb) == ER_OK, "decoded text refused by the encoder: %s",
                   er_last_error());
        er_free(back);
        er_free(out);
    }
    free(ids);
    return 0;
}
