// ertrain quantize: float model dir -> quantized model dir (see train/quantize.h).
#include "train/quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "quant/quant.h"
#include "quant/quantizer.h"
#include "train/run.h"
#include "train/sequence.h"
#include "train/trainer.h"
#include "train/transform_model.h"

#define SPECS "q8, q4, q4g32, q4g64, q4g128, q4lut, q2lut or q2rtn"

// ---- the model ----

static size_t param_bytes(const ParamTensor *p, size_t float_size) {
    if (p->w && p->w->fmt != WF_F32) // packed, or a float format narrower than the fp32 count
        return weight_bytes(p->w);
    return p->numel * float_size;
}

int quantize_parse_weights(const char *spec, WeightFormat *f, int *group, int *uniform) {
    *uniform = 0;
    if (spec && strcmp(spec, "q2rtn") == 0) {
        *f = WF_Q2LUT;
        *group = 0;
        *uniform = 1;
        return ER_OK;
    }
    return quant_parse_spec(spec, f, group);
}

int quantize_plan(const Model *m, const QuantizeOptions *o, QuantizePlan *plan) {
    memset(plan, 0, sizeof *plan);
    QuantConfig *q = &plan->q;
    if (m->quant.enabled)
        return er_error(ER_EINVAL, "quantize: the model is already quantized (%s)", m->quant.method);
    if (!o->weights || quantize_parse_weights(o->weights, &q->linear, &q->group, &plan->linear_uniform) < 0)
        return er_error(ER_EINVAL, "--weights \"%s\" is not one of " SPECS, o->weights ? o->weights : "");
    const char *emb = o->embeddings ? o->embeddings : "int8";
    if (strcmp(emb, "int8") != 0 && strcmp(emb, "fp") != 0)
        return er_error(ER_EINVAL, "--embeddings \"%s\" must be int8 or fp", emb);
    q->embed_int8 = strcmp(emb, "int8") == 0;
    // A tied lm_head is the embedding: the config then names the embedding's format for it.
    const char *head = o->lm_head                  ? o->lm_head
                       : m->cfg.tied               ? (q->embed_int8 ? "q8" : "fp")
                       : q->linear == WF_Q2LUT     ? "q4"
                                                   : o->weights;
    int hg = 0;
    if (strcmp(head, "fp") == 0)
        q->lm_head = WF_F32;
    else if (quantize_parse_weights(head, &q->lm_head, &hg, &plan->head_uniform) < 0)
        return er_error(ER_EINVAL, "--lm-head \"%s\" is not one of fp, " SPECS, head);
    if (m->cfg.tied && o->lm_head && q->lm_head != (q->embed_int8 ? WF_Q8 : WF_F32))
        return er_error(ER_EINVAL,
                        "--lm-head %s: the model ties its lm_head to the embedding (--embeddings %s); untie it first "
                        "(quantize_untie)",
                        head, emb);
    if (weight_format_grouped(q->lm_head) && weight_format_grouped(q->linear) && hg != q->group)
        return er_error(ER_EINVAL, "--lm-head %s must use the group size of --weights %s", head, o->weights);
    if (weight_format_grouped(q->lm_head))
        q->group = hg;
    const char *ss = o->scale_search ? o->scale_search : "lp";
    if (strcmp(ss, "lp") != 0 && strcmp(ss, "minmax") != 0)
        return er_error(ER_EINVAL, "--scale-search \"%s\" must be lp or minmax", ss);
    plan->minmax = strcmp(ss, "minmax") == 0;
    // Check every matrix fits its format before any work.
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        if (!p->w)
            continue;
        WeightFormat f = p->w == &m->embed ? (q->embed_int8 ? WF_Q8 : WF_F32)
                         : p->w == &m->lm_head ? q->lm_head
                                               : q->linear;
        if (weight_is_quantized(f))
            ER_TRY(quant_check_shape(f, p->w->rows, p->w->cols, q->group, p->name));
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
    WeightFormat f = !p->w                 ? WF_F32
                     : p->w == &m->embed   ? (q->embed_int8 ? WF_Q8 : WF_F32)
                     : p->w == &m->lm_head ? q->lm_head
                                           : q->linear;
    quant_options_default(qo, f, weight_format_grouped(f) ? q->group : 0);
    qo->search = plan->minmax ? QSEARCH_MINMAX : QSEARCH_LP;
    if (o->p > 0)
        qo->p = o->p;
    if (o->kmeans_iters > 0)
        qo->kmeans_iters = o->kmeans_iters;
    qo->uniform = !p->w || p->w == &m->embed ? 0 : p->w == &m->lm_head ? plan->head_uniform : plan->linear_uniform;
}

int quantize_model(Model *m, const QuantizeOptions *o, const float *const *importance, FILE *log, QuantizeReport *rep) {
    memset(rep, 0, sizeof *rep);
    QuantizePlan plan;
    ER_TRY(quantize_plan(m, o, &plan));
    size_t fsz = m->cfg.dtype == DT_F32 ? 4 : 2, lin_bytes = 0, lin_numel = 0, total_numel = 0;
    for (int i = 0; i < m->n_params; i++) {
        rep->bytes_before += m->params[i].numel * fsz;
        total_numel += m->params[i].numel;
    }
    m->quant = plan.q; // model_quant_format now gives each matrix its target
    float *tmp = NULL;
    size_t tmp_n = 0;
    double err_sum = 0;
    int err_n = 0, rc = ER_OK;
    double lerr[7];
    int li = 0;
    for (int i = 0; i < m->n_params && rc == ER_OK; i++) {
        ParamTensor *p = &m->params[i];
        if (!p->w)
            continue;
        QuantOptions qo;
        quantize_plan_options(m, &plan, o, p, &qo);
        WeightFormat f = qo.fmt;
        int group = qo.group;
        if (!weight_is_quantized(f))
            continue;
        const float *src = p->data;
        if (!src || p->w->fmt != WF_F32) {
            if (tmp_n < p->numel) {
                er_free(tmp);
                tmp = er_alloc(p->numel * sizeof(float));
                tmp_n = tmp ? p->numel : 0;
                if (!tmp) {
                    rc = ER_ENOMEM;
                    break;
                }
            }
            quant_dequant_rows(tmp, p->w, 0, p->w->rows);
            src = tmp;
        }
        Weight qw;
        rc = quantize_matrix(&qw, src, p->w->rows, p->w->cols, importance ? importance[i] : NULL, &qo);
        if (rc < 0)
            break;
        double e = quant_rel_error(&qw, src);
        rep->max_rel_error = e > rep->max_rel_error ? e : rep->max_rel_error;
        int is_layer = p->w != &m->embed && p->w != &m->lm_head;
        if (is_layer) {
            lin_bytes += weight_bytes(&qw);
            lin_numel += p->numel;
            err_sum += e;
            err_n++;
            lerr[li++] = e;
        }
        rc = model_set_weight(m, p, &qw);
        if (rc < 0) {
            weight_free(&qw);
            break;
        }
        if (log && !is_layer) {
            char spec[16];
            fprintf(log, "  %-28s %-6s rel err %.4f\n", p->name, quant_spec_name(f, group, spec), e);
        }
        if (li == 7 && log)
            // q, k, v, o, gate, up, down in HF order
            fprintf(log, "  layer %3d  rel err q %.4f k %.4f v %.4f o %.4f gate %.4f up %.4f down %.4f\n",
                    (int)(strstr(p->name, "layers.") ? atoi(strstr(p->name, "layers.") + 7) : 0), lerr[0], lerr[1],
                    lerr[2], lerr[3], lerr[4], lerr[5], lerr[6]);
        if (li == 7)
            li = 0;
    }
    er_free(tmp);
    if (rc < 0) {
        // The model holds a mix now; the caller frees it.
        return rc;
    }
    for (int i = 0; i < m->n_params; i++)
        rep->bytes_after += param_bytes(&m->params[i], fsz);
    rep->bits_per_weight = lin_numel ? (double)lin_bytes * 8.0 / (double)lin_numel : 0;
    rep->model_bits_per_weight = total_numel ? (double)rep->bytes_after * 8.0 / (double)total_numel : 0;
    rep->mean_rel_error = err_n ? err_sum / err_n : 0;
    m->quant.bits_per_weight = round(rep->bits_per_weight * 1e4) / 1e4;
    return ER_OK;
}

int quantize_untie(Model *m) {
    if (!m->cfg.tied)
        return ER_OK;
    if (m->quant.enabled)
        return er_error(ER_EINVAL, "untie: the model is already quantized");
    ModelConfig c = m->cfg;
    c.tied = 0;
    Model u;
    ER_TRY(model_build_random(&u, &c, 0.0f, 0));
    for (int i = 0; i < u.n_params; i++) {
        ParamTensor *d = &u.params[i];
        const char *name = strcmp(d->name, "lm_head.weight") == 0 ? "model.embed_tokens.weight" : d->name;
        const ParamTensor *s = model_find_param(m, name);
        if (!s || s->numel != d->numel) {
            model_free(&u);
            return er_error(ER_EINVAL, "untie: no parameter \"%s\" of %zu values in the tied model", name, d->numel);
        }
        if (s->w)
            quant_dequant_rows(d->data, s->w, 0, s->w->rows);
        else
            memcpy(d->data, s->data, s->numel * sizeof(float));
    }
    model_free(m);
    *m = u;
    // The parameter table points at the Weight fields of the struct it was built in.
    for (int i = 0; i < m->n_params; i++) {
        if (m->params[i].w == &u.embed)
            m->params[i].w = &m->embed;
        else if (m->params[i].w == &u.lm_head)
            m->params[i].w = &m->lm_head;
    }
    return ER_OK;
}

// ---- calibration ----

typedef struct {
    Tokenizer *tok;
    SeqBuilder sb;
    int have_sb;
    Sequence *seqs;
    int n, max_len;
} Calib;

static void calib_free(Calib *c) {
    for (int i = 0; i < c->n; i++)
        sequence_free(&c->seqs[i]);
    er_free(c->seqs);
    if (c->have_sb)
        seq_builder_free(&c->sb);
    tok_free(c->tok);
    memset(c, 0, sizeof *c);
}

// Up to n_max sequences (loss on every position, like pretraining), from the model dir's tokenizer.
static int calib_load(Calib *c, const char *model_dir, const char *path, const char *response_key, int n_max,
                      int seq_len, int V) {
    memset(c, 0, sizeof *c);
    ChatStyle style;
    ER_TRY(tok_load(&c->tok, model_dir));
    if (tok_vocab_size(c->tok) > V)
        return er_error(ER_EINVAL, "%s: the tokenizer has %d tokens, more than the model's vocab_size %d", model_dir,
                        tok_vocab_size(c->tok), V);
    ER_TRY(train_chat_style(model_dir, &style));
    ER_TRY(seq_builder_init(&c->sb, c->tok, style, "", seq_len, 1, 1));
    c->have_sb = 1;
    Dataset d;
    DatasetOptions dopt = {response_key};
    ER_TRY(dataset_load(path, &dopt, n_max, &d));
    int rc = ER_OK;
    c->seqs = er_calloc((size_t)d.n + 1, sizeof(Sequence));
    if (!c->seqs)
        rc = ER_ENOMEM;
    for (int i = 0; rc == ER_OK && i < d.n; i++) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%.1024s:%ld", path, d.ex[i].line);
        Sequence *s = &c->seqs[c->n];
        rc = seq_build(&c->sb, &d.ex[i], ctx, s);
        if (rc == SEQ_TOO_LONG) {
            rc = ER_OK;
            continue;
        }
        if (rc < 0)
            break;
        if (s->n < 2) {
            sequence_free(s);
            continue;
        }
        c->max_len = s->n - 1 > c->max_len ? s->n - 1 : c->max_len;
        c->n++;
    }
    dataset_free(&d);
    if (rc == ER_OK && c->n == 0)
        rc = er_error(ER_EINVAL, "%s: no calibration record gives a sequence within --seq-len %d", path, seq_len);
    return rc;
}

// Runs the model over sequences [i0, i1) one at a time. With fisher != NULL (a trainable model),
// accumulates the squared gradient of each sequence's mean loss into fisher (layout of grad_mem);
// else the token-weighted mean NLL goes to *nll.
static int calib_pass(Model *m, Calib *c, int i0, int i1, float *fisher, double *nll) {
    Activations a;
    Batch b;
    ER_TRY(acts_alloc(&a, &m->cfg, 1, c->max_len, fisher ? ACTS_TRAIN : ACTS_SCORE, 0));
    int rc = batch_alloc(&b, 1, c->max_len);
    if (rc < 0) {
        acts_free(&a);
        return rc;
    }
    double sum = 0;
    long count = 0;
    for (int i = i0; i < i1 && rc == ER_OK; i++) {
        rc = batch_fill(&b, &c->sb, c->seqs, &i, 1);
        if (rc < 0 || b.n_loss == 0)
            continue;
        ModelInput in = {.B = 1, .T = b.T, .tokens = b.tokens, .len = b.len};
        double loss;
        if (fisher)
            model_zero_grad(m);
        rc = model_forward(m, &in, &a);
        if (rc == ER_OK)
            rc = model_loss(&a, b.targets, b.loss_mask, fisher != NULL, &loss);
        if (rc == ER_OK && fisher) {
            rc = model_backward(m, &in, &a);
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
    return j;
}

int quantize_load(Model *m, const char *model_dir, const char *transforms, uint64_t seed, const QuantizeOptions *o,
                  int trainable, FILE *log, QuantizeSource *src) {
    memset(src, 0, sizeof *src);
    const char *tr = transforms ? transforms : "none";
    unsigned tflags;
    if (transform_parse_mode(tr, &tflags) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", er_last_error());
        return er_error(ER_EINVAL, "--transforms \"%s\" (none, rotate, fpt, or a list of r, u, v, k): %s", tr, why);
    }
    double t0 = time_now();
    // The transforms rewrite the weights: they need a trainable fp32 model.
    ER_TRY(model_load(m, model_dir, trainable || tflags ? MODEL_LOAD_TRAINABLE : 0));
    int rc = ER_OK;
    if (m->quant.enabled)
        rc = er_error(ER_EINVAL, "%s is already quantized (%s): quantize the float model", model_dir, m->quant.method);
    src->bf16 = m->cfg.dtype == DT_BF16;
    src->params = model_config_num_params(&m->cfg);
    src->bytes = src->params * dtype_size(m->cfg.dtype);
    if (rc == ER_OK && log)
        fprintf(log, "loaded %s: %zu parameters (%s), %.1fs\n", model_dir, src->params, dtype_name(m->cfg.dtype),
                time_now() - t0);
    if (rc == ER_OK && tflags) {
        t0 = time_now();
        rc = transform_model(m, tr, seed);
        if (rc == ER_OK && log)
            fprintf(log, "transforms %s applied (function-preserving%s), %.1fs\n", tr,
                    m->cfg.tied ? "" : ", lm_head untied", time_now() - t0);
    }
    if (rc == ER_OK && m->cfg.tied && o && o->lm_head) {
        WeightFormat hf, ef = !o->embeddings || strcmp(o->embeddings, "int8") == 0 ? WF_Q8 : WF_F32;
        int hg, hu;
        if (strcmp(o->lm_head, "fp") == 0)
            hf = WF_F32;
        else if (quantize_parse_weights(o->lm_head, &hf, &hg, &hu) < 0)
            rc = er_error(ER_EINVAL, "--lm-head \"%s\" is not one of fp, " SPECS, o->lm_head);
        if (rc == ER_OK && hf != ef) {
            rc = quantize_untie(m);
            if (rc == ER_OK && log)
                fprintf(log, "lm_head untied from the embedding so it can be %s (the dir gets its own lm_head.weight)\n",
                        o->lm_head);
        }
    }
    if (rc < 0)
        model_free(m);
    return rc;
}

int quantize_write_dir(const Model *m, const char *src_dir, const char *out_dir, int as_bf16) {
    ER_TRY(model_save(m, out_dir, as_bf16));
    char *tj = path_join(src_dir, "tokenizer.json");
    if (!tj)
        return ER_ENOMEM;
    int rc = ER_OK;
    if (path_exists(tj))
        rc = run_copy_tokenizer(src_dir, out_dir);
    else
        printf("note: %s has no tokenizer.json; none copied\n", src_dir);
    er_free(tj);
    return rc;
}

int quantize_data_nll(Model *m, const char *tokenizer_dir, const char *path, const char *response_key, int n,
                      int seq_len, double *nll, int *n_seq) {
    Calib cal;
    int rc = calib_load(&cal, tokenizer_dir, path, response_key, n, seq_len, m->cfg.V);
    if (rc == ER_OK)
        rc = calib_pass(m, &cal, 0, cal.n, NULL, nll);
    if (n_seq)
        *n_seq = cal.n;
    calib_free(&cal);
    return rc;
}

int quantize_run(const QuantizeConfig *c, QuantizeResult *res) {
    QuantizeResult local;
    if (!res)
        res = &local;
    memset(res, 0, sizeof *res);
    res->nll_before = res->nll_after = NAN;
    if (!c->model_dir || !c->out_dir)
        return er_error(ER_EINVAL, "--model and --out are required");
    const char *tr = c->transforms ? c->transforms : "none";
    unsigned tflags;
    if (transform_parse_mode(tr, &tflags) < 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", er_last_error());
        return er_error(ER_EINVAL, "--transforms \"%s\" (none, rotate, fpt, or a list of r, u, v, k): %s", tr, why);
    }
    // --weights bf16: the float model stored as bf16 (no quantization_config), the bf16 row of a size table.
    int to_bf16 = c->q.weights && strcmp(c->q.weights, "bf16") == 0;
    const char *sens = c->sensitivity ? c->sensitivity : c->calib && !to_bf16 ? "fisher" : "none";
    if (strcmp(sens, "fisher") != 0 && strcmp(sens, "none") != 0)
        return er_error(ER_EINVAL, "--sensitivity \"%s\" must be fisher or none", sens);
    int fisher = strcmp(sens, "fisher") == 0;
    if (fisher && !c->calib)
        return er_error(ER_EINVAL, "--sensitivity fisher needs calibration data (--calib FILE.jsonl)");
    if (fisher && to_bf16)
        return er_error(ER_EINVAL, "--sensitivity fisher has nothing to weight with --weights bf16");
    if (to_bf16 && c->q.lm_head)
        return er_error(ER_EINVAL, "--lm-head is for quantized formats; --weights bf16 stores every tensor as bf16");
    if (c->calib_n < 1)
        return er_error(ER_EINVAL, "--calib-n must be >= 1 (got %d)", c->calib_n);
    if (c->seq_len < 2)
        return er_error(ER_EINVAL, "--seq-len must be >= 2 (got %d)", c->seq_len);
    // Options are checked on a throwaway run of the parser before the (slow) load.
    {
        WeightFormat f;
        int g, u;
        if (!c->q.weights || (!to_bf16 && quantize_parse_weights(c->q.weights, &f, &g, &u) < 0))
            return er_error(ER_EINVAL, "--weights \"%s\" is not one of bf16, " SPECS, c->q.weights ? c->q.weights : "");
    }
    ER_TRY(run_dir_check(c->out_dir, RUN_ONCE));
    threads_set(c->threads);

    Model m;
    Calib cal = {0};
    float *fmem = NULL;
    const float **imp = NULL;
    QuantizeSource src;
    double t0;
    // Fisher needs gradients: a trainable fp32 model.
    int rc = quantize_load(&m, c->model_dir, tr, c->seed, to_bf16 ? NULL : &c->q, fisher, stdout, &src);
    int have_model = rc == ER_OK;
    if (rc == ER_OK && c->calib)
        rc = calib_load(&cal, c->model_dir, c->calib, c->response_key, 2 * c->calib_n, c->seq_len, m.cfg.V);
    int n_fit = cal.n < c->calib_n ? cal.n : c->calib_n;
    int h0 = n_fit, h1 = cal.n; // held-out NLL sequences
    if (h1 <= h0)
        h0 = 0, h1 = n_fit;
    if (rc == ER_OK && fisher) {
        t0 = time_now();
        fmem = er_calloc(m.n_param_floats, sizeof(float));
        imp = er_calloc((size_t)m.n_params, sizeof(float *));
        if (!fmem || !imp)
            rc = er_error(ER_ENOMEM, "quantize: cannot allocate %.1f MiB for the Fisher sensitivities",
                          m.n_param_floats * 4.0 / 1048576.0);
        if (rc == ER_OK)
            rc = calib_pass(&m, &cal, 0, n_fit, fmem, NULL);
        if (rc == ER_OK) {
            for (int i = 0; i < m.n_params; i++)
                imp[i] = m.params[i].grad ? fmem + (m.params[i].grad - m.grad_mem) : NULL;
            printf("fisher: squared gradients over %d calibration sequences, %.1fs\n", n_fit, time_now() - t0);
        }
    }
    if (rc == ER_OK && c->calib) {
        rc = calib_pass(&m, &cal, h0, h1, NULL, &res->nll_before);
        res->nll_sequences = h1 - h0;
        res->nll_held_out = h0 > 0;
    }
    if (rc == ER_OK && !to_bf16) {
        t0 = time_now();
        QuantizeOptions qo = c->q;
        qo.method_note = fisher ? "fisher" : NULL;
        qo.transforms = tr;
        printf("quantizing to %s:\n", c->q.weights);
        rc = quantize_model(&m, &qo, (const float *const *)imp, stdout, &res->rep);
        if (rc == ER_OK) {
            res->rep.bytes_before = src.bytes;
            res->rep.model_bits_per_weight = (double)res->rep.bytes_after * 8.0 / (double)src.params;
            printf("quantized in %.1fs\n", time_now() - t0);
        }
    }
    er_free(fmem);
    er_free(imp);
    if (rc == ER_OK && c->calib && !to_bf16)
        rc = calib_pass(&m, &cal, h0, h1, NULL, &res->nll_after);
    if (rc == ER_OK)
        rc = quantize_write_dir(&m, c->model_dir, c->out_dir, src.bf16 || to_bf16);
    if (rc == ER_OK && to_bf16) {
        // The report of the dir as written; its NLL from the bf16 weights as they load.
        res->rep.bytes_before = src.bytes;
        res->rep.bytes_after = src.params * 2;
        res->rep.bits_per_weight = res->rep.model_bits_per_weight = 16.0;
        if (c->calib) {
            Model b;
            rc = model_load(&b, c->out_dir, 0);
            if (rc == ER_OK) {
                rc = calib_pass(&b, &cal, h0, h1, NULL, &res->nll_after);
                model_free(&b);
            }
        }
    }
    if (rc == ER_OK) {
        cJSON *j = run_json(c, &m, res, sens);
        rc = j ? run_write_json(c->out_dir, j) : ER_ENOMEM;
        cJSON_Delete(j);
    }
    if (rc == ER_OK) {
        const QuantizeReport *r = &res->rep;
        printf("bits per weight: %.3f (layer projections, scales included), %.3f (whole model)\n", r->bits_per_weight,
               r->model_bits_per_weight);
        printf("bytes: %.2f MiB -> %.2f MiB (%.2fx smaller)\n", r->bytes_before / 1048576.0, r->bytes_after / 1048576.0,
               r->bytes_after ? (double)r->bytes_before / (double)r->bytes_after : 0.0);
        if (!to_bf16)
            printf("relative error: mean %.4f, worst %.4f\n", r->mean_rel_error, r->max_rel_error);
        if (c->calib)
            printf("NLL on %d %s calibration sequences: %.4f (float) -> %.4f (%s), %+.4f\n", res->nll_sequences,
                   res->nll_held_out ? "held-out" : "(in-sample)", res->nll_before, res->nll_after, c->q.weights,
                   res->nll_after - res->nll_before);
        printf("wrote %s\n", c->out_dir);
    }
    calib_free(&cal);
    if (have_model)
        model_free(&m);
    return rc;
}
