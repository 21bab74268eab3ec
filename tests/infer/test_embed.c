// Embeddings (er_embed, erinfer embed): the pooled final hidden states against the PyTorch reference's
// sentence-transformers pooling (mean and last token, L2-normalised) on its random checkpoints, Qwen2 and Qwen3,
// prefilled in chunks; then what the API adds: how the model dir says to pool (sentence-transformers' Pooling
// config), its query prompt, the tokenizer's template tokens, Matryoshka truncation, and the command.
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/safetensors.h"
#include "core/threads.h"
#include "data/tokenizer.h"
#include "infer/embed.h"
#include "infer/engine.h"
#include "infer/erinfer.h"
#include "model/model.h"
#include "tests/common/helpers.h"
#include "tests/common/ref.h"

// Each reference row's tokens through engine_embed (a chunk of 5 positions, so rows cross chunks) against
// embed_mean / embed_last.
static void check_reference(const char *name) {
    threads_set(2);
    char dir[1024], path[1100];
    ref_case_dir(dir, sizeof dir, name, "PyTorch reference data");
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    StFile ex;
    cr_assert_eq(safetensors_open(&ex, path), 0, "%s", er_last_error());
    const StTensor *tt = ref_need(&ex, "tokens");
    int B = (int)tt->shape[0], T = (int)tt->shape[1];
    const int *tokens = tt->data, *lengths = ref_need(&ex, "lengths")->data;
    Model m;
    cr_assert_eq(model_load(&m, dir, 0), 0, "%s", er_last_error());
    int C = m.cfg.C;
    Engine e;
    cr_assert_eq(engine_init(&e, &m, NULL, KV_F32, 1, T, 5, 0), 0, "%s", er_last_error());
    float *h = malloc(sizeof(float) * C);
    for (int last = 0; last <= 1; last++) {
        const float *want = ref_need(&ex, last ? "embed_last" : "embed_mean")->data;
        for (int b = 0; b < B; b++) {
            char what[128];
            snprintf(what, sizeof what, "%s row %d, %s pooling", name, b, last ? "last-token" : "mean");
            cr_assert_eq(engine_embed(&e, tokens + (size_t)b * T, lengths[b], last, h), 0, "%s", er_last_error());
            embed_finish(h, h, C, 1);
            ref_assert_close(what, h, want + (size_t)b * C, C, 1e-4);
        }
    }
    free(h);
    engine_free(&e);
    model_free(&m);
    safetensors_close(&ex);
}

Test(embed, reference_qwen2) { check_reference("qwen2_untied_f32"); }
Test(embed, reference_qwen3) { check_reference("qwen3_untied_f32"); }
Test(embed, reference_qwen3_bf16) { check_reference("qwen3_bf16"); }

// ---- the API ----

static HelperFixture fx;
static void setup(void) { helper_fixture_open(&fx, "er_embed_", "erinfer"); }
static void teardown(void) { helper_fixture_close(&fx); }

static void write_file(const char *dir, const char *name, const char *text) {
    char *p = path_join(dir, name);
    cr_assert_eq(file_write_atomic(p, text, strlen(text)), 0, "%s", er_last_error());
    er_free(p);
}

static ErSession *open_session(ErModel **m, const char *dir) {
    ErSession *s;
    ErSessionParams sp;
    cr_assert_eq(er_model_load(m, dir), 0, "%s", er_last_error());
    er_session_params_init(&sp);
    sp.max_tokens = 256;
    cr_assert_eq(er_session_open(&s, *m, &sp), 0, "%s", er_last_error());
    return s;
}

static double dot(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++)
        d += (double)a[i] * b[i];
    return d;
}

static void expect_same(const float *a, const float *b, int n, const char *what) {
    cr_expect_eq(memcmp(a, b, sizeof(float) * n), 0, "%s: the vectors differ", what);
}

TestSuite(embed_api, .init = setup, .fini = teardown, .timeout = 120);

// Unit vectors, several texts at once equal to one at a time, the token count returned, the truncation, pooling
// by name, and the session's cached prompt left for the next generate.
Test(embed_api, vectors_and_params) {
    ErModel *m;
    ErSession *s = open_session(&m, fx.model);
    int C = er_model_embedding_size(m);
    const char *texts[3] = {"Start with 3. Add 4.", "a", "Multiply by 2. Subtract 5. What is the result?"};
    float *all = malloc(sizeof(float) * 3 * C), *one = malloc(sizeof(float) * C), *raw = malloc(sizeof(float) * C);
    ErEmbedParams p;
    er_embed_params_init(&p);
    int tokens = er_embed(s, texts, 3, &p, all, (size_t)3 * C);
    cr_assert_gt(tokens, 3, "%s", er_last_error());
    int sum = 0;
    for (int i = 0; i < 3; i++) {
        int n = er_embed(s, &texts[i], 1, &p, one, (size_t)C);
        cr_assert_gt(n, 0, "%s", er_last_error());
        sum += n;
        expect_same(one, all + (size_t)i * C, C, "a text alone and among others");
        cr_expect_float_eq(dot(one, one, C), 1.0, 1e-5);
    }
    cr_expect_eq(sum, tokens);
    cr_expect_lt(dot(all, all + 2 * (size_t)C, C), 0.9999, "two different texts give the same vector");
    // Matryoshka: the first d values of the unnormalised vector, normalised.
    p.normalize = 0;
    cr_assert_gt(er_embed(s, texts, 1, &p, raw, (size_t)C), 0, "%s", er_last_error());
    p.normalize = 1;
    p.dimensions = C / 2;
    cr_assert_gt(er_embed(s, texts, 1, &p, one, (size_t)C / 2), 0, "%s", er_last_error());
    embed_finish(raw, raw, C / 2, 1);
    for (int i = 0; i < C / 2; i++)
        cr_expect_float_eq(one[i], raw[i], 1e-6, "dimension %d", i);
    // Pooling by name: mean is the model's default here (no Pooling config); last differs.
    p.dimensions = 0;
    p.pooling = ER_POOL_MEAN;
    cr_assert_gt(er_embed(s, texts, 1, &p, one, (size_t)C), 0, "%s", er_last_error());
    expect_same(one, all, C, "ER_POOL_MEAN on a model without a Pooling config");
    p.pooling = ER_POOL_LAST;
    cr_assert_gt(er_embed(s, texts, 1, &p, one, (size_t)C), 0, "%s", er_last_error());
    cr_expect_neq(memcmp(one, all, sizeof(float) * C), 0);
    // Refusals: each names what is wrong.
    struct {
        int pooling, dimensions, query;
        size_t cap;
        const char *needle;
    } bad[] = {{7, 0, 0, C, "pooling"}, {0, C + 1, 0, C, "dimensions"}, {0, 0, 1, C, "query prompt"},
               {0, 0, 0, C - 1, "floats"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        er_embed_params_init(&p);
        p.pooling = bad[i].pooling, p.dimensions = bad[i].dimensions, p.query = bad[i].query;
        cr_expect_eq(er_embed(s, texts, 1, &p, one, bad[i].cap), ER_EINVAL);
        cr_expect(strstr(er_last_error(), bad[i].needle), "%s", er_last_error());
    }
    er_embed_params_init(&p);
    const char *empty = "";
    cr_expect_eq(er_embed(s, &empty, 1, &p, one, (size_t)C), ER_ERANGE);
    cr_expect(strstr(er_last_error(), "text 0"), "%s", er_last_error());
    // The session's cached prompt survives an embedding: the same prompt again is reused whole.
    ErGenParams gp;
    er_gen_params_init(&gp);
    gp.max_new_tokens = 2;
    cr_assert_eq(er_generate_raw(s, texts[2], &gp, NULL, NULL), 0, "%s", er_last_error());
    cr_assert_gt(er_embed(s, texts, 1, &p, one, (size_t)C), 0, "%s", er_last_error());
    cr_assert_eq(er_generate_raw(s, texts[2], &gp, NULL, NULL), 0, "%s", er_last_error());
    const ErStats *st = er_result_stats(s);
    cr_expect_geq(st->prompt_reused, st->prompt_tokens - 1, "reused %d of %d prompt tokens", st->prompt_reused,
                  st->prompt_tokens);
    free(all), free(one), free(raw);
    er_session_free(s);
    er_model_free(m);
}

// A Qwen3-Embedding-style dir: sentence-transformers' last-token Pooling config, a query prompt, and a tokenizer whose
// TemplateProcessing appends <|endoftext|>. Each is what the API does by itself.
Test(embed_api, model_dir_says_how) {
    char *pool = path_join(fx.model, "1_Pooling");
    cr_assert_eq(mkdir(pool, 0755), 0);
    write_file(pool, "config.json", "{\"word_embedding_dimension\": 32, \"pooling_mode_cls_token\": false, "
                                    "\"pooling_mode_mean_tokens\": false, \"pooling_mode_lasttoken\": true}");
    write_file(fx.model, "modules.json", "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": "
                                         "\"sentence_transformers.models.Transformer\"}, {\"idx\": 1, \"name\": \"1\", "
                                         "\"path\": \"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"}]");
    write_file(fx.model, "config_sentence_transformers.json",
               "{\"prompts\": {\"query\": \"Instruct: find it\\nQuery:\", \"document\": \"\"}}");
    // The tokenizer: the tiny one with a TemplateProcessing post-processor appending <|endoftext|>.
    char *tj = path_join(fx.model, "tokenizer.json"), *text;
    size_t n;
    cr_assert_eq(file_read_all(tj, 64u << 20, &text, &n), 0);
    cJSON *doc = cJSON_Parse(text);
    er_free(text);
    int eot;
    {
        Tokenizer *tok;
        cr_assert_eq(tok_load(&tok, fx.model), 0, "%s", er_last_error());
        eot = tok_token_id(tok, "<|endoftext|>");
        tok_free(tok);
    }
    char pp[600];
    snprintf(pp, sizeof pp, "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, {\"type\": "
             "\"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": "
             "{\"id\": \"<|endoftext|>\", \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"<|endoftext|>\": "
             "{\"id\": \"<|endoftext|>\", \"ids\": [%d], \"tokens\": [\"<|endoftext|>\"]}}}]}", eot);
    cJSON_ReplaceItemInObject(doc, "post_processor", cJSON_Parse(pp));
    char *out = cJSON_PrintUnformatted(doc);
    cr_assert_eq(file_write_atomic(tj, out, strlen(out)), 0);
    cJSON_free(out);
    cJSON_Delete(doc);

    ErModel *m;
    ErSession *s = open_session(&m, fx.model);
    int C = er_model_embedding_size(m);
    float *a = malloc(sizeof(float) * C), *b = malloc(sizeof(float) * C);
    ErEmbedParams p;
    er_embed_params_init(&p);
    const char *doc_text = "Start with 3. Add 4.", *with_eot = "Start with 3. Add 4.<|endoftext|>";
    int n1 = er_embed(s, &doc_text, 1, &p, a, (size_t)C);
    cr_assert_gt(n1, 0, "%s", er_last_error());
    // The model's pooling (the last token) of the text and the appended <|endoftext|>: engine_embed on the tiny
    // tokenizer's (no template) tokens of the text with <|endoftext|> written out.
    {
        Tokenizer *tok;
        cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), 0);
        int *ids, nt;
        cr_assert_eq(tok_encode(tok, with_eot, strlen(with_eot), &ids, &nt), 0);
        cr_expect_eq(nt, n1, "the template's token was not appended (%d tokens, %d with it written out)", n1, nt);
        Model mm;
        cr_assert_eq(model_load(&mm, fx.model, 0), 0, "%s", er_last_error());
        Engine e;
        cr_assert_eq(engine_init(&e, &mm, NULL, KV_F32, 1, 256, 64, 0), 0, "%s", er_last_error());
        cr_assert_eq(engine_embed(&e, ids, nt, 1, b), 0, "%s", er_last_error());
        embed_finish(b, b, C, 1);
        for (int i = 0; i < C; i++)
            cr_expect_float_eq(a[i], b[i], 1e-5, "last-token pooling of the text and <|endoftext|>, value %d", i);
        engine_free(&e);
        model_free(&mm);
        er_free(ids);
        tok_free(tok);
    }
    // The query prompt: query = 1 is the prompt written before the text.
    er_embed_params_init(&p);
    p.query = 1;
    cr_assert_gt(er_embed(s, &doc_text, 1, &p, a, (size_t)C), 0, "%s", er_last_error());
    const char *prompted = "Instruct: find it\nQuery:Start with 3. Add 4.";
    p.query = 0;
    cr_assert_gt(er_embed(s, &prompted, 1, &p, b, (size_t)C), 0, "%s", er_last_error());
    expect_same(a, b, C, "query = 1 and the query prompt written out");
    free(a), free(b);
    er_session_free(s);
    er_model_free(m);
    er_free(tj);
    er_free(pool);
}

// A Pooling config this build has no pooling for is refused when embedding (the model still loads and generates).
Test(embed_api, unsupported_pooling_refused) {
    char *pool = path_join(fx.model, "1_Pooling");
    cr_assert_eq(mkdir(pool, 0755), 0);
    write_file(pool, "config.json", "{\"pooling_mode_cls_token\": true}");
    ErModel *m;
    ErSession *s = open_session(&m, fx.model);
    float v[64];
    ErEmbedParams p;
    er_embed_params_init(&p);
    const char *t = "x";
    cr_expect_eq(er_embed(s, &t, 1, &p, v, 64), ER_EUNSUPPORTED);
    cr_expect(strstr(er_last_error(), "pooling_mode_cls_token"), "%s", er_last_error());
    p.pooling = ER_POOL_MEAN; // asked by name, it runs
    cr_expect_gt(er_embed(s, &t, 1, &p, v, 64), 0, "%s", er_last_error());
    er_session_free(s);
    er_model_free(m);
    write_file(pool, "config.json", "{\"pooling_mode_lasttoken\": \"yes\"}");
    cr_expect_lt(er_model_load(&m, fx.model), 0);
    cr_expect(strstr(er_last_error(), "1_Pooling/config.json"), "%s", er_last_error());
    er_free(pool);
}

// erinfer embed: one line per text, the vectors er_embed gives; bad flags are one line each.
Test(embed_api, command) {
    helper_need_program(fx.prog, "erinfer", "erinfer embed tests");
    char in[600];
    snprintf(in, sizeof in, "%s/in.jsonl", fx.tmp);
    write_file(fx.tmp, "in.jsonl", "{\"text\": \"Start with 3. Add 4.\"}\n{\"text\": \"a\"}\n");
    CmdResult r = helper_run(fx.tmp, "'%s' embed --model '%s' --input '%s' --dimensions 8", fx.prog, fx.model, in);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_expect_eq(helper_count_lines(r.out), 2);
    cJSON *j = cJSON_Parse(r.out); // the first line
    cr_assert(j, "%s", r.out);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "embedding")), 8);
    cr_expect_gt(cJSON_GetObjectItem(j, "tokens")->valueint, 1);
    double ss = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, cJSON_GetObjectItem(j, "embedding")) ss += x->valuedouble * x->valuedouble;
    cr_expect_float_eq(ss, 1.0, 1e-5);
    cJSON_Delete(j);
    helper_result_free(&r);
    r = helper_run(fx.tmp, "'%s' embed --model '%s' --text a --pooling max", fx.prog, fx.model);
    helper_expect_error(&r, "--pooling max", "--pooling");
    r = helper_run(fx.tmp, "'%s' embed --model '%s'", fx.prog, fx.model);
    helper_expect_error(&r, "no text", "--text");
    r = helper_run(fx.tmp, "'%s' embed --model '%s' --text a --query", fx.prog, fx.model);
    helper_expect_error(&r, "--query without a prompt", "query prompt");
    write_file(fx.tmp, "bad.jsonl", "{\"text\": \"a\"}\n{\"txt\": 1}\n");
    r = helper_run(fx.tmp, "'%s' embed --model '%s' --input '%s/bad.jsonl' --output '%s/o.jsonl'", fx.prog, fx.model,
                   fx.tmp, fx.tmp);
    helper_expect_error(&r, "a record without text", "bad.jsonl:2");
    char o[600];
    snprintf(o, sizeof o, "%s/o.jsonl", fx.tmp);
    cr_expect(!path_exists(o), "a failed run left %s", o);
}
