// GGUF without llama.cpp: export -> import -> export is byte-identical, an HF dir and its GGUF give the same
// logits, q4_0 / q8_0 import exactly, the tokenizer from a GGUF is the tokenizer.json one on the Qwen corpus,
// quantized dirs export to q4_0 exactly or are refused, erinfer runs a .gguf, and malformed files get one
// clear error each.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "lora/peft.h"
#include "model/gguf_model.h"
#include "quant/quant.h"
#include "tests/common/gguf_helpers.h"
#include "train/gguf_export.h"

static char *tmp;
static void setup(void) { tmp = helper_tmpdir("er_gguf"); }
static void teardown(void) {
    helper_rmdir(tmp);
    er_free(tmp);
}
TestSuite(gguf, .init = setup, .fini = teardown, .timeout = 300);

static char *tmp_path(const char *name) {
    char *p = path_join(tmp, name);
    cr_assert(p);
    return p;
}

static void expect_same_file(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    cr_assert_eq(file_read_all(a, 1u << 30, &x, &nx), ER_OK, "%s", er_last_error());
    cr_assert_eq(file_read_all(b, 1u << 30, &y, &ny), ER_OK, "%s", er_last_error());
    cr_expect(nx == ny && memcmp(x, y, nx) == 0, "%s (%zu bytes) and %s (%zu bytes) differ", a, nx, b, ny);
    er_free(x);
    er_free(y);
}

// Export -> import -> export gives the same bytes, for every type, qwen2 (tiny base), llama and qwen3.
Test(gguf, round_trip_is_byte_identical) {
    char *llama = tmp_path("llama"), *qwen3 = tmp_path("qwen3");
    gguf_make_arch_dir(llama, ARCH_LLAMA);
    gguf_make_arch_dir(qwen3, ARCH_QWEN3);
    const char *dirs[3] = {GGUF_TINY_BASE, llama, qwen3};
    const char *types[5] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
    for (int d = 0; d < 3; d++)
        for (int t = 0; t < 5; t++) {
            char a[512], b[512];
            snprintf(a, sizeof a, "%s/a-%d-%s.gguf", tmp, d, types[t]);
            snprintf(b, sizeof b, "%s/b-%d-%s.gguf", tmp, d, types[t]);
            cr_assert_eq(gguf_export_model(dirs[d], a, types[t], NULL), ER_OK, "%s", er_last_error());
            cr_assert_eq(gguf_export_model(a, b, types[t], NULL), ER_OK, "%s", er_last_error());
            expect_same_file(a, b);
        }
    er_free(llama);
    er_free(qwen3);
}

// HF dir -> GGUF -> our forward: the same logits (f32: bit for bit), and the chat template travels.
Test(gguf, dir_and_gguf_give_the_same_logits) {
    char *llama = tmp_path("llama"), *qwen3 = tmp_path("qwen3"), *g = tmp_path("m.gguf");
    gguf_make_arch_dir(llama, ARCH_LLAMA);
    gguf_make_arch_dir(qwen3, ARCH_QWEN3);
    const char *dirs[3] = {GGUF_TINY_BASE, llama, qwen3};
    int ids[24];
    for (int i = 0; i < 24; i++)
        ids[i] = (i * 37 + 5) % 500;
    for (int d = 0; d < 3; d++) {
        cr_assert_eq(gguf_export_model(dirs[d], g, NULL, NULL), ER_OK, "%s", er_last_error());
        Model a, b;
        cr_assert_eq(model_load(&a, dirs[d], 0), ER_OK, "%s", er_last_error());
        cr_assert_eq(model_load(&b, g, 0), ER_OK, "%s", er_last_error());
        cr_assert_eq(memcmp(&a.cfg, &b.cfg, offsetof(ModelConfig, dtype)), 0, "%s: the config changed", dirs[d]);
        float *la = helper_forward_logits(&a, ids, 1, 24), *lb = helper_forward_logits(&b, ids, 1, 24);
        double err = helper_rel_err(lb, la, (size_t)24 * a.cfg.V);
        cr_expect_leq(err, 1e-6, "%s: logits through the GGUF differ by %.2e", dirs[d], err);
        free(la);
        free(lb);
        model_free(&a);
        model_free(&b);
    }
    ChatStyle s1, s2;
    cr_assert_eq(gguf_export_model(GGUF_TINY_BASE, g, NULL, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(chat_style_from_config(GGUF_TINY_BASE, &s1), ER_OK, "%s", er_last_error());
    cr_assert_eq(chat_style_from_config(g, &s2), ER_OK, "%s", er_last_error());
    cr_expect_eq(s1, s2);
    er_free(llama);
    er_free(qwen3);
    er_free(g);
}

// A GGUF parsed from bytes at an address misaligned for its float types (a buffer, an fd range at an odd offset):
// every matrix the model reads in place is aligned for its type (the misaligned ones copied), with the values of
// the file loaded from its path.
Test(gguf, misaligned_bytes_give_aligned_weights) {
    const char *types[2] = {"f32", "f16"};
    for (int ty = 0; ty < 2; ty++) {
        char *g = tmp_path(ty ? "f16.gguf" : "f32.gguf");
        cr_assert_eq(gguf_export_model(GGUF_TINY_BASE, g, types[ty], NULL), ER_OK, "%s", er_last_error());
        Model ref;
        cr_assert_eq(model_load(&ref, g, 0), ER_OK, "%s", er_last_error());
        char *all;
        size_t n;
        cr_assert_eq(file_read_all(g, 64u << 20, &all, &n), ER_OK, "%s", er_last_error());
        for (size_t off = 1; off < 4; off++) {
            unsigned char *buf = malloc(n + off);
            memcpy(buf + off, all, n);
            ByteRange r;
            cr_assert_eq(bytes_from_buffer(&r, buf + off, n, "<buffer>", 1), ER_OK);
            GgufFile *f = er_calloc(1, sizeof *f);
            cr_assert_eq(gguf_open_bytes(f, &r), ER_OK, "%s", er_last_error());
            Model m;
            cr_assert_eq(model_load_gguf_file(&m, f, 0), ER_OK, "%s", er_last_error());
            float *a = malloc((size_t)m.cfg.C * sizeof(float)), *b = malloc((size_t)m.cfg.C * sizeof(float));
            for (int i = 0; i < m.n_params; i++) {
                const Weight *w = m.params[i].w;
                if (!w)
                    continue;
                size_t esz = w->fmt == WF_F32 ? 4 : 2;
                cr_assert_eq((uintptr_t)w->data % esz, 0, "%s at offset %zu: \"%s\" is read in place misaligned",
                             types[ty], off, m.params[i].name);
                for (int row = 0; row < w->rows && w->cols == m.cfg.C; row += 37) {
                    weight_row_f32(a, w, row);
                    weight_row_f32(b, ref.params[i].w, row);
                    cr_assert_eq(memcmp(a, b, (size_t)w->cols * sizeof(float)), 0, "\"%s\" row %d differs",
                                 m.params[i].name, row);
                }
            }
            free(a);
            free(b);
            model_free(&m);
            free(buf);
        }
        er_free(all);
        model_free(&ref);
        er_free(g);
    }
}

// q4_0 and q8_0 import as themselves, in place, rows exactly the blocks' (u - 8) d and q d.
Test(gguf, quantized_import_is_exact) {
    char *g4 = tmp_path("q4.gguf"), *g8 = tmp_path("q8.gguf");
    cr_assert_eq(gguf_export_model(GGUF_TINY_BASE, g4, "q4_0", NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_export_model(GGUF_TINY_BASE, g8, "q8_0", NULL), ER_OK, "%s", er_last_error());
    const char *paths[2] = {g4, g8};
    for (int k = 0; k < 2; k++) {
        Model m;
        GgufFile f;
        cr_assert_eq(model_load(&m, paths[k], 0), ER_OK, "%s", er_last_error());
        cr_assert_eq(gguf_open(&f, paths[k]), ER_OK, "%s", er_last_error());
        const GgufTensor *t = gguf_find_tensor(&f, "blk.1.ffn_down.weight");
        const Weight *w = &m.layers[1].wdown;
        cr_assert(t);
        cr_expect_eq(w->fmt, k == 0 ? WF_Q4_0 : WF_Q8_0);
        cr_expect(!w->owned, "%s: rows were copied, not used in place from the file", paths[k]);
        float row[384];
        size_t bad = 0;
        for (int r = 0; r < w->rows; r++) {
            weight_row_f32(row, w, r);
            const uint8_t *blk = (const uint8_t *)t->data + (size_t)r * (w->cols / 32) * (k == 0 ? 18 : 34);
            for (int b = 0; b < w->cols / 32; b++, blk += k == 0 ? 18 : 34) {
                uint16_t h;
                memcpy(&h, blk, 2);
                float d = f16_to_f32(h);
                for (int j = 0; j < 32; j++) {
                    float want = k == 0 ? (float)(((blk[2 + j % 16] >> (j < 16 ? 0 : 4)) & 15) - 8) * d
                                        : (float)(int8_t)blk[2 + j] * d;
                    bad += row[b * 32 + j] != want;
                }
            }
        }
        cr_expect_eq(bad, 0, "%s: %zu weights differ from the blocks", paths[k], bad);
        gguf_close(&f);
        model_free(&m);
    }
    er_free(g4);
    er_free(g8);
}

// w (q4_0) as a q4g32 weight of the same values: scale d, zero -8 d (exact in fp16), the codes repacked.
static void q4_0_as_q4g32(Weight *q, const Weight *w) {
    int ng = w->cols / 32;
    uint8_t *codes = malloc((size_t)w->cols);
    cr_assert_eq(quant_weight_alloc(q, WF_Q4G, w->rows, w->cols, 32, 0), ER_OK, "%s", er_last_error());
    for (int r = 0; r < w->rows; r++) {
        const uint8_t *blk = (const uint8_t *)w->data + (size_t)r * weight_row_bytes(WF_Q4_0, w->cols);
        for (int b = 0; b < ng; b++, blk += 18) {
            uint16_t d;
            memcpy(&d, blk, 2);
            ((uint16_t *)q->gscale)[(size_t)r * ng + b] = d;
            ((uint16_t *)q->gzero)[(size_t)r * ng + b] = f32_to_f16(-8.0f * f16_to_f32(d));
            for (int j = 0; j < 16; j++) {
                codes[32 * b + j] = blk[2 + j] & 15;
                codes[32 * b + j + 16] = blk[2 + j] >> 4;
            }
        }
        quant_pack4((uint8_t *)q->data + (size_t)r * weight_row_bytes(WF_Q4G, w->cols), codes, w->cols);
    }
    free(codes);
}

// A model of ours in q4g32 whose zeros are all -8 x scale (q4_0's blocks) exports to q4_0 by default, each block
// its scale and codes (a q4_0 file's matrices made q4g32 write that file's tensors again); loaded back as q4_0,
// every row has the q4g32 row's values.
Test(gguf, q4_0_shaped_q4g32_exports_as_q4_0) {
    char *g = tmp_path("q4_0.gguf"), *g2 = tmp_path("q4g32.gguf");
    cr_assert_eq(gguf_export_model(GGUF_TINY_BASE, g, "q4_0", NULL), ER_OK, "%s", er_last_error());
    Model m, b;
    cr_assert_eq(model_load(&m, g, 0), ER_OK, "%s", er_last_error());
    int mats = 0;
    for (int i = 0; i < m.n_params; i++) {
        Weight *w = m.params[i].w, q;
        if (!w)
            continue;
        cr_assert_eq(w->fmt, WF_Q4_0, "%s is %s", m.params[i].name, weight_format_name(w->fmt));
        q4_0_as_q4g32(&q, w);
        weight_free(w);
        *w = q;
        mats++;
    }
    uint32_t type;
    cr_assert_eq(model_gguf_default_type(&m, &type), ER_OK, "%s", er_last_error());
    cr_expect_eq(type, GGML_Q4_0, "the default export type of a q4_0-shaped q4g32 model is %u", type);
    GgufWriter wr = {0};
    cr_assert_eq(model_gguf_put(&m, type, &wr, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_write(&wr, g2), ER_OK, "%s", er_last_error());
    gguf_writer_free(&wr);
    GgufFile fa, fb;
    cr_assert_eq(gguf_open(&fa, g), ER_OK, "%s", er_last_error());
    cr_assert_eq(gguf_open(&fb, g2), ER_OK, "%s", er_last_error());
    cr_expect_eq(fb.n_tensors, fa.n_tensors);
    for (int i = 0; i < fa.n_tensors; i++) {
        const GgufTensor *ta = &fa.tensors[i], *tb = gguf_find_tensor(&fb, ta->name);
        cr_expect(tb && tb->type == ta->type && tb->nbytes == ta->nbytes && !memcmp(tb->data, ta->data, ta->nbytes),
                  "%s: tensor %s is not the q4_0 file's", g2, ta->name);
    }
    gguf_close(&fa);
    gguf_close(&fb);
    cr_assert_eq(model_load(&b, g2, 0), ER_OK, "%s", er_last_error());
    size_t bad = 0;
    for (int i = 0; i < m.n_params; i++) {
        const Weight *w = m.params[i].w, *v = b.params[i].w;
        if (!w)
            continue;
        cr_assert(v && v->fmt == WF_Q4_0, "%s", b.params[i].name);
        float *x = malloc(sizeof(float) * (size_t)w->cols), *y = malloc(sizeof(float) * (size_t)w->cols);
        for (int r = 0; r < w->rows; r++) {
            weight_row_f32(x, w, r);
            weight_row_f32(y, v, r);
            for (int k = 0; k < w->cols; k++)
                bad += x[k] != y[k]; // by value: q4_0's 0 * d is -0 where d < 0, q4g32's 8 d - 8 d is +0
        }
        free(x);
        free(y);
    }
    cr_expect_eq(bad, 0, "%zu values of the %d matrices differ from the q4g32 rows", bad, mats);
    model_free(&b);
    model_free(&m);
    er_free(g);
    er_free(g2);
}

// The tokenizer rebuilt from a GGUF's tokenizer.ggml.* arrays encodes the Qwen corpus (Hugging Face's ids)
// exactly as tokenizer.json does, and keeps the special ids; so does the tokenizer.json written from it (what
// ertrain quantize / merge / sft put beside a model dir made from a GGUF base).
Test(gguf, tokenizer_from_gguf_matches_tokenizer_json) {
    char *dir = tmp_path("qwen"), *g = tmp_path("q.gguf");
    gguf_make_qwen_dir(dir, ARCH_QWEN2);
    cr_assert_eq(gguf_export_model(dir, g, "q4_0", NULL), ER_OK, "%s", er_last_error());
    Tokenizer *a, *b, *c, *toks[2];
    char *out = tmp_path("json");
    cr_assert_eq(dir_make(out), ER_OK);
    cr_assert_eq(tok_gguf_write_json(g, out), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_load(&a, dir), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_load(&b, g), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_load(&c, out), ER_OK, "%s", er_last_error());
    toks[0] = b, toks[1] = c;
    cr_expect_eq(tok_eos_id(c), tok_eos_id(a));
    cr_expect_eq(tok_pad_id(c), tok_pad_id(a));
    cr_expect_eq(tok_vocab_size(a), tok_vocab_size(b));
    cr_expect_eq(tok_eos_id(a), tok_eos_id(b));
    cr_expect_eq(tok_pad_id(a), tok_pad_id(b));
    cr_expect_eq(tok_bos_id(a), tok_bos_id(b));
    char *buf;
    size_t len;
    cr_assert_eq(file_read_all("tests/data/golden/qwen_tokenizer.jsonl", 16u << 20, &buf, &len), ER_OK, "%s",
                 er_last_error());
    int n = 0, bad = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"), n++) {
        cJSON *rec = cJSON_Parse(line);
        const char *t = cJSON_GetObjectItem(rec, "text")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(rec, "ids");
        for (int j = 0; j < 2; j++) {
            int *ids, nid;
            cr_assert_eq(tok_encode(toks[j], t, strlen(t), &ids, &nid), ER_OK, "%s", er_last_error());
            int eq = nid == cJSON_GetArraySize(want);
            for (int k = 0; eq && k < nid; k++)
                eq = cJSON_GetArrayItem(want, k)->valueint == ids[k];
            bad += !eq;
            er_free(ids);
        }
        cJSON_Delete(rec);
    }
    cr_expect_eq(bad, 0, "%d of 2 x %d corpus texts tokenize differently from the GGUF", bad, n);
    cr_expect_gt(n, 2000);
    er_free(buf);
    tok_free(a);
    tok_free(b);
    tok_free(c);
    er_free(out);
    er_free(dir);
    er_free(g);
}

// Quantized dirs of ours: q4g32 exports to q4_0 by default only when its zeros are -8 x scale; otherwise the
// default is refused with one line and an explicit --type requantizes, saying so.
Test(gguf, quantized_dirs_export_exactly_or_say_so) {
    char *prog = helper_program("ertrain");
    helper_need_program(prog, "ertrain", "the quantized-dir export tests");
    CmdResult r = helper_run(tmp, "%s quantize --model %s --out %s/q8 --weights q8 --embeddings fp", prog,
                             GGUF_TINY_BASE, tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    helper_result_free(&r);
    r = helper_run(tmp, "%s export gguf --model %s/q8 --out %s/q8.gguf", prog, tmp, tmp);
    helper_expect_error(&r, "export of a q8 dir without --type", "no GGUF type holds exactly");
    r = helper_run(tmp, "%s export gguf --model %s/q8 --out %s/q8.gguf --type q8_0", prog, tmp, tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.out, "requantized to q8_0"), "no requantization note in: %s", r.out);
    helper_result_free(&r);
    // A q4_0 GGUF imports as q4_0, which exports back as q4_0 by default (bytes kept).
    r = helper_run(tmp, "(%s export gguf --model %s --out %s/a.gguf --type q4_0 && %s export gguf --model %s/a.gguf "
                   "--out %s/b.gguf)", prog, GGUF_TINY_BASE, tmp, prog, tmp, tmp);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_expect(!strstr(r.out, "requantized"), "%s", r.out);
    helper_result_free(&r);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/a.gguf", tmp);
    snprintf(b, sizeof b, "%s/b.gguf", tmp);
    expect_same_file(a, b);
    er_free(prog);
}

// erinfer takes a .gguf wherever it takes a model dir: greedy generation, with and without a (masked) adapter,
// gives the dir's text.
Test(gguf, erinfer_generates_from_a_gguf) {
    char *prog = helper_program("erinfer");
    helper_need_program(prog, "erinfer", "the erinfer GGUF test");
    char *g = tmp_path("tiny.gguf"), *ad = tmp_path("adapter");
    cr_assert_eq(gguf_export_model(GGUF_TINY_BASE, g, "f32", NULL), ER_OK, "%s", er_last_error());
    Model m;
    LoraAdapter a;
    cr_assert_eq(model_load(&m, GGUF_TINY_BASE, 0), ER_OK, "%s", er_last_error());
    helper_random_adapter(&a, &m.cfg, 0.05f, 3);
    a.masked = 1;
    cr_assert_eq(peft_save(&a, ad), ER_OK, "%s", er_last_error());
    const char *models[2] = {GGUF_TINY_BASE, g};
    for (int with = 0; with < 2; with++) {
        CmdResult r[2];
        for (int k = 0; k < 2; k++) {
            r[k] = helper_run(tmp, "%s generate --model %s --prompt 'x = 3. y = x + 4. What is y?' --max-new 24 "
                              "--threads 1 %s %s", prog, models[k], with ? "--adapter" : "", with ? ad : "");
            cr_assert_eq(r[k].status, 0, "%s", r[k].err);
        }
        cr_expect(strlen(r[0].out) > 0);
        cr_expect_str_eq(r[1].out, r[0].out);
        helper_result_free(&r[0]);
        helper_result_free(&r[1]);
    }
    lora_free(&a);
    model_free(&m);
    er_free(g);
    er_free(ad);
    er_free(prog);
}

// ---- malformed files ----

typedef struct {
    uint8_t b[1024];
    size_t n;
} Bytes;

static void put(Bytes *x, const void *p, size_t n) {
    cr_assert(x->n + n <= sizeof x->b);
    memcpy(x->b + x->n, p, n);
    x->n += n;
}
static void put_u32(Bytes *x, uint32_t v) { put(x, &v, 4); }
static void put_u64(Bytes *x, uint64_t v) { put(x, &v, 8); }
static void put_str(Bytes *x, const char *s) {
    put_u64(x, strlen(s));
    put(x, s, strlen(s));
}

// A header: magic, version, counts.
static void put_head(Bytes *x, uint64_t nt, uint64_t nkv) {
    put(x, "GGUF", 4);
    put_u32(x, 3);
    put_u64(x, nt);
    put_u64(x, nkv);
}

// One f32 tensor {32} at `offset`, data padded to the alignment after the header.
static void put_tensor(Bytes *x, const char *name, uint32_t type, uint64_t ne0, uint64_t offset) {
    put_str(x, name);
    put_u32(x, 1);
    put_u64(x, ne0);
    put_u32(x, type);
    put_u64(x, offset);
}

static void put_data(Bytes *x, size_t n) {
    static const uint8_t zeros[512];
    while (x->n % 32)
        put(x, zeros, 1);
    put(x, zeros, n);
}

// gguf_open refuses x with one line naming the file and mentioning needle.
static void expect_refused(const Bytes *x, const char *needle) {
    char *p = tmp_path("bad.gguf");
    cr_assert_eq(file_write_atomic(p, x->b, x->n), ER_OK);
    GgufFile f;
    int rc = gguf_open(&f, p);
    cr_expect_lt(rc, 0, "a file that should hold \"%s\" was accepted", needle);
    cr_expect(strstr(er_last_error(), p) && strstr(er_last_error(), needle) && !strchr(er_last_error(), '\n'),
              "message \"%s\" does not name the file and \"%s\"", er_last_error(), needle);
    er_free(p);
}

Test(gguf, valid_small_file_opens) {
    Bytes x = {0};
    put_head(&x, 1, 2);
    put_str(&x, "general.architecture");
    put_u32(&x, GGUF_STRING);
    put_str(&x, "qwen2");
    put_str(&x, "a.list");
    put_u32(&x, GGUF_ARRAY);
    put_u32(&x, GGUF_I32);
    put_u64(&x, 2);
    put_u32(&x, 7);
    put_u32(&x, 9);
    put_tensor(&x, "t", GGML_F32, 32, 0);
    put_data(&x, 128);
    char *p = tmp_path("ok.gguf");
    cr_assert_eq(file_write_atomic(p, x.b, x.n), ER_OK);
    GgufFile f;
    cr_assert_eq(gguf_open(&f, p), ER_OK, "%s", er_last_error());
    const char *arch = NULL;
    const GgufKV *list;
    cr_assert_eq(gguf_get_str(&f, "general.architecture", 0, &arch), ER_OK);
    cr_expect_str_eq(arch, "qwen2");
    cr_assert_eq(gguf_get_array(&f, "a.list", GGUF_I32, 2, &list), ER_OK, "%s", er_last_error());
    cr_expect_eq(gguf_array_int(list, 1), 9);
    cr_expect_eq(f.tensors[0].nbytes, 128);
    gguf_close(&f);
    // Every truncation of it is refused, without a crash.
    for (size_t n = 0; n < x.n; n++) {
        cr_assert_eq(file_write_atomic(p, x.b, n), ER_OK);
        cr_expect_lt(gguf_open(&f, p), 0, "the file cut at %zu bytes was accepted", n);
    }
    er_free(p);
}

Test(gguf, lying_headers_are_refused) {
    Bytes x = {0};
    put(&x, "GGUG", 4), put_u32(&x, 3), put_u64(&x, 0), put_u64(&x, 0);
    expect_refused(&x, "magic");
    x.n = 0, put(&x, "GGUF", 4), put_u32(&x, 2), put_u64(&x, 0), put_u64(&x, 0);
    expect_refused(&x, "version 2");
    x.n = 0, put_head(&x, 0, (uint64_t)1 << 40), put_data(&x, 64);
    expect_refused(&x, "claims");
    x.n = 0, put_head(&x, (uint64_t)1 << 40, 0), put_data(&x, 64);
    expect_refused(&x, "claims");
    x.n = 0, put_head(&x, 0, 1), put_u64(&x, (uint64_t)1 << 60), put_data(&x, 64); // key length
    expect_refused(&x, "bytes long");
    x.n = 0, put_head(&x, 0, 1), put_str(&x, "k"), put_u32(&x, 99), put_data(&x, 64);
    expect_refused(&x, "unknown value type");
    x.n = 0, put_head(&x, 0, 1), put_str(&x, "k"), put_u32(&x, GGUF_ARRAY), put_u32(&x, GGUF_U8);
    put_u64(&x, (uint64_t)1 << 50), put_data(&x, 64);
    expect_refused(&x, "claims");
    x.n = 0, put_head(&x, 0, 1), put_str(&x, "k"), put_u32(&x, GGUF_ARRAY), put_u32(&x, GGUF_ARRAY), put_u64(&x, 1);
    put_data(&x, 64);
    expect_refused(&x, "arrays");
    x.n = 0, put_head(&x, 0, 1), put_str(&x, "k"), put_u32(&x, GGUF_STRING), put_u64(&x, 3), put(&x, "a\0b", 3);
    put_data(&x, 64);
    expect_refused(&x, "NUL");
    x.n = 0, put_head(&x, 0, 2);
    for (int i = 0; i < 2; i++)
        put_str(&x, "k"), put_u32(&x, GGUF_U32), put_u32(&x, 1);
    put_data(&x, 64);
    expect_refused(&x, "twice");
    x.n = 0, put_head(&x, 0, 1), put_str(&x, "general.alignment"), put_u32(&x, GGUF_U32), put_u32(&x, 48);
    put_data(&x, 64);
    expect_refused(&x, "power of two");
}

Test(gguf, lying_tensors_are_refused) {
    Bytes x = {0};
    put_head(&x, 1, 0), put_tensor(&x, "t", 99, 32, 0), put_data(&x, 128);
    expect_refused(&x, "unknown ggml type 99");
    x.n = 0, put_head(&x, 1, 0), put_tensor(&x, "t", GGML_F32, 32, 4), put_data(&x, 160);
    expect_refused(&x, "not a multiple of the alignment");
    x.n = 0, put_head(&x, 1, 0), put_tensor(&x, "t", GGML_F32, 32, 1 << 20), put_data(&x, 128);
    expect_refused(&x, "outside the file");
    x.n = 0, put_head(&x, 1, 0), put_tensor(&x, "t", GGML_F32, 64, 0), put_data(&x, 128); // 256 bytes needed
    expect_refused(&x, "outside the file");
    x.n = 0, put_head(&x, 1, 0), put_tensor(&x, "t", GGML_Q8_0, 33, 0), put_data(&x, 128);
    expect_refused(&x, "not a multiple of 32");
    x.n = 0, put_head(&x, 1, 0), put_str(&x, "t"), put_u32(&x, 5), put_data(&x, 128);
    expect_refused(&x, "dimensions");
    x.n = 0, put_head(&x, 1, 0), put_str(&x, "t"), put_u32(&x, 2), put_u64(&x, (uint64_t)1 << 40);
    put_u64(&x, (uint64_t)1 << 40), put_u32(&x, GGML_F32), put_u64(&x, 0), put_data(&x, 128);
    expect_refused(&x, "overflows");
    x.n = 0, put_head(&x, 2, 0), put_tensor(&x, "t", GGML_F32, 32, 0), put_tensor(&x, "t", GGML_F32, 32, 128);
    put_data(&x, 256);
    expect_refused(&x, "twice");
}

// A writer holding the tiny base as f32, for the model-level refusals below.
static void tiny_writer(GgufWriter *w, Model *m, Tokenizer **tok) {
    cr_assert_eq(model_load(m, GGUF_TINY_BASE, 0), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_load(tok, GGUF_TINY_BASE), ER_OK, "%s", er_last_error());
    memset(w, 0, sizeof *w);
    cr_assert_eq(model_gguf_put(m, GGML_F32, w, NULL), ER_OK, "%s", er_last_error());
    cr_assert_eq(tok_gguf_put(*tok, m->cfg.V, w), ER_OK, "%s", er_last_error());
}

static GgufWriteKV *writer_kv(GgufWriter *w, const char *key) {
    for (int i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key))
            return &w->kv[i];
    cr_assert_fail("no key %s", key);
    return NULL;
}

// A model GGUF with one thing wrong is refused by model_load (or tok_load) naming it.
static void expect_model_refused(void (*spoil)(GgufWriter *w), const char *needle, int tokenizer) {
    GgufWriter w;
    Model m, bad;
    Tokenizer *tok, *t2 = NULL;
    tiny_writer(&w, &m, &tok);
    spoil(&w);
    char *p = tmp_path("spoiled.gguf");
    cr_assert_eq(gguf_write(&w, p), ER_OK, "%s", er_last_error());
    int rc = tokenizer ? tok_load(&t2, p) : model_load(&bad, p, 0);
    cr_expect_lt(rc, 0, "accepted a file with %s", needle);
    cr_expect(strstr(er_last_error(), needle), "\"%s\" does not mention \"%s\"", er_last_error(), needle);
    gguf_writer_free(&w);
    model_free(&m);
    tok_free(tok);
    er_free(p);
}

static uint8_t *zero_block(size_t n) {
    uint8_t *z = er_calloc(n, 1);
    cr_assert(z);
    return z;
}

static void spoil_type(GgufWriter *w) { // iq4_nl (known to ggml, not to us) with the right byte count
    for (int i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, "blk.2.ffn_up.weight")) {
            w->tensors[i].type = 20;
            w->tensors[i].nbytes = (size_t)w->tensors[i].ne[0] * w->tensors[i].ne[1] / 32 * 18;
            er_free(w->tensors[i].owned);
            w->tensors[i].data = w->tensors[i].owned = zero_block(w->tensors[i].nbytes);
        }
}
static void spoil_arch(GgufWriter *w) { memcpy((char *)writer_kv(w, "general.architecture")->data + 8, "gpt2_", 5); }
static void spoil_blocks(GgufWriter *w) { *(uint32_t *)writer_kv(w, "qwen2.block_count")->data = 5; }
static void spoil_heads(GgufWriter *w) { *(uint32_t *)writer_kv(w, "qwen2.attention.head_count")->data = 8; }
static void spoil_nan(GgufWriter *w) {
    for (int i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->tensors[i].name, "blk.0.attn_k.weight"))
            ((float *)w->tensors[i].owned)[5] = NAN;
}
static void spoil_pre(GgufWriter *w) { memcpy((char *)writer_kv(w, "tokenizer.ggml.pre")->data + 8, "qwen3", 5); }
static void spoil_eos(GgufWriter *w) { *(uint32_t *)writer_kv(w, "tokenizer.ggml.eos_token_id")->data = 1u << 20; }

Test(gguf, bad_models_are_refused_by_name) {
    expect_model_refused(spoil_type, "has type iq4_nl (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K "
                                     "or q6_K)", 0);
    expect_model_refused(spoil_arch, "\"gpt2_\" (supported: qwen2, qwen3, llama)", 0);
    expect_model_refused(spoil_blocks, "block_count is 5 but the file holds 4 blocks", 0);
    expect_model_refused(spoil_heads, "blk.0.attn_q.weight", 0);
    expect_model_refused(spoil_nan, "NaN", 0);
    expect_model_refused(spoil_pre, "tokenizer.ggml.pre is \"qwen3\"", 1);
    expect_model_refused(spoil_eos, "outside", 1);
}
