// ertrain quantize: float model dir -> quantized model dir (see train/quantize.h).
#include "train/quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gemm.h"
#include "core/gguf.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "quant/quant.h"
#include "quant/quantizer.h"
#include "train/fpt.h"
#include "train/run.h"
#include "train/sequence.h"
#include "train/trainer.h"
#include "train/transform_model.h"

// ---- the model ----

static size_t param_bytes(const ParamTensor *p, size_t float_size) {
    if (p->w && p->w->fmt != WF_F32) // packed, or a float format narrower than the fp32 count
        return weight_bytes(p->w);
    return p->numel * float_size;
}

int quantize_parse_weights(const char *spec, WeightFormat *f, int *group, int *mix, int *uniform) {
    *uniform = *mix = 0;
    if (quant_parse_mix(spec, f)) {
        *group = 0;
        *mix = QUANT_MIX_K_M;
        return ER_OK;
    }
    if (spec && strcmp(spec, "q2rtn") == 0) {
        *f = WF_Q2LUT;
        *group = 0;
        *uniform = 1;
        return ER_OK;
    }
    return quant_parse_spec(spec, f, group);
}

// q2rtn is not a format of the table (quant/weight.c) but this file's policy: q2lut with RTN codebooks.
const char *quantize_weights_list(char *buf, size_t n, const char *sep, const char *last) {
    char specs[256];
    snprintf(buf, n, "%s%sq4_k_m%sq5_k_m%sq2rtn", quant_spec_list(specs, sizeof specs, sep, sep), sep, sep, last);
    return buf;
}

// The embedding's format o asks for: --embeddings, by default int8 (q8), or q8_0 beside GGUF block weights so that
// the model exports to GGUF as it is; WF_F32 for "fp" and for what does not parse (reported by the caller).
static WeightFormat embed_format(const QuantizeOptions *o) {
    WeightFormat lin = WF_F32, e = WF_F32;
    int g, mix, u;
    if (o->embeddings)
        return quant_parse_embeddings(o->embeddings, &e) == ER_OK ? e : WF_F32;
    if (o->weights)
        quantize_parse_weights(o->weights, &lin, &g, &mix, &u);
    return weight_is_quantized(lin) && weight_format_info(lin)->block ? WF_Q8_0 : WF_Q8;
}

#define SPARSE_FORMATS_ERROR                                                                                     \
    "--sparse %d: sparse corrections are for the k-means codebook formats (q2lut, q4lut), not --weights %s"

int quantize_plan(const Model *m, const QuantizeOptions *o, QuantizePlan *plan) {
    memset(plan, 0, sizeof *plan);
    QuantConfig *q = &plan->q;
    if (m->quant.enabled)
        return er_error(ER_EINVAL, "quantize: the model is already quantized (%s)", m->quant.method);
    char specs[256];
    quantize_weights_list(specs, sizeof specs, ", ", " or ");
    if (!o->weights || quantize_parse_weights(o->weights, &q->linear, &q->group, &q->mix, &plan->linear_uniform) < 0)
        return er_error(ER_EINVAL, "--weights \"%s\" is not one of %s", o->weights ? o->weights : "", specs);
    if (o->embeddings && quant_parse_embeddings(o->embeddings, &q->embed) < 0)
        return er_error(ER_EINVAL, "--embeddings \"%s\" must be int8, q8_0 or fp", o->embeddings);
    q->embed = embed_format(o);
    // A tied lm_head is the embedding: the config then names the embedding's format for it.
    const char *head = o->lm_head                  ? o->lm_head
                       : m->cfg.tied               ? (q->embed == WF_F32 ? "fp" : weight_format_name(q->embed))
                       : q->linear == WF_Q2LUT     ? "q4"
                       : q->mix                    ? "q6_k"
                                                   : o->weights;
    int hg = 0, head_mix = 0;
    if (strcmp(head, "fp") == 0)
        q->lm_head = WF_F32;
    else if (quantize_parse_weights(head, &q->lm_head, &hg, &head_mix, &plan->head_uniform) < 0 || head_mix)
        return er_error(ER_EINVAL, "--lm-head \"%s\" is not one of fp, %s", head, specs);
    if (m->cfg.tied && o->lm_head && q->lm_head != q->embed)
        return er_error(ER_EINVAL,
                        "--lm-head %s: the model ties its lm_head to the embedding (--embeddings %s); untie it first "
                        "(quantize_untie)",
                        head, q->embed == WF_F32 ? "fp" : q->embed == WF_Q8 ? "int8" : "q8_0");
    if (weight_format_grouped(q->lm_head) && weight_format_grouped(q->linear) && hg != q->group)
        return er_error(ER_EINVAL, "--lm-head %s must use the group size of --weights %s", head, o->weights);
    if (weight_format_grouped(q->lm_head))
        q->group = hg;
    const char *ss = o->scale_search ? o->scale_search : "lp";
    if (strcmp(ss, "lp") != 0 && strcmp(ss, "minmax") != 0)
        return er_error(ER_EINVAL, "--scale-search \"%s\" must be lp or minmax", ss);
    plan->minmax = strcmp(ss, "minmax") == 0;
    if (o->sparse && (!weight_format_info(q->linear)->levels || plan->linear_uniform))
        return er_error(ER_EINVAL, SPARSE_FORMATS_ERROR, o->sparse, o->weights);
    q->sparse = o->sparse;
    // Check every matrix fits its format before any work.
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        if (!p->w)
            continue;
        int group, sparse;
        WeightFormat f = model_quant_format_in(m, q, p, &group, &sparse);
        if (weight_is_quantized(f))
            ER_TRY(quant_check_shape(f, p->w->rows, p->w->cols, group, sparse, p->name));
    }
    // q2rtn is stored as q2lut (a codebook of 4 evenly spaced levels): the method says how it was made.
    int kmeans = weight_format_info(q->linear)->levels && !plan->linear_uniform; // codebook formats
    snprintf(q->method, sizeof q->method, "%s%s%s", kmeans ? "kmeans" : plan->minmax ? "rtn-minmax" : "rtn-lp",
             o->method_note && o->method_note[0] ? "-" : "", o->method_note ? o->method_note : "");
    snprintf(q->transforms, sizeof q->transforms, "%s", o->transforms ? o->transforms : "none");
    q->enabled = 1;
    return ER_OK;
}

void quantize_plan_options(const Model *m, const QuantizePlan *plan, const QuantizeOptions *o, const ParamTensor *p,
                           QuantOptions *qo) {
    const QuantConfig *q = &plan->q;
    int group, sparse;
    WeightFormat f = model_quant_format_in(m, q, p, &group, &sparse);
    quant_options_default(qo, f, group);
    qo->search = plan->minmax ? QSEARCH_MINMAX : QSEARCH_LP;
    if (o->p > 0)
        qo->p = o->p;
    if (o->kmeans_iters > 0)
        qo->kmeans_iters = o->kmeans_iters;
    qo->uniform = !p->w || p->w == &m->embed ? 0 : p->w == &m->lm_head ? plan->head_uniform : plan->linear_uniform;
    qo->sparse = !p->w || p->w == &m->embed || p->w == &m->lm_head ? 0 : q->sparse;
    qo->hessian = o->hessians && p->w && p >= m->params && p < m->params + m->n_params ? o->hessians[p - m->params]
                                                                                        : NULL;
}

// The layer projections' totals of a quantize_model run.
typedef struct {
    size_t lin_bytes, lin_numel;
    double err_sum;
    int err_n;
    double lerr[7]; // the current layer's q, k, v, o, gate, up, down in HF order
    int li;
} QuantTally;

// Matrix p quantized as qo says (imp: its importances or NULL) and set into m. tmp (*tmp_n floats)
// holds the fp32 source of a matrix stored otherwise, grown as needed.
static int quantize_param(Model *m, ParamTensor *p, const QuantOptions *qo, const float *imp, float **tmp,
                          size_t *tmp_n, FILE *log, QuantTally *t, QuantizeReport *rep) {
    const float *src = p->data;
    if (!src || p->w->fmt != WF_F32) {
        if (*tmp_n < p->numel) {
            er_free(*tmp);
            *tmp = er_alloc(p->numel * sizeof(float));
            *tmp_n = *tmp ? p->numel : 0;
            if (!*tmp)
                return ER_ENOMEM;
        }
        quant_dequant_rows(*tmp, p->w, 0, p->w->rows);
        src = *tmp;
    }
    Weight qw;
    int qrc = quantize_matrix(&qw, src, p->w->rows, p->w->cols, imp, qo);
    if (qrc < 0)
        return er_error_prefix(qrc, "%s", p->name);
    double e = quant_rel_error(&qw, src);
    rep->max_rel_error = e > rep->max_rel_error ? e : rep->max_rel_error;
    int is_layer = p->w != &m->embed && p->w != &m->lm_head;
    if (is_layer) {
        t->lin_bytes += weight_bytes(&qw);
        t->lin_numel += p->numel;
        t->err_sum += e;
        t->err_n++;
        t->lerr[t->li++] = e;
    }
    int rc = model_set_weight(m, p, &qw);
    if (rc < 0) {
        weight_free(&qw);
        return rc;
    }
    if (log && !is_layer) {
        char spec[16];
        fprintf(log, "  %-28s %-6s rel err %.4f\n", p->name, quant_spec_name(qo->fmt, qo->group, spec), e);
    }
    if (t->li == 7) {
        const char *l = strstr(p->name, "layers.");
        if (log)
            fprintf(log, "  layer %3d  rel err q %.4f k %.4f v %.4f o %.4f gate %.4f up %.4f down %.4f\n",
                    l ? atoi(l + 7) : 0, t->lerr[0], t->lerr[1], t->lerr[2], t->lerr[3], t->lerr[4], t->lerr[5],
                    t->lerr[6]);
        t->li = 0;
    }
    return ER_OK;
}

int quantize_model(Model *m, const QuantizeOptions *o, const float *const *importance, FILE *log, QuantizeReport *rep) {
    memset(rep, 0, sizeof *rep);
    QuantizePlan plan;
    ER_TRY(quantize_plan(m, o, &plan));
    size_t fsz = m->cfg.dtype == DT_F32 ? 4 : 2, total_numel = 0;
    for (int i = 0; i < m->n_params; i++) {
        rep->bytes_before += m->params[i].numel * fsz;
        total_numel += m->params[i].numel;
    }
    m->quant = plan.q; // model_quant_format now gives each matrix its target
    QuantTally t = {0};
    float *tmp = NULL;
    size_t tmp_n = 0;
    QuantGptqCache gc = {0}; // q, k, v (and gate, up) come in a row and share one H: factored once
    int rc = ER_OK;
    for (int i = 0; i < m->n_params; i++) {
        ParamTensor *p = &m->params[i];
        if (!p->w)
            continue;
        QuantOptions qo;
        quantize_plan_options(m, &plan, o, p, &qo);
        qo.gptq_cache = &gc;
        if (weight_is_quantized(qo.fmt)) // on error the model holds a mix; the caller frees it
            ER_CHECK(quantize_param(m, p, &qo, importance ? importance[i] : NULL, &tmp, &tmp_n, log, &t, rep));
    }
    for (int i = 0; i < m->n_params; i++)
        rep->bytes_after += param_bytes(&m->params[i], fsz);
    rep->bits_per_weight = t.lin_numel ? (double)t.lin_bytes * 8.0 / (double)t.lin_numel : 0;
    rep->model_bits_per_weight = total_numel ? (double)rep->bytes_after * 8.0 / (double)total_numel : 0;
    rep->mean_rel_error = t.err_n ? t.err_sum / t.err_n : 0;
    m->quant.bits_per_weight = round(rep->bits_per_weight * 1e4) / 1e4;
done:
    er_free(tmp);
    quant_gptq_cache_free(&gc);
    return rc;
}

int quantize_untie(Model *m) {
    if (m->cfg.tied && m->quant.enabled)
        return er_error(ER_EINVAL, "untie: the model is already quantized");
    return model_untie(m);
}

// ---- calibration ----

typedef struct {
    Tokenizer *tok;
    SeqBuilder sb;
    Sequence *seqs;
    int n, max_len;
} Calib;

static void calib_free(Calib *c) {
    for (int i = 0; i < c->n; i++)
        sequence_free(&c->seqs[i]);
    er_free(c->seqs);
    seq_builder_free(&c->sb);
    tok_free(c->tok);
    memset(c, 0, sizeof *c);
}

// Up to n_max sequences (loss on every position, like pretraining), from the model dir's tokenizer.
// On error the caller still frees c.
static int calib_load(Calib *c, const char *model_dir, const char *path, const char *response_key, int n_max,
                      int seq_len, int V) {
    memset(c, 0, sizeof *c);
    ChatStyle style;
    Dataset d = {0};
    DatasetOptions dopt = {response_key};
    int rc = ER_OK;
    ER_CHECK(tok_load(&c->tok, model_dir));
    if (tok_vocab_size(c->tok) > V)
        ER_CHECK(er_error(ER_EINVAL, "%s: the tokenizer has %d tokens, more than the model's vocab_size %d", model_dir,
                          tok_vocab_size(c->tok), V));
    ER_CHECK(train_chat_style(model_dir, &style));
    ER_CHECK(seq_builder_init(&c->sb, c->tok, style, "", seq_len, 1, 1));
    ER_CHECK(dataset_load(path, &dopt, n_max, &d));
    if (!(c->seqs = er_calloc((size_t)d.n + 1, sizeof(Sequence))))
        ER_CHECK(ER_ENOMEM);
    for (int i = 0; i < d.n; i++) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%.1024s:%ld", path, d.ex[i].line);
        Sequence *s = &c->seqs[c->n];
        int r = seq_build(&c->sb, &d.ex[i], ctx, s);
        if (r == SEQ_TOO_LONG)
            continue;
        ER_CHECK(r);
        if (s->n < 2) {
            sequence_free(s);
            continue;
        }
        c->max_len = s->n - 1 > c->max_len ? s->n - 1 : c->max_len;
        c->n++;
    }
    if (c->n == 0)
        ER_CHECK(er_error(ER_EINVAL, "%s: no calibration record gives a sequence within --seq-len %d", path, seq_len));
done:
    dataset_free(&d);
    return rc;
}

// Runs the model over sequences [i0, i1) one at a time. With fisher != NULL (a trainable model),
// accumulates the squared gradient of each sequence's mean loss into fisher (layout of grad_mem);
// else the token-weighted mean NLL goes to *nll.
static int calib_pass(Model *m, Calib *c, int i0, int i1, float *fisher, double *nll) {
    Activations a = {0};
    Batch b = {0};
    double sum = 0;
    long count = 0;
    int rc = ER_OK;
    ER_CHECK(acts_alloc(&a, &m->cfg, 1, c->max_len, fisher ? ACTS_TRAIN : ACTS_SCORE, 0));
    ER_CHECK(batch_alloc(&b, 1, c->max_len));
    for (int i = i0; i < i1; i++) {
        ER_CHECK(batch_fill(&b, &c->sb, c->seqs, &i, 1));
        if (b.n_loss == 0)
            continue;
        ModelInput in = {.B = 1, .T = b.T, .tokens = b.tokens, .len = b.len};
        double loss;
        if (fisher)
            model_zero_grad(m);
        ER_CHECK(model_forward(m, &in, &a));
        ER_CHECK(model_loss(&a, b.targets, b.loss_mask, fisher != NULL, &loss));
        if (fisher) {
            ER_CHECK(model_backward(m, &in, &a));
            const float *g = m->grad_mem;
            size_t n = m->n_param_floats;
#pragma omp parallel for schedule(static)
            for (size_t j = 0; j < n; j++)
                fisher[j] += g[j] * g[j];
        }
        sum += loss * (double)b.n_loss;
        count += b.n_loss;
    }
    if (nll)
        *nll = count ? sum / (double)count : NAN;
done:
    batch_free(&b);
    acts_free(&a);
    return rc;
}

// An error naming the first block of quantize_input_moments's *hmem (layout in quantize.h) with a NaN or
// Inf: the activations of the calibration sequences [i0, i1) overflowed or were not finite.
static int hessian_check(const float *hmem, const ModelConfig *cfg, size_t per_layer, int i0, int i1) {
    int C = cfg->C, qd = cfg->NH * cfg->HS, FF = cfg->FF;
    size_t sizes[4] = {(size_t)C * C, (size_t)qd * qd, (size_t)C * C, (size_t)FF * FF};
    const char *readers[4] = {"q/k/v_proj", "o_proj", "gate/up_proj", "down_proj"};
    for (int l = 0; l <= cfg->L; l++) {
        const float *h = hmem + per_layer * l;
        for (int k = 0; k < (l < cfg->L ? 4 : 1); k++) {
            for (size_t j = 0; j < sizes[k]; j++)
                if (!isfinite(h[j]))
                    return l < cfg->L ? er_error(ER_EINVAL, "quantize: the input second moments of "
                                                 "model.layers.%d.%s are not finite (NaN or Inf in the activations "
                                                 "of calibration sequences %d..%d)", l, readers[k], i0, i1 - 1)
                                      : er_error(ER_EINVAL, "quantize: the input second moments of lm_head are not "
                                                 "finite (NaN or Inf in the activations of calibration sequences "
                                                 "%d..%d)", i0, i1 - 1);
            h += sizes[k];
        }
    }
    return ER_OK;
}

int quantize_input_moments(Model *m, const SeqBuilder *sb, const Sequence *seqs, int i0, int i1, int max_len,
                           float **hmem, const float ***hs) {
    const ModelConfig *cfg = &m->cfg;
    int C = cfg->C, qd = cfg->NH * cfg->HS, FF = cfg->FF, rc = ER_OK;
    size_t per_layer = 2 * (size_t)C * C + (size_t)qd * qd + (size_t)FF * FF;
    Activations a = {0};
    Batch b = {0};
    *hmem = er_calloc(per_layer * cfg->L + (size_t)C * C, sizeof(float));
    if (hs)
        *hs = er_calloc((size_t)m->n_params, sizeof(float *));
    if (!*hmem || (hs && !*hs))
        ER_CHECK(er_error(ER_ENOMEM, "quantize: cannot allocate %.1f MiB for the input second moments",
                          (per_layer * cfg->L + (size_t)C * C) * 4.0 / 1048576.0));
    ER_CHECK(acts_alloc(&a, cfg, 1, max_len, ACTS_TRAIN, 0));
    ER_CHECK(batch_alloc(&b, 1, max_len));
    float *hf = *hmem + per_layer * cfg->L; // (C, C) the lm_head's input
    for (int i = i0; i < i1; i++) {
        ER_CHECK(batch_fill(&b, sb, seqs, &i, 1));
        ModelInput in = {.B = 1, .T = b.T, .tokens = b.tokens, .len = b.len};
        ER_CHECK(model_forward(m, &in, &a));
        int N = b.T;
        for (int l = 0; l < cfg->L; l++) {
            float *h = *hmem + per_layer * l, *ho = h + (size_t)C * C, *hm = ho + (size_t)qd * qd,
                  *hd = hm + (size_t)C * C;
            const LayerActs *la = &a.layer[l];
            gemm_f32(1, 0, C, C, N, 1.0f, la->ln1, C, la->ln1, C, 1.0f, h, C);
            gemm_f32(1, 0, qd, qd, N, 1.0f, la->atty, qd, la->atty, qd, 1.0f, ho, qd);
            gemm_f32(1, 0, C, C, N, 1.0f, la->ln2, C, la->ln2, C, 1.0f, hm, C);
            gemm_f32(1, 0, FF, FF, N, 1.0f, la->hmlp, FF, la->hmlp, FF, 1.0f, hd, FF);
        }
        gemm_f32(1, 0, C, C, N, 1.0f, a.lnf, C, a.lnf, C, 1.0f, hf, C);
    }
    ER_CHECK(hessian_check(*hmem, cfg, per_layer, i0, i1));
    for (int i = 0; hs && i < m->n_params; i++) {
        const Weight *w = m->params[i].w;
        for (int l = 0; w && l < cfg->L; l++) {
            const LayerWeights *lw = &m->layers[l];
            const float *h = *hmem + per_layer * l, *ho = h + (size_t)C * C, *hm = ho + (size_t)qd * qd,
                        *hd = hm + (size_t)C * C;
            (*hs)[i] = w == &lw->wq || w == &lw->wk || w == &lw->wv ? h
                       : w == &lw->wo                              ? ho
                       : w == &lw->wgate || w == &lw->wup          ? hm
                       : w == &lw->wdown                           ? hd
                                                                   : (*hs)[i];
        }
        if (w == &m->lm_head && m->lm_head.data != m->embed.data)
            (*hs)[i] = hf;
    }
done:
    batch_free(&b);
    acts_free(&a);
    return rc;
}

// ---- the command ----

static cJSON *run_json(const QuantizeConfig *c, const Model *m, const QuantizeResult *r, const char *sens) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "command", "quantize");
    cJSON_AddStringToObject(j, "version", ERTRAIN_VERSION);
    cJSON_AddStringToObject(j, "model", c->model_dir);
    cJSON_AddStringToObject(j, "weights", c->q.weights); // as asked: q2rtn is stored as q2lut
    cJSON *q = m->quant.enabled ? quant_config_to_json(&m->quant) : NULL;
    if (q)
        cJSON_AddItemToObject(j, "quantization_config", q);
    cJSON_AddStringToObject(j, "sensitivity", sens);
    cJSON_AddStringToObject(j, "scale_search", c->q.scale_search ? c->q.scale_search : "lp");
    if (c->calib)
        cJSON_AddStringToObject(j, "calib", c->calib);
    cJSON_AddNumberToObject(j, "calib_n", c->calib_n);
    cJSON_AddNumberToObject(j, "seq_len", c->seq_len);
    cJSON_AddNumberToObject(j, "seed", (double)c->seed);
    cJSON_AddNumberToObject(j, "bits_per_weight", r->rep.bits_per_weight);
    cJSON_AddNumberToObject(j, "model_bits_per_weight", r->rep.model_bits_per_weight);
    cJSON_AddNumberToObject(j, "bytes_before", (double)r->rep.bytes_before);
    cJSON_AddNumberToObject(j, "bytes_after", (double)r->rep.bytes_after);
    cJSON_AddNumberToObject(j, "mean_rel_error", r->rep.mean_rel_error);
    cJSON_AddNumberToObject(j, "max_rel_error", r->rep.max_rel_error);
    if (!isnan(r->nll_before)) {
        cJSON_AddNumberToObject(j, "nll_before", r->nll_before);
        cJSON_AddNumberToObject(j, "nll_after", r->nll_after);
        cJSON_AddNumberToObject(j, "nll_sequences", r->nll_sequences);
        cJSON_AddBoolToObject(j, "nll_held_out", r->nll_held_out);
    }
    if (!isnan(r->fpt_local_first) || !isnan(r->fpt_kl_before)) {
        cJSON *f = cJSON_AddObjectToObject(j, "fpt");
        RunNumber nums[] = {{"local_steps", (double)c->fpt_local_steps}, {"steps", (double)c->fpt_steps},
                            {"lr", c->fpt_lr}, {"local_first", r->fpt_local_first}, {"local_last", r->fpt_local_last},
                            {"kl_before", r->fpt_kl_before}, {"kl_after", r->fpt_kl_after}};
        if (f)
            run_add_numbers(f, nums, sizeof nums / sizeof nums[0]);
    }
    return j;
}

static int parse_transforms(const char *tr, unsigned *flags) {
    if (transform_parse_mode(tr, flags) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", er_last_error());
        return er_error(ER_EINVAL, "--transforms \"%s\" (none, rotate, fpt, or a list of r, u, v, k): %s", tr, why);
    }
    return ER_OK;
}

// A tied model whose lm_head is asked for another format than the embedding's is untied first.
static int untie_for_head(Model *m, const QuantizeOptions *o, FILE *log) {
    WeightFormat hf, ef = embed_format(o);
    int hg, hm, hu;
    if (strcmp(o->lm_head, "fp") == 0)
        hf = WF_F32;
    else if (quantize_parse_weights(o->lm_head, &hf, &hg, &hm, &hu) < 0 || hm) {
        char specs[256];
        return er_error(ER_EINVAL, "--lm-head \"%s\" is not one of fp, %s", o->lm_head,
                        quantize_weights_list(specs, sizeof specs, ", ", " or "));
    }
    if (hf == ef)
        return ER_OK;
    ER_TRY(quantize_untie(m));
    if (log)
        fprintf(log, "lm_head untied from the embedding so it can be %s (the dir gets its own lm_head.weight)\n",
                o->lm_head);
    return ER_OK;
}

int quantize_load(Model *m, const char *model_dir, const char *transforms, uint64_t seed, const QuantizeOptions *o,
                  int trainable, FILE *log, QuantizeSource *src) {
    memset(src, 0, sizeof *src);
    memset(m, 0, sizeof *m);
    const char *tr = transforms ? transforms : "none";
    unsigned tflags;
    ER_TRY(parse_transforms(tr, &tflags));
    double t0 = time_now();
    int rc = ER_OK;
    // The transforms rewrite the weights: they need a trainable fp32 model.
    ER_CHECK(model_load(m, model_dir, trainable || tflags ? MODEL_LOAD_TRAINABLE : 0));
    if (m->quant.enabled)
        ER_CHECK(er_error(ER_EINVAL, "%s is already quantized (%s): quantize the float model", model_dir,
                          m->quant.method));
    src->bf16 = m->cfg.dtype == DT_BF16;
    src->params = model_config_num_params(&m->cfg);
    src->bytes = src->params * dtype_size(m->cfg.dtype);
    if (log)
        fprintf(log, "loaded %s: %zu parameters (%s), %.1fs\n", model_dir, src->params, dtype_name(m->cfg.dtype),
                time_now() - t0);
    if (tflags) {
        t0 = time_now();
        ER_CHECK(transform_model(m, tr, seed));
        if (log)
            fprintf(log, "transforms %s applied (function-preserving%s), %.1fs\n", tr,
                    m->cfg.tied ? "" : ", lm_head untied", time_now() - t0);
    }
    if (m->cfg.tied && o && o->lm_head)
        ER_CHECK(untie_for_head(m, o, log));
done:
    if (rc < 0)
        model_free(m);
    return rc;
}

int quantize_write_dir(const Model *m, const char *src_dir, const char *out_dir, int as_bf16, FILE *log) {
    ER_TRY(model_save(m, out_dir, as_bf16));
    char *tj = path_join(src_dir, "tokenizer.json");
    if (!tj)
        return ER_ENOMEM;
    int has_tokenizer = gguf_is_path(src_dir) || path_exists(tj);
    er_free(tj);
    if (has_tokenizer)
        return run_copy_tokenizer(src_dir, out_dir);
    if (log)
        fprintf(log, "note: %s has no tokenizer.json; none copied\n", src_dir);
    return ER_OK;
}

int quantize_data_nll(Model *m, const char *tokenizer_dir, const char *path, const char *response_key, int n,
                      int seq_len, double *nll, int *n_seq) {
    Calib cal;
    int rc = ER_OK;
    ER_CHECK(calib_load(&cal, tokenizer_dir, path, response_key, n, seq_len, m->cfg.V));
    ER_CHECK(calib_pass(m, &cal, 0, cal.n, NULL, nll));
done:
    if (n_seq)
        *n_seq = cal.n;
    calib_free(&cal);
    return rc;
}

int quantize_stream_moments(Model *m, const char *tokenizer_dir, const char *path, const char *response_key, int n,
                            int seq_len, double *S, double *diag) {
    const ModelConfig *cfg = &m->cfg;
    int C = cfg->C, N = 2 * cfg->L + 1, rc = ER_OK;
    long tokens = 0;
    Calib cal;
    Activations a = {0};
    Batch b = {0};
    if (S)
        memset(S, 0, sizeof(double) * (size_t)C * C);
    memset(diag, 0, sizeof(double) * (size_t)N * C);
    ER_CHECK(calib_load(&cal, tokenizer_dir, path, response_key, n, seq_len, cfg->V));
    ER_CHECK(acts_alloc(&a, cfg, 1, cal.max_len, ACTS_TRAIN, 0));
    ER_CHECK(batch_alloc(&b, 1, cal.max_len));
    for (int i = 0; i < cal.n; i++) {
        ER_CHECK(batch_fill(&b, &cal.sb, cal.seqs, &i, 1));
        ModelInput in = {.B = 1, .T = b.T, .tokens = b.tokens, .len = b.len};
        ER_CHECK(transform_stream_moments_add(m, &in, &a, S, diag, &tokens));
    }
    transform_stream_moments_mean(&m->cfg, S, diag, tokens);
done:
    batch_free(&b);
    acts_free(&a);
    calib_free(&cal);
    return rc;
}

// The flags, checked before the (slow) load. *to_bf16: --weights bf16 (the float model stored as bf16,
// no quantization_config: the bf16 row of a size table); *sens: the sensitivity in effect.
static int quantize_check(const QuantizeConfig *c, int *to_bf16, const char **sens) {
    if (!c->model_dir || !c->out_dir)
        return er_error(ER_EINVAL, "--model and --out are required");
    unsigned tflags;
    ER_TRY(parse_transforms(c->transforms ? c->transforms : "none", &tflags));
    *to_bf16 = c->q.weights && strcmp(c->q.weights, "bf16") == 0;
    if (tflags & TRANSFORM_TRAINED) {
        if (*to_bf16)
            return er_error(ER_EINVAL, "--transforms fpt-trained trains against a quantizer: not with --weights bf16");
        if ((c->fpt_local_steps > 0 || c->fpt_steps > 0) && !c->calib)
            return er_error(ER_EINVAL, "--transforms fpt-trained needs calibration data (--calib FILE.jsonl) for its "
                            "%ld local and %ld end-to-end steps", c->fpt_local_steps, c->fpt_steps);
        if (c->fpt_local_steps < 0 || c->fpt_steps < 0 || !(c->fpt_lr > 0) || !isfinite(c->fpt_lr))
            return er_error(ER_EINVAL, "--fpt-local-steps and --fpt-steps must be >= 0 and --fpt-lr > 0");
    } else if (c->resume) {
        return er_error(ER_EINVAL, "--resume continues a --transforms fpt-trained run; nothing else resumes");
    }
    *sens = c->sensitivity ? c->sensitivity : c->calib && !*to_bf16 ? "fisher" : "none";
    if (strcmp(*sens, "fisher") != 0 && strcmp(*sens, "none") != 0)
        return er_error(ER_EINVAL, "--sensitivity \"%s\" must be fisher or none", *sens);
    int fisher = strcmp(*sens, "fisher") == 0;
    if (fisher && !c->calib)
        return er_error(ER_EINVAL, "--sensitivity fisher needs calibration data (--calib FILE.jsonl)");
    if (fisher && *to_bf16)
        return er_error(ER_EINVAL, "--sensitivity fisher has nothing to weight with --weights bf16");
    if (*to_bf16 && c->q.lm_head)
        return er_error(ER_EINVAL, "--lm-head is for quantized formats; --weights bf16 stores every tensor as bf16");
    if (c->calib_n < 1)
        return er_error(ER_EINVAL, "--calib-n must be >= 1 (got %d)", c->calib_n);
    if (c->seq_len < 2)
        return er_error(ER_EINVAL, "--seq-len must be >= 2 (got %d)", c->seq_len);
    WeightFormat f;
    int g, mix, u;
    char specs[256];
    if (!c->q.weights || (!*to_bf16 && quantize_parse_weights(c->q.weights, &f, &g, &mix, &u) < 0))
        return er_error(ER_EINVAL, "--weights \"%s\" is not one of bf16, %s", c->q.weights ? c->q.weights : "",
                        quantize_weights_list(specs, sizeof specs, ", ", " or "));
    if (c->q.sparse && (*to_bf16 || !weight_format_info(f)->levels || u))
        return er_error(ER_EINVAL, SPARSE_FORMATS_ERROR, c->q.sparse, c->q.weights);
    return ER_OK;
}

// --error-feedback: *gptq when the codebook formats' codes are assigned against the inputs' second moments.
static int error_feedback_mode(const QuantizeConfig *c, int *gptq) {
    WeightFormat f = WF_F32;
    int g, mix, u = 0;
    if (c->q.weights && strcmp(c->q.weights, "bf16") != 0)
        ER_TRY(quantize_parse_weights(c->q.weights, &f, &g, &mix, &u));
    int lut = weight_format_info(f)->levels && !u;
    const char *e = c->error_feedback ? c->error_feedback : lut && c->calib ? "gptq" : "none";
    if (strcmp(e, "gptq") != 0 && strcmp(e, "none") != 0)
        return er_error(ER_EINVAL, "--error-feedback \"%s\" must be gptq or none", e);
    *gptq = strcmp(e, "gptq") == 0;
    if (*gptq && !c->calib)
        return er_error(ER_EINVAL, "--error-feedback gptq needs calibration data (--calib FILE.jsonl)");
    if (*gptq && !lut)
        return er_error(ER_EINVAL, "--error-feedback gptq is for the k-means codebook formats (q2lut, q4lut), not %s",
                        c->q.weights);
    return ER_OK;
}

// Fisher sensitivities: squared gradients over the first n_fit calibration sequences into *fmem
// (layout of grad_mem), with *imp (n_params) pointing at each parameter's share.
static int fisher_importance(Model *m, Calib *cal, int n_fit, FILE *log, float **fmem, const float ***imp) {
    double t0 = time_now();
    *fmem = er_calloc(m->n_param_floats, sizeof(float));
    *imp = er_calloc((size_t)m->n_params, sizeof(float *));
    if (!*fmem || !*imp)
        return er_error(ER_ENOMEM, "quantize: cannot allocate %.1f MiB for the Fisher sensitivities",
                        m->n_param_floats * 4.0 / 1048576.0);
    ER_TRY(calib_pass(m, cal, 0, n_fit, *fmem, NULL));
    for (int i = 0; i < m->n_params; i++)
        (*imp)[i] = m->params[i].grad ? *fmem + (m->params[i].grad - m->grad_mem) : NULL;
    if (log)
        fprintf(log, "fisher: squared gradients over %d calibration sequences, %.1fs\n", n_fit, time_now() - t0);
    return ER_OK;
}

int quantize_fisher(Model *m, const char *tokenizer_dir, const char *path, const char *response_key, int n,
                    int seq_len, float **fmem, const float ***imp) {
    Calib cal;
    *fmem = NULL;
    *imp = NULL;
    int rc = ER_OK;
    ER_CHECK(calib_load(&cal, tokenizer_dir, path, response_key, n, seq_len, m->cfg.V));
    ER_CHECK(fisher_importance(m, &cal, cal.n, NULL, fmem, imp));
done:
    calib_free(&cal);
    return rc;
}

static int quantize_step(Model *m, const QuantizeConfig *c, const QuantizeSource *src, const float **imp,
                         const float **hs, FILE *log, QuantizeReport *rep) {
    double t0 = time_now();
    QuantizeOptions qo = c->q;
    qo.method_note = imp && hs ? "fisher-gptq" : imp ? "fisher" : hs ? "gptq" : NULL;
    qo.hessians = (const float *const *)hs;
    qo.transforms = c->transforms ? c->transforms : "none";
    if (log)
        fprintf(log, "quantizing to %s:\n", c->q.weights);
    ER_TRY(quantize_model(m, &qo, (const float *const *)imp, log, rep));
    rep->bytes_before = src->bytes;
    rep->model_bits_per_weight = (double)rep->bytes_after * 8.0 / (double)src->params;
    if (log)
        fprintf(log, "quantized in %.1fs\n", time_now() - t0);
    return ER_OK;
}

// *out = every setting of c besides the --fpt-* ones that changes what fpt-trained computes: a resumed
// run must match them.
static int fpt_settings_json(const QuantizeConfig *c, cJSON **out) {
    char fp[48] = "";
    if (c->calib) // none when neither stage runs
        ER_TRY(file_fingerprint(c->calib, fp, sizeof fp)); // core/fileio.h: "<bytes>:<FNV-1a 64>"
    char *calib = path_resolve(c->calib ? c->calib : "");
    cJSON *j = calib ? cJSON_CreateObject() : NULL;
    if (j) {
        const QuantizeOptions *q = &c->q;
        cJSON_AddStringToObject(j, "calib", calib);
        cJSON_AddStringToObject(j, "calib_bytes_fnv1a", fp);
        cJSON_AddStringToObject(j, "response_key", c->response_key ? c->response_key : "");
        cJSON_AddNumberToObject(j, "seq_len", c->seq_len);
        cJSON_AddNumberToObject(j, "seed", (double)c->seed);
        cJSON_AddStringToObject(j, "embeddings", q->embeddings ? q->embeddings : "");
        cJSON_AddStringToObject(j, "lm_head", q->lm_head ? q->lm_head : "");
        cJSON_AddStringToObject(j, "scale_search", q->scale_search ? q->scale_search : "");
        cJSON_AddNumberToObject(j, "p", q->p);
        cJSON_AddNumberToObject(j, "kmeans_iters", q->kmeans_iters);
    }
    er_free(calib);
    *out = j;
    return j ? ER_OK : ER_ENOMEM;
}

// --transforms fpt-trained: m holds the closed-form fpt; trains its transforms on the first n_fit
// calibration sequences and merges them (train/fpt.h). metrics.jsonl and checkpoint/ go into out_dir.
static int train_transforms(Model *m, const QuantizeConfig *c, const Calib *cal, int n_fit, QuantizeResult *res) {
    ER_TRY(dir_make(c->out_dir));
    FptTrainConfig fc = {.local_steps = c->fpt_local_steps, .steps = c->fpt_steps, .lr = c->fpt_lr, .q = &c->q,
                         .sb = &cal->sb, .seqs = cal->seqs, .n_seqs = n_fit, .max_len = cal->max_len,
                         .dir = c->out_dir, .save_every = c->fpt_save_every, .resume = c->resume,
                         .log = c->log};
    FptTrainResult fr;
    double t0 = time_now();
    cJSON *settings;
    ER_TRY(fpt_settings_json(c, &settings));
    fc.settings = settings;
    int rc = fpt_train(m, &fc, &fr);
    cJSON_Delete(settings);
    ER_TRY(rc);
    res->fpt_local_first = fr.local_first, res->fpt_local_last = fr.local_last;
    res->fpt_kl_before = fr.kl_before, res->fpt_kl_after = fr.kl_after;
    if (c->log) {
        fprintf(c->log, "fpt-trained: %ld local + %ld end-to-end steps, merged into the weights", c->fpt_local_steps,
                c->fpt_steps);
        if (c->fpt_local_steps > 0)
            fprintf(c->log, "; local objective %.4f -> %.4f", fr.local_first, fr.local_last);
        if (c->fpt_steps > 0)
            fprintf(c->log, "; mean KL over the calibration sequences %.5f -> %.5f", fr.kl_before, fr.kl_after);
        fprintf(c->log, "; %.1fs\n", time_now() - t0);
    }
    return ER_OK;
}

// --weights bf16: the report of the dir as written, its NLL from the bf16 weights as they load.
static int bf16_result(const QuantizeConfig *c, const char *dir, const QuantizeSource *src, Calib *cal, int h0,
                       int h1, QuantizeResult *res) {
    res->rep.bytes_before = src->bytes;
    res->rep.bytes_after = src->params * 2;
    res->rep.bits_per_weight = res->rep.model_bits_per_weight = 16.0;
    if (!c->calib)
        return ER_OK;
    Model b;
    int rc = ER_OK;
    ER_CHECK(model_load(&b, dir, 0));
    ER_CHECK(calib_pass(&b, cal, h0, h1, NULL, &res->nll_after));
done:
    model_free(&b);
    return rc;
}

typedef struct {
    const Model *m;
    const char *src_dir;
    int as_bf16;
    FILE *log;
} WriteDirCtx;

static int write_dir(void *ctx, const char *dir) {
    const WriteDirCtx *w = ctx;
    return quantize_write_dir(w->m, w->src_dir, dir, w->as_bf16, w->log);
}

static void print_report(FILE *log, const QuantizeConfig *c, const QuantizeResult *res, int to_bf16) {
    const QuantizeReport *r = &res->rep;
    if (!log)
        return;
    fprintf(log, "bits per weight: %.3f (layer projections, scales included), %.3f (whole model)\n",
            r->bits_per_weight, r->model_bits_per_weight);
    fprintf(log, "bytes: %.2f MiB -> %.2f MiB (%.2fx smaller)\n", r->bytes_before / 1048576.0,
            r->bytes_after / 1048576.0, r->bytes_after ? (double)r->bytes_before / (double)r->bytes_after : 0.0);
    if (!to_bf16)
        fprintf(log, "relative error: mean %.4f, worst %.4f\n", r->mean_rel_error, r->max_rel_error);
    if (c->calib)
        fprintf(log, "NLL on %d %s calibration sequences: %.4f (float) -> %.4f (%s), %+.4f\n", res->nll_sequences,
                res->nll_held_out ? "held-out" : "(in-sample)", res->nll_before, res->nll_after, c->q.weights,
                res->nll_after - res->nll_before);
    fprintf(log, "wrote %s\n", c->out_dir);
}

int quantize_run(const QuantizeConfig *c, QuantizeResult *res) {
    QuantizeResult local;
    if (!res)
        res = &local;
    memset(res, 0, sizeof *res);
    res->nll_before = res->nll_after = NAN;
    res->fpt_local_first = res->fpt_local_last = res->fpt_kl_before = res->fpt_kl_after = NAN;
    int to_bf16 = 0;
    const char *sens = "none";
    ER_TRY(quantize_check(c, &to_bf16, &sens));
    unsigned tflags;
    ER_TRY(parse_transforms(c->transforms ? c->transforms : "none", &tflags));
    int trained = (tflags & TRANSFORM_TRAINED) != 0;
    ER_TRY(dir_output_not_input(c->out_dir, c->model_dir, "--model"));
    ER_TRY(dir_output_not_input(c->out_dir, c->calib, "--calib"));
    ER_TRY(run_dir_check(c->out_dir, !trained ? RUN_ONCE : c->resume ? RUN_RESUME : RUN_NEW, c->log));
    threads_set(c->threads);
    int fisher = strcmp(sens, "fisher") == 0, gptq = 0;
    ER_TRY(error_feedback_mode(c, &gptq));
    Model m = {0};
    Calib cal = {0};
    float *fmem = NULL, *hmem = NULL;
    const float **imp = NULL, **hs = NULL;
    QuantizeSource src;
    cJSON *j = NULL;
    char *stage = NULL;
    int rc = ER_OK;
    // Fisher needs gradients: a trainable fp32 model.
    ER_CHECK(quantize_load(&m, c->model_dir, c->transforms, c->seed, to_bf16 ? NULL : &c->q, fisher || gptq, c->log,
                           &src));
    if (c->calib)
        ER_CHECK(calib_load(&cal, c->model_dir, c->calib, c->response_key, 2 * c->calib_n, c->seq_len, m.cfg.V));
    int n_fit = cal.n < c->calib_n ? cal.n : c->calib_n;
    int h0 = n_fit, h1 = cal.n; // held-out NLL sequences; in-sample when there are none
    if (h1 <= h0)
        h0 = 0, h1 = n_fit;
    if (trained) {
        ER_CHECK(train_transforms(&m, c, &cal, n_fit, res));
    }
    if (fisher)
        ER_CHECK(fisher_importance(&m, &cal, n_fit, c->log, &fmem, &imp));
    if (gptq) {
        double t0 = time_now();
        ER_CHECK(quantize_input_moments(&m, &cal.sb, cal.seqs, 0, n_fit, cal.max_len, &hmem, &hs));
        if (c->log)
            fprintf(c->log, "gptq: input second moments over %d calibration sequences, %.1fs\n", n_fit, time_now() - t0);
    }
    if (c->calib) {
        ER_CHECK(calib_pass(&m, &cal, h0, h1, NULL, &res->nll_before));
        res->nll_sequences = h1 - h0;
        res->nll_held_out = h0 > 0;
    }
    if (!to_bf16) {
        ER_CHECK(quantize_step(&m, c, &src, imp, hs, c->log, &res->rep));
        er_free(fmem); // not needed past the quantizers
        er_free(imp);
        fmem = NULL;
        imp = NULL;
        if (c->calib)
            ER_CHECK(calib_pass(&m, &cal, h0, h1, NULL, &res->nll_after));
    }
    // A trained run's dir holds its checkpoint: the model files move in once all are written. Else the whole
    // dir is staged beside --out and renamed onto it at the end: a failed write leaves no half a model.
    WriteDirCtx wd = {&m, c->model_dir, src.bf16 || to_bf16, c->log};
    if (trained) {
        ER_CHECK(run_write_outputs(c->out_dir, write_dir, &wd));
    } else {
        ER_CHECK(dir_stage_open(c->out_dir, &stage));
        ER_CHECK(write_dir(&wd, stage));
    }
    const char *dst = stage ? stage : c->out_dir;
    if (to_bf16)
        ER_CHECK(bf16_result(c, dst, &src, &cal, h0, h1, res));
    if (!(j = run_json(c, &m, res, sens)))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(run_write_json(dst, j));
    if (stage) {
        rc = dir_stage_commit(stage, c->out_dir);
        stage = NULL;
        ER_CHECK(rc);
    }
    print_report(c->log, c, res, to_bf16);
done:
    dir_stage_abort(stage);
    cJSON_Delete(j);
    er_free(fmem);
    er_free(imp);
    er_free(hmem);
    er_free(hs);
    calib_free(&cal);
    model_free(&m);
    return rc;
}
