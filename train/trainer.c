// The loop shared by `ertrain sft`, `ertrain pretrain` and `ertrain qat`.
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/gguf.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/dist.h"
#include "train/optim.h"
#include "train/run.h"
#include "train/sequence.h"

// Streams forked per epoch and per micro-batch: the tag in the top byte keeps them apart.
#define STREAM_EPOCH(e) ((3ull << 56) | (uint64_t)(e))
#define STREAM_DROPOUT(i) ((4ull << 56) | (uint64_t)(i))
#define BUCKET_BATCHES 8 // length buckets of 8 batches: little padding, order still well mixed

void train_config_default(TrainConfig *c, TrainKind kind) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->rank = 16;
    c->alpha = 32;
    c->targets = "all";
    c->prefix = "<think>\n";
    c->device = "cpu";
    c->lr = kind == TRAIN_SFT ? 2e-4 : 1e-3;
    c->min_lr = 0;
    c->warmup = 0.03;
    c->clip = 1.0;
    c->weight_decay = kind == TRAIN_SFT ? 0.0 : 0.1;
    c->beta1 = 0.9;
    c->beta2 = kind == TRAIN_SFT ? 0.999 : 0.95;
    c->eps = 1e-8;
    c->epochs = 1;
    c->batch = 8;
    c->seq_len = 0; // the model's max_position_embeddings
    c->grad_accum = 1;
    c->init_std = 0.02;
    c->eval_split = 0.05;
    c->eval_max = 256;
    if (kind == TRAIN_QAT) {
        // Fine-tuning a trained model, not training one: a small step, no decay towards zero.
        c->lr = 1e-4;
        c->weight_decay = 0.0;
    }
}

uint64_t train_derived_seed(int seed, uint64_t stream) {
    ErRng root, r;
    rng_seed(&root, (uint64_t)(uint32_t)seed);
    rng_fork(&r, &root, stream);
    return rng_u64(&r);
}

int train_config_check(const TrainConfig *c) {
    if (!c->data_path || !c->out_dir)
        return er_error(ER_EINVAL, "--data and --out are required");
    if (!(c->lr > 0) || !(c->min_lr >= 0) || c->min_lr > c->lr)
        return er_error(ER_EINVAL, "--lr must be > 0 and --min-lr in [0, lr] (got %g, %g)", c->lr, c->min_lr);
    if (c->batch < 1 || c->grad_accum < 1)
        return er_error(ER_EINVAL, "--batch and --grad-accum must be >= 1 (got %d, %d)", c->batch, c->grad_accum);
    if (c->seq_len != 0 && c->seq_len < 2)
        return er_error(ER_EINVAL, "--seq-len must be 0 (the model's positions) or >= 2 (got %d)", c->seq_len);
    if (c->recompute && c->dropout > 0) // the backward's recomputed forward would draw other dropout masks
        return er_error(ER_EINVAL, "--recompute needs --dropout 0 (got %g)", c->dropout);
    if (c->steps < 0 || c->epochs < 0 || (c->steps == 0 && c->epochs == 0))
        return er_error(ER_EINVAL, "give --steps N or --epochs E (both >= 1)");
    if (!(c->warmup >= 0))
        return er_error(ER_EINVAL, "--warmup must be a fraction in [0, 1) or a number of steps (got %g)", c->warmup);
    if (c->warmup >= 1 && c->warmup != floor(c->warmup))
        return er_error(ER_EINVAL, "--warmup %g: a value >= 1 is a number of steps and must be whole", c->warmup);
    if (!(c->clip >= 0) || !(c->weight_decay >= 0))
        return er_error(ER_EINVAL, "--clip and --weight-decay must be >= 0");
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1) || !(c->eps > 0))
        return er_error(ER_EINVAL, "AdamW needs beta1, beta2 in [0, 1) and eps > 0");
    if (!(c->eval_split >= 0 && c->eval_split < 1) || c->eval_max < 0 || c->eval_every < 0 || c->save_every < 0)
        return er_error(ER_EINVAL, "--eval-split must be in [0, 1) and --eval-max, --eval-every, --save-every >= 0");
    if (c->stop_after < 0)
        return er_error(ER_EINVAL, "stop_after must be >= 0 (got %d)", c->stop_after);
    return ER_OK;
}

int train_chat_style(const char *path, ChatStyle *out) {
    if (gguf_is_path(path)) // a GGUF model file carries its chat template
        return chat_style_from_config(path, out);
    char dir[4096];
    run_tokenizer_dir(path, dir, sizeof dir);
    char *cfg = path_join(dir, "tokenizer_config.json");
    if (!cfg)
        return ER_ENOMEM;
    *out = CHAT_CHATML;
    int rc = path_exists(cfg) ? chat_style_from_config(cfg, out) : ER_OK;
    er_free(cfg);
    return rc;
}

cJSON *train_model_info(const char *key, const char *path, const ModelConfig *mc, size_t params) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, key, path);
    const RunNumber nums[] = {
        {"hidden_size", mc->C},
        {"num_hidden_layers", mc->L},
        {"vocab_size", mc->V},
        {"parameters", (double)params},
    };
    run_add_numbers(j, nums, sizeof nums / sizeof nums[0]);
    return j;
}

unsigned char *train_decay_mask(const Model *m) {
    unsigned char *decay = er_calloc(m->n_param_floats, 1);
    if (!decay)
        return NULL;
    for (int i = 0; i < m->n_params; i++) {
        const ParamTensor *p = &m->params[i];
        memset(decay + (p->data - m->param_mem), p->ndim == 2, p->numel);
    }
    return decay;
}

void train_job_init(TrainJob *job, const TrainConfig *c, const char *label, Model *m, const Tokenizer *tok,
                    ChatStyle style, cJSON *model_info, int (*save_final)(void *ctx, const char *out_dir),
                    void *save_ctx) {
    memset(job, 0, sizeof *job);
    job->cfg = c;
    job->label = label;
    job->model = m;
    job->params = m->param_mem;
    job->grads = m->grad_mem;
    job->n = m->n_param_floats;
    job->tok = tok;
    job->style = style;
    job->prefix = "";
    job->model_info = model_info;
    job->save_final = save_final;
    job->save_ctx = save_ctx;
}

// ---- the run ----

typedef struct {
    TrainJob *job;
    const TrainConfig *cfg;
    ErRng root;
    SeqBuilder sb;
    Sequence *train, *eval; // (n_train), (n_eval)
    int n_train, n_eval;
    long n_records, n_skipped, n_truncated;
    int max_len_train, max_len_eval;
    int seq_len;            // --seq-len, or the model's max_position_embeddings
    int rows;               // batch rows this rank computes: --batch / ranks (train/dist.h)
    long total_steps, warmup_steps;
    Batches ep;             // the current epoch's batch order
    TrainState st;
    TrainDevice dev;        // where the passes and the optimizer run
    AdamW opt;
    Activations acts, eval_acts;
    Batch batch;
    int *eval_idx;
    cJSON *config;          // resolved configuration
    MetricsLog ml;
    char *ckpt_dir;
    char data_fp[48];       // file_fingerprint of --data: a resume refuses a changed file
    long resumed_from;      // the checkpoint's step, or -1 for a new run
    int complete;           // resumed a finished run: outputs rewritten, run.json kept
    Progress prog;
    int prog_on;
    char *rank_where;       // under mpirun: every rank's TrainDevice.where, rank after rank (for the plan)
} Trainer;

static void trainer_free(Trainer *t) {
    for (int i = 0; i < t->n_train; i++)
        sequence_free(&t->train[i]);
    for (int i = 0; i < t->n_eval; i++)
        sequence_free(&t->eval[i]);
    er_free(t->train);
    er_free(t->eval);
    seq_builder_free(&t->sb);
    batches_free(&t->ep);
    train_state_free(&t->st);
    adamw_free(&t->opt);
    acts_free(&t->acts);
    acts_free(&t->eval_acts);
    train_device_close(&t->dev);
    batch_free(&t->batch);
    er_free(t->eval_idx);
    er_free(t->rank_where);
    cJSON_Delete(t->config);
    metrics_close(&t->ml);
    er_free(t->ckpt_dir);
}

// Sequences of d's examples; records whose prompt does not fit are counted and left out.
static int build_sequences(Trainer *t, const Dataset *d, Sequence **out, int *n_out, int *max_len) {
    *out = er_calloc((size_t)d->n + 1, sizeof(Sequence));
    *n_out = 0;
    *max_len = 0;
    if (!*out)
        return ER_ENOMEM;
    for (int i = 0; i < d->n; i++) {
        char ctx[1200];
        snprintf(ctx, sizeof ctx, "%.1024s:%ld", t->cfg->data_path, d->ex[i].line);
        Sequence *s = &(*out)[*n_out];
        int rc = seq_build(&t->sb, &d->ex[i], ctx, s);
        if (rc < 0)
            return rc;
        if (rc == SEQ_TOO_LONG) {
            t->n_skipped++;
            continue;
        }
        t->n_truncated += s->truncated;
        *max_len = s->n - 1 > *max_len ? s->n - 1 : *max_len;
        (*n_out)++;
    }
    return ER_OK;
}

static int load_data(Trainer *t) {
    const TrainConfig *c = t->cfg;
    DatasetOptions dopt = {c->response_key};
    Dataset d = {0}, ev = {0};
    int rc = ER_OK;
    ER_CHECK(dataset_load(c->data_path, &dopt, 0, &d));
    t->n_records = d.n;
    if (d.n == 0)
        ER_CHECK(er_error(ER_EFORMAT, "%s: no records", c->data_path));
    long n_eval = c->eval_split > 0 ? lround(c->eval_split * d.n) : 0;
    if (c->eval_split > 0 && n_eval == 0 && d.n > 1)
        n_eval = 1;
    if (c->eval_max > 0 && n_eval > c->eval_max)
        n_eval = c->eval_max;
    if (n_eval >= d.n)
        n_eval = d.n - 1;
    ErRng r;
    rng_fork(&r, &t->root, TRAIN_STREAM_SPLIT);
    ER_CHECK(dataset_split(&d, (int)n_eval, &r, &ev));
    ER_CHECK(build_sequences(t, &d, &t->train, &t->n_train, &t->max_len_train));
    ER_CHECK(build_sequences(t, &ev, &t->eval, &t->n_eval, &t->max_len_eval));
    if (t->n_train == 0)
        ER_CHECK(er_error(ER_EINVAL, "%s: no training record fits --seq-len %d (%ld refused as too long)", c->data_path,
                          t->seq_len, t->n_skipped));
done:
    dataset_free(&d);
    dataset_free(&ev);
    return rc;
}

// Batch order of epoch e: a function of the seed and e only.
static int make_epoch(Trainer *t, long e) {
    batches_free(&t->ep);
    int *lengths = er_alloc(sizeof(int) * (size_t)t->n_train);
    if (!lengths)
        return ER_ENOMEM;
    for (int i = 0; i < t->n_train; i++)
        lengths[i] = t->train[i].n - 1;
    ErRng r;
    rng_fork(&r, &t->root, STREAM_EPOCH(e));
    int rc = batches_by_length(lengths, t->n_train, t->cfg->batch, BUCKET_BATCHES, &r, &t->ep);
    er_free(lengths);
    ER_TRY(rc);
    t->st.epoch = e;
    t->st.cursor = 0;
    return ER_OK;
}

// The checkpoint keeps the epoch's order; TrainState and Batches share the arrays' meaning.
static void state_point_at_epoch(Trainer *t) {
    t->st.order = t->ep.index;
    t->st.n_order = t->ep.n;
    t->st.batch_start = t->ep.start;
    t->st.n_batches = t->ep.n_batches;
}

static void state_detach_epoch(Trainer *t) {
    t->st.order = NULL;
    t->st.batch_start = NULL;
    t->st.n_order = t->st.n_batches = 0;
}

static cJSON *config_to_json(const Trainer *t) {
    const TrainConfig *c = t->cfg;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "command", t->job->label);
    if (c->kind == TRAIN_SFT || c->kind == TRAIN_QAT) {
        run_add_path(j, "model", c->model_dir);
    } else if (c->model_dir) { // pretrain --init: continued from a model dir
        run_add_path(j, "init", c->model_dir);
        run_add_path(j, "tokenizer", c->tokenizer_path);
    } else {
        run_add_path(j, "config", c->config_path);
        run_add_path(j, "tokenizer", c->tokenizer_path);
        cJSON_AddNumberToObject(j, "init_std", c->init_std);
    }
    run_add_path(j, "data", c->data_path);
    cJSON_AddStringToObject(j, "data_fingerprint", t->data_fp);
    if (c->response_key)
        cJSON_AddStringToObject(j, "response_key", c->response_key);
    else
        cJSON_AddNullToObject(j, "response_key");
    cJSON_AddStringToObject(j, "chat_style", chat_style_name(t->job->style));
    if (c->kind == TRAIN_SFT) {
        cJSON_AddNumberToObject(j, "rank", c->rank);
        cJSON_AddNumberToObject(j, "alpha", c->alpha);
        cJSON_AddStringToObject(j, "targets", c->targets);
        cJSON_AddBoolToObject(j, "rslora", c->rslora);
        cJSON_AddNumberToObject(j, "dropout", c->dropout);
        cJSON_AddBoolToObject(j, "masked", !c->no_mask);
        cJSON_AddStringToObject(j, "prefix", t->job->prefix);
    }
    const RunNumber nums[] = {
        {"lr", c->lr},
        {"min_lr", c->min_lr},
        {"warmup", c->warmup},
        {"warmup_steps", (double)t->warmup_steps},
        {"clip", c->clip},
        {"weight_decay", c->weight_decay},
        {"beta1", c->beta1},
        {"beta2", c->beta2},
        {"eps", c->eps},
        {"epochs", c->steps > 0 ? 0 : c->epochs},
        {"steps", (double)t->total_steps},
        {"batch", c->batch},
        {"seq_len", t->seq_len},
        {"grad_accum", c->grad_accum},
        {"eval_split", c->eval_split},
        {"eval_max", c->eval_max},
        {"eval_every", c->eval_every},
        {"save_every", c->save_every},
        {"seed", c->seed},
        {"threads", threads_get()},
        {"ranks", dist_size()},
    };
    run_add_numbers(j, nums, sizeof nums / sizeof nums[0]);
    if (t->job->extra_config) {
        const cJSON *item;
        cJSON_ArrayForEach(item, t->job->extra_config) {
            cJSON_AddItemToObject(j, item->string, cJSON_Duplicate(item, 1));
        }
    }
    return j;
}

int train_out_check(const TrainConfig *c) {
    const char *in[] = {c->model_dir, c->config_path, c->tokenizer_path, c->data_path};
    const char *flag[] = {c->kind == TRAIN_PRETRAIN ? "--init" : "--model", "--config", "--tokenizer", "--data"};
    for (int i = 0; i < 4; i++)
        ER_TRY(dir_output_not_input(c->out_dir, in[i], flag[i]));
    return run_dir_check(c->out_dir, c->resume ? RUN_RESUME : RUN_NEW, c->out);
}

// Settings that do not change the trajectory may differ on resume, and so may the run's length (an
// extended run); everything else must match.
int train_config_check_resume(const cJSON *saved, const cJSON *now, const char *ckpt_dir) {
    static const char *free_keys[] = {"threads", "ranks", "eval_every", "save_every", "steps", "epochs", "warmup_steps"};
    if (!saved)
        return er_error(ER_EFORMAT, "%.*s/state.json: no \"config\" to check the resumed run against",
                        path_dir_len(ckpt_dir), ckpt_dir);
    const cJSON *item;
    cJSON_ArrayForEach(item, now) {
        int skip = 0;
        for (size_t i = 0; i < sizeof free_keys / sizeof free_keys[0]; i++)
            skip |= strcmp(item->string, free_keys[i]) == 0;
        if (skip)
            continue;
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(saved, item->string);
        if (run_is_fingerprint_key(item->string)) { // a checkpoint from before fingerprints has none to compare
            if (s)
                ER_TRY(run_check_fingerprint(s, item, now, ckpt_dir));
            continue;
        }
        if (!s || !cJSON_Compare(item, s, 1)) {
            char *a = s ? cJSON_PrintUnformatted(s) : NULL, *b = cJSON_PrintUnformatted(item);
            er_error(ER_EINVAL, "%s: the checkpoint was made with %s = %s, this run has %s (resume with the same settings)",
                     ckpt_dir, item->string, a ? a : "(unset)", b ? b : "?");
            cJSON_free(a);
            cJSON_free(b);
            return ER_EINVAL;
        }
    }
    return ER_OK;
}

// run.json: the resolved configuration and the counts; with `res` (a finished run) its result too.
static int write_run_json(Trainer *t, const TrainResult *res) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return ER_ENOMEM;
    cJSON_AddStringToObject(j, "version", ERTRAIN_VERSION);
    cJSON_AddStringToObject(j, "command", t->job->label);
    cJSON_AddNumberToObject(j, "seed", t->cfg->seed);
    cJSON_AddStringToObject(j, "data", t->cfg->data_path);
    cJSON_AddItemToObject(j, "config", cJSON_Duplicate(t->config, 1));
    if (t->job->model_info)
        cJSON_AddItemToObject(j, "model", cJSON_Duplicate(t->job->model_info, 1));
    const RunNumber counts[] = {
        {"records", (double)t->n_records},
        {"train", t->n_train},
        {"eval", t->n_eval},
        {"refused_too_long", (double)t->n_skipped},
        {"truncated", (double)t->n_truncated},
        {"batches_per_epoch", t->ep.n_batches},
        {"trained_parameters", (double)t->job->n},
    };
    cJSON *n = cJSON_AddObjectToObject(j, "counts");
    if (n)
        run_add_numbers(n, counts, sizeof counts / sizeof counts[0]);
    if (t->resumed_from >= 0)
        cJSON_AddNumberToObject(j, "resumed_from_step", (double)t->resumed_from);
    cJSON *r = res ? cJSON_AddObjectToObject(j, "result") : NULL;
    if (r) {
        cJSON_AddNumberToObject(r, "steps", (double)res->steps);
        cJSON_AddNumberToObject(r, "train_loss", res->last_loss);
        if (isfinite(res->eval_loss))
            cJSON_AddNumberToObject(r, "eval_loss", res->eval_loss);
        cJSON_AddNumberToObject(r, "tokens", (double)t->st.tokens);
        cJSON_AddNumberToObject(r, "tokens_per_s", res->tokens_per_s);
    }
    int rc = run_write_json(t->cfg->out_dir, j);
    cJSON_Delete(j);
    return rc;
}

// Mean loss over the held-out sequences, weighted by their loss positions; each rank takes its
// share of them and the sums are added up.
static int evaluate(Trainer *t, double *out) {
    TrainJob *job = t->job;
    int B = t->rows, lo, hi;
    if (!t->eval_acts.mem)
        ER_TRY(acts_alloc_on(&t->eval_acts, t->dev.be, &job->model->cfg, B, t->max_len_eval,
                             ACTS_SCORE | ACTS_LOSS_ONLY, 0));
    if (job->before_forward)
        ER_TRY(job->before_forward(job->hook_ctx, t->st.step));
    dist_share(t->n_eval, dist_rank(), dist_size(), &lo, &hi);
    double sw[2] = {0, 0}; // loss x loss positions, loss positions
    for (int i = lo; i < hi; i += B) {
        int n = hi - i < B ? hi - i : B;
        Batch *b = &t->batch;
        ER_TRY(batch_fill(b, &t->sb, t->eval, t->eval_idx + i, n));
        ModelInput in = {.B = b->B, .T = b->T, .tokens = b->tokens, .len = b->len};
        if (t->dev.adapter) {
            in.adapter = t->dev.adapter;
            in.adapter_mask = b->adapter_mask;
        }
        double loss;
        ER_TRY(model_forward(t->dev.model, &in, &t->eval_acts));
        ER_TRY(model_loss(&t->eval_acts, b->targets, b->loss_mask, 0, &loss));
        sw[0] += loss * (double)b->n_loss;
        sw[1] += (double)b->n_loss;
    }
    ER_TRY(dist_sum_doubles(sw, 2));
    *out = sw[1] > 0 ? sw[0] / sw[1] : NAN;
    return ER_OK;
}

// One optimizer step: grad_accum micro-batches, clip, AdamW. *loss is the mean micro-batch loss.
// Under mpirun each rank computes its block of every micro-batch's rows (dist_share) and the
// gradients are summed across ranks before the clip, so every rank takes the same step.
static int train_step(Trainer *t, double lr, double *loss, double *gnorm, long *tokens) {
    TrainJob *job = t->job;
    const TrainConfig *c = t->cfg;
    ER_TRY(t->dev.be->ops->zero(t->dev.be, t->dev.grads, job->n * sizeof(float)));
    if (job->before_forward)
        ER_TRY(job->before_forward(job->hook_ctx, t->st.step));
    double sum = 0;
    *tokens = 0;
    for (int k = 0; k < c->grad_accum; k++) {
        if (t->st.cursor >= t->ep.n_batches) {
            ER_TRY(make_epoch(t, t->st.epoch + 1));
            state_point_at_epoch(t);
        }
        const int *idx = t->ep.index + t->ep.start[t->st.cursor];
        int n = t->ep.start[t->st.cursor + 1] - t->ep.start[t->st.cursor], lo, hi;
        dist_share(n, dist_rank(), dist_size(), &lo, &hi);
        Batch *b = &t->batch;
        if (hi > lo)
            ER_TRY(batch_fill(b, &t->sb, t->train, idx + lo, hi - lo));
        else // a short last batch of an epoch may leave a rank no row
            b->B = b->T = 0, b->n_loss = b->n_tokens = 0;
        ErRng drop;
        rng_fork(&drop, &t->root, STREAM_DROPOUT(t->st.step * (uint64_t)c->grad_accum + (uint64_t)k));
        ModelInput in = {.B = b->B, .T = b->T, .tokens = b->tokens, .len = b->len};
        if (t->dev.adapter) {
            in.adapter = t->dev.adapter;
            in.adapter_mask = b->adapter_mask;
            in.dropout_rng = job->adapter->dropout > 0 ? &drop : NULL;
        }
        // The micro-batch's counts over every rank (loss positions, input positions), before the loss: the
        // loss-only pass runs the head's backward inside model_loss, so the weight goes in there.
        double cnt[2] = {(double)b->n_loss, (double)b->n_tokens};
        ER_TRY(dist_sum_doubles(cnt, 2));
        double l = 0;
        if (b->B > 0) {
            // The micro-batch loss is the mean over all its loss positions: this rank's mean weighs
            // n_loss here / n_loss in all; accumulation averages the micro-batch means (1/grad_accum).
            float s = cnt[0] > 0 ? (float)((double)b->n_loss / cnt[0] / c->grad_accum) : 0.0f;
            ER_TRY(model_forward(t->dev.model, &in, &t->acts));
            int rc = model_loss_scaled(&t->acts, b->targets, b->loss_mask, s, &l);
            if (rc < 0)
                return er_error_prefix(rc, "step %ld", t->st.step + 1);
            ER_TRY(model_backward(t->dev.model, &in, &t->acts));
        }
        double lsum = l * (double)b->n_loss; // loss x loss positions, over every rank
        ER_TRY(dist_sum_doubles(&lsum, 1));
        sum += cnt[0] > 0 ? lsum / cnt[0] : 0;
        *tokens += (long)cnt[1];
        t->st.cursor++;
    }
    ER_TRY(train_device_sum_grads(&t->dev, job));
    *loss = sum / c->grad_accum;
    ER_TRY(clip_grad_norm(t->opt.be, t->dev.grads, job->n, c->clip, gnorm));
    if (!isfinite(*gnorm))
        return er_error(ER_ERANGE, "step %ld: the gradient norm is not finite (%g); lower --lr or check the data",
                        t->st.step + 1, *gnorm);
    return adamw_step(&t->opt, t->dev.params, t->dev.grads, t->dev.decay_mask, lr);
}

// Rank 0 writes it, once every rank's parameters and optimizer state are seen to be the same.
static int save_checkpoint(Trainer *t) {
    AdamW *opt;
    ER_TRY(train_device_to_host(&t->dev, t->job, &t->opt, &opt));
    ER_TRY(dist_check_same(t->job->params, sizeof(float) * t->job->n, "trained parameters"));
    ER_TRY(dist_check_same(opt->m, sizeof(float) * t->job->n, "AdamW moments"));
    if (dist_rank() != 0)
        return ER_OK;
    t->st.config = t->config; // borrowed for the save
    int rc = checkpoint_save(t->ckpt_dir, &t->st, t->job->params, t->job->n, opt);
    t->st.config = NULL;
    return rc;
}

// Whether a checkpoint's state fits this run: the same seed, not past its length, a data order over
// this run's sequences.
static int check_saved_state(const Trainer *t, const TrainState *st) {
    ER_TRY(train_config_check_resume(st->config, t->config, t->ckpt_dir));
    if (memcmp(st->rng.s, t->root.s, sizeof st->rng.s) != 0)
        return er_error(ER_EINVAL, "%s: RNG state does not come from --seed %d", t->ckpt_dir, t->cfg->seed);
    if (st->step > t->total_steps)
        return er_error(ER_EINVAL, "%s: checkpoint at step %ld is past the %ld steps asked for (a run can be extended, "
                        "not shortened)", t->ckpt_dir, st->step, t->total_steps);
    if (st->n_order != t->n_train || st->n_batches < 1 || st->cursor > st->n_batches)
        return er_error(ER_EFORMAT, "%s: the saved data order covers %d sequences in %d batches (cursor %ld), this run "
                        "has %d", t->ckpt_dir, st->n_order, st->n_batches, st->cursor, t->n_train);
    for (int i = 0; i < st->n_order; i++)
        if (st->order[i] < 0 || st->order[i] >= t->n_train)
            return er_error(ER_EFORMAT, "%s: saved data order has index %d outside [0, %d)", t->ckpt_dir, st->order[i],
                            t->n_train);
    return ER_OK;
}

// Restores the run's state from its checkpoint (data order, optimizer, parameters).
static int resume_from_checkpoint(Trainer *t) {
    TrainState st;
    AdamW *opt = t->dev.placed ? &t->dev.host_opt : &t->opt;
    ER_TRY(checkpoint_load(t->ckpt_dir, &st, t->job->params, t->job->n, opt));
    int rc = ER_OK;
    ER_CHECK(train_device_from_host(&t->dev, t->job, &t->opt, opt));
    ER_CHECK(check_saved_state(t, &st));
    batches_free(&t->ep);
    t->ep.index = st.order;
    t->ep.start = st.batch_start;
    t->ep.n = st.n_order;
    t->ep.n_batches = st.n_batches;
    st.order = NULL;
    st.batch_start = NULL;
    t->st.step = st.step;
    t->st.epoch = st.epoch;
    t->st.cursor = st.cursor;
    t->st.tokens = st.tokens;
    state_point_at_epoch(t);
done:
    train_state_free(&st);
    return rc;
}

// Checks the job against its model, builds the sequences and sizes the run and its buffers.
static int trainer_setup(Trainer *t) {
    TrainJob *job = t->job;
    const TrainConfig *c = t->cfg;
    const ModelConfig *mc = &job->model->cfg;
    rng_seed(&t->root, (uint64_t)(uint32_t)c->seed);
    t->st.rng = t->root;
    t->resumed_from = -1;
    t->seq_len = c->seq_len ? c->seq_len : mc->max_pos;
    if (c->batch % dist_size() != 0)
        return er_error(ER_EINVAL, "--batch %d is the global batch: it must be a multiple of the %d ranks", c->batch,
                        dist_size());
    t->rows = c->batch / dist_size();
    // Dropout masks are drawn along a micro-batch's rows from one stream: a split batch would draw others.
    if (job->adapter && job->adapter->dropout > 0 && dist_size() > 1)
        return er_error(ER_EUNSUPPORTED, "--dropout %g with %d ranks: the dropout masks are drawn per micro-batch, not "
                        "per sequence, so they would differ from one rank's (use --dropout 0 or one rank)",
                        job->adapter->dropout, dist_size());
    if (t->seq_len > mc->max_pos)
        return er_error(ER_EINVAL, "--seq-len %d is longer than the model's max_position_embeddings %d", c->seq_len,
                        mc->max_pos);
    if (tok_vocab_size(job->tok) > mc->V)
        return er_error(ER_EINVAL, "the tokenizer has %d ids but the model's vocabulary only %d",
                        tok_vocab_size(job->tok), mc->V);
    ER_TRY(train_device_open(&t->dev, job, c->device, c->place_on_cpu)); // before the data: a bad device fails fast
    if (dist_size() > 1) { // which device each rank took, for the plan line
        size_t n;
        void *all;
        ER_TRY(dist_gather(t->dev.where, 1, sizeof t->dev.where, &all, &n));
        t->rank_where = all;
    }
    ER_TRY(seq_builder_init(&t->sb, job->tok, job->style, job->prefix, t->seq_len, c->kind != TRAIN_SFT, c->no_mask));
    ER_TRY(file_fingerprint(c->data_path, t->data_fp, sizeof t->data_fp));
    ER_TRY(load_data(t));
    ER_TRY(make_epoch(t, 0));
    state_point_at_epoch(t);
    if (c->steps > 0) {
        t->total_steps = c->steps;
    } else {
        long micro = (long)c->epochs * t->ep.n_batches;
        t->total_steps = (micro + c->grad_accum - 1) / c->grad_accum;
    }
    t->warmup_steps = c->warmup < 1 ? lround(c->warmup * (double)t->total_steps) : (long)c->warmup;
    t->config = config_to_json(t);
    t->ckpt_dir = path_join(c->out_dir, "checkpoint");
    if (!t->config || !t->ckpt_dir)
        return ER_ENOMEM;
    ER_TRY(adamw_init(&t->opt, t->dev.be, job->n, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay));
    int maxT = t->max_len_train > t->max_len_eval ? t->max_len_train : t->max_len_eval;
    ER_TRY(batch_alloc(&t->batch, c->batch, maxT));
    Backend *be = t->dev.be;
    size_t limit; // what is left where the passes run, the model placed
    ER_TRY(be->ops->mem_available(be, &limit));
    // Loss-only: the LM head and the loss run a chunk of rows at a time, never the whole (rows x T, V) logits.
    ActsMode mode = (c->recompute ? ACTS_TRAIN_RECOMPUTE : ACTS_TRAIN) | ACTS_LOSS_ONLY;
    ER_TRY(acts_alloc_on(&t->acts, be, mc, t->rows, t->max_len_train, mode, limit));
    t->eval_idx = er_calloc((size_t)t->n_eval + 1, sizeof(int));
    if (!t->eval_idx)
        return ER_ENOMEM;
    for (int i = 0; i < t->n_eval; i++)
        t->eval_idx[i] = i;
    return ER_OK;
}

// Continues the run in --out from its checkpoint, or starts it there; opens metrics.jsonl.
static int trainer_start(Trainer *t) {
    const TrainConfig *c = t->cfg;
    // run_dir_check said so already when --resume finds no checkpoint: the run starts from step 0.
    int resume = c->resume && checkpoint_exists(t->ckpt_dir);
    if (resume) {
        ER_TRY(resume_from_checkpoint(t));
        t->resumed_from = t->st.step;
    }
    t->complete = t->st.step >= t->total_steps;
    if (dist_rank() != 0) // rank 0 alone writes the run dir
        return ER_OK;
    ER_TRY(dir_make(c->out_dir));
    ER_TRY(metrics_open(&t->ml, c->out_dir, "metrics.jsonl", resume, t->st.step));
    if (!t->complete)
        ER_TRY(write_run_json(t, NULL));
    return ER_OK;
}

static void print_plan(const Trainer *t, FILE *out) {
    const TrainJob *job = t->job;
    const TrainConfig *c = t->cfg;
    fprintf(out, "%s: %d training / %d held-out sequences from %ld records of %s (%ld refused: prompt longer than "
           "--seq-len; %ld truncated)\n",
           job->label, t->n_train, t->n_eval, t->n_records, c->data_path, t->n_skipped, t->n_truncated);
    fprintf(out, "%s: %zu trained parameters, %ld steps of %d x %d sequences (%d batches per epoch), warmup %ld, "
           "activations %.1f MiB, %d threads\n",
           job->label, job->n, t->total_steps, c->grad_accum, c->batch, t->ep.n_batches, t->warmup_steps,
           t->acts.bytes / 1048576.0, threads_get());
    fprintf(out, "%s: %s %s (%s)", job->label, dist_size() > 1 ? "rank 0 on" : "running on", t->dev.where,
            t->dev.be->device);
    size_t w = sizeof t->dev.where;
    for (int r = 1; t->rank_where && r < dist_size(); r++)
        fprintf(out, ", %d on %.*s", r, (int)w, t->rank_where + (size_t)r * w);
    fprintf(out, "%s%s\n", t->dev.why_cpu ? ": " : "", t->dev.why_cpu ? t->dev.why_cpu : "");
    if (t->resumed_from >= 0)
        fprintf(out, "%s: resumed from %s at step %ld\n", job->label, t->ckpt_dir, t->resumed_from);
    fflush(out);
}

// What one optimizer step logs.
typedef struct {
    double loss, lr, gnorm;
    int evaluated;    // eval_loss holds the held-out loss
    double eval_loss;
    double tokens_per_s;
} StepLog;

// Appends the step's line to metrics.jsonl. Deterministic fields first; tokens_per_s (wall clock) last,
// so lines of a resumed run and an uninterrupted one agree byte for byte up to it.
static int log_step(Trainer *t, const StepLog *s) {
    cJSON *line = cJSON_CreateObject();
    if (!line)
        return ER_ENOMEM;
    cJSON_AddNumberToObject(line, "step", (double)t->st.step);
    cJSON_AddNumberToObject(line, "epoch",
                            (double)t->st.epoch + (double)t->st.cursor / (double)(t->ep.n_batches ? t->ep.n_batches : 1));
    cJSON_AddNumberToObject(line, "loss", s->loss);
    cJSON_AddNumberToObject(line, "lr", s->lr);
    cJSON_AddNumberToObject(line, "grad_norm", s->gnorm);
    cJSON_AddNumberToObject(line, "tokens", (double)t->st.tokens);
    if (s->evaluated)
        cJSON_AddNumberToObject(line, "eval_loss", s->eval_loss);
    cJSON_AddNumberToObject(line, "tokens_per_s", round(s->tokens_per_s * 10) / 10);
    // Seconds this rank has spent in the gradient all-reduce (waiting for the others included).
    cJSON_AddNumberToObject(line, "allreduce_s", round(dist_reduce_seconds() * 1000) / 1000);
    int rc = metrics_write(&t->ml, line);
    cJSON_Delete(line);
    return rc;
}

static void show_step(Trainer *t, const StepLog *s, double eval_loss) {
    char extra[160];
    int k = snprintf(extra, sizeof extra, "loss %.4f lr %.2e %.0f tok/s", s->loss, s->lr, s->tokens_per_s);
    if (isfinite(eval_loss) && k > 0 && (size_t)k < sizeof extra)
        snprintf(extra + k, sizeof extra - (size_t)k, " eval %.4f", eval_loss);
    if (s->evaluated && !t->prog.tty) // an eval result is worth a line of its own in a log
        t->prog.t_last_print = 0;
    progress_update(&t->prog, t->st.step, extra);
}

// The steps from where the run is to its end, or to cfg->stop_after (*stopped: as if killed there).
static int trainer_loop(Trainer *t, TrainResult *r, int *stopped) {
    const TrainConfig *c = t->cfg;
    double t0 = time_now();
    long tokens0 = t->st.tokens, step0 = t->st.step;
    *stopped = 0;
    while (t->st.step < t->total_steps) {
        StepLog s = {.lr = lr_schedule(t->st.step, t->warmup_steps, t->total_steps, c->lr, c->min_lr)};
        long tokens = 0;
        ER_TRY(train_step(t, s.lr, &s.loss, &s.gnorm, &tokens));
        t->st.step++;
        t->st.tokens += tokens;
        if (t->st.step == step0 + 1)
            r->first_loss = s.loss;
        r->last_loss = s.loss;
        s.evaluated = t->n_eval > 0 &&
                      ((c->eval_every > 0 && t->st.step % c->eval_every == 0) || t->st.step == t->total_steps);
        if (s.evaluated) {
            ER_TRY(evaluate(t, &s.eval_loss));
            r->eval_loss = s.eval_loss;
        }
        double el = time_now() - t0;
        s.tokens_per_s = r->tokens_per_s = el > 0 ? (double)(t->st.tokens - tokens0) / el : 0;
        if (dist_rank() == 0)
            ER_TRY(log_step(t, &s));
        if (t->prog_on)
            show_step(t, &s, r->eval_loss);
        if ((c->save_every > 0 && t->st.step % c->save_every == 0) || t->st.step == t->total_steps)
            ER_TRY(save_checkpoint(t));
        if (c->stop_after > 0 && t->st.step >= c->stop_after && t->st.step < t->total_steps) {
            *stopped = 1;
            return ER_OK;
        }
    }
    return ER_OK;
}

// Writes the outputs of a run that reached its end: the result, and run.json with it.
static int trainer_finish(Trainer *t, TrainResult *r) {
    TrainJob *job = t->job;
    const TrainConfig *c = t->cfg;
    if (t->complete) {
        r->first_loss = r->last_loss = NAN;
        if (t->n_eval > 0)
            ER_TRY(evaluate(t, &r->eval_loss));
        if (dist_rank() != 0)
            return ER_OK;
        ER_TRY(run_write_outputs(c->out_dir, job->save_final, job->save_ctx));
        if (c->out)
            fprintf(c->out, "%s: the run in %s was already complete (%ld steps); its outputs were written again\n", job->label,
                   c->out_dir, r->steps);
        return ER_OK;
    }
    AdamW *opt;
    ER_TRY(train_device_to_host(&t->dev, job, &t->opt, &opt)); // the outputs are written from the host
    if (dist_rank() != 0) // rank 0 alone writes the outputs
        return ER_OK;
    ER_TRY(run_write_outputs(c->out_dir, job->save_final, job->save_ctx));
    ER_TRY(write_run_json(t, r));
    if (c->out) {
        fprintf(c->out, "%s: %ld steps, final train loss %.4f", job->label, r->steps, r->last_loss);
        if (isfinite(r->eval_loss))
            fprintf(c->out, ", held-out loss %.4f", r->eval_loss);
        fprintf(c->out, ", %.0f tokens/s; wrote %s\n", r->tokens_per_s, c->out_dir);
    }
    return ER_OK;
}

int trainer_run(TrainJob *job, TrainResult *res) {
    const TrainConfig *c = job->cfg;
    Trainer t;
    memset(&t, 0, sizeof t);
    t.job = job;
    t.cfg = c;
    TrainResult r;
    memset(&r, 0, sizeof r);
    r.eval_loss = NAN;
    int rc = ER_OK, stopped = 0;
    ER_CHECK(trainer_setup(&t));
    ER_CHECK(trainer_start(&t));
    if (c->out)
        print_plan(&t, c->out);
    if (c->log && !t.complete) {
        // Steps are counted as the run counts them; rate and ETA from where this call starts.
        progress_begin(&t.prog, c->log, job->label, "step", t.st.step, t.total_steps);
        t.prog_on = 1;
    }
    ER_CHECK(trainer_loop(&t, &r, &stopped));
    r.steps = t.st.step;
    if (t.prog_on) {
        char extra[96];
        snprintf(extra, sizeof extra, "loss %.4f", r.last_loss);
        progress_end(&t.prog, stopped ? "stopped (stop_after)" : extra);
        t.prog_on = 0;
    }
    if (!stopped) // stopped: as if killed, no final outputs
        ER_CHECK(trainer_finish(&t, &r));
done:
    if (t.prog_on)
        progress_end(&t.prog, "failed");
    r.n_train = t.n_train;
    r.n_eval = t.n_eval;
    r.n_skipped = t.n_skipped;
    r.n_truncated = t.n_truncated;
    if (res)
        *res = r;
    state_detach_epoch(&t);
    trainer_free(&t);
    return rc;
}
