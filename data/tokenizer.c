// Byte-level BPE tokenizer from a Hugging Face tokenizer.json, reproducing `tokenizers`:
//
//   text ─ added tokens (raw, leftmost-longest) ─ normalizer (NFC) ─ added tokens (normalized)
//        ─ pre-tokenizer stages (Split regexes, ByteLevel prefix space) ─ BPE per word ─ ids
//
// tokenizer.json is parsed with cJSON, after checks for what cJSON would let through silently
// (see tok_json_parse). The document lives only while loading: everything encoding and decoding
// need is copied into the tables of struct Tokenizer, and the document is freed before tok_load
// returns.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer.h"

#include <cjson/cJSON.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/json.h"
#include "core/utf8.h"

#define TOK_MAX_FILE ((size_t)1 << 30)
#define TOK_MAX_ID (1 << 24)   // ids are array indices: a lying file must not make us allocate GBs
#define TOK_MAX_STAGES 8
#define TOK_MAX_NORM 8
#define BPE_SMALL 64           // words up to this many symbols merge by linear scan, longer by heap
#define CACHE_SLOTS 32768      // 4 MiB word cache, direct-mapped
#define CACHE_KEY_MAX 48
#define CACHE_IDS_MAX 18

typedef struct {
    char *content; // as written in tokenizer.json
    size_t len;
    char *match;   // what is searched for: content, or normalized content for normalized tokens
    size_t match_len;
    int id;
    unsigned char single_word, lstrip, rstrip, normalized, special;
} AddedToken;

// Added tokens searched in one pass, longest first so the first hit at a position is the
// longest (Aho-Corasick LeftmostLongest in `tokenizers`).
typedef struct {
    int n;
    int *tok;               // indices into Tokenizer.added, by decreasing match length
    unsigned char first[256]; // a token starts with this byte
    int single_first;       // the only first byte when there is one (memchr), else -1
} AddedSet;

typedef struct {
    uint64_t key; // left id << 32 | right id; UINT64_MAX = empty
    uint32_t rank;
    int32_t id;
} MergeSlot;

enum { STAGE_SPLIT, STAGE_PREFIX_SPACE };
typedef struct {
    int kind;
    pcre2_code *re;
    int jit;
} PreStage;

typedef struct {
    _Atomic unsigned char busy; // a try-lock: a reader that finds it taken just skips the cache
    unsigned char keylen;       // 0 = empty slot
    unsigned char nids;
    unsigned char pad;
    uint32_t hash;
    char key[CACHE_KEY_MAX];
    int32_t ids[CACHE_IDS_MAX];
} CacheSlot;

struct Tokenizer {
    char *path;
    int n_ids; // V: largest id + 1
    // vocabulary strings (tokenizer.json form) and decoded bytes, per id
    char *strs;
    uint32_t *str_off, *str_len;   // (V); str_len UINT32_MAX = no string
    char *dec;
    uint32_t *dec_off, *dec_len;   // (V); dec_len UINT32_MAX = no token
    unsigned char *special;        // (V)
    int32_t *vocab_tab;            // string -> id of model.vocab, open addressing
    uint32_t vocab_mask;
    int byte_id[256];              // id of the one-byte symbol, -1 if absent
    MergeSlot *merges;
    uint32_t merge_mask;
    int unk_id, fuse_unk, ignore_merges;
    AddedToken *added;
    int n_added;
    AddedSet raw_set, norm_set;
    int norm[TOK_MAX_NORM];        // utf8proc option sets applied in order
    int n_norm;
    PreStage stages[TOK_MAX_STAGES];
    int n_stages;
    int eos_id, pad_id, bos_id;
    int qwen2_split;               // the one Split stage is Qwen2's regex (llama.cpp pre-tokenizer "qwen2")
    int *eos_ids;
    int n_eos;
    // The special tokens tokenizer.json's TemplateProcessing post-processor puts around a single text
    // (HF add_special_tokens=True): TOK_MAX_TEMPLATE ids before and after it.
    int tmpl_pre[TOK_MAX_TEMPLATE], tmpl_post[TOK_MAX_TEMPLATE];
    int n_tmpl_pre, n_tmpl_post;
    CacheSlot *cache;              // (CACHE_SLOTS)
};

// ---------------------------------------------------------------------------------------------
// UTF-8 and character classes

static uint32_t utf8_decode(const unsigned char *s, int w) {
    switch (w) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    default:
        return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
               (s[3] & 0x3F);
    }
}

static int utf8_encode(uint32_t c, char *out) {
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | c >> 6);
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | c >> 12);
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | c >> 18);
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

// Rust regex `\s` (Unicode White_Space), used by lstrip / rstrip of added tokens.
static int is_white_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Rust regex `\w` (Alphabetic, marks, decimal digits, connector punctuation, joiners), used
// by single_word added tokens.
static int is_word_char(uint32_t c) {
    if (c < 0x80)
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9))
        return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

// Code point ending at s[end) (s valid UTF-8, end > 0).
static uint32_t utf8_last(const unsigned char *s, size_t end, size_t *start) {
    size_t i = end - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80)
        i--;
    *start = i;
    return utf8_decode(s + i, (int)(end - i));
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte is one printable character.
static void byte_level_table(uint32_t byte_cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

// ---------------------------------------------------------------------------------------------
// Vocabulary and merges tables

static int vocab_find(const Tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_tab)
        return -1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int id = t->vocab_tab[i];
        if (id < 0)
            return -1;
        if (t->str_len[id] == n && memcmp(t->strs + t->str_off[id], s, n) == 0)
            return id;
    }
}

static inline uint32_t merge_slot(uint64_t key, uint32_t mask) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

static inline const MergeSlot *merge_find(const Tokenizer *t, int a, int b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = merge_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
        const MergeSlot *m = &t->merges[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

// A later duplicate overwrites the rank, as HashMap::collect in `tokenizers` does.
static void merge_put(Tokenizer *t, int a, int b, uint32_t rank, int id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = merge_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
        MergeSlot *m = &t->merges[i];
        if (m->key == UINT64_MAX || m->key == key) {
            m->key = key;
            m->rank = rank;
            m->id = id;
            return;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loading

// cJSON parses tokenizer.json; the checks here cover what it reports too vaguely or lets
// through. It says only where a parse stopped, so json_why says why. Its strings are
// NUL-terminated without a length, so a raw NUL byte, a \u0000 escape, or a \u escape without 4
// hex digits (which it reads as \u0000) would cut a token short without a word. It reads any
// byte below 0x20 as whitespace and skips a byte order mark, both refused by JSON and by
// serde_json in `tokenizers`. Still accepted: raw tab, newline and carriage return inside strings
// (cJSON keeps them verbatim; refusing them needs a string-aware pass over the whole file, about
// 13 ms for Qwen's 11 MB) and numbers with leading zeros.

static int hex4(const char *s, size_t n, unsigned *out) {
    if (n < 4)
        return -1;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

// What is wrong with the escape at s[0] == '\\' (n bytes left), or NULL when it is valid.
static const char *escape_why(const char *s, size_t n) {
    char e = n > 1 ? s[1] : 0;
    if (e != 'u')
        return e && strchr("\"\\/bfnrt", e) ? NULL : "bad escape in string";
    unsigned hi, lo;
    if (hex4(s + 2, n - 2, &hi) < 0)
        return "bad \\u escape";
    if (hi >= 0xDC00 && hi <= 0xDFFF)
        return "lone low surrogate in \\u escape";
    if (hi >= 0xD800 && hi <= 0xDBFF &&
        (n < 12 || s[6] != '\\' || s[7] != 'u' || hex4(s + 8, n - 8, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF))
        return "lone high surrogate in \\u escape";
    return NULL;
}

// Why cJSON stopped at byte `off`. Only runs on a failed parse, so it may rescan the text.
static const char *json_why(const char *s, size_t len, size_t off, char *tmp, size_t tmp_len) {
    int in_at, in_end; // inside a string where cJSON stopped / at the end of the text
    long depth_at;
    json_nesting(s, len, off, &in_at, &depth_at);
    json_nesting(s, len, len, &in_end, NULL);
    const char *why;
    if (off < len && in_at && s[off] == '\\' && (why = escape_why(s + off, len - off)))
        return why;
    if (depth_at >= CJSON_NESTING_LIMIT) {
        snprintf(tmp, tmp_len, "nested too deeply (more than %d levels)", CJSON_NESTING_LIMIT);
        return tmp;
    }
    if (off >= len || (in_at && in_end))
        return "unexpected end of file";
    unsigned char c = (unsigned char)s[off];
    if (c >= 0x21 && c < 0x7F)
        snprintf(tmp, tmp_len, "unexpected '%c'", c);
    else
        snprintf(tmp, tmp_len, "unexpected byte 0x%02x", c);
    return tmp;
}

// First byte that is a control character JSON never allows (anything below 0x20 but tab,
// newline and carriage return), or len. Blocks of 64 bytes vectorize.
static size_t ctrl_find(const unsigned char *s, size_t len) {
    size_t i = 0;
    for (; i + 64 <= len; i += 64) {
        unsigned any = 0;
        for (int j = 0; j < 64; j++) {
            unsigned char c = s[i + j];
            any |= (c < 0x20) & (c != '\t') & (c != '\n') & (c != '\r');
        }
        if (any)
            break;
    }
    for (; i < len; i++)
        if (s[i] < 0x20 && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            return i;
    return len;
}

// cJSON reads a \u escape without 4 hex digits as \u0000, and \u0000 would cut a string short.
// Runs on text cJSON parsed, so every backslash found from the start on begins an escape.
static int check_u_escapes(const char *path, const char *buf, size_t len) {
    for (size_t i = 0; i < len;) {
        const char *p = memchr(buf + i, '\\', len - i);
        if (!p)
            break;
        size_t at = (size_t)(p - buf);
        unsigned cp;
        i = at + 2;
        if (p[1] != 'u')
            continue;
        if (hex4(p + 2, len - at - 2, &cp) < 0)
            return er_error(ER_EFORMAT, "%s: not valid JSON at byte %zu: bad \\u escape", path, at);
        if (cp != 0)
            continue;
        // Quote the start of the string: back to its opening quote, the first one not escaped.
        size_t q = at;
        while (q > 0) {
            q--;
            size_t nb = 0;
            while (nb < q && buf[q - nb - 1] == '\\')
                nb++;
            if (buf[q] == '"' && nb % 2 == 0)
                break;
        }
        int n = (int)(at + 6 - q > 40 ? 40 : at + 6 - q);
        while (n > 0 && q + (size_t)n < len && ((unsigned char)buf[q + (size_t)n] & 0xC0) == 0x80)
            n--; // whole characters only
        return er_error(ER_EUNSUPPORTED, "%s: byte %zu: U+0000 (\\u0000) inside a string is not supported: %.*s...",
                        path, at, n, buf + q);
    }
    return ER_OK;
}

// Parses tokenizer.json text; buf[len] must be 0 (file_read_all puts it there). Errors name the
// file and the byte.
static int tok_json_parse(const char *path, const char *buf, size_t len, cJSON **out) {
    *out = NULL;
    size_t bad = utf8_invalid_at(buf, len);
    if (bad < len)
        return er_error(ER_EFORMAT, "%s: not valid UTF-8 at byte %zu", path, bad);
    if ((bad = ctrl_find((const unsigned char *)buf, len)) < len)
        return er_error(ER_EFORMAT, "%s: not valid JSON at byte %zu: control character 0x%02x", path, bad,
                        (unsigned char)buf[bad]);
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
        return er_error(ER_EFORMAT, "%s: not valid JSON at byte 0: a byte order mark", path);
    // The terminating NUL goes in too: cJSON reads it as whitespace, so text that ends too early
    // fails at byte len, where a wrong last byte fails at len - 1.
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(buf, len + 1, &end, 0);
    if (!root) {
        char tmp[64];
        size_t off = end ? (size_t)(end - buf) : 0;
        return er_error(ER_EFORMAT, "%s: not valid JSON at byte %zu: %s", path, off,
                        json_why(buf, len, off, tmp, sizeof tmp));
    }
    int rc = ER_OK;
    long trail = json_trailing_at(buf, len, end);
    if (trail >= 0)
        ER_CHECK(er_error(ER_EFORMAT, "%s: not valid JSON at byte %ld: unexpected text after the value", path, trail));
    ER_CHECK(check_u_escapes(path, buf, len));
    *out = root;
    root = NULL;
done:
    cJSON_Delete(root);
    return rc;
}

// cJSON keeps numbers as doubles: an id must be one exactly, and small enough to index arrays.
static int is_id(const cJSON *v) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < TOK_MAX_ID &&
           v->valuedouble == (double)(int)v->valuedouble;
}

static int get_id(const char *path, const cJSON *v, const char *field, int *out) {
    if (!cJSON_IsNumber(v))
        return json_field_error(path, field, "a token id", v);
    if (!is_id(v))
        return er_error(ER_EFORMAT, "%s: field \"%s\": %g is not a token id (an integer in [0, %d))", path, field,
                        v->valuedouble, TOK_MAX_ID);
    *out = (int)v->valuedouble;
    return ER_OK;
}

static int load_vocab(Tokenizer *t, const char *path, const cJSON *model) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return json_field_error(path, "model.vocab", "an object of token -> id", vocab);
    int max_id = -1;
    size_t bytes = 0, count = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int id;
        if (!is_id(e)) {
            char field[64];
            snprintf(field, sizeof field, "model.vocab[\"%.32s\"]", e->string);
            return get_id(path, e, field, &id);
        }
        id = (int)e->valuedouble;
        if (id > max_id)
            max_id = id;
        bytes += strlen(e->string) + 1; // each string NUL-terminated for tok_token_str
        count++;
    }
    if (count == 0)
        return er_error(ER_EFORMAT, "%s: field \"model.vocab\" is empty", path);
    if (max_id + 1 > t->n_ids)
        t->n_ids = max_id + 1; // added tokens were read first and may reach further
    if (bytes > UINT32_MAX)
        return er_error(ER_EFORMAT, "%s: field \"model.vocab\" holds more than 4 GiB of strings", path);
    int V = t->n_ids > 0 ? t->n_ids : 1;
    t->strs = er_alloc(bytes + 1);
    t->str_off = er_calloc((size_t)V, sizeof *t->str_off);
    t->str_len = er_alloc((size_t)V * sizeof *t->str_len);
    uint32_t cap = pow2_at_least(count * 2 + 1);
    t->vocab_tab = er_alloc((size_t)cap * sizeof *t->vocab_tab);
    if (!t->strs || !t->str_off || !t->str_len || !t->vocab_tab)
        return ER_ENOMEM;
    t->vocab_mask = cap - 1;
    memset(t->vocab_tab, 0xff, (size_t)cap * sizeof *t->vocab_tab);
    memset(t->str_len, 0xff, (size_t)V * sizeof *t->str_len);
    size_t off = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) {
        int id = (int)e->valuedouble;
        const char *key = e->string;
        size_t keylen = strlen(key);
        if (t->str_len[id] != UINT32_MAX)
            return er_error(ER_EFORMAT, "%s: field \"model.vocab\": id %d is used by two tokens (\"%.32s\" and \"%.32s\")",
                            path, id, t->strs + t->str_off[id], key);
        memcpy(t->strs + off, key, keylen + 1);
        t->str_off[id] = (uint32_t)off;
        t->str_len[id] = (uint32_t)keylen;
        off += keylen + 1;
        // Duplicate keys: JSON objects keep the last one in serde; the first stays reachable here
        // only by id, which is harmless.
        for (uint32_t i = (uint32_t)hash_bytes(key, keylen) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
            int other = t->vocab_tab[i];
            if (other < 0) {
                t->vocab_tab[i] = id;
                break;
            }
            if (t->str_len[other] == keylen && memcmp(t->strs + t->str_off[other], key, keylen) == 0) {
                t->vocab_tab[i] = id;
                break;
            }
        }
    }
    t->strs[off] = 0;
    return ER_OK;
}

static int merge_token(Tokenizer *t, const char *path, const char *s, size_t n, long idx, int *out) {
    *out = vocab_find(t, s, n);
    if (*out < 0)
        return er_error(ER_EFORMAT, "%s: field \"model.merges[%ld]\": \"%.*s\" is not in model.vocab", path, idx,
                        (int)(n > 40 ? 40 : n), s);
    return ER_OK;
}

// The two tokens of merge `rank`: the legacy "a b" form (exactly one space, as `tokenizers`
// requires) or ["a", "b"].
static int merge_pair(const char *path, const cJSON *m, long rank, const char **a, size_t *na, const char **b,
                      size_t *nb) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return er_error(ER_EFORMAT, "%s: field \"model.merges[%ld]\": \"%.40s\" is not two tokens separated by one space",
                            path, rank, s);
        *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
        return ER_OK;
    }
    const cJSON *x = m->child, *y = x ? x->next : NULL;
    if (cJSON_IsArray(m) && cJSON_IsString(x) && cJSON_IsString(y) && !y->next) {
        *a = x->valuestring, *na = strlen(*a), *b = y->valuestring, *nb = strlen(*b);
        return ER_OK;
    }
    char field[48];
    snprintf(field, sizeof field, "model.merges[%ld]", rank);
    return json_field_error(path, field, "\"a b\" or [\"a\", \"b\"]", m);
}

static int load_merges(Tokenizer *t, const char *path, const cJSON *model) {
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (cJSON_IsNull(merges))
        merges = NULL;
    else if (merges && !cJSON_IsArray(merges))
        return json_field_error(path, "model.merges", "an array", merges);
    uint32_t cap = pow2_at_least((size_t)cJSON_GetArraySize(merges) * 2 + 1);
    t->merges = er_alloc((size_t)cap * sizeof *t->merges);
    if (!t->merges)
        return ER_ENOMEM;
    t->merge_mask = cap - 1;
    memset(t->merges, 0xff, (size_t)cap * sizeof *t->merges);
    if (!merges)
        return ER_OK;
    char *cat = NULL; // a and b joined: the merged token
    size_t cat_cap = 0;
    long rank = 0;
    int rc = ER_OK;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        int ia, ib, im;
        ER_CHECK(merge_pair(path, m, rank, &a, &na, &b, &nb));
        ER_CHECK(merge_token(t, path, a, na, rank, &ia));
        ER_CHECK(merge_token(t, path, b, nb, rank, &ib));
        if (na + nb > cat_cap) {
            cat_cap = (na + nb) * 2;
            char *p = er_realloc_array(cat, cat_cap, 1);
            if (!p) {
                rc = ER_ENOMEM;
                goto done;
            }
            cat = p;
        }
        memcpy(cat, a, na);
        memcpy(cat + na, b, nb);
        ER_CHECK(merge_token(t, path, cat, na + nb, rank, &im));
        merge_put(t, ia, ib, (uint32_t)rank, im);
    }
done:
    free(cat);
    return rc;
}

static int load_model(Tokenizer *t, const char *path, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model))
        return json_field_error(path, "model", "an object", model);
    const char *type = NULL;
    ER_TRY(json_opt_string_named(model, "type", "model.type", &type, path));
    if (type && strcmp(type, "BPE") != 0)
        return er_error(ER_EUNSUPPORTED, "%s: field \"model.type\": \"%.40s\" is not supported (only \"BPE\")", path,
                        type);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == 0))
        return er_error(ER_EUNSUPPORTED, "%s: field \"model.dropout\": BPE dropout is not supported (must be null)",
                        path);
    const char *affix[2] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        char field[64];
        snprintf(field, sizeof field, "model.%s", affix[i]);
        const char *s = NULL;
        ER_TRY(json_opt_string_named(model, affix[i], field, &s, path));
        if (s && *s)
            return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": \"%.20s\" is not supported (must be empty)", path,
                            field, s);
    }
    int byte_fallback = 0;
    ER_TRY(json_opt_bool_named(model, "byte_fallback", "model.byte_fallback", &byte_fallback, path));
    if (byte_fallback)
        return er_error(ER_EUNSUPPORTED, "%s: field \"model.byte_fallback\": true is not supported", path);
    ER_TRY(json_opt_bool_named(model, "fuse_unk", "model.fuse_unk", &t->fuse_unk, path));
    ER_TRY(json_opt_bool_named(model, "ignore_merges", "model.ignore_merges", &t->ignore_merges, path));
    ER_TRY(load_vocab(t, path, model));
    const char *unk = NULL;
    ER_TRY(json_opt_string_named(model, "unk_token", "model.unk_token", &unk, path));
    t->unk_id = -1;
    if (unk && (t->unk_id = vocab_find(t, unk, strlen(unk))) < 0)
        return er_error(ER_EFORMAT, "%s: field \"model.unk_token\": \"%.40s\" is not in model.vocab", path, unk);
    return load_merges(t, path, model);
}

static int norm_apply(const Tokenizer *t, const char *s, size_t n, char **out, size_t *out_len);

static int cmp_added_len(const void *a, const void *b, void *ctx) {
    const AddedToken *added = ctx;
    const AddedToken *x = &added[*(const int *)a], *y = &added[*(const int *)b];
    if (x->match_len != y->match_len)
        return x->match_len < y->match_len ? 1 : -1;
    return *(const int *)a - *(const int *)b;
}

static int added_set_build(AddedSet *set, const AddedToken *added, int n_added, int normalized) {
    set->tok = er_alloc((size_t)(n_added ? n_added : 1) * sizeof *set->tok);
    if (!set->tok)
        return ER_ENOMEM;
    set->n = 0;
    memset(set->first, 0, sizeof set->first);
    for (int i = 0; i < n_added; i++)
        if (added[i].normalized == normalized && added[i].match_len > 0) {
            set->tok[set->n++] = i;
            set->first[(unsigned char)added[i].match[0]] = 1;
        }
    qsort_r(set->tok, (size_t)set->n, sizeof *set->tok, cmp_added_len, (void *)added);
    set->single_first = -1;
    int nfirst = 0;
    for (int b = 0; b < 256; b++)
        if (set->first[b]) {
            nfirst++;
            set->single_first = b;
        }
    if (nfirst != 1)
        set->single_first = -1;
    return ER_OK;
}

static int load_added(Tokenizer *t, const char *path, const cJSON *root) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (arr && !cJSON_IsNull(arr) && !cJSON_IsArray(arr))
        return json_field_error(path, "added_tokens", "an array", arr);
    int n = cJSON_IsArray(arr) ? cJSON_GetArraySize(arr) : 0;
    t->added = er_calloc((size_t)(n ? n : 1), sizeof *t->added);
    if (!t->added)
        return ER_ENOMEM;
    int i = 0;
    for (const cJSON *e = n ? arr->child : NULL; e; e = e->next, i++) {
        char field[64];
        snprintf(field, sizeof field, "added_tokens[%d]", i);
        if (!cJSON_IsObject(e))
            return json_field_error(path, field, "an object", e);
        AddedToken *a = &t->added[t->n_added];
        snprintf(field, sizeof field, "added_tokens[%d].id", i);
        ER_TRY(get_id(path, cJSON_GetObjectItemCaseSensitive(e, "id"), field, &a->id));
        snprintf(field, sizeof field, "added_tokens[%d].content", i);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsString(content))
            return json_field_error(path, field, "a string", content);
        int flags[5] = {0, 0, 0, -1, 0}; // single_word lstrip rstrip normalized special
        const char *names[5] = {"single_word", "lstrip", "rstrip", "normalized", "special"};
        for (int k = 0; k < 5; k++) {
            snprintf(field, sizeof field, "added_tokens[%d].%s", i, names[k]);
            ER_TRY(json_opt_bool_named(e, names[k], field, &flags[k], path));
        }
        if (flags[3] < 0)
            flags[3] = !flags[4]; // AddedToken::from(content, special) in `tokenizers`
        size_t len = strlen(content->valuestring);
        a->content = er_alloc(len + 1);
        if (!a->content)
            return ER_ENOMEM;
        memcpy(a->content, content->valuestring, len + 1);
        a->len = len;
        a->single_word = (unsigned char)flags[0], a->lstrip = (unsigned char)flags[1];
        a->rstrip = (unsigned char)flags[2], a->normalized = (unsigned char)flags[3];
        a->special = (unsigned char)flags[4];
        t->n_added++;
        if (a->id >= t->n_ids)
            t->n_ids = a->id + 1;
    }
    return ER_OK;
}

// Matching forms of the added tokens; needs the normalizer loaded.
static int added_finish(Tokenizer *t) {
    for (int i = 0; i < t->n_added; i++) {
        AddedToken *a = &t->added[i];
        a->match = NULL;
        if (a->normalized && t->n_norm) // norm_apply leaves match NULL when normalizing changes nothing
            ER_TRY(norm_apply(t, a->content, a->len, &a->match, &a->match_len));
        if (!a->match) {
            a->match = a->content;
            a->match_len = a->len;
        }
    }
    ER_TRY(added_set_build(&t->raw_set, t->added, t->n_added, 0));
    return added_set_build(&t->norm_set, t->added, t->n_added, 1);
}

// Normalizers and pre-tokenizers are objects {"type": ..., ...}; a "Sequence" holds a list of them.
typedef int (*LoadPartFn)(Tokenizer *t, const char *path, const cJSON *v, const char *field, int depth, void *arg);

// The "type" of the part v named `field`; *type stays NULL when v is absent or null.
static int part_type(const char *path, const cJSON *v, const char *field, const char **type) {
    *type = NULL;
    if (!v || cJSON_IsNull(v))
        return ER_OK;
    if (!cJSON_IsObject(v))
        return json_field_error(path, field, "an object or null", v);
    char tf[256];
    snprintf(tf, sizeof tf, "%s.type", field);
    ER_TRY(json_opt_string_named(v, "type", tf, type, path));
    return *type ? ER_OK : json_field_error(path, tf, "a string", NULL);
}

// The parts listed in the Sequence v's array `key`, each loaded by fn as "<field>.<key>[i]".
static int load_sequence(Tokenizer *t, const char *path, const cJSON *v, const char *field, const char *key, int depth,
                         LoadPartFn fn, void *arg) {
    char lf[256];
    snprintf(lf, sizeof lf, "%s.%s", field, key);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, key);
    if (!cJSON_IsArray(list))
        return json_field_error(path, lf, "an array", list);
    int i = 0;
    for (const cJSON *e = list->child; e; e = e->next, i++) {
        char ef[288];
        snprintf(ef, sizeof ef, "%s[%d]", lf, i);
        ER_TRY(fn(t, path, e, ef, depth + 1, arg));
    }
    return ER_OK;
}

static int load_normalizer(Tokenizer *t, const char *path, const cJSON *n, const char *field, int depth, void *arg) {
    const char *type;
    ER_TRY(part_type(path, n, field, &type));
    if (!type)
        return ER_OK;
    static const struct { const char *name; int opts; } forms[] = {
        {"NFC", UTF8PROC_STABLE | UTF8PROC_COMPOSE},
        {"NFD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
        {"NFKC", UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
        {"NFKD", UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
    };
    for (size_t k = 0; k < sizeof forms / sizeof forms[0]; k++)
        if (strcmp(type, forms[k].name) == 0) {
            if (t->n_norm == TOK_MAX_NORM)
                return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": more than %d normalizers", path, field, TOK_MAX_NORM);
            t->norm[t->n_norm++] = forms[k].opts;
            return ER_OK;
        }
    if (strcmp(type, "Sequence") == 0 && depth < 4)
        return load_sequence(t, path, n, field, "normalizers", depth, load_normalizer, NULL);
    return er_error(ER_EUNSUPPORTED, "%s: field \"%s.type\": normalizer \"%.40s\" is not supported (NFC, NFD, NFKC, NFKD, Sequence)",
                    path, field, type);
}

static int stage_add_regex(Tokenizer *t, const char *path, const char *field, const char *pat, size_t len, int literal) {
    if (t->n_stages == TOK_MAX_STAGES)
        return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": more than %d pre-tokenizer stages", path, field,
                        TOK_MAX_STAGES);
    int err;
    PCRE2_SIZE erroff;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &erroff, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": regex not supported by PCRE2 at offset %zu: %s", path,
                        field, (size_t)erroff, (const char *)msg);
    }
    PreStage *st = &t->stages[t->n_stages++];
    st->kind = STAGE_SPLIT;
    st->re = re;
    st->jit = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
    return ER_OK;
}

// The GPT-2 split that ByteLevel applies itself when use_regex is true.
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Qwen2's split (tokenizer.json's Split regex; llama.cpp's pre-tokenizer "qwen2").
static const char QWEN2_PATTERN[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                                    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// `arg` is an int * set once a ByteLevel stage is seen.
static int load_pre_tokenizer(Tokenizer *t, const char *path, const cJSON *p, const char *field, int depth, void *arg) {
    int *byte_level = arg;
    const char *type;
    ER_TRY(part_type(path, p, field, &type));
    if (!type)
        return ER_OK;
    if (strcmp(type, "Sequence") == 0 && depth < 4)
        return load_sequence(t, path, p, field, "pretokenizers", depth, load_pre_tokenizer, byte_level);
    char f[320];
    if (strcmp(type, "ByteLevel") == 0) {
        int prefix = 1, use_regex = 1; // serde defaults of ByteLevel in `tokenizers`
        snprintf(f, sizeof f, "%s.add_prefix_space", field);
        ER_TRY(json_opt_bool_named(p, "add_prefix_space", f, &prefix, path));
        snprintf(f, sizeof f, "%s.use_regex", field);
        ER_TRY(json_opt_bool_named(p, "use_regex", f, &use_regex, path));
        if (*byte_level)
            return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": a second ByteLevel pre-tokenizer is not supported", path,
                            field);
        *byte_level = 1;
        if (prefix) {
            if (t->n_stages == TOK_MAX_STAGES)
                return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": too many pre-tokenizer stages", path, field);
            t->stages[t->n_stages++].kind = STAGE_PREFIX_SPACE;
        }
        if (use_regex)
            ER_TRY(stage_add_regex(t, path, field, GPT2_PATTERN, sizeof GPT2_PATTERN - 1, 0));
        return ER_OK;
    }
    if (strcmp(type, "Split") == 0) {
        if (*byte_level)
            return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": a Split after ByteLevel is not supported", path, field);
        const char *behavior = NULL, *pat = NULL;
        snprintf(f, sizeof f, "%s.behavior", field);
        ER_TRY(json_opt_string_named(p, "behavior", f, &behavior, path));
        if (!behavior || strcmp(behavior, "Isolated") != 0)
            return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": only \"Isolated\" is supported (got \"%.40s\")", path,
                            f, behavior ? behavior : "nothing");
        int invert = 0;
        snprintf(f, sizeof f, "%s.invert", field);
        ER_TRY(json_opt_bool_named(p, "invert", f, &invert, path));
        if (invert)
            return er_error(ER_EUNSUPPORTED, "%s: field \"%s\": true is not supported", path, f);
        snprintf(f, sizeof f, "%s.pattern", field);
        const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        if (!cJSON_IsObject(pattern))
            return json_field_error(path, f, "an object {\"Regex\": ...} or {\"String\": ...}", pattern);
        snprintf(f, sizeof f, "%s.pattern.Regex", field);
        ER_TRY(json_opt_string_named(pattern, "Regex", f, &pat, path));
        if (pat) {
            t->qwen2_split = t->n_stages == 0 && strcmp(pat, QWEN2_PATTERN) == 0;
            return stage_add_regex(t, path, f, pat, strlen(pat), 0);
        }
        snprintf(f, sizeof f, "%s.pattern.String", field);
        ER_TRY(json_opt_string_named(pattern, "String", f, &pat, path));
        if (pat && *pat)
            return stage_add_regex(t, path, f, pat, strlen(pat), 1);
        return er_error(ER_EFORMAT, "%s: field \"%s.pattern\" must hold a non-empty \"Regex\" or \"String\"", path,
                        field);
    }
    return er_error(ER_EUNSUPPORTED, "%s: field \"%s.type\": pre-tokenizer \"%.40s\" is not supported (Split, ByteLevel, Sequence)",
                    path, field, type);
}

static int load_decoder(const char *path, const cJSON *root) {
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!cJSON_IsObject(d))
        return er_error(ER_EUNSUPPORTED, "%s: field \"decoder\" must be a ByteLevel decoder (got %s)", path,
                        json_type_name(d));
    const char *type = NULL;
    ER_TRY(json_opt_string_named(d, "type", "decoder.type", &type, path));
    if (!type || strcmp(type, "ByteLevel") != 0)
        return er_error(ER_EUNSUPPORTED, "%s: field \"decoder.type\": \"%.40s\" is not supported (only \"ByteLevel\")",
                        path, type ? type : "nothing");
    return ER_OK;
}

// Decoded bytes per id, as the ByteLevel decoder produces them: a token whose characters are
// all in the byte alphabet becomes those bytes, any other token its UTF-8 text unchanged.
// Added tokens override the vocabulary string of their id, as id_to_token does.
static int build_decode(Tokenizer *t, const uint32_t byte_cp[256]) {
    int16_t cp_byte[324];
    memset(cp_byte, 0xff, sizeof cp_byte);
    for (int b = 0; b < 256; b++)
        cp_byte[byte_cp[b]] = (int16_t)b;
    int V = t->n_ids > 0 ? t->n_ids : 1;
    const char **src = er_calloc((size_t)V, sizeof *src);
    uint32_t *srclen = er_calloc((size_t)V, sizeof *srclen);
    t->dec_off = er_alloc((size_t)V * sizeof *t->dec_off);
    t->dec_len = er_alloc((size_t)V * sizeof *t->dec_len);
    t->special = er_calloc((size_t)V, 1);
    int rc = ER_OK;
    size_t total = 0, off = 0;
    if (!src || !srclen || !t->dec_off || !t->dec_len || !t->special) {
        rc = ER_ENOMEM;
        goto done;
    }
    for (int id = 0; id < t->n_ids; id++)
        if (t->str_len[id] != UINT32_MAX) {
            src[id] = t->strs + t->str_off[id];
            srclen[id] = t->str_len[id];
        }
    for (int i = 0; i < t->n_added; i++) {
        const AddedToken *a = &t->added[i];
        src[a->id] = a->content;
        srclen[a->id] = (uint32_t)a->len;
        t->special[a->id] |= a->special;
    }
    for (int id = 0; id < t->n_ids; id++)
        total += src[id] ? srclen[id] : 0;
    if (!(t->dec = er_alloc(total + 1))) {
        rc = ER_ENOMEM;
        goto done;
    }
    for (int id = 0; id < V; id++) {
        t->dec_off[id] = (uint32_t)off;
        t->dec_len[id] = UINT32_MAX;
        if (id >= t->n_ids || !src[id])
            continue;
        const unsigned char *s = (const unsigned char *)src[id];
        size_t n = srclen[id], o = off, i = 0;
        int all = 1;
        while (i < n) {
            int w = utf8_next(s + i, n - i);
            uint32_t cp = w > 0 ? utf8_decode(s + i, w) : 0xFFFFFFFF;
            if (w <= 0 || cp >= 324 || cp_byte[cp] < 0) {
                all = 0;
                break;
            }
            t->dec[o++] = (char)cp_byte[cp];
            i += (size_t)w;
        }
        if (!all) {
            memcpy(t->dec + off, s, n);
            o = off + n;
        }
        t->dec_len[id] = (uint32_t)(o - off);
        off = o;
    }
    t->dec[off] = 0;
done:
    er_free(src);
    er_free(srclen);
    return rc;
}

// eos_token / pad_token / bos_token of tokenizer_config.json: a string or {"content": ...}.
static int config_token(const Tokenizer *t, const char *path, const cJSON *cfg, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v || cJSON_IsNull(v))
        return ER_OK;
    const char *name = NULL;
    if (cJSON_IsString(v))
        name = v->valuestring;
    else if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c))
            name = c->valuestring;
    }
    if (!name)
        return er_error(ER_EFORMAT, "%s: field \"%s\" must be a string or {\"content\": string}", path, key);
    int id = tok_token_id(t, name);
    if (id < 0)
        return er_error(ER_EFORMAT, "%s: field \"%s\": \"%.60s\" is not a token of %s", path, key, name, t->path);
    *out = id;
    return ER_OK;
}

static int add_eos(Tokenizer *t, int id) {
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id)
            return ER_OK;
    int *p = er_realloc_array(t->eos_ids, (size_t)t->n_eos + 1, sizeof *p);
    if (!p)
        return ER_ENOMEM;
    t->eos_ids = p;
    t->eos_ids[t->n_eos++] = id;
    return ER_OK;
}

static int gen_id(const Tokenizer *t, const char *path, const char *key, const cJSON *v, int *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < t->n_ids) ||
        v->valuedouble != (double)(int)v->valuedouble)
        return er_error(ER_EFORMAT, "%s: field \"%s\" must hold token ids in [0, %d)", path, key, t->n_ids);
    *out = (int)v->valuedouble;
    return ER_OK;
}

// eos_token, pad_token and bos_token of tokenizer_config.json (parsed; `path` names it).
static int load_tokenizer_config(Tokenizer *t, const char *path, const cJSON *cfg) {
    if (!cJSON_IsObject(cfg))
        return er_error(ER_EFORMAT, "%s: must be a JSON object", path);
    ER_TRY(config_token(t, path, cfg, "eos_token", &t->eos_id));
    ER_TRY(config_token(t, path, cfg, "pad_token", &t->pad_id));
    ER_TRY(config_token(t, path, cfg, "bos_token", &t->bos_id));
    if (t->eos_id >= 0)
        ER_TRY(add_eos(t, t->eos_id));
    return ER_OK;
}

// generation_config.json (parsed): every eos_token_id (one id or a list) ends a sequence; pad_token_id and
// bos_token_id count where tokenizer_config.json named none.
static int load_generation_config(Tokenizer *t, const char *path, const cJSON *gen) {
    int id;
    if (!cJSON_IsObject(gen))
        return er_error(ER_EFORMAT, "%s: must be a JSON object", path);
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(gen, "eos_token_id"), *e;
    if (cJSON_IsArray(eos)) {
        cJSON_ArrayForEach(e, eos) {
            ER_TRY(gen_id(t, path, "eos_token_id", e, &id));
            ER_TRY(add_eos(t, id));
        }
    } else if (eos && !cJSON_IsNull(eos)) {
        ER_TRY(gen_id(t, path, "eos_token_id", eos, &id));
        ER_TRY(add_eos(t, id));
    }
    const char *keys[2] = {"pad_token_id", "bos_token_id"};
    int *dst[2] = {&t->pad_id, &t->bos_id};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(gen, keys[k]);
        if (!v || cJSON_IsNull(v))
            continue;
        ER_TRY(gen_id(t, path, keys[k], v, &id));
        if (*dst[k] < 0)
            *dst[k] = id;
    }
    return ER_OK;
}

// The special ids of tokenizer_config.json and generation_config.json texts (text NULL: absent).
static int load_config_texts(Tokenizer *t, const JsonText *cfg_text, const JsonText *gen_text) {
    t->eos_id = t->pad_id = t->bos_id = -1;
    cJSON *cfg = NULL, *gen = NULL;
    int rc = ER_OK;
    if (cfg_text && cfg_text->text) {
        ER_CHECK(json_parse_text(cfg_text, (size_t)64 << 20, &cfg));
        ER_CHECK(load_tokenizer_config(t, cfg_text->name, cfg));
    }
    if (gen_text && gen_text->text) {
        ER_CHECK(json_parse_text(gen_text, (size_t)16 << 20, &gen));
        ER_CHECK(load_generation_config(t, gen_text->name, gen));
    }
    if (t->eos_id < 0 && t->n_eos)
        t->eos_id = t->eos_ids[0];
done:
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    return rc;
}

// tokenizer_config.json and generation_config.json next to the tokenizer, when present.
static int load_config_ids(Tokenizer *t, const char *dir) {
    const char *names[2] = {"tokenizer_config.json", "generation_config.json"};
    size_t limits[2] = {(size_t)64 << 20, (size_t)16 << 20};
    JsonText texts[2] = {{NULL, NULL, 0}, {NULL, NULL, 0}};
    char *paths[2] = {NULL, NULL}, *bufs[2] = {NULL, NULL};
    int rc = ER_OK;
    for (int k = 0; k < 2; k++) {
        if (!(paths[k] = path_join(dir, names[k])))
            ER_CHECK(ER_ENOMEM);
        texts[k].name = paths[k];
        if (path_exists(paths[k])) {
            ER_CHECK(file_read_all(paths[k], limits[k], &bufs[k], &texts[k].len));
            texts[k].text = bufs[k];
        }
    }
    rc = load_config_texts(t, &texts[0], &texts[1]);
done:
    for (int k = 0; k < 2; k++) {
        free(paths[k]);
        er_free(bufs[k]);
    }
    return rc;
}

// One TemplateProcessing's "single" template: the special tokens before and after the text ("Sequence" "A"),
// each looked up in its "special_tokens" map. Other post-processors (ByteLevel's offsets, ...) change no id.
static int load_template(Tokenizer *t, const cJSON *pp, const char *field) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pp, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pp, "processors"), *it;
        char sub[96];
        int i = 0;
        cJSON_ArrayForEach(it, list) {
            snprintf(sub, sizeof sub, "%s.processors[%d]", field, i++);
            ER_TRY(load_template(t, it, sub));
        }
        return ER_OK;
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "TemplateProcessing") != 0)
        return ER_OK;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(pp, "single"), *specials, *piece;
    specials = cJSON_GetObjectItemCaseSensitive(pp, "special_tokens");
    if (!cJSON_IsArray(single))
        return er_error(ER_EFORMAT, "%s: field \"%s.single\" must be an array", t->path, field);
    int after = 0;
    t->n_tmpl_pre = t->n_tmpl_post = 0;
    cJSON_ArrayForEach(piece, single) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(piece, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(piece, "SpecialToken");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
        if (seq) {
            after = 1;
            continue;
        }
        const cJSON *entry = cJSON_IsString(name) ? cJSON_GetObjectItemCaseSensitive(specials, name->valuestring) : NULL;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids"), *id;
        if (!cJSON_IsArray(ids))
            return er_error(ER_EFORMAT, "%s: field \"%s.single\": a SpecialToken without ids in \"special_tokens\"",
                            t->path, field);
        cJSON_ArrayForEach(id, ids) {
            int *n = after ? &t->n_tmpl_post : &t->n_tmpl_pre;
            if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= t->n_ids || *n == TOK_MAX_TEMPLATE)
                return er_error(ER_EFORMAT, "%s: field \"%s.special_tokens\": an id out of range or more than %d of "
                                "them", t->path, field, TOK_MAX_TEMPLATE);
            (after ? t->tmpl_post : t->tmpl_pre)[(*n)++] = id->valueint;
        }
    }
    return ER_OK;
}

// Everything taken from the document. Strings are copied: the document is freed right after.
static int load_doc(Tokenizer *t, const cJSON *root) {
    int byte_level = 0;
    if (!cJSON_IsObject(root))
        return er_error(ER_EFORMAT, "%s: must be a JSON object (got %s)", t->path, json_type_name(root));
    ER_TRY(load_added(t, t->path, root));
    ER_TRY(load_model(t, t->path, root));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    ER_TRY(load_normalizer(t, t->path, norm, "normalizer", 0, NULL));
    ER_TRY(load_pre_tokenizer(t, t->path, pre, "pre_tokenizer", 0, &byte_level));
    if (!byte_level)
        return er_error(ER_EUNSUPPORTED,
                        "%s: field \"pre_tokenizer\": no ByteLevel pre-tokenizer (only byte-level BPE is supported)",
                        t->path);
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "post_processor");
    if (pp && !cJSON_IsNull(pp))
        ER_TRY(load_template(t, pp, "post_processor"));
    return load_decoder(t->path, root);
}

// The tables derived from what load_doc read.
static int load_finish(Tokenizer *t) {
    uint32_t byte_cp[256];
    ER_TRY(added_finish(t));
    byte_level_table(byte_cp);
    for (int b = 0; b < 256; b++) {
        char u[4];
        int n = utf8_encode(byte_cp[b], u);
        t->byte_id[b] = vocab_find(t, u, (size_t)n);
        // `tokenizers` silently drops a byte with no symbol when there is no unk token: refuse instead.
        if (t->byte_id[b] < 0 && t->unk_id < 0)
            return er_error(ER_EFORMAT, "%s: field \"model.vocab\" has no symbol \"%.*s\" for byte 0x%02X and "
                            "there is no unk_token: text holding that byte would be dropped", t->path, n, u, b);
    }
    return build_decode(t, byte_cp);
}

static int gguf_doc(Tokenizer *t, const GgufFile *f, cJSON **out);
static int gguf_ids(Tokenizer *t);

// A new tokenizer named `path` in messages (its file, or what names the bytes).
static Tokenizer *tok_new(const char *path) {
    Tokenizer *t = er_calloc(1, sizeof *t);
    if (t && !(t->path = er_strdup(path))) {
        er_free(t);
        t = NULL;
    }
    if (!t)
        er_error(ER_ENOMEM, "tok_load: out of memory");
    return t;
}

// The tables from a tokenizer.json document (root, deleted here).
static int tok_from_doc(Tokenizer *t, cJSON *root) {
    int rc = load_doc(t, root);
    cJSON_Delete(root); // everything needed is copied out
    ER_TRY(rc);
    return load_finish(t);
}

// The tokenizer.json text (buf[len] must be 0): parsed and loaded.
static int tok_from_json(Tokenizer *t, const char *buf, size_t len) {
    cJSON *root = NULL;
    ER_TRY(tok_json_parse(t->path, buf, len, &root));
    return tok_from_doc(t, root);
}

// The tokenizer of a GGUF file: its document and its special ids.
static int tok_from_gguf(Tokenizer *t, const GgufFile *f) {
    cJSON *root = NULL;
    ER_TRY(gguf_doc(t, f, &root));
    ER_TRY(tok_from_doc(t, root));
    return gguf_ids(t);
}

// The end of every load: the word cache, then *out; on failure the one-line message and t freed.
static int tok_finish(Tokenizer *t, int rc, Tokenizer **out) {
    if (rc == ER_OK && !(t->cache = er_calloc(CACHE_SLOTS, sizeof *t->cache)))
        rc = ER_ENOMEM;
    if (rc < 0) {
        // Messages quote strings from the file: keep them on one line.
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", er_last_error());
        for (char *p = msg; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7F)
                *p = '?';
        er_error(rc, "%s", msg);
        tok_free(t);
        return rc;
    }
    *out = t;
    return ER_OK;
}

int tok_load(Tokenizer **out, const char *path_or_dir) {
    *out = NULL;
    if (!path_or_dir)
        return er_error(ER_EINVAL, "tok_load: no path");
    int is_dir = path_is_dir(path_or_dir);
    char *path = is_dir ? path_join(path_or_dir, "tokenizer.json") : er_strdup(path_or_dir), *dir = NULL, *buf = NULL;
    const char *slash = strrchr(path_or_dir, '/');
    if (is_dir)
        dir = er_strdup(path_or_dir);
    else
        dir = slash ? strndup(path_or_dir, (size_t)(slash - path_or_dir) + (slash == path_or_dir)) : er_strdup(".");
    Tokenizer *t = path ? tok_new(path) : NULL;
    size_t len = 0;
    GgufFile f = {0};
    int rc = ER_OK;
    if (!t || !dir) {
        rc = er_error(ER_ENOMEM, "tok_load: out of memory");
        goto done;
    }
    if (gguf_is_path(t->path)) {
        ER_CHECK(gguf_open(&f, t->path));
        ER_CHECK(tok_from_gguf(t, &f));
    } else {
        ER_CHECK(file_read_all(t->path, TOK_MAX_FILE, &buf, &len));
        ER_CHECK(tok_from_json(t, buf, len));
        ER_CHECK(load_config_ids(t, dir));
    }
done:
    gguf_close(&f);
    er_free(buf);
    free(path);
    free(dir);
    if (!t)
        return rc;
    return tok_finish(t, rc, out);
}

int tok_load_gguf(Tokenizer **out, const GgufFile *f) {
    *out = NULL;
    Tokenizer *t = tok_new(f->path);
    if (!t)
        return ER_ENOMEM;
    return tok_finish(t, tok_from_gguf(t, f), out);
}

int tok_load_texts(Tokenizer **out, const JsonText *tokenizer, const JsonText *config, const JsonText *generation) {
    *out = NULL;
    if (tokenizer->len > TOK_MAX_FILE)
        return er_error(ER_ERANGE, "%s: %zu bytes, more than the %zu allowed", tokenizer->name, tokenizer->len,
                        TOK_MAX_FILE);
    Tokenizer *t = tok_new(tokenizer->name);
    char *buf = er_alloc(tokenizer->len + 1); // NUL-terminated, as tok_json_parse reads it
    int rc = ER_OK;
    if (!t || !buf) {
        rc = ER_ENOMEM;
        goto done;
    }
    memcpy(buf, tokenizer->text, tokenizer->len);
    buf[tokenizer->len] = 0;
    ER_CHECK(tok_from_json(t, buf, tokenizer->len));
    ER_CHECK(load_config_texts(t, config, generation));
done:
    er_free(buf);
    if (!t)
        return rc;
    return tok_finish(t, rc, out);
}

void tok_free(Tokenizer *t) {
    if (!t)
        return;
    for (int i = 0; i < t->n_added; i++) {
        if (t->added[i].match != t->added[i].content)
            free(t->added[i].match);
        er_free(t->added[i].content);
    }
    er_free(t->added);
    er_free(t->raw_set.tok);
    er_free(t->norm_set.tok);
    for (int i = 0; i < t->n_stages; i++)
        pcre2_code_free(t->stages[i].re);
    free(t->path);
    er_free(t->strs);
    free(t->str_off);
    free(t->str_len);
    er_free(t->dec);
    er_free(t->dec_off);
    er_free(t->dec_len);
    er_free(t->special);
    er_free(t->vocab_tab);
    er_free(t->merges);
    free(t->eos_ids);
    er_free(t->cache);
    er_free(t);
}

// ---------------------------------------------------------------------------------------------
// Encoding

typedef struct {
    const Tokenizer *t;
    int special_as_text;
    int *ids;          // output
    size_t n, cap;
    pcre2_match_data *md;
    pcre2_match_context *mctx; // only once a match needs more JIT stack than the default 32 KiB
    pcre2_jit_stack *jstack;
    int *sym;          // BPE scratch (big words also use prev/next/heap)
    uint32_t *rank;
    int *prev, *next;
    uint64_t *heap;
    size_t sym_cap;
    char *bl;          // byte-level form of a word, for ignore_merges
    size_t bl_cap;
} EncodeCtx;

typedef int (*PieceFn)(EncodeCtx *c, const char *s, size_t len);

static int push_ids(EncodeCtx *c, const int *ids, size_t n) {
    if (n == 0)
        return ER_OK;
    if (c->n + n > c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        while (cap < c->n + n)
            cap *= 2;
        if (cap > (size_t)INT32_MAX)
            return er_error(ER_ERANGE, "tok_encode: more than 2^31 tokens");
        int *p = er_realloc_array(c->ids, cap, sizeof *p);
        if (!p)
            return ER_ENOMEM;
        c->ids = p;
        c->cap = cap;
    }
    memcpy(c->ids + c->n, ids, n * sizeof *ids);
    c->n += n;
    return ER_OK;
}

static inline uint32_t pair_rank(const Tokenizer *t, int a, int b) {
    const MergeSlot *m = merge_find(t, a, b);
    return m ? m->rank : UINT32_MAX;
}

// Merges the lowest-ranked adjacent pair, leftmost on ties, until none is left: the order of
// the BinaryHeap in `tokenizers`' Word::merge_all. rank[i] caches the rank of pair (i, i+1).
static int bpe_small(const Tokenizer *t, int *sym, uint32_t *rank, int n) {
    for (int i = 0; i + 1 < n; i++)
        rank[i] = pair_rank(t, sym[i], sym[i + 1]);
    while (n > 1) {
        uint32_t best = UINT32_MAX;
        int bi = -1;
        for (int i = 0; i + 1 < n; i++)
            if (rank[i] < best) {
                best = rank[i];
                bi = i;
            }
        if (bi < 0)
            break;
        sym[bi] = merge_find(t, sym[bi], sym[bi + 1])->id;
        if (n - bi - 2 > 0)
            memmove(sym + bi + 1, sym + bi + 2, (size_t)(n - bi - 2) * sizeof *sym);
        if (n - bi - 3 > 0)
            memmove(rank + bi + 1, rank + bi + 2, (size_t)(n - bi - 3) * sizeof *rank);
        n--;
        if (bi > 0)
            rank[bi - 1] = pair_rank(t, sym[bi - 1], sym[bi]);
        if (bi + 1 < n)
            rank[bi] = pair_rank(t, sym[bi], sym[bi + 1]);
    }
    return n;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n)
            break;
        if (l + 1 < *n && h[l + 1] < h[l])
            l++;
        if (h[l] >= v)
            break;
        h[i] = h[l];
        i = l;
    }
    h[i] = v;
    return top;
}

// Same merge order for long words (long runs of spaces, digits-free junk) in O(n log n):
// heap entries are rank << 32 | position of the left symbol; stale entries are skipped.
static int bpe_heap(const Tokenizer *t, EncodeCtx *c, int n) {
    int *sym = c->sym, *prev = c->prev, *next = c->next;
    uint64_t *heap = c->heap;
    size_t hn = 0;
    for (int i = 0; i < n; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
    }
    for (int i = 0; i + 1 < n; i++) {
        uint32_t r = pair_rank(t, sym[i], sym[i + 1]);
        if (r != UINT32_MAX)
            heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)i);
    }
    while (hn) {
        uint64_t top = heap_pop(heap, &hn);
        uint32_t r = (uint32_t)(top >> 32);
        int i = (int)(uint32_t)top, j = next[i];
        if (sym[i] < 0 || j < 0)
            continue;
        const MergeSlot *m = merge_find(t, sym[i], sym[j]);
        if (!m || m->rank != r)
            continue;
        sym[i] = m->id;
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0)
            prev[next[j]] = i;
        if (prev[i] >= 0 && (r = pair_rank(t, sym[prev[i]], sym[i])) != UINT32_MAX)
            heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)prev[i]);
        if (next[i] >= 0 && (r = pair_rank(t, sym[i], sym[next[i]])) != UINT32_MAX)
            heap_push(heap, &hn, (uint64_t)r << 32 | (uint32_t)i);
    }
    int k = 0;
    for (int i = 0; i >= 0; i = next[i])
        sym[k++] = sym[i];
    return k;
}

static int scratch_reserve(EncodeCtx *c, size_t n) {
    if (n <= c->sym_cap)
        return ER_OK;
    size_t cap = n < 256 ? 256 : n * 2;
    if (cap > (size_t)INT32_MAX / 4)
        return er_error(ER_ERANGE, "tok_encode: a pre-token of %zu bytes is too long", n);
    int *sym = er_realloc_array(c->sym, cap, sizeof *sym);
    if (sym)
        c->sym = sym;
    uint32_t *rank = er_realloc_array(c->rank, cap, sizeof *rank);
    if (rank)
        c->rank = rank;
    int *prev = er_realloc_array(c->prev, cap, sizeof *prev);
    if (prev)
        c->prev = prev;
    int *next = er_realloc_array(c->next, cap, sizeof *next);
    if (next)
        c->next = next;
    uint64_t *heap = er_realloc_array(c->heap, cap * 3, sizeof *heap);
    if (heap)
        c->heap = heap;
    if (!sym || !rank || !prev || !next || !heap)
        return ER_ENOMEM;
    c->sym_cap = cap;
    return ER_OK;
}

static inline CacheSlot *cache_slot(const Tokenizer *t, uint64_t h) {
    return &t->cache[(h ^ (h >> 32)) & (CACHE_SLOTS - 1)];
}

// One pre-token (bytes; each byte is one byte-level symbol) -> ids.
static int bpe_word(EncodeCtx *c, const char *s, size_t len) {
    const Tokenizer *t = c->t;
    if (t->ignore_merges) {
        if (len * 2 > c->bl_cap) {
            char *p = er_realloc_array(c->bl, len * 2 + 16, 1);
            if (!p)
                return ER_ENOMEM;
            c->bl = p;
            c->bl_cap = len * 2 + 16;
        }
        uint32_t byte_cp[256];
        byte_level_table(byte_cp);
        size_t o = 0;
        for (size_t i = 0; i < len; i++)
            o += (size_t)utf8_encode(byte_cp[(unsigned char)s[i]], c->bl + o);
        int id = vocab_find(t, c->bl, o);
        if (id >= 0)
            return push_ids(c, &id, 1);
    }
    uint64_t h = 0;
    CacheSlot *slot = NULL;
    if (len <= CACHE_KEY_MAX) {
        h = hash_bytes(s, len);
        slot = cache_slot(t, h);
        if (atomic_exchange_explicit(&slot->busy, 1, memory_order_acquire) == 0) {
            int hit = slot->keylen == len && slot->hash == (uint32_t)(h >> 32) && memcmp(slot->key, s, len) == 0;
            int ids[CACHE_IDS_MAX], n = slot->nids;
            if (hit)
                memcpy(ids, slot->ids, (size_t)n * sizeof *ids);
            atomic_store_explicit(&slot->busy, 0, memory_order_release);
            if (hit)
                return push_ids(c, ids, (size_t)n);
        }
    }
    ER_TRY(scratch_reserve(c, len));
    int n = 0, prev_unk = 0;
    for (size_t i = 0; i < len; i++) {
        int id = t->byte_id[(unsigned char)s[i]];
        if (id < 0) {
            // A byte missing from the vocabulary: `tokenizers` emits unk (fused if asked) or drops it.
            if (t->unk_id < 0 || (t->fuse_unk && prev_unk))
                continue;
            id = t->unk_id;
            prev_unk = 1;
        } else {
            prev_unk = 0;
        }
        c->sym[n++] = id;
    }
    n = n <= BPE_SMALL ? bpe_small(t, c->sym, c->rank, n) : bpe_heap(t, c, n);
    if (slot && n <= CACHE_IDS_MAX && atomic_exchange_explicit(&slot->busy, 1, memory_order_acquire) == 0) {
        slot->keylen = (unsigned char)len;
        slot->hash = (uint32_t)(h >> 32);
        slot->nids = (unsigned char)n;
        memcpy(slot->key, s, len);
        memcpy(slot->ids, c->sym, (size_t)n * sizeof *c->sym);
        atomic_store_explicit(&slot->busy, 0, memory_order_release);
    }
    return push_ids(c, c->sym, (size_t)n);
}

static int re_match(EncodeCtx *c, const PreStage *st, const char *s, size_t len, size_t pos) {
    for (;;) {
        int rc = st->jit ? pcre2_jit_match(st->re, (PCRE2_SPTR)s, len, pos, 0, c->md, c->mctx)
                         : pcre2_match(st->re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || c->jstack)
            return rc;
        c->mctx = pcre2_match_context_create(NULL);
        c->jstack = pcre2_jit_stack_create(64 << 10, 256 << 20, NULL);
        if (!c->mctx || !c->jstack)
            return er_error(ER_ENOMEM, "tok_encode: out of memory for the regex stack");
        pcre2_jit_stack_assign(c->mctx, NULL, c->jstack);
    }
}

// Pre-tokenizer stage `k` on one piece: Split keeps matches and the text between them as
// pieces (behavior Isolated); the ByteLevel prefix space prepends ' ' when missing.
static int pretok(EncodeCtx *c, int k, const char *s, size_t len) {
    const Tokenizer *t = c->t;
    if (len == 0)
        return ER_OK;
    if (k == t->n_stages)
        return bpe_word(c, s, len);
    const PreStage *st = &t->stages[k];
    if (st->kind == STAGE_PREFIX_SPACE) {
        if (s[0] == ' ')
            return pretok(c, k + 1, s, len);
        char *p = er_alloc(len + 1);
        if (!p)
            return ER_ENOMEM;
        p[0] = ' ';
        memcpy(p + 1, s, len);
        int rc = pretok(c, k + 1, p, len + 1);
        er_free(p);
        return rc;
    }
    size_t pos = 0, done = 0;
    while (pos < len) {
        int rc = re_match(c, st, s, len, pos);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            if (rc == ER_ENOMEM)
                return rc;
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return er_error(ER_ERANGE, "tok_encode: pre-tokenizer regex failed: %s", (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { // an empty match splits nothing; step over one character
            int w = ms < len ? utf8_next((const unsigned char *)s + ms, len - ms) : 1;
            pos = ms + (size_t)(w > 0 ? w : 1);
            continue;
        }
        if (ms > done)
            ER_TRY(pretok(c, k + 1, s + done, ms - done));
        ER_TRY(pretok(c, k + 1, s + ms, me - ms));
        done = pos = me;
    }
    return pretok(c, k + 1, s + done, len - done);
}

static int encode_piece(EncodeCtx *c, const char *s, size_t len) { return pretok(c, 0, s, len); }

// NFC quick check: a code point is "stable" when it has combining class 0, NFC maps it to
// itself, and it is never the second part of a canonical composition. Text made only of
// stable code points is already NFC, so most text (CJK, Hangul syllables, emoji, Latin-1)
// skips utf8proc. One bitmap per process, built on first use.
static uint8_t *nfc_stable;
static pthread_once_t nfc_once = PTHREAD_ONCE_INIT;

static void nfc_stable_build(void) {
    uint8_t *m = malloc(0x110000 / 8);
    if (!m)
        return; // every text then takes the utf8proc path
    memset(m, 0xff, 0x110000 / 8);
#define NFC_UNSTABLE(c) (m[(c) >> 3] &= (uint8_t) ~(1u << ((c)&7)))
    for (utf8proc_int32_t c = 0x80; c < 0x110000; c++) {
        const utf8proc_property_t *p = utf8proc_get_property(c);
        if (p->category == UTF8PROC_CATEGORY_CN)
            continue;
        if (p->combining_class)
            NFC_UNSTABLE(c);
        utf8proc_int32_t d[16];
        int last = 0;
        utf8proc_ssize_t k = utf8proc_decompose_char(c, d, 16, UTF8PROC_DECOMPOSE, &last);
        if (k <= 1 && (k < 1 || d[0] == c))
            continue;
        for (utf8proc_ssize_t j = 1; j < k && j < 16; j++)
            NFC_UNSTABLE(d[j]);
        if (c >= 0xAC00 && c <= 0xD7A3)
            continue; // Hangul syllables compose back to themselves
        utf8proc_uint8_t one[8];
        utf8proc_ssize_t n = utf8proc_encode_char(c, one);
        one[n] = 0;
        utf8proc_uint8_t *nfc = utf8proc_NFC(one);
        if (!nfc || strcmp((const char *)nfc, (const char *)one) != 0)
            NFC_UNSTABLE(c);
        free(nfc);
    }
#undef NFC_UNSTABLE
    nfc_stable = m;
}

static int nfc_is_identity(const unsigned char *s, size_t n) {
    pthread_once(&nfc_once, nfc_stable_build);
    if (!nfc_stable)
        return 0;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int w = utf8_next(s + i, n - i);
        if (w <= 0)
            return 0;
        uint32_t c = utf8_decode(s + i, w);
        if (!(nfc_stable[c >> 3] & (1u << (c & 7))))
            return 0;
        i += (size_t)w;
    }
    return 1;
}

// Applies the normalizers; *out is NULL when the text is unchanged (free *out with free()).
static int norm_apply(const Tokenizer *t, const char *s, size_t n, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = n;
    char *cur = NULL;
    size_t cur_len = n;
    for (int k = 0; k < t->n_norm; k++) {
        const unsigned char *p = (const unsigned char *)(cur ? cur : s);
        // Plain ASCII is stable under every form.
        size_t i = 0;
        while (i < cur_len && p[i] < 0x80)
            i++;
        if (i == cur_len)
            continue;
        if (t->norm[k] == (UTF8PROC_STABLE | UTF8PROC_COMPOSE) && nfc_is_identity(p + i, cur_len - i))
            continue;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t m = utf8proc_map(p, (utf8proc_ssize_t)cur_len, &dst, (utf8proc_option_t)t->norm[k]);
        if (m < 0) {
            free(cur);
            return er_error(ER_EINVAL, "tok_encode: normalization failed: %s", utf8proc_errmsg(m));
        }
        free(cur);
        cur = (char *)dst;
        cur_len = (size_t)m;
    }
    *out = cur;
    *out_len = cur_len;
    return ER_OK;
}

static int added_find(const AddedToken *added, const AddedSet *set, const unsigned char *s, size_t len, size_t pos,
                      size_t *ms, const AddedToken **tok) {
    while (pos < len) {
        if (set->single_first >= 0) {
            const unsigned char *p = memchr(s + pos, set->single_first, len - pos);
            if (!p)
                return 0;
            pos = (size_t)(p - s);
        } else {
            while (pos < len && !set->first[s[pos]])
                pos++;
            if (pos == len)
                return 0;
        }
        for (int k = 0; k < set->n; k++) {
            const AddedToken *a = &added[set->tok[k]];
            if (a->match_len <= len - pos && (unsigned char)a->match[0] == s[pos] &&
                memcmp(a->match, s + pos, a->match_len) == 0) {
                *ms = pos;
                *tok = a;
                return 1;
            }
        }
        pos++;
    }
    return 0;
}

static size_t ws_suffix(const unsigned char *s, size_t end) { // bytes of White_Space ending at end
    size_t i = end;
    while (i > 0) {
        size_t st;
        if (!is_white_space(utf8_last(s, i, &st)))
            break;
        i = st;
    }
    return end - i;
}

static size_t ws_prefix(const unsigned char *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        int w = utf8_next(s + i, len - i);
        if (w <= 0 || !is_white_space(utf8_decode(s + i, w)))
            break;
        i += (size_t)w;
    }
    return i;
}

// AddedVocabulary::find_matches of `tokenizers`: non-overlapping leftmost-longest matches; a
// rejected match (single_word, or a special token kept as text) still consumes its span.
static int added_split(EncodeCtx *c, const AddedSet *set, const char *text, size_t len, PieceFn fn) {
    const Tokenizer *t = c->t;
    const unsigned char *s = (const unsigned char *)text;
    if (set->n == 0)
        return fn(c, text, len);
    size_t pos = 0, start_offset = 0, ms;
    const AddedToken *a;
    while (added_find(t->added, set, s, len, pos, &ms, &a)) {
        size_t me = ms + a->match_len;
        pos = me;
        if (c->special_as_text && a->special)
            continue;
        if (a->single_word) {
            size_t st;
            int start_space = ms == 0 || !is_word_char(utf8_last(s, ms, &st));
            int w = me < len ? utf8_next(s + me, len - me) : 0;
            int stop_space = me == len || !is_word_char(utf8_decode(s + me, w));
            if (!start_space || !stop_space)
                continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t ns = ms - ws_suffix(s, ms);
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip)
            stop += ws_prefix(s + me, len - me);
        if (start_offset < start)
            ER_TRY(fn(c, text + start_offset, start - start_offset));
        ER_TRY(push_ids(c, &a->id, 1));
        start_offset = stop;
    }
    return start_offset < len ? fn(c, text + start_offset, len - start_offset) : ER_OK;
}

// A section between raw added tokens: normalize, then look for normalized added tokens.
static int encode_section(EncodeCtx *c, const char *s, size_t len) {
    const Tokenizer *t = c->t;
    if (len == 0)
        return ER_OK;
    char *norm = NULL;
    size_t nlen = len;
    ER_TRY(norm_apply(t, s, len, &norm, &nlen));
    int rc = added_split(c, &t->norm_set, norm ? norm : s, nlen, encode_piece);
    free(norm);
    return rc;
}

int tok_encode_ex(const Tokenizer *tok, const char *text, size_t len, int special_as_text, int **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (!tok || (!text && len))
        return er_error(ER_EINVAL, "tok_encode: no tokenizer or no text");
    size_t bad = utf8_invalid_at(text, len);
    if (bad < len)
        return er_error(ER_EINVAL, "tok_encode: text is not valid UTF-8 (byte %zu)", bad);
    EncodeCtx c = {.t = tok, .special_as_text = special_as_text};
    c.md = pcre2_match_data_create(1, NULL);
    int rc = c.md ? added_split(&c, &tok->raw_set, text ? text : "", len, encode_section)
                  : er_error(ER_ENOMEM, "tok_encode: out of memory");
    pcre2_match_data_free(c.md);
    pcre2_match_context_free(c.mctx);
    pcre2_jit_stack_free(c.jstack);
    free(c.sym);
    free(c.rank);
    free(c.prev);
    free(c.next);
    free(c.heap);
    free(c.bl);
    if (rc < 0) {
        free(c.ids);
        return rc;
    }
    *ids = c.ids;
    *n = (int)c.n;
    return ER_OK;
}

int tok_encode(const Tokenizer *tok, const char *text, size_t len, int **ids, int *n) {
    return tok_encode_ex(tok, text, len, 0, ids, n);
}

// ---------------------------------------------------------------------------------------------
// Decoding and lookups

int tok_text_from_bytes(const char *bytes, size_t n, char **text, size_t *len) {
    const unsigned char *raw = (const unsigned char *)bytes;
    char *out = er_alloc(n * 3 + 1); // every bad byte may become the 3 bytes of U+FFFD
    if (!out)
        return ER_ENOMEM;
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        int k = utf8_next(raw + i, n - i);
        if (k > 0) {
            memcpy(out + w, raw + i, (size_t)k);
            w += (size_t)k;
            i += (size_t)k;
        } else {
            memcpy(out + w, "\xEF\xBF\xBD", 3);
            w += 3;
            i += (size_t)-k;
        }
    }
    out[w] = 0;
    *text = out;
    if (len)
        *len = w;
    return ER_OK;
}

size_t tok_utf8_complete(const char *bytes, size_t n) {
    const unsigned char *raw = (const unsigned char *)bytes;
    size_t i = 0;
    while (i < n) {
        int k = utf8_next(raw + i, n - i);
        // Ill-formed only because the buffer ends: a valid lead byte whose failure reaches the end.
        if (k < 0 && raw[i] >= 0xC2 && raw[i] <= 0xF4 && (size_t)-k == n - i)
            return i;
        i += (size_t)(k > 0 ? k : -k);
    }
    return n;
}

int tok_decode(const Tokenizer *tok, const int *ids, int n, char **text, size_t *len) {
    *text = NULL;
    if (len)
        *len = 0;
    if (!tok || n < 0 || (!ids && n))
        return er_error(ER_EINVAL, "tok_decode: no tokenizer or no ids");
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= tok->n_ids || tok->dec_len[id] == UINT32_MAX)
            return er_error(ER_ERANGE, "tok_decode: id %d (position %d) is not a token (vocabulary of %d ids)", id, i,
                            tok->n_ids);
        total += tok->dec_len[id];
    }
    char *raw = er_alloc(total + 1);
    if (!raw)
        return ER_ENOMEM;
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        memcpy(raw + o, tok->dec + tok->dec_off[ids[i]], tok->dec_len[ids[i]]);
        o += tok->dec_len[ids[i]];
    }
    int rc = tok_text_from_bytes(raw, total, text, len);
    er_free(raw);
    return rc;
}

const char *tok_token_bytes(const Tokenizer *tok, int id, size_t *len) {
    if (!tok || id < 0 || id >= tok->n_ids || tok->dec_len[id] == UINT32_MAX)
        return NULL;
    if (len)
        *len = tok->dec_len[id];
    return tok->dec + tok->dec_off[id];
}

int tok_template(const Tokenizer *tok, const int **pre, int *n_pre, const int **post) {
    *pre = tok->tmpl_pre;
    *n_pre = tok->n_tmpl_pre;
    *post = tok->tmpl_post;
    return tok->n_tmpl_post;
}

int tok_vocab_size(const Tokenizer *tok) { return tok ? tok->n_ids : 0; }

int tok_token_id(const Tokenizer *tok, const char *name) {
    if (!tok || !name)
        return -1;
    size_t n = strlen(name);
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == n && memcmp(tok->added[i].content, name, n) == 0)
            return tok->added[i].id;
    return vocab_find(tok, name, n);
}

const char *tok_token_str(const Tokenizer *tok, int id) {
    if (!tok || id < 0 || id >= tok->n_ids)
        return NULL;
    for (int i = 0; i < tok->n_added; i++)
        if (tok->added[i].id == id)
            return tok->added[i].content;
    return tok->str_len[id] == UINT32_MAX ? NULL : tok->strs + tok->str_off[id];
}

int tok_is_special(const Tokenizer *tok, int id) {
    return tok && id >= 0 && id < tok->n_ids && tok->special[id];
}

int tok_eos_id(const Tokenizer *tok) { return tok ? tok->eos_id : -1; }
int tok_pad_id(const Tokenizer *tok) { return tok ? tok->pad_id : -1; }
int tok_bos_id(const Tokenizer *tok) { return tok ? tok->bos_id : -1; }

int tok_eos_ids(const Tokenizer *tok, const int **ids) {
    *ids = tok ? tok->eos_ids : NULL;
    return tok ? tok->n_eos : 0;
}

int tok_is_eos(const Tokenizer *tok, int id) {
    for (int i = 0; tok && i < tok->n_eos; i++)
        if (tok->eos_ids[i] == id)
            return 1;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// GGUF (llama.cpp): tokenizer.ggml.* arrays <-> the tables above

// llama.cpp's token types (llama_token_type / gguf-py TokenType).
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

// What llama.cpp's "qwen2" pre-tokenizer and gpt2 BPE do, as tokenizer.json parts.
static const char GGUF_QWEN2_PARTS[] =
    "{\"normalizer\": {\"type\": \"NFC\"}, \"decoder\": {\"type\": \"ByteLevel\"}, \"pre_tokenizer\": "
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"behavior\": \"Isolated\", \"pattern\": "
    "{\"Regex\": \"\"}}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}}";

// The tokens as model.vocab (normal, unknown and byte tokens) and added_tokens (control: special; user
// defined: not special); unused ids (llama.cpp's "[PAD<id>]" fillers) are left out.
static int gguf_tokens(const GgufFile *f, cJSON *root, cJSON *vocab) {
    const GgufKV *tokens, *types = NULL;
    ER_TRY(gguf_get_array(f, "tokenizer.ggml.tokens", GGUF_STRING, -1, &tokens));
    if (tokens->n > TOK_MAX_ID)
        return er_error(ER_EFORMAT, "%s: tokenizer.ggml.tokens holds %llu tokens (at most %d)", f->path,
                        (unsigned long long)tokens->n, TOK_MAX_ID);
    if (gguf_find(f, "tokenizer.ggml.token_type"))
        ER_TRY(gguf_get_array(f, "tokenizer.ggml.token_type", GGUF_I32, (int64_t)tokens->n, &types));
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    if (!added)
        return ER_ENOMEM;
    for (uint64_t i = 0; i < tokens->n; i++) {
        int64_t type = types ? gguf_array_int(types, i) : TT_NORMAL;
        if (type == TT_UNUSED)
            continue;
        if (type < TT_NORMAL || type > TT_BYTE)
            return er_error(ER_EFORMAT, "%s: tokenizer.ggml.token_type[%llu] is %lld (expected 1 to 6)", f->path,
                            (unsigned long long)i, (long long)type);
        if (type != TT_CONTROL && type != TT_USER_DEFINED) {
            if (!cJSON_AddNumberToObject(vocab, tokens->strs[i], (double)i))
                return ER_ENOMEM;
            continue;
        }
        cJSON *a = cJSON_CreateObject();
        if (!a || !cJSON_AddItemToArray(added, a) || !cJSON_AddNumberToObject(a, "id", (double)i) ||
            !cJSON_AddStringToObject(a, "content", tokens->strs[i]) || !cJSON_AddFalseToObject(a, "normalized") ||
            !cJSON_AddBoolToObject(a, "special", type == TT_CONTROL))
            return ER_ENOMEM;
    }
    return ER_OK;
}

// The special ids (checked against the vocabulary by gguf_ids once it is loaded).
static int gguf_special(Tokenizer *t, const GgufFile *f) {
    const char *keys[4] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                           "tokenizer.ggml.padding_token_id", "tokenizer.ggml.bos_token_id"};
    int64_t id[4] = {-1, -1, -1, -1};
    for (int k = 0; k < 4; k++)
        ER_TRY(gguf_get_int(f, keys[k], 1, 0, TOK_MAX_ID, &id[k]));
    t->eos_id = (int)id[0];
    t->pad_id = (int)id[2];
    t->bos_id = (int)id[3];
    for (int k = 0; k < 2; k++)
        if (id[k] >= 0)
            ER_TRY(add_eos(t, (int)id[k]));
    return ER_OK;
}

// A tokenizer.json document built from the GGUF file f (model "gpt2", pre-tokenizer "qwen2").
static int gguf_doc(Tokenizer *t, const GgufFile *f, cJSON **out) {
    cJSON *root = NULL;
    const char *model = NULL, *pre = NULL;
    const GgufKV *merges;
    int rc = ER_OK;
    ER_CHECK(gguf_get_str(f, "tokenizer.ggml.model", 0, &model));
    if (strcmp(model, "gpt2") != 0)
        ER_CHECK(er_error(ER_EUNSUPPORTED, "%s: tokenizer.ggml.model is \"%.40s\" (supported: gpt2, byte-level BPE)",
                          f->path, model));
    ER_CHECK(gguf_get_str(f, "tokenizer.ggml.pre", 0, &pre));
    if (strcmp(pre, "qwen2") != 0)
        ER_CHECK(er_error(ER_EUNSUPPORTED, "%s: tokenizer.ggml.pre is \"%.40s\" (supported: qwen2)", f->path, pre));
    ER_CHECK(gguf_get_array(f, "tokenizer.ggml.merges", GGUF_STRING, -1, &merges));
    cJSON *m, *vocab, *list, *pattern;
    if (!(root = cJSON_Parse(GGUF_QWEN2_PARTS)) || !(m = cJSON_AddObjectToObject(root, "model")) ||
        !cJSON_AddStringToObject(m, "type", "BPE") || !(vocab = cJSON_AddObjectToObject(m, "vocab")) ||
        !(list = cJSON_AddArrayToObject(m, "merges")))
        ER_CHECK(ER_ENOMEM);
    pattern = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "pre_tokenizer"),
                                                                         "pretokenizers"), 0), "pattern");
    if (!cJSON_ReplaceItemInObject(pattern, "Regex", cJSON_CreateString(QWEN2_PATTERN)))
        ER_CHECK(ER_ENOMEM);
    for (uint64_t i = 0; i < merges->n; i++)
        if (!cJSON_AddItemToArray(list, cJSON_CreateString(merges->strs[i])))
            ER_CHECK(ER_ENOMEM);
    ER_CHECK(gguf_tokens(f, root, vocab));
    ER_CHECK(gguf_special(t, f));
    *out = root;
    root = NULL;
done:
    cJSON_Delete(root);
    return rc;
}

static int gguf_ids(Tokenizer *t) {
    const int ids[3] = {t->eos_id, t->pad_id, t->bos_id};
    for (int k = 0; k < 3; k++)
        if (ids[k] >= t->n_ids)
            return er_error(ER_EFORMAT, "%s: special token id %d is outside the %d tokens", t->path, ids[k], t->n_ids);
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] >= t->n_ids)
            return er_error(ER_EFORMAT, "%s: end token id %d is outside the %d tokens", t->path, t->eos_ids[i],
                            t->n_ids);
    return ER_OK;
}

static int cmp_rank(const void *a, const void *b) {
    uint32_t x = ((const MergeSlot *)a)->rank, y = ((const MergeSlot *)b)->rank;
    return (x > y) - (x < y);
}

// The merges in rank order as "left right" strings into w.
static int gguf_put_merges(const Tokenizer *t, GgufWriter *w) {
    size_t cap = (size_t)t->merge_mask + 1, n = 0, bytes = 0;
    MergeSlot *m = er_alloc(cap * sizeof *m);
    if (!m)
        return ER_ENOMEM;
    for (size_t i = 0; i < cap; i++)
        if (t->merges[i].key != UINT64_MAX) {
            m[n++] = t->merges[i];
            bytes += t->str_len[m[n - 1].key >> 32] + t->str_len[(uint32_t)m[n - 1].key] + 2;
        }
    qsort(m, n, sizeof *m, cmp_rank);
    char *text = er_alloc(bytes + 1), *p = text;
    const char **strs = er_alloc((n ? n : 1) * sizeof *strs);
    int rc = text && strs ? ER_OK : ER_ENOMEM;
    for (size_t i = 0; rc == ER_OK && i < n; i++) {
        strs[i] = p;
        p += sprintf(p, "%s %s", t->strs + t->str_off[m[i].key >> 32], t->strs + t->str_off[(uint32_t)m[i].key]) + 1;
    }
    if (rc == ER_OK)
        rc = gguf_set_str_array(w, "tokenizer.ggml.merges", strs, n);
    er_free(m);
    er_free(text);
    er_free(strs);
    return rc;
}

int tok_gguf_put(const Tokenizer *t, int n_vocab, GgufWriter *w) {
    if (!t->qwen2_split || t->n_stages != 1)
        return er_error(ER_EUNSUPPORTED, "%s: the pre-tokenizer is not Qwen2's split regex; llama.cpp's \"qwen2\" "
                        "pre-tokenizer would split text differently", t->path);
    if (n_vocab < t->n_ids)
        return er_error(ER_EINVAL, "%s: the tokenizer has %d ids but the model only %d", t->path, t->n_ids, n_vocab);
    const char **strs = er_calloc((size_t)n_vocab, sizeof *strs);
    int32_t *types = er_alloc((size_t)n_vocab * sizeof *types);
    char *pads = er_alloc((size_t)n_vocab * 20);
    int rc = ER_OK;
    if (!strs || !types || !pads)
        ER_CHECK(ER_ENOMEM);
    for (int id = 0; id < n_vocab; id++) {
        int has = id < t->n_ids && t->str_len[id] != UINT32_MAX;
        types[id] = has ? TT_NORMAL : TT_UNUSED;
        strs[id] = has ? t->strs + t->str_off[id] : pads + (size_t)id * 20;
        if (!has) // what llama.cpp's converter writes for ids without a token
            snprintf(pads + (size_t)id * 20, 20, "[PAD%d]", id);
    }
    for (int i = 0; i < t->n_added; i++) {
        strs[t->added[i].id] = t->added[i].content;
        types[t->added[i].id] = t->added[i].special ? TT_CONTROL : TT_USER_DEFINED;
    }
    ER_CHECK(gguf_set_str(w, "tokenizer.ggml.model", "gpt2"));
    ER_CHECK(gguf_set_str(w, "tokenizer.ggml.pre", "qwen2"));
    ER_CHECK(gguf_set_str_array(w, "tokenizer.ggml.tokens", strs, (size_t)n_vocab));
    ER_CHECK(gguf_set_i32_array(w, "tokenizer.ggml.token_type", types, (size_t)n_vocab));
    ER_CHECK(gguf_put_merges(t, w));
    const char *keys[3] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
                           "tokenizer.ggml.bos_token_id"};
    const int ids[3] = {t->eos_id, t->pad_id, t->bos_id};
    for (int k = 0; k < 3; k++)
        if (ids[k] >= 0)
            ER_CHECK(gguf_set_u32(w, keys[k], (uint32_t)ids[k]));
    ER_CHECK(gguf_set_bool(w, "tokenizer.ggml.add_bos_token", 0)); // encoding never adds special tokens here
done:
    er_free(strs);
    er_free(types);
    er_free(pads);
    return rc;
}

// tokenizer_config.json of a GGUF's tokenizer: the special tokens by content, and the chat template.
static int gguf_write_config(const Tokenizer *t, const char *dir) {
    GgufFile f;
    const char *tmpl = NULL;
    char *path = path_join(dir, "tokenizer_config.json");
    cJSON *cfg = cJSON_CreateObject();
    int rc = ER_OK;
    if (!path || !cfg)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(gguf_open(&f, t->path));
    rc = gguf_get_str(&f, "tokenizer.chat_template", 1, &tmpl);
    if (rc == ER_OK && tmpl && !cJSON_AddStringToObject(cfg, "chat_template", tmpl))
        rc = ER_ENOMEM;
    gguf_close(&f);
    ER_CHECK(rc);
    const char *keys[3] = {"eos_token", "pad_token", "bos_token"};
    const int ids[3] = {t->eos_id, t->pad_id, t->bos_id};
    for (int k = 0; k < 3; k++)
        if (ids[k] >= 0 && !cJSON_AddStringToObject(cfg, keys[k], tok_token_str(t, ids[k])))
            ER_CHECK(ER_ENOMEM);
    ER_CHECK(json_write_file(path, cfg));
done:
    cJSON_Delete(cfg);
    free(path);
    return rc;
}

int tok_gguf_write_json(const char *gguf, const char *dir) {
    Tokenizer *t = NULL, doc_t = {0};
    cJSON *doc = NULL;
    GgufFile f = {0};
    char *path = path_join(dir, "tokenizer.json");
    int rc = path ? ER_OK : ER_ENOMEM;
    ER_CHECK(rc);
    ER_CHECK(tok_load(&t, gguf)); // the whole file checked first
    doc_t.path = t->path;
    ER_CHECK(gguf_open(&f, gguf));
    ER_CHECK(gguf_doc(&doc_t, &f, &doc));
    ER_CHECK(json_write_file(path, doc));
    ER_CHECK(gguf_write_config(t, dir));
done:
    gguf_close(&f);
    free(doc_t.eos_ids);
    cJSON_Delete(doc);
    tok_free(t);
    free(path);
    return rc;
}
