// THE forward (and its backward). One pass takes B sequences x T new positions, a per-position
// adapter mask and a keeper: Activations that keep every layer (training), only each layer's input
// (training with recomputation) or one reused layer (forward-only scoring). Every op runs through the
// backend the activations were allocated on (model/backend.h); the host only places the pass's inputs.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/threads.h"
#include "model/backend.h"
#include "model/model.h"
#include "model/ops.h"

// ---- activations ----

typedef struct {
    size_t layer, global, backward;
} ActsSize; // in floats

// The widest input of any matrix: C, NH*HS (o_proj) or FF (down_proj).
static int max_in(const ModelConfig *c) {
    int w = c->FF > c->NH * c->HS ? c->FF : c->NH * c->HS;
    return w > c->C ? w : c->C;
}

// Keys one query may see: the pass's own T, or any cached position below max_position_embeddings.
static int attn_keys(const ModelConfig *c, int T) { return T > c->max_pos ? T : c->max_pos; }

// The rows of logits a pass keeps: B for decoding, a chunk of the N = B*T rows for a loss-only pass
// (ACTS_LOSS_CHUNK_FLOATS, at least one row, at most N), else all N.
static size_t logits_rows(const ModelConfig *c, int B, int T, ActsMode mode) {
    size_t N = (size_t)B * T;
    if (mode & ACTS_LOSS_ONLY) {
        size_t rows = ACTS_LOSS_CHUNK_FLOATS / (size_t)c->V;
        return rows < 1 ? 1 : rows > N ? N : rows;
    }
    return mode == ACTS_DECODE ? (size_t)B : N;
}

static ActsSize acts_size(const ModelConfig *c, int B, int T, ActsMode mode) {
    size_t N = (size_t)B * T, C = c->C, qd = (size_t)c->NH * c->HS, kvd = (size_t)c->NKV * c->HS, FF = c->FF;
    ActsSize s;
    size_t qkn = c->arch == ARCH_QWEN3; // Qwen3's q/k norms
    // res ln1 rstd1 q k v lse atty res2 ln2 rstd2 gate up hmlp, Qwen3: qr kr rstdq rstdk
    s.layer = N * C * 4 + N * 2 + N * qd * 2 + N * kvd * 2 + N * c->NH + N * FF * 3 +
              qkn * (N * qd + N * kvd + N * c->NH + N * c->NKV);
    // resf lnf rstdf logits tmp wscratch scores row_loss (N doubles); the pass's inputs on the backend:
    // tokens targets mask adapter-mask (N bytes, counted as floats) positions
    s.global = N * C * 3 + N + logits_rows(c, B, T, mode) * (size_t)c->V + quant_scratch_floats(max_in(c)) +
               (size_t)threads_get() * (c->NH / c->NKV) * attn_keys(c, T) + 2 * N + 5 * N;
    // dres dln dq dk dv datty dgate dup dh dkh dvh, Qwen3: dqr dkr
    s.backward = N * C * 2 + N * qd * 4 + N * kvd * 2 + N * FF * 3 + qkn * (N * qd + N * kvd);
    return s;
}

size_t acts_bytes(const ModelConfig *cfg, int B, int T, ActsMode mode) {
    ActsSize s = acts_size(cfg, B, T, mode);
    size_t floats = s.layer + s.global;
    mode &= ~ACTS_LOSS_ONLY;
    if (mode == ACTS_TRAIN) // every layer's intermediates
        floats += s.layer * (cfg->L - 1) + s.backward;
    if (mode == ACTS_TRAIN_RECOMPUTE) // one layer's, and each layer's input
        floats += (size_t)B * T * cfg->C * cfg->L + s.backward;
    return floats * sizeof(float);
}

static float *take(float **p, size_t n) {
    float *r = *p;
    *p += (n + 15) & ~(size_t)15; // keep every buffer 64-byte aligned
    return r;
}

int acts_alloc(Activations *a, const ModelConfig *cfg, int B, int T, ActsMode mode, size_t max_bytes) {
    return acts_alloc_on(a, backend_cpu(), cfg, B, T, mode, max_bytes);
}

// One layer's buffers for N positions; train: the residual after attention kept apart from the input.
static void take_layer(LayerActs *la, float **p, size_t N, const ModelConfig *cfg, int train) {
    size_t C = cfg->C, qd = (size_t)cfg->NH * cfg->HS, kvd = (size_t)cfg->NKV * cfg->HS, FF = cfg->FF;
    la->res = take(p, N * C);
    la->ln1 = take(p, N * C);
    la->rstd1 = take(p, N);
    la->q = take(p, N * qd);
    la->k = take(p, N * kvd);
    la->v = take(p, N * kvd);
    la->lse = take(p, N * cfg->NH);
    la->atty = take(p, N * qd);
    la->res2 = train ? take(p, N * C) : la->res; // forward-only: the residual is updated in place
    la->ln2 = take(p, N * C);
    la->rstd2 = take(p, N);
    la->gate = take(p, N * FF);
    la->up = take(p, N * FF);
    la->hmlp = take(p, N * FF);
    size_t qkn = cfg->arch == ARCH_QWEN3;
    la->qr = train ? take(p, qkn * N * qd) : la->q; // forward-only: q and k are normalised in place
    la->kr = train ? take(p, qkn * N * kvd) : la->k;
    la->rstdq = take(p, qkn * N * cfg->NH);
    la->rstdk = take(p, qkn * N * cfg->NKV);
}

int acts_alloc_on(Activations *a, Backend *be, const ModelConfig *cfg, int B, int T, ActsMode mode,
                  size_t max_bytes) {
    memset(a, 0, sizeof *a);
    if (B <= 0 || T <= 0)
        return er_error(ER_EINVAL, "activations: batch %d x %d positions is empty", B, T);
    ActsMode flags = mode;
    mode &= ~ACTS_LOSS_ONLY;
    if ((flags & ACTS_LOSS_ONLY) && mode != ACTS_TRAIN && mode != ACTS_TRAIN_RECOMPUTE && mode != ACTS_SCORE)
        return er_error(ER_EINVAL, "activations: a decode pass keeps one row's logits; it has no loss-only form");
    int recompute = mode == ACTS_TRAIN_RECOMPUTE, train = mode == ACTS_TRAIN || recompute;
    int keep = train && !recompute;
    size_t bytes = acts_bytes(cfg, B, T, flags);
    int nbuf = 18 * (keep ? cfg->L : 1) + 8 + 13 + 5 + 1;
    bytes += (size_t)nbuf * 64;
    if (max_bytes && bytes > max_bytes)
        return er_error(ER_ENOMEM, "activations for %d x %d positions need %.1f MiB, more than the %.1f MiB allowed", B, T,
                        bytes / 1048576.0, max_bytes / 1048576.0);
    a->be = be;
    a->cfg = *cfg;
    a->B = B;
    a->T = T;
    a->mode = train ? ACTS_TRAIN : mode;
    a->recompute = recompute;
    a->loss_only = (flags & ACTS_LOSS_ONLY) != 0;
    a->bytes = bytes;
    a->mem = be->ops->alloc(be, bytes);
    int nl = keep ? cfg->L : 1;
    a->layer = er_calloc((size_t)nl, sizeof(LayerActs));
    a->pos = er_alloc(((size_t)B * T + B) * sizeof(int));
    a->pos0 = a->pos ? a->pos + (size_t)B * T : NULL;
    if (!a->mem || !a->layer || !a->pos) {
        acts_free(a);
        return er_error(ER_ENOMEM, "activations: cannot allocate %.1f MiB for %d x %d positions", bytes / 1048576.0, B, T);
    }
    size_t N = (size_t)B * T, C = cfg->C, qd = (size_t)cfg->NH * cfg->HS, kvd = (size_t)cfg->NKV * cfg->HS, FF = cfg->FF;
    float *p = a->mem;
    for (int l = 0; l < nl; l++)
        take_layer(&a->layer[l], &p, N, cfg, train);
    if (recompute)
        a->layer_in = take(&p, N * C * cfg->L);
    a->resf = train ? take(&p, N * C) : a->layer[0].res;
    a->lnf = take(&p, N * C);
    a->rstdf = take(&p, N);
    size_t lrows = logits_rows(cfg, B, T, flags);
    if (a->loss_only) { // the logits exist a chunk at a time, inside model_loss
        a->loss_rows = (int)lrows;
        a->loss_chunk = take(&p, lrows * (size_t)cfg->V);
    } else {
        a->logits = take(&p, lrows * (size_t)cfg->V);
    }
    a->tmp = take(&p, N * C);
    a->wscratch = take(&p, quant_scratch_floats(max_in(cfg)));
    a->attn_threads = threads_get();
    a->attn_keys = attn_keys(cfg, T);
    a->scores = take(&p, (size_t)a->attn_threads * (cfg->NH / cfg->NKV) * a->attn_keys);
    a->row_loss = (double *)take(&p, 2 * N);
    if (train) {
        a->dres = take(&p, N * C);
        a->dln = take(&p, N * C);
        a->dq = take(&p, N * qd);
        a->dk = take(&p, N * kvd);
        a->dv = take(&p, N * kvd);
        a->datty = take(&p, N * qd);
        a->dgate = take(&p, N * FF);
        a->dup = take(&p, N * FF);
        a->dh = take(&p, N * FF);
        a->dkh = take(&p, N * qd);
        a->dvh = take(&p, N * qd);
        size_t qkn = cfg->arch == ARCH_QWEN3;
        a->dqr = take(&p, qkn * N * qd);
        a->dkr = take(&p, qkn * N * kvd);
    }
    a->tokens_buf = (int *)take(&p, N);
    a->targets_buf = (int *)take(&p, N);
    a->mask_buf = take(&p, N);
    a->amask_buf = (uint8_t *)take(&p, N);
    a->pos_buf = (int *)take(&p, N);
    return ER_OK;
}

int acts_set_loss_rows(Activations *a, int rows) {
    if (!a->loss_only)
        return er_error(ER_EINVAL, "activations: not sized loss-only (ACTS_LOSS_ONLY)");
    if (rows < 1 || rows > a->loss_rows)
        return er_error(ER_EINVAL, "activations: a loss chunk of %d rows (expected 1..%d)", rows, a->loss_rows);
    a->loss_rows = rows;
    return ER_OK;
}

void acts_free(Activations *a) {
    if (a->be) {
        Backend *be = a->be;
        be->ops->free(be, a->lora_h);
        be->ops->free(be, a->lora_dh);
        be->ops->free(be, a->lora_x);
        be->ops->free(be, a->lora_keep);
        be->ops->free(be, a->lora_dx);
        be->ops->free(be, a->mem);
        be->ops->free(be, a->cos_tab);
        be->ops->free(be, a->sin_tab);
        be->ops->free(be, a->kv_buf);
    }
    er_free(a->layer);
    er_free(a->pos);
    er_free(a->kv_host);
    memset(a, 0, sizeof *a);
}

// Copies n bytes of a host input into the pass's buffer for it on the backend.
static int acts_put(const Activations *a, void *dst, const void *host, size_t n) {
    return a->be->ops->upload(a->be, dst, host, n);
}

// Another backend's tables: computed on the host (in double, as the CPU's are), then placed.
static int rope_tables_put(Activations *a, int P, size_t bytes) {
    int rc = ER_OK;
    float *cos_host = er_alloc(2 * bytes);
    if (!cos_host)
        return ER_ENOMEM;
    float *sin_host = cos_host + bytes / sizeof(float);
    rope_tables(cos_host, sin_host, P, a->cfg.HS, a->cfg.rope_theta);
    ER_CHECK(acts_put(a, a->cos_tab, cos_host, bytes));
    ER_CHECK(acts_put(a, a->sin_tab, sin_host, bytes));
done:
    er_free(cos_host);
    return rc;
}

static int ensure_rope(Activations *a, int P) {
    if (P <= a->P)
        return ER_OK;
    // Grow geometrically: decoding asks for one more position every step.
    if (P < 2 * a->P)
        P = 2 * a->P;
    if (P < 256)
        P = 256;
    Backend *be = a->be;
    size_t bytes = (size_t)P * (a->cfg.HS / 2) * sizeof(float);
    be->ops->free(be, a->cos_tab);
    be->ops->free(be, a->sin_tab);
    a->P = 0;
    a->cos_tab = be->ops->alloc(be, bytes);
    a->sin_tab = be->ops->alloc(be, bytes);
    if (!a->cos_tab || !a->sin_tab)
        return ER_ENOMEM;
    if (be->kind == BACKEND_CPU)
        rope_tables(a->cos_tab, a->sin_tab, P, a->cfg.HS, a->cfg.rope_theta);
    else
        ER_TRY(rope_tables_put(a, P, bytes));
    a->P = P;
    return ER_OK;
}

// ---- linear layers, with the masked adapter ----

// Adapter buffers sized for this pass's adapter (rank r; inputs kept after dropout when training).
static int ensure_lora_acts(Activations *a, const LoraAdapter *ad, int train) {
    Backend *be = a->be;
    int nl = a->mode == ACTS_TRAIN && !a->recompute ? a->cfg.L : 1;
    size_t N = (size_t)a->B * a->T;
    if (a->lora_r != ad->r) {
        be->ops->free(be, a->lora_h);
        be->ops->free(be, a->lora_dh);
        a->lora_h = be->ops->alloc(be, sizeof(float) * (size_t)nl * LT_COUNT * N * ad->r);
        a->lora_dh = be->ops->alloc(be, sizeof(float) * N * ad->r);
        a->lora_r = a->lora_h && a->lora_dh ? ad->r : 0;
        if (!a->lora_r)
            return ER_ENOMEM;
    }
    int xw = max_in(&a->cfg);
    if (train && ad->dropout > 0 && !a->lora_xw) {
        if (be->kind != BACKEND_CPU) // the keep masks are drawn on the host, from the pass's stream
            return er_error(ER_EUNSUPPORTED, "forward: adapter dropout runs on the CPU backend only, not on %s",
                            be->name);
        a->lora_x = er_alloc(sizeof(float) * (size_t)nl * LT_COUNT * N * xw);
        a->lora_keep = er_alloc((size_t)nl * LT_COUNT * N * xw);
        a->lora_dx = er_alloc(sizeof(float) * N * xw);
        if (!a->lora_x || !a->lora_keep || !a->lora_dx) { // all or none, so a later call tries again
            er_free(a->lora_x);
            er_free(a->lora_keep);
            er_free(a->lora_dx);
            a->lora_x = a->lora_dx = NULL;
            a->lora_keep = NULL;
            return ER_ENOMEM;
        }
        a->lora_xw = xw;
    }
    return ER_OK;
}

// Everything one linear layer needs to find its adapter and its kept adapter activations.
typedef struct {
    const ModelInput *in;
    Activations *a;
    int l;
    int train; // dropout applies
} LinCtx;

static const LoraMat *lin_lora(const LinCtx *lc, LoraTarget t, float **h, float **xd, uint8_t **keep) {
    const LoraAdapter *ad = lc->in->adapter;
    if (!ad)
        return NULL;
    const LoraMat *m = lora_mat(ad, lc->l, t);
    if (!m)
        return NULL;
    size_t N = (size_t)lc->in->B * lc->in->T, slot = (size_t)(lc->a->mode == ACTS_TRAIN && !lc->a->recompute ? lc->l : 0) * LT_COUNT + t;
    *h = lc->a->lora_h + slot * N * ad->r;
    *xd = lc->a->lora_x && lc->train ? lc->a->lora_x + slot * N * lc->a->lora_xw : NULL;
    *keep = *xd ? lc->a->lora_keep + slot * N * lc->a->lora_xw : NULL;
    return m;
}

// The products' flags: inference passes (ACTS_DECODE: prefill and decode) run the prompt's products on int8 inputs
// where the format has such kernels; training and scoring keep the exact product on fp32 inputs.
static int product_flags(const Activations *a) { return a->mode == ACTS_DECODE ? QUANT_INT8_PREFILL : 0; }

// out (N, rows) = inp · Wᵀ + bias, plus the adapter on rows whose mask is on.
static int linear_forward(const LinCtx *lc, LoraTarget t, float *out, const float *inp, const Weight *w,
                          const float *bias, int N) {
    Backend *be = lc->a->be;
    ER_TRY(be->ops->matmul_forward(be, out, inp, w, bias, N, lc->a->wscratch, product_flags(lc->a)));
    float *h, *xd;
    uint8_t *keep;
    const LoraMat *m = lin_lora(lc, t, &h, &xd, &keep);
    if (!m)
        return ER_OK;
    const LoraAdapter *ad = lc->in->adapter;
    const float *x = inp;
    if (xd) { // inverted dropout on the adapter's input, kept for the backward
        float p_keep = 1.0f - ad->dropout, inv = 1.0f / p_keep;
        for (size_t i = 0; i < (size_t)N * m->in; i++) {
            keep[i] = rng_uniform(lc->in->dropout_rng) < p_keep;
            xd[i] = keep[i] ? inp[i] * inv : 0.0f;
        }
        x = xd;
    }
    return be->ops->lora_forward(be, out, h, x, m, ad->r, ad->scale, lc->a->amask, N);
}

// dinp (N,K) += dout · W (+ the adapter's share); dW (R,K) += doutᵀ · inp and dbias (R) += Σ dout
// when given; adapter gradients accumulate in the adapter.
static int linear_backward(const LinCtx *lc, LoraTarget t, float *dinp, float *dW, float *dbias, const float *dout,
                           const float *inp, const Weight *w, int N) {
    Backend *be = lc->a->be;
    if (dW || dbias)
        ER_TRY(be->ops->matmul_backward_weight(be, dW, dbias, dout, inp, N, w->rows, w->cols));
    float *h, *xd;
    uint8_t *keep;
    const LoraMat *m = lin_lora(lc, t, &h, &xd, &keep);
    if (m) {
        const LoraAdapter *ad = lc->in->adapter;
        if (xd) { // gradients of A against the dropped input; dx through the dropout mask
            float *dxd = lc->a->lora_dx; // (N, in)
            memset(dxd, 0, sizeof(float) * (size_t)N * m->in);
            lora_backward(dxd, (LoraMat *)m, ad->r, ad->scale, dout, xd, h, lc->a->amask, N, lc->a->lora_dh);
            float inv = 1.0f / (1.0f - ad->dropout);
            for (size_t i = 0; i < (size_t)N * m->in; i++)
                if (keep[i])
                    dinp[i] += dxd[i] * inv;
        } else {
            ER_TRY(be->ops->lora_backward(be, dinp, (LoraMat *)m, ad->r, ad->scale, dout, inp, h, lc->a->amask, N,
                                          lc->a->lora_dh));
        }
    }
    return be->ops->matmul_backward_input(be, dinp, dout, w, N, lc->a->wscratch);
}

// ---- forward ----

static int check_input(const Model *m, const ModelInput *in, const Activations *a) {
    const ModelConfig *c = &m->cfg;
    if (in->B <= 0 || in->T <= 0 || in->B > a->B || in->T > a->T) // buffers are sized per row and per position
        return er_error(ER_EINVAL, "forward: %d x %d positions do not fit activations sized for %d x %d", in->B, in->T,
                        a->B, a->T);
    if (in->adapter && (in->adapter->L != c->L || !in->adapter->mats))
        return er_error(ER_EINVAL, "forward: the adapter has %d layers, the model %d", in->adapter->L, c->L);
    if (in->adapter && in->adapter->dropout > 0 && a->mode == ACTS_TRAIN && !in->dropout_rng)
        return er_error(ER_EINVAL, "forward: adapter dropout needs a random stream (ModelInput.dropout_rng)");
    if (a->recompute && in->dropout_rng && in->adapter && in->adapter->dropout > 0) // the backward would draw again
        return er_error(ER_EUNSUPPORTED, "forward: recomputing activations needs adapter dropout 0, not %g",
                        in->adapter->dropout);
    for (int b = 0; b < in->B; b++) {
        int n = in->len ? in->len[b] : in->T;
        if (n < 1 || n > in->T)
            return er_error(ER_EINVAL, "forward: row %d has %d valid positions (expected 1..%d)", b, n, in->T);
        for (int t = 0; t < n; t++) {
            int tok = in->tokens[b * in->T + t];
            if (tok < 0 || tok >= c->V)
                return er_error(ER_ERANGE, "forward: token id %d at position %d is outside the vocabulary [0, %d)", tok,
                                b * in->T + t, c->V);
        }
    }
    Backend *mbe = m->be ? m->be : backend_cpu();
    if (mbe != a->be)
        return er_error(ER_EINVAL, "forward: the model is on %s, the activations on %s", mbe->name, a->be->name);
    if (in->kv) {
        if (in->kv->be != a->be)
            return er_error(ER_EINVAL, "forward: the KV cache is on %s, the activations on %s",
                            in->kv->be ? in->kv->be->name : "no backend", a->be->name);
        if (a->mode == ACTS_TRAIN)
            return er_error(ER_EINVAL, "forward: training keeps its own keys and values, not a KV cache");
        if (in->kv->L != c->L || in->kv->NKV != c->NKV || in->kv->HS != c->HS)
            return er_error(ER_EINVAL, "forward: the KV cache was sized for another model");
        for (int b = 0; b < in->B; b++) {
            int s = in->kv_slots[b];
            if (s < 0 || s >= in->kv->max_seqs || !in->kv->seqs[s].active)
                return er_error(ER_EINVAL, "forward: row %d names KV sequence %d, which is not open", b, s);
            for (int r = 0; r < b; r++)
                if (in->kv_slots[r] == s)
                    return er_error(ER_EINVAL, "forward: rows %d and %d append to the same KV sequence", r, b);
        }
    }
    return ER_OK;
}

// Where layer l's input lives: in its own buffers (training keeps every layer's), in the kept inputs
// (recomputation), or in the one reused layer of a forward-only pass.
static float *layer_input(const Activations *a, int l) {
    if (a->recompute)
        return a->layer_in + (size_t)l * a->B * a->T * a->cfg.C;
    return a->layer[a->mode == ACTS_TRAIN ? l : 0].res;
}

// The buffers layer l's intermediates go to (recomputation: the one scratch layer, reading l's input).
static LayerActs *layer_acts(Activations *a, int l) {
    LayerActs *la = &a->layer[a->mode == ACTS_TRAIN && !a->recompute ? l : 0];
    if (a->recompute)
        la->res = layer_input(a, l);
    return la;
}

// Layer l of the pass: from la->res (its input) through every intermediate into la, the output into
// next (which may be la->res in a forward-only pass, or any scratch when recomputing).
static int layer_forward(const Model *m, const ModelInput *in, Activations *a, int l, LayerActs *la, float *next) {
    const ModelConfig *c = &m->cfg;
    int B = in->B, T = in->T, N = B * T, C = c->C;
    KVCache *kv = in->kv;
    Backend *be = a->be;
    const LayerWeights *w = &m->layers[l];
    LinCtx lc = {in, a, l, a->mode == ACTS_TRAIN && in->dropout_rng};
    ER_TRY(be->ops->rmsnorm_forward(be, la->ln1, la->rstd1, la->res, w->ln1, N, C, c->eps));
    int qkn = c->arch == ARCH_QWEN3; // q and k come out of their projections into qr, kr, then the norms
    ER_TRY(linear_forward(&lc, LT_Q, qkn ? la->qr : la->q, la->ln1, &w->wq, w->bq, N));
    ER_TRY(linear_forward(&lc, LT_K, qkn ? la->kr : la->k, la->ln1, &w->wk, w->bk, N));
    ER_TRY(linear_forward(&lc, LT_V, la->v, la->ln1, &w->wv, w->bv, N));
    if (qkn) { // each head's RMSNorm: (N*NH, HS) and (N*NKV, HS) rows
        ER_TRY(be->ops->rmsnorm_forward(be, la->q, la->rstdq, la->qr, w->q_norm, N * c->NH, c->HS, c->eps));
        ER_TRY(be->ops->rmsnorm_forward(be, la->k, la->rstdk, la->kr, w->k_norm, N * c->NKV, c->HS, c->eps));
    }
    ER_TRY(be->ops->rope_forward(be, la->q, a->pos_buf, a->cos_tab, a->sin_tab, N, c->NH, c->HS));
    ER_TRY(be->ops->rope_forward(be, la->k, a->pos_buf, a->cos_tab, a->sin_tab, N, c->NKV, c->HS));
    if (kv) { // kv_pass_put's inputs: cache rows (N), pos0 (B), len (B), block tables
        const int *dst = a->kv_buf, *pos0 = dst + N, *len = pos0 + B, *blocks = len + B;
        ER_TRY(be->ops->kv_store(be, kv, l, la->k, la->v, dst, N));
        ER_TRY(be->ops->kv_attention_forward(be, la->atty, la->q, kv, l, blocks, pos0, len, B, T, c->NH, a->scores,
                                             a->attn_threads, a->attn_keys));
    } else {
        ER_TRY(be->ops->attention_forward(be, la->atty, la->lse, la->q, la->k, la->v, B, T, c->NH, c->NKV, c->HS,
                                          a->scores, a->attn_threads));
    }
    ER_TRY(linear_forward(&lc, LT_O, a->tmp, la->atty, &w->wo, NULL, N));
    ER_TRY(be->ops->residual_forward(be, la->res2, la->res, a->tmp, (size_t)N * C));
    ER_TRY(be->ops->rmsnorm_forward(be, la->ln2, la->rstd2, la->res2, w->ln2, N, C, c->eps));
    ER_TRY(linear_forward(&lc, LT_GATE, la->gate, la->ln2, &w->wgate, NULL, N));
    ER_TRY(linear_forward(&lc, LT_UP, la->up, la->ln2, &w->wup, NULL, N));
    ER_TRY(be->ops->swiglu_forward(be, la->hmlp, la->gate, la->up, N, c->FF));
    ER_TRY(linear_forward(&lc, LT_DOWN, a->tmp, la->hmlp, &w->wdown, NULL, N));
    return be->ops->residual_forward(be, next, la->res2, a->tmp, (size_t)N * C);
}

// A KV pass's inputs for the backend's KV ops, placed in one upload (Activations.kv_buf's layout).
static int kv_pass_put(Activations *a, const ModelInput *in) {
    const KVCache *kv = in->kv;
    Backend *be = a->be;
    int B = in->B, T = in->T, N = B * T;
    size_t n = (size_t)N + 2 * (size_t)B + (size_t)B * kv->max_blocks_per_seq;
    if (n > a->kv_cap) {
        be->ops->free(be, a->kv_buf);
        er_free(a->kv_host);
        a->kv_cap = 0;
        a->kv_host = er_alloc(n * sizeof(int));
        a->kv_buf = a->kv_host ? be->ops->alloc(be, n * sizeof(int)) : NULL;
        if (!a->kv_buf)
            return ER_ENOMEM;
        a->kv_cap = n;
    }
    int *dst = a->kv_host, *pos0 = dst + N, *len = pos0 + B, *blocks = len + B;
    for (int b = 0; b < B; b++) {
        pos0[b] = a->pos0[b];
        len[b] = in->len ? in->len[b] : T;
        for (int t = 0; t < T; t++)
            dst[b * T + t] = t < len[b] ? kv_row(kv, in->kv_slots[b], pos0[b] + t) : -1;
    }
    kv_block_table(kv, in->kv_slots, B, blocks);
    return acts_put(a, a->kv_buf, a->kv_host, n * sizeof(int));
}

static int forward_pass(Model *m, const ModelInput *in, Activations *a) {
    const ModelConfig *c = &m->cfg;
    int B = in->B, T = in->T, N = B * T, C = c->C;
    KVCache *kv = in->kv;
    a->nB = B;
    a->nT = T;
    int maxpos = 0;
    for (int b = 0; b < B; b++) {
        a->pos0[b] = kv ? kv->seqs[in->kv_slots[b]].len : 0;
        for (int t = 0; t < T; t++) {
            int p = a->pos0[b] + t;
            a->pos[b * T + t] = p;
            if (p > maxpos)
                maxpos = p;
        }
    }
    ER_TRY(ensure_rope(a, maxpos + 1));
    int train = a->mode == ACTS_TRAIN && in->dropout_rng;
    if (in->adapter)
        ER_TRY(ensure_lora_acts(a, in->adapter, train));
    if (kv) {
        for (int b = 0; b < B; b++)
            ER_TRY(kv_seq_extend(kv, in->kv_slots[b], a->pos0[b] + (in->len ? in->len[b] : T)));
        ER_TRY(kv_pass_put(a, in));
    }
    ER_TRY(acts_put(a, a->tokens_buf, in->tokens, sizeof(int) * N));
    ER_TRY(acts_put(a, a->pos_buf, a->pos, sizeof(int) * N));
    a->amask = NULL;
    if (in->adapter_mask) {
        ER_TRY(acts_put(a, a->amask_buf, in->adapter_mask, (size_t)N));
        a->amask = a->amask_buf;
    }

    Backend *be = a->be;
    ER_TRY(be->ops->embed_forward(be, layer_input(a, 0), &m->embed, a->tokens_buf, N)); // (N, C)

    for (int l = 0; l < c->L; l++) {
        float *next = l + 1 < c->L && a->mode == ACTS_TRAIN ? layer_input(a, l + 1) : a->resf;
        ER_TRY(layer_forward(m, in, a, l, layer_acts(a, l), next));
    }
    if (a->mode == ACTS_DECODE) {
        // Only each row's last valid position predicts the next token: normalise and project B rows.
        for (int b = 0; b < B; b++) {
            int last = b * T + (in->len ? in->len[b] : T) - 1;
            ER_TRY(be->ops->copy(be, a->tmp + (size_t)b * C, a->resf + (size_t)last * C, sizeof(float) * C));
        }
        ER_TRY(be->ops->rmsnorm_forward(be, a->lnf, a->rstdf, a->tmp, m->norm, B, C, c->eps));
        return be->ops->matmul_forward(be, a->logits, a->lnf, &m->lm_head, NULL, B, a->wscratch, product_flags(a));
    }
    ER_TRY(be->ops->rmsnorm_forward(be, a->lnf, a->rstdf, a->resf, m->norm, N, C, c->eps));
    if (a->loss_only) // model_loss applies the head, a chunk of rows at a time
        return ER_OK;
    return be->ops->matmul_forward(be, a->logits, a->lnf, &m->lm_head, NULL, N, a->wscratch, product_flags(a));
}

int model_forward(Model *m, const ModelInput *in, Activations *a) {
    ER_TRY(check_input(m, in, a));
    a->head_model = m;
    a->head_done = 0;
    int rc = forward_pass(m, in, a);
    if (rc < 0 && in->kv) // a failed pass leaves every sequence as it was
        for (int b = 0; b < in->B; b++)
            if (in->kv->seqs[in->kv_slots[b]].len > a->pos0[b])
                kv_seq_truncate(in->kv, in->kv_slots[b], a->pos0[b]);
    return rc;
}

// The loss over row losses the op left in a->row_loss, added in row order as the op adds them: the same
// bits as one call over every row.
static int loss_from_rows(Activations *a, int N, double wsum, double *loss) {
    const double *rows = a->row_loss;
    double *host = NULL;
    if (a->be->kind != BACKEND_CPU) {
        host = er_alloc(sizeof(double) * N);
        if (!host)
            return er_error(ER_ENOMEM, "loss: cannot allocate %d row losses", N);
        int rc = a->be->ops->download(a->be, host, a->row_loss, sizeof(double) * N);
        if (rc < 0) {
            er_free(host);
            return rc;
        }
        rows = host;
    }
    double total = 0.0;
    for (int n = 0; n < N; n++)
        total += rows[n];
    er_free(host);
    *loss = total / wsum;
    return ER_OK;
}

// A loss-only pass: the LM head, the cross-entropy and (grad) the head's backward, loss_rows rows at a
// time, so only one chunk's logits ever exist. wsum, the whole pass's mask sum, gives every chunk the
// gradient rows of the whole pass's mean. dln's rows += the chunk's dlogits · lm_head and g_lm_head +=
// the chunk's share: the unchunked backward's values, summed in chunks (fp32 rounding apart).
static int loss_chunked(Activations *a, const float *mask, int grad, float scale, double wsum, double *loss) {
    Model *m = a->head_model;
    Backend *be = a->be;
    int N = a->nB * a->nT, V = a->cfg.V, C = a->cfg.C, tr = m->trainable;
    if (grad)
        ER_TRY(be->ops->zero(be, a->dln, sizeof(float) * N * C));
    *loss = 0.0;
    if (wsum == 0.0) // an empty mask: no loss and a zero gradient, as the unchunked op gives
        return ER_OK;
    LinCtx head = {&(ModelInput){0}, a, 0, 0}; // the lm_head has no adapter
    for (int r0 = 0; r0 < N; r0 += a->loss_rows) {
        int n = N - r0 < a->loss_rows ? N - r0 : a->loss_rows;
        const float *x = a->lnf + (size_t)r0 * C;
        double part;
        ER_TRY(be->ops->matmul_forward(be, a->loss_chunk, x, &m->lm_head, NULL, n, a->wscratch, product_flags(a)));
        ER_TRY(be->ops->cross_entropy(be, &part, a->loss_chunk, a->targets_buf + r0, mask ? a->mask_buf + r0 : NULL,
                                      n, V, grad, wsum, a->row_loss + r0));
        if (!isfinite(part)) // refused before this chunk's head gradient joins the earlier chunks'
            return er_error(ER_ERANGE, "loss is not finite (%g) in positions %d..%d", part, r0, r0 + n - 1);
        if (!grad)
            continue;
        if (scale != 1.0f)
            ER_TRY(be->ops->scale(be, a->loss_chunk, (size_t)n * V, scale));
        ER_TRY(linear_backward(&head, LT_Q, a->dln + (size_t)r0 * C, tr ? m->g_lm_head : NULL, NULL, a->loss_chunk, x,
                               &m->lm_head, n));
    }
    return loss_from_rows(a, N, wsum, loss);
}

static int loss_run(Activations *a, const int *targets, const float *mask, int grad, float scale, double *loss) {
    if (a->mode == ACTS_DECODE)
        return er_error(ER_EINVAL, "loss: a decode pass keeps only the last position's logits");
    if (a->loss_only && grad && a->mode != ACTS_TRAIN)
        return er_error(ER_EINVAL, "loss: a loss-only scoring pass keeps nothing for a gradient (ACTS_TRAIN does)");
    if (a->loss_only && !a->head_model)
        return er_error(ER_EINVAL, "loss: no forward pass ran on these activations");
    a->head_done = 0;
    int N = a->nB * a->nT, V = a->cfg.V;
    double wsum = 0.0; // the op's sum: in row order, in double
    for (int n = 0; n < N; n++) {
        if (mask && !isfinite(mask[n]))
            return er_error(ER_EINVAL, "loss: mask at position %d is not finite", n);
        if (mask && mask[n] < 0.0f) // a weight below zero has no meaning, and would make the sum no divisor
            return er_error(ER_EINVAL, "loss: mask at position %d is negative (%g)", n, mask[n]);
        if ((!mask || mask[n] != 0.0f) && (targets[n] < 0 || targets[n] >= V))
            return er_error(ER_ERANGE, "loss: target %d at position %d is outside the vocabulary [0, %d)", targets[n], n,
                            V);
        wsum += mask ? mask[n] : 1.0;
    }
    ER_TRY(acts_put(a, a->targets_buf, targets, sizeof(int) * N));
    if (mask)
        ER_TRY(acts_put(a, a->mask_buf, mask, sizeof(float) * N));
    if (a->loss_only) {
        ER_TRY(loss_chunked(a, mask, grad, scale, wsum, loss));
    } else {
        ER_TRY(a->be->ops->cross_entropy(a->be, loss, a->logits, a->targets_buf, mask ? a->mask_buf : NULL, N, V, grad,
                                         0.0, a->row_loss));
        if (grad && scale != 1.0f)
            ER_TRY(a->be->ops->scale(a->be, a->logits, (size_t)N * V, scale));
    }
    if (!isfinite(*loss))
        return er_error(ER_ERANGE, "loss is not finite (%g)", *loss);
    a->head_done = a->loss_only && grad; // a loss that failed leaves no head gradient to go on from
    return ER_OK;
}

int model_loss(Activations *a, const int *targets, const float *mask, int grad, double *loss) {
    return loss_run(a, targets, mask, grad != 0, 1.0f, loss);
}

int model_loss_scaled(Activations *a, const int *targets, const float *mask, float scale, double *loss) {
    return loss_run(a, targets, mask, 1, scale, loss);
}

// ---- backward ----

int model_backward(Model *m, const ModelInput *in, Activations *a) {
    if (a->mode != ACTS_TRAIN)
        return er_error(ER_EINVAL, "backward: the forward did not keep activations (ACTS_TRAIN)");
    const ModelConfig *c = &m->cfg;
    int B = a->nB, T = a->nT, N = B * T, C = c->C, qd = c->NH * c->HS;
    int tr = m->trainable;
    Backend *be = a->be;
    const BackendOps *op = be->ops;

    if (a->loss_only) { // model_loss ran the head's backward: dln holds d loss / d lnf
        if (!a->head_done)
            return er_error(ER_EINVAL, "backward: a loss-only pass needs model_loss with grad first (it runs the "
                            "LM head's backward)");
        if (a->head_model != m)
            return er_error(ER_EINVAL, "backward: the loss ran another model's LM head");
        a->head_done = 0;
    } else {
        ER_TRY(op->zero(be, a->dln, sizeof(float) * N * C));
        LinCtx head = {&(ModelInput){0}, a, 0, 0}; // the lm_head has no adapter
        ER_TRY(linear_backward(&head, LT_Q, a->dln, tr ? m->g_lm_head : NULL, NULL, a->logits, a->lnf, &m->lm_head,
                               N));
    }
    ER_TRY(op->zero(be, a->dres, sizeof(float) * N * C));
    ER_TRY(op->rmsnorm_backward(be, a->dres, tr ? m->g_norm : NULL, a->dln, a->resf, m->norm, a->rstdf, N, C));

    for (int l = c->L - 1; l >= 0; l--) {
        const LayerWeights *w = &m->layers[l];
        LayerGrads *g = tr ? &m->grads[l] : NULL;
        LayerActs *la = layer_acts(a, l);
        if (a->recompute) // this layer's intermediates again, from its kept input (its output is not needed)
            ER_TRY(layer_forward(m, in, a, l, la, a->tmp));
        LinCtx lc = {in, a, l, a->lora_x != NULL && in->dropout_rng != NULL};
        // MLP: dres holds d(res2 + mlp_out)
        ER_TRY(op->zero(be, a->dh, sizeof(float) * N * c->FF));
        ER_TRY(linear_backward(&lc, LT_DOWN, a->dh, g ? g->wdown : NULL, NULL, a->dres, la->hmlp, &w->wdown, N));
        ER_TRY(op->swiglu_backward(be, a->dgate, a->dup, a->dh, la->gate, la->up, N, c->FF));
        ER_TRY(op->zero(be, a->dln, sizeof(float) * N * C));
        ER_TRY(linear_backward(&lc, LT_GATE, a->dln, g ? g->wgate : NULL, NULL, a->dgate, la->ln2, &w->wgate, N));
        ER_TRY(linear_backward(&lc, LT_UP, a->dln, g ? g->wup : NULL, NULL, a->dup, la->ln2, &w->wup, N));
        ER_TRY(op->rmsnorm_backward(be, a->dres, g ? g->ln2 : NULL, a->dln, la->res2, w->ln2, la->rstd2, N, C));
        // attention: dres holds d(res2) = d(res + attn_out)
        ER_TRY(op->zero(be, a->datty, sizeof(float) * N * qd));
        ER_TRY(linear_backward(&lc, LT_O, a->datty, g ? g->wo : NULL, NULL, a->dres, la->atty, &w->wo, N));
        ER_TRY(op->attention_backward(be, a->dq, a->dk, a->dv, a->datty, la->atty, la->lse, la->q, la->k, la->v, B, T,
                                      c->NH, c->NKV, c->HS, a->dkh, a->dvh));
        ER_TRY(op->rope_backward(be, a->dq, a->pos_buf, a->cos_tab, a->sin_tab, N, c->NH, c->HS));
        ER_TRY(op->rope_backward(be, a->dk, a->pos_buf, a->cos_tab, a->sin_tab, N, c->NKV, c->HS));
        float *dq = a->dq, *dk = a->dk; // d(q, k as the projections give them)
        if (c->arch == ARCH_QWEN3) {
            dq = a->dqr;
            dk = a->dkr;
            ER_TRY(op->zero(be, dq, sizeof(float) * N * qd));
            ER_TRY(op->zero(be, dk, sizeof(float) * N * c->NKV * c->HS));
            ER_TRY(op->rmsnorm_backward(be, dq, g ? g->q_norm : NULL, a->dq, la->qr, w->q_norm, la->rstdq, N * c->NH,
                                        c->HS));
            ER_TRY(op->rmsnorm_backward(be, dk, g ? g->k_norm : NULL, a->dk, la->kr, w->k_norm, la->rstdk, N * c->NKV,
                                        c->HS));
        }
        ER_TRY(op->zero(be, a->dln, sizeof(float) * N * C));
        ER_TRY(linear_backward(&lc, LT_Q, a->dln, g ? g->wq : NULL, g ? g->bq : NULL, dq, la->ln1, &w->wq, N));
        ER_TRY(linear_backward(&lc, LT_K, a->dln, g ? g->wk : NULL, g ? g->bk : NULL, dk, la->ln1, &w->wk, N));
        ER_TRY(linear_backward(&lc, LT_V, a->dln, g ? g->wv : NULL, g ? g->bv : NULL, a->dv, la->ln1, &w->wv, N));
        ER_TRY(op->rmsnorm_backward(be, a->dres, g ? g->ln1 : NULL, a->dln, la->res, w->ln1, la->rstd1, N, C));
    }
    if (tr) // the embedding rows of this pass's tokens (staged by the forward)
        ER_TRY(op->embed_backward(be, m->g_embed, a->dres, a->tokens_buf, N, C));
    return ER_OK;
}
