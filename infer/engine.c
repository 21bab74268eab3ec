#include "infer/engine.h"

#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/threads.h"
#include "data/grade.h"
#include "model/ops.h"

#define DEFAULT_BUDGET_SUFFIX "\n</think>\n\nFinal answer: "

void gen_config_default(GenConfig *g) {
    memset(g, 0, sizeof *g);
    g->n_samples = 1;
    g->max_new = 256;
    g->sampler = sampler_params_default();
    g->seed = 0;
    g->answer_tokens = 32;
    g->budget_suffix = DEFAULT_BUDGET_SUFFIX;
}

int engine_init(Engine *e, Model *m, const Tokenizer *tok, KvType kv_type, int max_samples, int max_len, int chunk,
                size_t max_bytes) {
    memset(e, 0, sizeof *e);
    e->prompt_slot = -1;
    if (max_samples < 1 || max_len < 2 || chunk < 1)
        return er_error(ER_EINVAL, "engine: need at least 1 sample, 2 positions and a chunk of 1");
    if (max_len > m->cfg.max_pos) // RoPE past the trained positions is not supported: refused, not extrapolated
        return er_error(ER_ERANGE, "%d positions per sequence exceed the model's %d (max_position_embeddings)", max_len,
                        m->cfg.max_pos);
    // Distinct positions: prompt P once + N tails of at most max_len - P each <= N * max_len. The KV
    // cache numbers positions, blocks and sequences (the samples' and the prompt's) with ints: what it
    // cannot number is refused before any size is computed from it (max_len >= 2, so max_samples + 1
    // fits too).
    size_t positions = (size_t)max_samples * (size_t)max_len;
    if (positions > INT_MAX)
        return er_error(ER_ERANGE, "a session of %d samples x %d positions holds %zu positions, more than a KV cache "
                        "can address (%d)", max_samples, max_len, positions, INT_MAX);
    e->model = m;
    e->tok = tok;
    e->max_samples = max_samples;
    e->max_len = max_len;
    e->chunk = chunk;
    size_t kv_bytes = kv_cache_bytes(&m->cfg, kv_type, max_samples + 1, positions);
    size_t need;
    if (kv_bytes == SIZE_MAX || er_add_size(kv_bytes, acts_bytes(&m->cfg, 1, chunk, ACTS_DECODE), &need) ||
        er_add_size(need, acts_bytes(&m->cfg, max_samples, 1, ACTS_DECODE), &need))
        return er_error(ER_ENOMEM, "a session of %d samples x %d positions needs more memory than can be addressed",
                        max_samples, max_len);
    if (max_bytes && need > max_bytes)
        return er_error(ER_ENOMEM, "a session of %d samples x %d positions needs %.1f MiB (KV cache %.1f MiB), more than "
                        "the %.1f MiB available", max_samples, max_len, need / 1048576.0, kv_bytes / 1048576.0,
                        max_bytes / 1048576.0);
    int rc = ER_OK;
    e->be = m->be ? m->be : backend_cpu();
    ER_CHECK(kv_cache_alloc_on(&e->kv, e->be, &m->cfg, kv_type, max_samples + 1, max_len, positions, 0));
    ER_CHECK(acts_alloc_on(&e->prefill, e->be, &m->cfg, 1, chunk, ACTS_DECODE, 0));
    ER_CHECK(acts_alloc_on(&e->decode, e->be, &m->cfg, max_samples, 1, ACTS_DECODE, 0));
    e->n_samplers = threads_get() < max_samples ? threads_get() : max_samples;
    e->samplers = er_calloc((size_t)e->n_samplers, sizeof(Sampler));
    if (!e->samplers) {
        rc = ER_ENOMEM;
        goto done;
    }
    for (int i = 0; i < e->n_samplers; i++)
        ER_CHECK(sampler_init(&e->samplers[i], m->cfg.V));
    e->prompt_tokens = er_alloc(sizeof(int) * (size_t)max_len);
    e->prompt_logits = er_alloc(sizeof(float) * (size_t)m->cfg.V);
    e->feat_sum = er_alloc(sizeof(double) * (size_t)m->cfg.C);
    e->kept_slot = er_alloc(sizeof(int) * (size_t)max_samples);
    e->kept_tail = er_alloc(sizeof(int) * (size_t)max_samples);
    if (!e->prompt_tokens || !e->prompt_logits || !e->feat_sum || !e->kept_slot || !e->kept_tail)
        rc = ER_ENOMEM;
done:
    if (rc < 0)
        engine_free(e);
    return rc;
}

void engine_free(Engine *e) {
    kv_cache_free(&e->kv);
    acts_free(&e->prefill);
    acts_free(&e->decode);
    acts_free(&e->verify);
    for (int i = 0; e->samplers && i < e->n_samplers; i++)
        sampler_free(&e->samplers[i]);
    er_free(e->samplers);
    er_free(e->prompt_tokens);
    er_free(e->prompt_logits);
    er_free(e->feat_sum);
    er_free(e->kept_slot);
    er_free(e->kept_tail);
    er_free(e->host);
    memset(e, 0, sizeof *e);
    e->prompt_slot = -1;
}

int engine_download(Engine *e, const float *p, size_t n, const float **host) {
    if (e->be->kind == BACKEND_CPU) {
        *host = p;
        return ER_OK;
    }
    if (n > e->host_cap) {
        er_free(e->host);
        e->host_cap = 0;
        if (!(e->host = er_alloc(n * sizeof(float))))
            return ER_ENOMEM;
        e->host_cap = n;
    }
    ER_TRY(e->be->ops->download(e->be, e->host, p, n * sizeof(float)));
    *host = e->host;
    return ER_OK;
}

// The final norm of a forward-only pass's `len` positions (the forward normalised only each row's last):
// resf holds the last layer's output at every position, and lnf has room for all of them; its last row is
// the forward's, recomputed identically. *host: lnf (len, C) on the host.
static int final_hidden(Engine *e, Activations *a, int len, const float **host) {
    const ModelConfig *c = &e->model->cfg;
    ER_TRY(a->be->ops->rmsnorm_forward(a->be, a->lnf, a->rstdf, a->resf, e->model->norm, len, c->C, c->eps));
    return engine_download(e, a->lnf, (size_t)len * c->C, host);
}

void gen_samples_free(GenSample *s, int n) {
    for (int i = 0; i < n; i++) {
        er_free(s[i].tokens);
        er_free(s[i].logprobs);
        er_free(s[i].top_ids);
        er_free(s[i].top_logprobs);
        er_free(s[i].text);
        memset(&s[i], 0, sizeof s[i]);
    }
}

// The switcher's EMA over prompt chunks (PromptFeatureSpec), fed position by position.
typedef struct {
    const PromptFeatureSpec *spec;
    float *h;   // (C) the EMA
    int in_chunk, folds;
} FeatureAcc;

// Folds the positions of the current chunk (e->feat_sum) into the EMA.
static void feature_fold(Engine *e, FeatureAcc *f) {
    int C = e->model->cfg.C;
    if (f->in_chunk == 0)
        return;
    float a = f->spec->alpha;
    for (int c = 0; c < C; c++) { // the first chunk initialises h (whatever the caller's buffer held)
        float m = (float)(e->feat_sum[c] / f->in_chunk);
        f->h[c] = f->folds == 0 ? m : a * m + (1 - a) * f->h[c];
    }
    memset(e->feat_sum, 0, sizeof(double) * (size_t)C);
    f->in_chunk = 0;
    f->folds++;
}

// After a prefill pass of `len` positions: every position's final hidden state into the features.
static int feature_accumulate(Engine *e, FeatureAcc *f, int len) {
    int C = e->model->cfg.C;
    const float *lnf;
    ER_TRY(final_hidden(e, &e->prefill, len, &lnf));
    for (int t = 0; t < len; t++) {
        const float *row = lnf + (size_t)t * C;
        for (int i = 0; i < C; i++)
            e->feat_sum[i] += row[i];
        if (++f->in_chunk == f->spec->chunk)
            feature_fold(e, f);
    }
    return ER_OK;
}

// The abort hook's answer: ER_EABORTED (naming where: "prefill" or "decode") when it says stop.
static int engine_poll_abort(const Engine *e, const char *where, int done, int total) {
    if (e->hooks.abort && e->hooks.abort(e->hooks.user))
        return er_error(ER_EABORTED, "%s: stopped by the abort callback at %d of %d %s", where, done, total,
                        strcmp(where, "prefill") == 0 ? "positions" : "tokens");
    return ER_OK;
}

static void engine_progress(const Engine *e, int done, int total) {
    if (e->hooks.progress)
        e->hooks.progress(e->hooks.user, done, total);
}

// Runs tokens through the forward into the prompt sequence in chunks; the logits after the last
// one are kept. `adapter_on` marks them as response positions (the masked-LoRA rule). With `pos`
// (the prompt's, not the response prefix's) each chunk done advances *pos, the prompt positions in the
// cache, reported to the progress hook out of `total`; the abort hook is polled before each chunk.
static int prefill(Engine *e, const int *tokens, int n, int adapter_on, const LoraAdapter *adapter, FeatureAcc *f,
                   int *pos, int total) {
    uint8_t mask[4096];
    int C = e->chunk < 4096 ? e->chunk : 4096;
    memset(mask, adapter_on, sizeof mask);
    for (int p = 0; p < n; p += C) {
        int len = n - p < C ? n - p : C;
        ER_TRY(engine_poll_abort(e, "prefill", pos ? *pos : p, pos ? total : n));
        ModelInput in = {.B = 1, .T = len, .tokens = tokens + p, .len = &len, .adapter_mask = mask,
                         .adapter = adapter, .kv = &e->kv, .kv_slots = &e->prompt_slot};
        ER_TRY(model_forward(e->model, &in, &e->prefill));
        e->forward_positions += len;
        if (f)
            ER_TRY(feature_accumulate(e, f, len));
        if (pos) {
            *pos += len;
            engine_progress(e, *pos, total);
        }
    }
    const float *logits;
    ER_TRY(engine_download(e, e->prefill.logits, (size_t)e->model->cfg.V, &logits));
    memcpy(e->prompt_logits, logits, sizeof(float) * (size_t)e->model->cfg.V);
    return ER_OK;
}

void engine_release_samples(Engine *e) {
    for (int i = 0; i < e->n_kept; i++)
        if (e->kept_slot[i] >= 0)
            kv_seq_close(&e->kv, e->kept_slot[i]);
    e->n_kept = 0;
    e->kept_adapter = NULL;
}

// The prompt: reuse the longest cached prefix computed the same way, prefill the rest (the whole
// prompt when features are asked for). Under the masked rule the prompt is the base model's,
// whichever adapter decodes.
static int prompt_prefill(Engine *e, const int *prompt, int n_prompt, const LoraAdapter *prompt_ad,
                          const PromptFeatureSpec *spec, float *feat, int *reused) {
    int reuse = 0;
    *reused = 0;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->model->cfg.V)
            return er_error(ER_ERANGE, "generate: prompt token %d is outside the vocabulary [0, %d)", prompt[i],
                            e->model->cfg.V);
    if (spec && (spec->chunk < 1 || !(spec->alpha > 0 && spec->alpha <= 1)))
        return er_error(ER_EINVAL, "prefill: features need a chunk >= 1 and alpha in (0, 1]");
    uint64_t prompt_gen = prompt_ad ? prompt_ad->generation : 0;
    if (e->prompt_slot >= 0 && e->prompt_adapter != prompt_gen)
        e->n_prompt = 0;
    if (!spec && e->prompt_slot >= 0 && e->prompt_logits_valid && e->n_prompt == n_prompt &&
        memcmp(e->prompt_tokens, prompt, sizeof(int) * (size_t)n_prompt) == 0) {
        *reused = n_prompt; // exactly this prompt, its logits still at hand: nothing to compute
        engine_progress(e, n_prompt, n_prompt);
        return ER_OK;
    }
    e->prompt_logits_valid = 0;
    while (e->prompt_slot >= 0 && !spec && reuse < e->n_prompt && reuse < n_prompt - 1 &&
           e->prompt_tokens[reuse] == prompt[reuse])
        reuse++;
    e->n_prompt = 0;
    ER_TRY(e->prompt_slot >= 0 ? kv_seq_truncate(&e->kv, e->prompt_slot, reuse) : kv_seq_open(&e->kv, &e->prompt_slot));
    FeatureAcc f = {spec, feat, 0, 0};
    if (spec)
        memset(e->feat_sum, 0, sizeof(double) * (size_t)e->model->cfg.C);
    // The cache holds prompt[0 .. n_prompt) whenever a chunk ends, so a prefill the abort hook stops leaves a
    // prefix the next call reuses.
    memcpy(e->prompt_tokens, prompt, sizeof(int) * (size_t)n_prompt);
    e->n_prompt = reuse;
    e->prompt_adapter = prompt_gen;
    engine_progress(e, reuse, n_prompt);
    ER_TRY(prefill(e, prompt + reuse, n_prompt - reuse, prompt_ad != NULL, prompt_ad, spec ? &f : NULL, &e->n_prompt,
                   n_prompt));
    if (spec)
        feature_fold(e, &f); // the last, possibly shorter, chunk
    e->prompt_logits_valid = 1;
    *reused = reuse;
    return ER_OK;
}

// After a failed call: the prompt sequence may be half-written, so it is forgotten, unless the abort hook
// stopped the call: then the cache holds exactly e->prompt_tokens[0 .. n_prompt) (and maybe more positions
// after them, cut by the next call), which the next call reuses.
static void prompt_forget(Engine *e, int rc) {
    if (rc == ER_EABORTED)
        return;
    if (e->prompt_slot >= 0)
        kv_seq_close(&e->kv, e->prompt_slot);
    e->prompt_slot = -1;
    e->n_prompt = 0;
    e->prompt_logits_valid = 0;
}

int engine_prefill(Engine *e, const int *prompt, int n_prompt, const LoraAdapter *adapter,
                   const PromptFeatureSpec *spec, float *feat, GenStats *stats) {
    double t0 = time_now();
    long fp0 = e->forward_positions;
    if (stats)
        memset(stats, 0, sizeof *stats);
    engine_release_samples(e);
    if (n_prompt < 1 || n_prompt > e->max_len)
        return er_error(ER_ERANGE, "prefill: the prompt has %d tokens, the engine holds 1..%d", n_prompt, e->max_len);
    const LoraAdapter *prompt_ad = adapter && !adapter->masked ? adapter : NULL;
    int reused;
    int rc = prompt_prefill(e, prompt, n_prompt, prompt_ad, spec, feat, &reused);
    if (rc < 0)
        prompt_forget(e, rc);
    if (stats) {
        stats->prompt_tokens = n_prompt;
        stats->prompt_reused = reused;
        stats->prefill_s = time_now() - t0;
        stats->forward_positions = e->forward_positions - fp0;
        stats->kv_bytes = kv_cache_bytes_in_use(&e->kv);
    }
    return rc;
}

int engine_verify_features(Engine *e, int sample, const int *tokens, int n, int adapter_on, float *out) {
    if (sample < 0 || sample >= e->n_kept || e->kept_slot[sample] < 0)
        return er_error(ER_EINVAL, "verify: sample %d has no KV sequence (generate with keep_kv first)", sample);
    if (n < 1)
        return er_error(ER_EINVAL, "verify: no verification tokens");
    int slot = e->kept_slot[sample], tail = e->kept_tail[sample], len0 = e->kv.seqs[slot].len;
    int total = n + (tail >= 0);
    if (len0 + total > e->max_len)
        return er_error(ER_ERANGE, "verify: the sample holds %d positions, %d more exceed the %d the engine was sized "
                        "for", len0, total, e->max_len);
    const LoraAdapter *ad = e->kept_adapter;
    int C = e->chunk < 4096 ? e->chunk : 4096, rc = ER_OK, rc2;
    uint8_t mask[4096];
    int buf[4096];
    for (int p = 0; p < total; p += C) {
        int len = total - p < C ? total - p : C;
        for (int t = 0; t < len; t++) {
            int q = p + t, is_tail = tail >= 0 && q == 0;
            buf[t] = is_tail ? tail : tokens[q - (tail >= 0)];
            // The sample's own last token is a response position like the rest of its response.
            mask[t] = is_tail ? (ad != NULL) : (adapter_on && ad != NULL);
        }
        ModelInput in = {.B = 1, .T = len, .tokens = buf, .len = &len, .adapter_mask = mask, .adapter = ad,
                         .kv = &e->kv, .kv_slots = &slot};
        ER_CHECK(model_forward(e->model, &in, &e->prefill));
        e->forward_positions += len;
    }
    const float *lnf;
    ER_CHECK(engine_download(e, e->prefill.lnf, (size_t)e->model->cfg.C, &lnf));
    memcpy(out, lnf, sizeof(float) * (size_t)e->model->cfg.C);
done: // the sample's cache back to its own length, whether or not the forward ran
    rc2 = kv_seq_truncate(&e->kv, slot, len0);
    return rc < 0 ? rc : rc2;
}

int engine_embed(Engine *e, const int *tokens, int n, int last, float *out) {
    const ModelConfig *c = &e->model->cfg;
    int C = c->C, slot, rc = ER_OK;
    if (n < 1 || n > e->max_len)
        return er_error(ER_ERANGE, "embed: %d tokens, the engine holds 1..%d", n, e->max_len);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->V)
            return er_error(ER_ERANGE, "embed: token %d is outside the vocabulary [0, %d)", tokens[i], c->V);
    engine_release_samples(e);
    ER_TRY(kv_seq_open(&e->kv, &slot));
    memset(e->feat_sum, 0, sizeof(double) * (size_t)C);
    const float *lnf = NULL;
    for (int p = 0; p < n; p += e->chunk) {
        int len = n - p < e->chunk ? n - p : e->chunk;
        ER_CHECK(engine_poll_abort(e, "prefill", p, n));
        ModelInput in = {.B = 1, .T = len, .tokens = tokens + p, .len = &len, .kv = &e->kv, .kv_slots = &slot};
        ER_CHECK(model_forward(e->model, &in, &e->prefill));
        e->forward_positions += len;
        ER_CHECK(final_hidden(e, &e->prefill, len, &lnf));
        for (int t = 0; t < len && !last; t++)
            for (int i = 0; i < C; i++)
                e->feat_sum[i] += lnf[(size_t)t * C + i];
    }
    for (int i = 0; i < C; i++)
        out[i] = last ? lnf[(size_t)((n - 1) % e->chunk) * C + i] : (float)(e->feat_sum[i] / n);
done:
    kv_seq_close(&e->kv, slot);
    return rc;
}

int engine_verify_features_all(Engine *e, const int *tokens, int n, int adapter_on, float *out) {
    int N = e->n_kept, T = n + 1, C = e->model->cfg.C, rc = ER_OK;
    if (N < 1)
        return er_error(ER_EINVAL, "verify: no kept samples (generate with keep_kv first)");
    if (n < 1)
        return er_error(ER_EINVAL, "verify: no verification tokens");
    for (int i = 0; i < N; i++) {
        if (e->kept_slot[i] < 0)
            return er_error(ER_EINVAL, "verify: sample %d has no KV sequence", i);
        int len0 = e->kv.seqs[e->kept_slot[i]].len, total = n + (e->kept_tail[i] >= 0);
        if (len0 + total > e->max_len)
            return er_error(ER_ERANGE, "verify: sample %d holds %d positions, %d more exceed the %d the engine was sized "
                            "for", i, len0, total, e->max_len);
    }
    // Sized on first use (and when longer verification prompts come): (max_samples, n + 1).
    if (!e->verify.mem || e->verify.T < T) {
        acts_free(&e->verify);
        ER_TRY(acts_alloc_on(&e->verify, e->be, &e->model->cfg, e->max_samples, T, ACTS_DECODE, 0));
    }
    int *buf = er_alloc(sizeof(int) * (size_t)N * T), *lens = er_alloc(sizeof(int) * (size_t)N);
    int *len0 = er_alloc(sizeof(int) * (size_t)N);
    uint8_t *mask = er_alloc((size_t)N * T);
    if (!buf || !lens || !len0 || !mask) {
        rc = ER_ENOMEM;
        goto done;
    }
    const LoraAdapter *ad = e->kept_adapter;
    long positions = 0;
    for (int i = 0; i < N; i++) {
        int tail = e->kept_tail[i], k = 0;
        len0[i] = e->kv.seqs[e->kept_slot[i]].len;
        if (tail >= 0) { // the sample's own last token: a response position like the rest of its response
            buf[i * T] = tail;
            mask[i * T] = ad != NULL;
            k = 1;
        }
        for (int t = 0; t < n; t++, k++) {
            buf[i * T + k] = tokens[t];
            mask[i * T + k] = adapter_on && ad != NULL;
        }
        for (int t = k; t < T; t++) { // right padding, not computed
            buf[i * T + t] = tokens[0];
            mask[i * T + t] = 0;
        }
        lens[i] = k;
        positions += k;
    }
    ModelInput in = {.B = N, .T = T, .tokens = buf, .len = lens, .adapter_mask = mask, .adapter = ad,
                     .kv = &e->kv, .kv_slots = e->kept_slot};
    rc = model_forward(e->model, &in, &e->verify);
    for (int i = 0; i < N; i++) { // every sample's cache back to its own length, whether or not the forward ran
        int rc2 = kv_seq_truncate(&e->kv, e->kept_slot[i], len0[i]);
        rc = rc < 0 ? rc : rc2;
    }
    if (rc < 0)
        goto done;
    e->forward_positions += positions;
    const float *lnf;
    ER_CHECK(engine_download(e, e->verify.lnf, (size_t)N * C, &lnf));
    memcpy(out, lnf, sizeof(float) * (size_t)N * C); // each row's last valid position
done:
    er_free(buf);
    er_free(lens);
    er_free(len0);
    er_free(mask);
    return rc;
}

static int encode(const Tokenizer *tok, const char *text, int **ids, int *n, const char *what) {
    *ids = NULL;
    *n = 0;
    if (!text || !text[0])
        return ER_OK;
    if (!tok)
        return er_error(ER_EINVAL, "generate: the %s needs a tokenizer", what);
    return tok_encode(tok, text, strlen(text), ids, n);
}

typedef struct {
    ErRng rng;
    StopMatcher stop;
    int slot;
    int tail;           // kept (GenConfig.keep_kv) and finished: its final token, not in the cache (-1: EOS)
    int live;
    int pending;        // next token to emit
    float pending_lp;
    int pending_top[ENGINE_TOP_MAX];      // GenConfig.top_logprobs most probable tokens at its step
    float pending_top_lp[ENGINE_TOP_MAX];
    int n_forced_used;  // suffix tokens already forced
    int suffix_close;   // the suffix's tokens through the one completing "</think>" (0: it holds none)
    int think_closed;   // the output holds "</think>": GenSample.think_len is final, the budget forces nothing
    int forcing;        // the budget suffix is being forced
    int pending_ends_suffix; // the pending token is the suffix's last
    long answer_raw;    // raw byte offset where the forced suffix ended (-1 = not yet)
    char *bytes;        // raw output bytes
    size_t n_bytes, cap_bytes;
    long stopped_at_bytes; // >= 0: cut here
    size_t streamed;    // raw bytes already passed to the callback
} SampleState;

// What sample i's latest token releases to the callback: the text after what it already has, up to
// where it is final. Bytes that may still become a stop string, and an incomplete UTF-8 character,
// wait; the sample's last call (done) flushes the rest. The chunks are converted as the final text
// is, so together they are exactly GenSample.text. Returns the callback's verdict (non-zero: stop).
static int stream_release(SampleState *s, int i, int tok, int done, GenTokenFn cb, void *user, int *stop) {
    size_t end;
    if (done) {
        end = s->stopped_at_bytes >= 0 ? (size_t)s->stopped_at_bytes : s->n_bytes;
    } else {
        size_t limit = s->n_bytes - stop_pending(&s->stop);
        end = limit > s->streamed ? s->streamed + tok_utf8_complete(s->bytes + s->streamed, limit - s->streamed)
                                  : s->streamed;
    }
    char *text = NULL;
    size_t len = 0;
    if (end > s->streamed)
        ER_TRY(tok_text_from_bytes(s->bytes + s->streamed, end - s->streamed, &text, &len));
    s->streamed = end;
    *stop = cb(user, i, tok, text ? text : "", len) != 0;
    er_free(text);
    return ER_OK;
}

static int push_bytes(SampleState *s, const char *b, size_t n) {
    if (s->n_bytes + n + 1 > s->cap_bytes) {
        size_t cap = (s->cap_bytes + n + 1) * 2;
        char *nb = er_realloc_array(s->bytes, cap, 1);
        if (!nb)
            return ER_ENOMEM;
        s->bytes = nb;
        s->cap_bytes = cap;
    }
    memcpy(s->bytes + s->n_bytes, b, n);
    s->n_bytes += n;
    return ER_OK;
}

// Sample s's think length after its latest (non-EOS) token, whose bytes were appended after n_before:
// "</think>" completed by it lies in the bytes from GRADE_THINK_CLOSE's length - 1 before them.
static void think_watch(SampleState *s, GenSample *o, size_t n_before) {
    if (s->think_closed)
        return;
    o->think_len = o->n_tokens;
    size_t w = strlen(GRADE_THINK_CLOSE), from = n_before >= w - 1 ? n_before - (w - 1) : 0;
    if (s->bytes && s->n_bytes > from && memmem(s->bytes + from, s->n_bytes - from, GRADE_THINK_CLOSE, w))
        s->think_closed = 1;
}

// The suffix's tokens through the one completing "</think>" (its bytes concatenated); 0 when it holds none.
static int suffix_close_tokens(const Tokenizer *tok, const int *suffix, int n_suffix, int *out) {
    *out = 0;
    size_t total = 0, nb;
    for (int i = 0; i < n_suffix; i++)
        total += tok_token_bytes(tok, suffix[i], &nb) ? nb : 0;
    char *buf = er_alloc(total + 1);
    if (!buf)
        return ER_ENOMEM;
    size_t n = 0;
    for (int i = 0; i < n_suffix && !*out; i++) {
        const char *b = tok_token_bytes(tok, suffix[i], &nb);
        if (b) {
            memcpy(buf + n, b, nb);
            n += nb;
        }
        buf[n] = 0;
        if (strstr(buf, GRADE_THINK_CLOSE))
            *out = i + 1;
    }
    er_free(buf);
    return ER_OK;
}

static int is_eos(const Engine *e, int tok) {
    return (e->tok && tok_is_eos(e->tok, tok)) || tok == e->model->cfg.eos_id;
}

// The next token of sample i from its logits row: a forced suffix token, or a sample (sp: the calling
// thread's scratch).
static int next_token(Engine *e, Sampler *sp, const GenConfig *g, SampleState *s, GenSample *o, int i,
                      const float *logits, const int *suffix, int n_suffix) {
    int V = e->model->cfg.V;
    // The budget bounds the think length: the suffix comes early enough for its "</think>" to end L at B.
    if (g->budget > 0 && !s->forcing && !s->think_closed && n_suffix > 0 &&
        o->n_tokens + s->suffix_close >= g->budget) {
        s->forcing = 1;
        o->budget_cut = 1;
    }
    if (s->forcing && s->n_forced_used < n_suffix) {
        s->pending = suffix[s->n_forced_used++];
        s->pending_ends_suffix = s->n_forced_used == n_suffix;
        logprob_forward(&s->pending_lp, logits, &s->pending, 1, V, 1.0f);
        return g->top_logprobs > 0 ? sampler_top_logprobs(sp, logits, g->top_logprobs, s->pending_top,
                                                          s->pending_top_lp)
                                   : ER_OK;
    }
    int rc = sampler_sample(sp, &g->sampler, logits, &s->rng, &s->pending, &s->pending_lp);
    if (rc == ER_OK && g->top_logprobs > 0)
        rc = sampler_top_logprobs(sp, logits, g->top_logprobs, s->pending_top, s->pending_top_lp);
    // "logits contain NaN (token 7)" names a vocabulary entry: say which sample and position too.
    return rc < 0 ? er_error_prefix(rc, "generate: sample %d, new token %d", i, o->n_tokens + 1) : ER_OK;
}

// The next tokens of the samples idx[0 .. n-1] from the logits rows (n, V), the rows split across the
// engine's samplers (on one thread, 8 rows over a 151936-token vocabulary are a tenth of a batched rollout step).
// Each sample draws from its own RNG stream, so the tokens do not depend on the split. On failure the
// error of the lowest failing row is the one reported, as a serial loop would.
static int next_tokens(Engine *e, const GenConfig *g, SampleState *st, GenSample *out, const int *idx, int n,
                       const float *logits, const int *suffix, int n_suffix) {
    size_t V = (size_t)e->model->cfg.V;
    int nt = n < e->n_samplers ? n : e->n_samplers, failed = n, failed_rc = ER_OK;
    char msg[512] = "";
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
    for (int r = 0; r < n; r++) {
        int i = idx[r];
        int rc = next_token(e, &e->samplers[omp_get_thread_num()], g, &st[i], &out[i], i, logits + (size_t)r * V,
                            suffix, n_suffix);
        if (rc < 0) {
            // Unnamed: a named critical section's lock is a global symbol of the library (.gomp_critical_user_*),
            // which the shipped liberinfer exports to no one (scripts/check_symbols.py).
#pragma omp critical
            if (r < failed) {
                failed = r;
                failed_rc = rc;
                snprintf(msg, sizeof msg, "%s", er_last_error()); // the error string is per thread
            }
        }
    }
    return failed < n ? er_error(failed_rc, "%s", msg) : ER_OK;
}

static int check_config(const Engine *e, const GenConfig *g, int n_prompt, int n_prefix, int n_suffix, int extra) {
    if (g->n_samples < 1 || g->n_samples > e->max_samples)
        return er_error(ER_EINVAL, "generate: %d samples requested, the engine holds 1..%d", g->n_samples,
                        e->max_samples);
    if (g->max_new < 1)
        return er_error(ER_EINVAL, "generate: max new tokens must be at least 1");
    if (n_prompt < 1)
        return er_error(ER_EINVAL, "generate: the prompt is empty");
    if ((long)n_prompt + n_prefix + g->max_new + extra > e->max_len)
        return er_error(ER_ERANGE, "generate: prompt (%d) + prefix (%d) + max new tokens (%d)%s exceed the %d positions "
                        "the engine was sized for", n_prompt, n_prefix, g->max_new,
                        extra ? " + the verifier's prompt" : "", e->max_len);
    if (g->budget < 0 || g->answer_tokens < 0)
        return er_error(ER_EINVAL, "generate: budget and answer tokens must not be negative");
    if (g->budget > 0 && (long)g->max_new < (long)g->budget + g->answer_tokens)
        return er_error(ER_EINVAL, "generate: the budget of %d tokens and its %d answer tokens need %ld new tokens, "
                        "more than the %d allowed (raise max new tokens or lower the budget)", g->budget,
                        g->answer_tokens, (long)g->budget + g->answer_tokens, g->max_new);
    if (g->budget > 0 && g->answer_tokens <= n_suffix)
        return er_error(ER_EINVAL, "generate: the answer allowance (%d tokens) must exceed the forced suffix (%d tokens)",
                        g->answer_tokens, n_suffix);
    if (g->n_stop < 0 || g->n_stop > STOP_MAX)
        return er_error(ER_EINVAL, "generate: at most %d stop strings", STOP_MAX);
    if (g->top_logprobs < 0 || g->top_logprobs > ENGINE_TOP_MAX || g->top_logprobs > e->model->cfg.V)
        return er_error(ER_EINVAL, "generate: top log-probs %d, expected 0..%d (and at most the vocabulary)",
                        g->top_logprobs, ENGINE_TOP_MAX);
    return sampler_params_validate(&g->sampler);
}

// Encodes the response prefix and budget suffix and checks the request (extra: positions appended to
// each sample afterwards); on failure nothing is held.
static int gen_prepare(const Engine *e, const GenConfig *g, int n_prompt, int extra, int **prefix, int *n_prefix,
                       int **suffix, int *n_suffix) {
    int rc = ER_OK;
    *suffix = NULL;
    *n_suffix = 0;
    ER_CHECK(encode(e->tok, g->response_prefix, prefix, n_prefix, "response prefix"));
    if (g->budget > 0)
        ER_CHECK(encode(e->tok, g->budget_suffix ? g->budget_suffix : DEFAULT_BUDGET_SUFFIX, suffix, n_suffix,
                        "budget suffix"));
    ER_CHECK(check_config(e, g, n_prompt, *n_prefix, *n_suffix, extra));
    int close = 0;
    if (*n_suffix > 0)
        ER_CHECK(suffix_close_tokens(e->tok, *suffix, *n_suffix, &close));
    if (g->budget > 0 && g->budget < close)
        ER_CHECK(er_error(ER_EINVAL, "generate: a budget of %d tokens cannot hold the forced suffix's %d tokens "
                          "through \"</think>\" (raise the budget)", g->budget, close));
done:
    if (rc < 0) {
        er_free(*prefix);
        er_free(*suffix);
        *prefix = *suffix = NULL;
    }
    return rc;
}

int engine_check_generation(const Engine *e, const GenConfig *g, int n_prompt, int extra) {
    int *prefix, *suffix, n_prefix, n_suffix;
    ER_TRY(gen_prepare(e, g, n_prompt, extra, &prefix, &n_prefix, &suffix, &n_suffix));
    er_free(prefix);
    er_free(suffix);
    return ER_OK;
}

// engine_generate's per-call buffers.
typedef struct {
    SampleState *st;                      // (N)
    int *rows_tok, *rows_slot, *rows_idx; // (N) one decode step's batch: token, KV slot, sample
    uint8_t *mask;                        // (N)
} GenBatch;

// 2. Samples fork the prompt sequence: its blocks are shared, not copied. Each gets its RNG stream,
// its stop matcher, its output buffers and its first token, from the prompt's logits.
static int samples_start(Engine *e, const GenConfig *g, SampleState *st, GenSample *out, const int *suffix,
                         int n_suffix) {
    ErRng base;
    rng_seed(&base, g->seed);
    int close = 0;
    if (n_suffix > 0)
        ER_TRY(suffix_close_tokens(e->tok, suffix, n_suffix, &close));
    for (int i = 0; i < g->n_samples; i++) {
        SampleState *s = &st[i];
        s->stopped_at_bytes = -1;
        s->answer_raw = -1;
        s->suffix_close = close;
        s->think_closed = grade_think_closes(g->response_prefix); // thinking off: L stays 0, nothing forced
        rng_fork(&s->rng, &base, (uint64_t)i);
        ER_TRY(stop_init(&s->stop, g->stop, g->n_stop));
        ER_TRY(kv_seq_fork(&e->kv, e->prompt_slot, &s->slot));
        out[i].tokens = er_alloc(sizeof(int) * (size_t)g->max_new);
        out[i].logprobs = er_alloc(sizeof(float) * (size_t)g->max_new);
        if (!out[i].tokens || !out[i].logprobs)
            return ER_ENOMEM;
        if ((out[i].n_top = g->top_logprobs) > 0) {
            out[i].top_ids = er_alloc(sizeof(int) * (size_t)g->max_new * (size_t)g->top_logprobs);
            out[i].top_logprobs = er_alloc(sizeof(float) * (size_t)g->max_new * (size_t)g->top_logprobs);
            if (!out[i].top_ids || !out[i].top_logprobs)
                return ER_ENOMEM;
        }
        ER_TRY(next_token(e, &e->samplers[0], g, s, &out[i], i, e->prompt_logits, suffix, n_suffix));
        s->live = 1;
    }
    return ER_OK;
}

// Emits sample i's pending token: appends it, checks EOS, the stop strings and the length limit, and
// streams it. *done when the sample has finished: its KV sequence is then kept (samples_keep hands
// it to the engine) or closed.
static int sample_emit(Engine *e, const GenConfig *g, SampleState *s, GenSample *o, int i, int max_total,
                       GenTokenFn cb, void *user, int *done) {
    int tok = s->pending;
    o->tokens[o->n_tokens] = tok;
    o->logprobs[o->n_tokens] = s->pending_lp;
    if (o->n_top > 0) {
        memcpy(o->top_ids + (size_t)o->n_tokens * (size_t)o->n_top, s->pending_top, sizeof(int) * (size_t)o->n_top);
        memcpy(o->top_logprobs + (size_t)o->n_tokens * (size_t)o->n_top, s->pending_top_lp,
               sizeof(float) * (size_t)o->n_top);
    }
    o->n_tokens++;
    *done = 0;
    if (is_eos(e, tok)) {
        o->finish = FINISH_EOS;
        *done = 1;
    } else if (!e->tok) {
        think_watch(s, o, 0); // no bytes: every token counts
    } else {
        size_t nb = 0, n_before = s->n_bytes;
        const char *b = tok_token_bytes(e->tok, tok, &nb);
        if (!b)
            b = "", nb = 0;
        ER_TRY(push_bytes(s, b, nb));
        think_watch(s, o, n_before);
        if (s->pending_ends_suffix) {
            s->answer_raw = (long)s->n_bytes;
            s->pending_ends_suffix = 0;
        }
        size_t at;
        if (stop_feed(&s->stop, b, nb, &at) == 1) {
            s->stopped_at_bytes = (long)at;
            o->finish = FINISH_STOP;
            *done = 1;
        }
    }
    if (!*done && o->n_tokens >= max_total) {
        o->finish = FINISH_LENGTH;
        *done = 1;
    }
    int user_stop = 0;
    if (cb)
        ER_TRY(stream_release(s, i, tok, *done, cb, user, &user_stop));
    if (user_stop && !*done) { // the text ends where the caller stopped reading
        o->finish = FINISH_STOP;
        s->stopped_at_bytes = (long)s->streamed;
        *done = 1;
    }
    if (*done) {
        s->live = 0;
        if (g->keep_kv) { // the final token is not in the cache yet (an EOS never will be)
            s->tail = is_eos(e, tok) ? -1 : tok;
        } else {
            kv_seq_close(&e->kv, s->slot);
            s->slot = -1;
        }
    }
    return ER_OK;
}

// The finished samples' KV sequences (GenConfig.keep_kv) become the engine's kept samples, replacing
// the ones kept before.
static void samples_keep(Engine *e, const GenConfig *g, SampleState *st) {
    engine_release_samples(e);
    for (int i = 0; i < g->n_samples; i++) {
        e->kept_slot[i] = st[i].slot;
        e->kept_tail[i] = st[i].tail;
        st[i].slot = -1;
    }
    e->n_kept = g->n_samples;
    e->kept_adapter = g->adapter;
}

// Tokens per sample: max_new, or the budget and its answer allowance when they are fewer.
static int gen_max_total(const GenConfig *g) {
    return g->budget > 0 && g->budget + g->answer_tokens < g->max_new ? g->budget + g->answer_tokens : g->max_new;
}

// 3. Batched decode: emit each live sample's pending token, then one forward for all of them.
static int samples_decode(Engine *e, const GenConfig *g, GenBatch *b, GenSample *out, const int *suffix,
                          int n_suffix, GenTokenFn cb, void *user, double t0, GenStats *stats) {
    int N = g->n_samples, first = 1;
    int max_total = gen_max_total(g);
    for (;;) {
        int B = 0;
        for (int i = 0; i < N; i++) {
            SampleState *s = &b->st[i];
            if (!s->live)
                continue;
            if (first) {
                stats->ttft_s = time_now() - t0;
                first = 0;
            }
            int tok = s->pending, done;
            ER_TRY(sample_emit(e, g, s, &out[i], i, max_total, cb, user, &done));
            if (done)
                continue;
            b->rows_tok[B] = tok;
            b->rows_slot[B] = s->slot;
            b->rows_idx[B] = i;
            b->mask[B] = 1;
            B++;
        }
        if (B == 0)
            return ER_OK;
        ER_TRY(engine_poll_abort(e, "decode", out[b->rows_idx[0]].n_tokens, max_total));
        ModelInput in = {.B = B, .T = 1, .tokens = b->rows_tok, .adapter_mask = b->mask, .adapter = g->adapter,
                         .kv = &e->kv, .kv_slots = b->rows_slot};
        ER_TRY(model_forward(e->model, &in, &e->decode));
        e->forward_positions += B;
        size_t used = kv_cache_bytes_in_use(&e->kv);
        if (used > stats->kv_bytes)
            stats->kv_bytes = used;
        const float *logits;
        ER_TRY(engine_download(e, e->decode.logits, (size_t)B * e->model->cfg.V, &logits));
        ER_TRY(next_tokens(e, g, b->st, out, b->rows_idx, B, logits, suffix, n_suffix));
    }
}

// 4. Texts: raw bytes cut at a stop string, made valid UTF-8; where the forced answer starts in it.
static int samples_text(const SampleState *st, GenSample *out, int N) {
    for (int i = 0; i < N; i++) {
        const SampleState *s = &st[i];
        out[i].answer_at = -1;
        size_t n = s->stopped_at_bytes >= 0 ? (size_t)s->stopped_at_bytes : s->n_bytes;
        ER_TRY(tok_text_from_bytes(s->bytes ? s->bytes : "", n, &out[i].text, &out[i].text_len));
        if (s->answer_raw >= 0 && (size_t)s->answer_raw <= n) {
            // The suffix is valid UTF-8 (tok_encode accepted it): its end is a boundary of the repaired text.
            char *head;
            size_t len;
            ER_TRY(tok_text_from_bytes(s->bytes, (size_t)s->answer_raw, &head, &len));
            er_free(head);
            out[i].answer_at = (long)len;
        }
    }
    return ER_OK;
}

int engine_generate(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
                    GenSample *out, GenStats *stats) {
    double t0 = time_now();
    memset(stats, 0, sizeof *stats);
    int *prefix, *suffix, n_prefix, n_suffix;
    ER_TRY(gen_prepare(e, g, n_prompt, 0, &prefix, &n_prefix, &suffix, &n_suffix));
    int rc = ER_OK, N = g->n_samples;
    memset(out, 0, sizeof(GenSample) * (size_t)N);
    long fp0 = e->forward_positions;
    engine_release_samples(e);
    GenBatch b = {er_calloc((size_t)N, sizeof(SampleState)), er_alloc(sizeof(int) * (size_t)N),
                  er_alloc(sizeof(int) * (size_t)N), er_alloc(sizeof(int) * (size_t)N), er_alloc((size_t)N)};
    for (int i = 0; b.st && i < N; i++)
        b.st[i].slot = -1; // no KV sequence yet
    if (!b.st || !b.rows_tok || !b.rows_slot || !b.rows_idx || !b.mask) {
        rc = ER_ENOMEM;
        goto done;
    }

    // 1. Prompt (see prompt_prefill).
    const LoraAdapter *prompt_ad = g->adapter && !g->adapter->masked ? g->adapter : NULL;
    int reuse = 0;
    ER_CHECK(prompt_prefill(e, prompt, n_prompt, prompt_ad, NULL, NULL, &reuse));
    // The response prefix is a response position (adapter on), shared by every sample.
    if (n_prefix > 0) {
        e->prompt_logits_valid = 0;
        ER_CHECK(prefill(e, prefix, n_prefix, 1, g->adapter, NULL, NULL, 0));
    }
    stats->prompt_tokens = n_prompt;
    stats->prompt_reused = reuse;
    stats->prefill_s = time_now() - t0;

    ER_CHECK(samples_start(e, g, b.st, out, suffix, n_suffix));
    double t_decode = time_now();
    rc = samples_decode(e, g, &b, out, suffix, n_suffix, cb, user, t0, stats);
    stats->decode_s = time_now() - t_decode;
    ER_CHECK(rc);
    ER_CHECK(samples_text(b.st, out, N));
    if (g->keep_kv)
        samples_keep(e, g, b.st);
done:
    for (int i = 0; b.st && i < N; i++) {
        stats->generated_tokens += out[i].n_tokens;
        if (b.st[i].slot >= 0)
            kv_seq_close(&e->kv, b.st[i].slot);
        er_free(b.st[i].bytes);
    }
    stats->forward_positions = e->forward_positions - fp0;
    // Each sample's first token comes from the prompt pass; the decode rate counts the others.
    long decoded = stats->generated_tokens - N;
    stats->decode_tokens_per_s = stats->decode_s > 0 && decoded > 0 ? decoded / stats->decode_s : 0;
    if (stats->kv_bytes == 0)
        stats->kv_bytes = kv_cache_bytes_in_use(&e->kv);
    er_free(b.st);
    er_free(b.rows_tok);
    er_free(b.rows_slot);
    er_free(b.rows_idx);
    er_free(b.mask);
    er_free(prefix);
    er_free(suffix);
    if (rc < 0) {
        engine_release_samples(e);
        gen_samples_free(out, N);
        prompt_forget(e, rc);
    }
    return rc;
}

// ---- requests decoded step by step, several in one forward (infer/decode_batch.h) ----

// engine_generate cut at its forward: the same prefill, sample start, emit and next-token steps,
// with the forward over the rows of every live request left to the caller.
struct EngineRequest {
    GenConfig g;
    GenBatch b;          // b.st: the samples; b.rows_idx: the sample of each row this step
    GenSample *out;
    int *suffix, n_suffix;
    int max_total;       // tokens per sample, the budget's answer allowance included
    int n_rows;          // rows given to the current step
    GenTokenFn cb;
    void *user;
    int rc;              // the first failure: its samples stop, the other requests go on
    double t0, t_decode;
    GenStats stats;
};

static void request_release(Engine *e, EngineRequest *r) {
    for (int i = 0; r->b.st && i < r->g.n_samples; i++) {
        r->stats.generated_tokens += r->out[i].n_tokens;
        if (r->b.st[i].slot >= 0)
            kv_seq_close(&e->kv, r->b.st[i].slot);
        er_free(r->b.st[i].bytes);
    }
    er_free(r->b.st);
    er_free(r->b.rows_idx);
    er_free(r->suffix);
    memset(&r->b, 0, sizeof r->b);
    r->suffix = NULL;
}

int engine_request_begin(Engine *e, const int *prompt, int n_prompt, const GenConfig *g, GenTokenFn cb, void *user,
                         GenSample *out, EngineRequest **req) {
    *req = NULL;
    int *prefix = NULL, n_prefix, rc = ER_OK;
    EngineRequest *r = er_calloc(1, sizeof *r);
    if (!r)
        return ER_ENOMEM;
    r->t0 = time_now();
    long fp0 = e->forward_positions;
    r->g = *g;
    r->out = out;
    r->cb = cb;
    r->user = user;
    int N = g->n_samples;
    memset(out, 0, sizeof(GenSample) * (size_t)(N > 0 ? N : 0));
    ER_CHECK(gen_prepare(e, g, n_prompt, 0, &prefix, &n_prefix, &r->suffix, &r->n_suffix));
    r->max_total = gen_max_total(g);
    r->b.st = er_calloc((size_t)N, sizeof(SampleState));
    r->b.rows_idx = er_alloc(sizeof(int) * (size_t)N);
    if (!r->b.st || !r->b.rows_idx)
        ER_CHECK(ER_ENOMEM);
    for (int i = 0; i < N; i++)
        r->b.st[i].slot = -1;
    // The prompt reuses what the engine's prompt sequence holds (the last admitted request's prompt);
    // the samples fork it, so the next request may rewrite it while these decode.
    int reuse;
    ER_CHECK(prompt_prefill(e, prompt, n_prompt, g->adapter && !g->adapter->masked ? g->adapter : NULL, NULL, NULL,
                            &reuse));
    r->stats.prompt_tokens = n_prompt;
    r->stats.prompt_reused = reuse;
    if (n_prefix > 0) { // the response prefix: response positions, adapter on
        e->prompt_logits_valid = 0;
        ER_CHECK(prefill(e, prefix, n_prefix, 1, g->adapter, NULL, NULL, 0));
    }
    r->stats.forward_positions = e->forward_positions - fp0;
    r->stats.prefill_s = time_now() - r->t0;
    ER_CHECK(samples_start(e, g, r->b.st, out, r->suffix, r->n_suffix));
    r->t_decode = time_now();
    r->g.stop = NULL; // the caller's strings: read above only (the matchers hold copies)
    r->g.n_stop = 0;
    r->g.response_prefix = r->g.budget_suffix = NULL;
    *req = r;
    r = NULL;
done:
    er_free(prefix);
    if (r) {
        request_release(e, r);
        er_free(r);
        gen_samples_free(out, N);
        prompt_forget(e, rc);
    }
    return rc;
}

int engine_request_rows(Engine *e, EngineRequest *r, int *tokens, int *slots, uint8_t *mask) {
    r->n_rows = 0;
    for (int i = 0; r->rc == ER_OK && i < r->g.n_samples; i++) {
        SampleState *s = &r->b.st[i];
        if (!s->live)
            continue;
        if (r->stats.ttft_s == 0)
            r->stats.ttft_s = time_now() - r->t0;
        int tok = s->pending, done;
        r->rc = sample_emit(e, &r->g, s, &r->out[i], i, r->max_total, r->cb, r->user, &done);
        if (r->rc < 0 || done)
            continue;
        tokens[r->n_rows] = tok;
        slots[r->n_rows] = s->slot;
        mask[r->n_rows] = r->g.adapter != NULL;
        r->b.rows_idx[r->n_rows++] = i;
    }
    if (r->rc < 0)
        r->n_rows = 0;
    r->stats.forward_positions += r->n_rows;
    return r->n_rows;
}

void engine_request_accept(Engine *e, EngineRequest *r, const float *logits) {
    if (r->rc == ER_OK)
        r->rc = next_tokens(e, &r->g, r->b.st, r->out, r->b.rows_idx, r->n_rows, logits, r->suffix, r->n_suffix);
    r->n_rows = 0;
}

int engine_request_samples(const EngineRequest *r) { return r->g.n_samples; }
int engine_request_pending_rows(const EngineRequest *r) { return r->n_rows; }

void engine_request_fail(EngineRequest *r, int rc) {
    if (r->rc == ER_OK)
        r->rc = rc;
    r->n_rows = 0;
}

int engine_request_done(const EngineRequest *r) {
    if (r->rc < 0)
        return 1;
    for (int i = 0; i < r->g.n_samples; i++)
        if (r->b.st[i].live)
            return 0;
    return 1;
}

int engine_request_end(Engine *e, EngineRequest *r, GenStats *stats) {
    int N = r->g.n_samples, rc = r->rc;
    if (rc == ER_OK)
        rc = samples_text(r->b.st, r->out, N);
    if (rc == ER_OK && r->g.keep_kv && engine_request_done(r))
        samples_keep(e, &r->g, r->b.st);
    r->stats.decode_s = time_now() - r->t_decode;
    request_release(e, r); // counts the generated tokens
    long decoded = r->stats.generated_tokens - N;
    r->stats.decode_tokens_per_s = r->stats.decode_s > 0 && decoded > 0 ? decoded / r->stats.decode_s : 0;
    r->stats.kv_bytes = kv_cache_bytes_in_use(&e->kv);
    if (stats)
        *stats = r->stats;
    if (rc < 0)
        gen_samples_free(r->out, N);
    er_free(r);
    return rc;
}
