// The bench runner (infer/bench.h).
#include "infer/bench.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "lora/peft.h"
#include "model/model.h"
#include "quant/quant.h"

// A prompt of exactly n tokens: ordinary text repeated when the dir has a tokenizer, else a fixed
// pattern of ids.
static int bench_prompt(const char *dir, int V, int n, int **out) {
    static const char text[] = "The quick brown fox jumps over the lazy dog while seven ducks swim in the pond. ";
    int *ids = er_alloc(sizeof(int) * (size_t)n), *text_ids = NULL, n_text = 0;
    Tokenizer *tok = NULL;
    char *tj = path_join(dir, "tokenizer.json");
    int rc = ER_OK;
    if (!ids || !tj)
        ER_CHECK(er_error(ER_ENOMEM, "%s: out of memory", dir));
    // A dir without tokenizer.json gets a fixed id pattern; a tokenizer that fails to load is an error.
    if (gguf_is_path(dir) || path_exists(tj)) { // a GGUF file carries its tokenizer
        ER_CHECK(tok_load(&tok, dir));
        ER_CHECK(tok_encode(tok, text, strlen(text), &text_ids, &n_text));
    }
    for (int i = 0; i < n; i++) {
        int id = n_text > 0 ? text_ids[i % n_text] : (int)((13 + 7919L * i) % V);
        ids[i] = id < V ? id : id % V;
    }
    *out = ids;
    ids = NULL;
done:
    er_free(ids);
    er_free(tj);
    er_free(text_ids);
    tok_free(tok);
    return rc;
}

// Bytes of the weights as held in memory (packed formats at their size; vectors fp32).
static size_t model_weight_bytes(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += m->params[i].w ? weight_bytes(m->params[i].w) : m->params[i].numel * sizeof(float);
    return n;
}

// Weight bytes the model holds outside its file mappings: the fp32 vectors, and matrices whose data
// had to be copied (dtype or alignment).
static size_t model_copied_bytes(const Model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const Weight *w = m->params[i].w;
        int mapped = 0;
        for (int f = 0; w && f < m->n_files; f++) {
            const char *p = w->data, *base = m->files[f].map;
            mapped |= p >= base && p < base + m->files[f].map_size;
        }
        if (w && m->gguf) {
            const char *p = w->data, *base = m->gguf->map;
            mapped |= p >= base && p < base + m->gguf->map_size;
        }
        n += !w ? m->params[i].numel * sizeof(float) : mapped ? 0 : weight_bytes(w);
    }
    return n;
}

int bench_decode_steps(const GenSample *s, int n) {
    int steps = 0;
    for (int i = 0; i < n; i++)
        if (s[i].n_tokens - 1 > steps)
            steps = s[i].n_tokens - 1;
    return steps;
}

// One row: N samples of T tokens after a P-token prompt. base_first: prefill the prompt with the
// base model first (as the pipeline does for the switcher), untimed; the row then times what the
// adapter's generation adds.
static int bench_row(Model *m, const LoraAdapter *ad, KvType kv, int N, const int *prompt, int P, int T,
                     int base_first, BenchRow *row) {
    int rc = ER_OK;
    Engine e = {0};
    GenSample *out = NULL;
    ER_CHECK(engine_init(&e, m, NULL, kv, N, P + T, 128, 0));
    size_t kv_alloc = e.kv.bytes, V = (size_t)m->cfg.V;
    size_t scratch = e.prefill.bytes + e.decode.bytes + V * (3 * sizeof(float) + sizeof(SamplerCand));
    if (base_first)
        ER_CHECK(engine_prefill(&e, prompt, P, NULL, NULL, NULL, NULL));
    GenConfig g;
    gen_config_default(&g);
    g.n_samples = N;
    g.max_new = T;
    g.sampler.temperature = 1.0f; // fixed-seed sampling: the samples differ, as they do in use
    g.seed = 1234;
    g.adapter = ad;
    out = er_calloc((size_t)N, sizeof *out);
    if (!out) {
        rc = ER_ENOMEM;
        goto done;
    }
    GenStats st;
    ER_CHECK(engine_generate(&e, prompt, P, &g, NULL, NULL, out, &st));
    int steps = bench_decode_steps(out, N);
    long decoded = st.generated_tokens - N; // the first token of each sample comes from the prefill
    *row = (BenchRow){.kv = kv == KV_F32 ? "f32" : "int8", .n = N, .ttft_s = st.ttft_s};
    row->step_s = steps > 0 ? st.decode_s / steps : 0;
    row->stream_tps = row->step_s > 0 ? 1.0 / row->step_s : 0;
    row->total_tps = st.decode_s > 0 ? decoded / st.decode_s : 0;
    row->tokens = st.generated_tokens;
    row->kv_bytes = st.kv_bytes;
    row->prompt_reused = st.prompt_reused;
    row->kv_alloc_bytes = kv_alloc;
    row->scratch_bytes = scratch + e.verify.bytes;
    gen_samples_free(out, N);
done:
    er_free(out);
    engine_free(&e);
    return rc;
}

int bench_run(const BenchConfig *c, BenchResult *res) {
    if (!c || !res || !c->model)
        return er_error(ER_EINVAL, "bench_run: NULL config, result or model");
    if (c->prompt_tokens < 1 || c->new_tokens < 2)
        return er_error(ER_EINVAL, "bench_run: expected at least 1 prompt token and 2 new tokens, got %d and %d",
                        c->prompt_tokens, c->new_tokens);
    memset(res, 0, sizeof *res);
    int rc = ER_OK, P = c->prompt_tokens, T = c->new_tokens;
    Model m = {0};
    LoraAdapter ad = {0};
    int *prompt = NULL;
    size_t released = 0;
    size_t rss0 = er_resident_bytes();
    ER_CHECK(model_load(&m, c->model, 0));
    ER_CHECK(model_tile_for_decode(&m, &released, NULL, NULL));
    m.cfg.eos_id = -1; // no EOS stop: every run decodes the same number of tokens
    if (c->adapter) {
        LoraShape shape = model_config_lora_shape(&m.cfg);
        ER_CHECK(peft_load(&ad, c->adapter, &shape, 0));
    }
    const LoraAdapter *adp = c->adapter ? &ad : NULL;
    ER_CHECK(bench_prompt(c->model, m.cfg.V, P, &prompt));
    // Warm-up: brings the mmapped weights into memory so the first row does not pay for it.
    BenchRow warm;
    ER_CHECK(bench_row(&m, adp, KV_F32, 1, prompt, P < 8 ? P : 8, 2, 0, &warm));
    size_t rss1 = er_resident_bytes(), held = warm.kv_alloc_bytes + warm.scratch_bytes;
    res->resident_weight_bytes = rss0 && rss1 > rss0 + held ? rss1 - rss0 - held : 0;
    res->L = m.cfg.L;
    res->C = m.cfg.C;
    res->V = m.cfg.V;
    res->weight_bytes = model_weight_bytes(&m);
    for (int i = 0; i < m.n_files; i++)
        res->mapped_bytes += m.files[i].map_size;
    if (m.gguf)
        res->mapped_bytes += m.gguf->map_size;
    res->mapped_bytes -= released < res->mapped_bytes ? released : res->mapped_bytes; // tiled: counted as copies
    res->copied_bytes = model_copied_bytes(&m);
    res->kernels = quant_simd_name();
    static const int Ns[] = {1, 2, 4, 8};
    static const KvType kvs[] = {KV_F32, KV_INT8};
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 4; j++) {
            ER_CHECK(bench_row(&m, adp, kvs[k], Ns[j], prompt, P, T, 0, &res->rows[res->n_rows]));
            res->n_rows++;
            if (c->on_row)
                c->on_row(c->user, res, res->n_rows - 1);
        }
    if (adp) {
        ER_CHECK(bench_row(&m, adp, KV_F32, 1, prompt, P, T, 1, &res->adapter_row));
        res->has_adapter = 1;
        res->adapter_masked = adp->masked;
    }
done:
    er_free(prompt);
    lora_free(&ad);
    model_free(&m);
    return rc;
}
