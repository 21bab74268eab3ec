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
#include "core/progress.h"
#include "core/rng.h"
#include "core/threads.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
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
        return er_error(ER_EINVAL, "--stop-after must be >= 0");
    return ER_OK;
}

int train_chat_style(const char *path, ChatStyle *out) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    if (!path_is_dir(dir)) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
        else
            snprintf(dir, sizeof dir, ".");
    }
    char *cfg = path_join(dir, "tokenizer_config.json");
    if (!cfg)
        return ER_ENOMEM;
    *out = CHAT_CHATML;
    int rc = path_exists(cfg) ? chat_style_from_config(cfg, out) : ER_OK;
    er_free(cfg);
    return rc;
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
    long total_steps, warmup_steps;
    Batches ep;             // the current epoch's batch order
    TrainState st;
    AdamW opt;
    Activations acts, eval_acts;
    Batch batch;
    int *eval_idx;
    cJSON *config;          // resolved configuration
    MetricsLog ml;
    char *ckpt_dir;
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
    batch_free(&t->batch);
    er_free(t->eval_idx);
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
    Dataset d, ev;
    ER_TRY(dataset_load(c->data_path, &dopt, 0, &d));
    t->n_records = d.n;
    if (d.n == 0) {
        dataset_free(&d);
        return er_error(ER_EFORMAT, "%s: no records", c->data_path);
    }
    long n_eval = c->eval_split > 0 ? lround(c->eval_split * d.n) : 0;
    if (c->eval_split > 0 && n_eval == 0 && d.n > 1)
        n_eval = 1;
    if (c->eval_max > 0 && n_eval > c->eval_max)
        n_eval = c->eval_max;
    if (n_eval >= d.n)
        n_eval = d.n - 1;
    ErRng r;
    rng_fork(&r, &t->root, TRAIN_STREAM_SPLIT);
    int rc = dataset_split(&d, (int)n_eval, &r, &ev);
    if (rc == ER_OK)
        rc = build_sequences(t, &d, &t->train, &t->n_train, &t->max_len_train);
    if (rc == ER_OK)
        rc = build_sequences(t, &ev, &t->eval, &t->n_eval, &t->max_len_eval);
    dataset_free(&d);
    dataset_free(&ev);
    ER_TRY(rc);
    if (t->n_train == 0)
        return er_error(ER_EINVAL, "%s: no training record fits --seq-len %d (%ld refused as too long)", c->data_path,
                        t->seq_len, t->n_skipped);
    return ER_OK;
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
    } else {
        run_add_path(j, "config", c->config_path);
        run_add_path(j, "tokenizer", c->tokenizer_path);
        cJSON_AddNumberToObject(j, "init_std", c->init_std);
    }
    run_add_path(j, "data", c->data_path);
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
    cJSON_AddNumberToObject(j, "lr", c->lr);
    cJSON_AddNumberToObject(j, "min_lr", c->min_lr);
    cJSON_AddNumberToObject(j, "warmup", c->warmup);
    cJSON_AddNumberToObject(j, "warmup_steps", (double)t->warmup_steps);
    cJSON_AddNumberToObject(j, "clip", c->clip);
    cJSON_AddNumberToObject(j, "weight_decay", c->weight_decay);
    cJSON_AddNumberToObject(j, "beta1", c->beta1);
    cJSON_AddNumberToObject(j, "beta2", c->beta2);
    cJSON_AddNumberToObject(j, "eps", c->eps);
    cJSON_AddNumberToObject(j, "epochs", c->steps > 0 ? 0 : c->epochs);
    cJSON_AddNumberToObject(j, "steps", (double)t->total_steps);
    cJSON_AddNumberToObject(j, "batch", c->batch);
    cJSON_AddNumberToObject(j, "seq_len", t->seq_len);
    cJSON_AddNumberToObject(j, "grad_accum", c->grad_accum);
    cJSON_AddNumberToObject(j, "eval_split", c->eval_split);
    cJSON_AddNumberToObject(j, "eval_max", c->eval_max);
    cJSON_AddNumberToObject(j, "eval_every", c->eval_every);
    cJSON_AddNumberToObject(j, "save_every", c->save_every);
    cJSON_AddNumberToObject(j, "seed", c->seed);
    cJSON_AddNumberToObject(j, "threads", threads_get());
    if (t->job->extra_config) {
        const cJSON *item;
        cJSON_ArrayForEach(item, t->job->extra_config) {
            cJSON_AddItemToObject(j, item->string, cJSON_Duplicate(item, 1));
        }
    }
    return j;
}

// Settings that do not change the trajectory may differ on resume, and so may the run's length (an
// extended run); everything else must match.
int train_config_check_resume(const cJSON *saved, const cJSON *now, const char *ckpt_dir) {
    static const char *free_keys[] = {"threads", "eval_every", "save_every", "steps", "epochs", "warmup_steps"};
    if (!saved)
        return er_error(ER_EFORMAT, "%s/state.json: no \"config\" to check the resumed run against", ckpt_dir);
    const cJSON *item;
    cJSON_ArrayForEach(item, now) {
        int skip = 0;
        for (size_t i = 0; i < sizeof free_keys / sizeof free_keys[0]; i++)
            skip |= strcmp(item->string, free_keys[i]) == 0;
        if (skip)
            continue;
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(saved, item->string);
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

static int write_run_json(Trainer *t, const TrainResult *res, long resumed_from, int finished) {
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
    cJSON *n = cJSON_AddObjectToObject(j, "counts");
    if (n) {
        cJSON_AddNumberToObject(n, "records", (double)t->n_records);
        cJSON_AddNumberToObject(n, "train", t->n_train);
        cJSON_AddNumberToObject(n, "eval", t->n_eval);
        cJSON_AddNumberToObject(n, "refused_too_long", (double)t->n_skipped);
        cJSON_AddNumberToObject(n, "truncated", (double)t->n_truncated);
        cJSON_AddNumberToObject(n, "batches_per_epoch", t->ep.n_batches);
        cJSON_AddNumberToObject(n, "trained_parameters", (double)t->job->n);
    }
    if (resumed_from >= 0)
        cJSON_AddNumberToObject(j, "resumed_from_step", (double)resumed_from);
    if (finished && res) {
        cJSON *r = cJSON_AddObjectToObject(j, "result");
        if (r) {
            cJSON_AddNumberToObject(r, "steps", (double)res->steps);
            cJSON_AddNumberToObject(r, "train_loss", res->last_loss);
            if (isfinite(res->eval_loss))
                cJSON_AddNumberToObject(r, "eval_loss", res->eval_loss);
            cJSON_AddNumberToObject(r, "tokens", (double)t->st.tokens);
            cJSON_AddNumberToObject(r, "tokens_per_s", res->tokens_per_s);
        }
    }
    int rc = run_write_json(t->cfg->out_dir, j);
    cJSON_Delete(j);
    return rc;
}

// Mean loss over the held-out sequences, weighted by their loss positions.
static int evaluate(Trainer *t, double *out) {
    TrainJob *job = t->job;
    int B = t->cfg->batch;
    if (!t->eval_acts.mem)
        ER_TRY(acts_alloc(&t->eval_acts, &job->model->cfg, B, t->max_len_eval, ACTS_SCORE, 0));
    if (job->before_forward)
        ER_TRY(job->before_forward(job->hook_ctx, t->st.step));
    double sum = 0, w = 0;
    for (int i = 0; i < t->n_eval; i += B) {
        int n = t->n_eval - i < B ? t->n_eval - i : B;
        Batch *b = &t->batch;
        ER_TRY(batch_fill(b, &t->sb, t->eval, t->eval_idx + i, n));
        ModelInput in = {.B = b->B, .T = b->T, .tokens = b->tokens, .len = b->len};
        if (job->adapter) {
            in.adapter = job->adapter;
            in.adapter_mask = b->adapter_mask;
        }
        double loss;
        ER_TRY(model_forward(job->model, &in, &t->eval_acts));
        ER_TRY(model_loss(&t->eval_acts, b->targets, b->loss_mask, 0, &loss));
        sum += loss * (double)b->n_loss;
        w += (double)b->n_loss;
    }
    *out = w > 0 ? sum / w : NAN;
    return ER_OK;
}

static void zero_grads(TrainJob *job) {
    if (job->adapter)
        lora_zero_grad(job->adapter);
    else
        model_zero_grad(job->model);
}

// One optimizer step: grad_accum micro-batches, clip, AdamW. *loss is the mean micro-batch loss.
static int train_step(Trainer *t, double lr, double *loss, double *gnorm, long *tokens) {
    TrainJob *job = t->job;
    const TrainConfig *c = t->cfg;
    zero_grads(job);
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
        int n = t->ep.start[t->st.cursor + 1] - t->ep.start[t->st.cursor];
        Batch *b = &t->batch;
        ER_TRY(batch_fill(b, &t->sb, t->train, idx, n));
        ErRng drop;
        rng_fork(&drop, &t->root, STREAM_DROPOUT(t->st.step * (uint64_t)c->grad_accum + (uint64_t)k));
        ModelInput in = {.B = b->B, .T = b->T, .tokens = b->tokens, .len = b->len};
        if (job->adapter) {
            in.adapter = job->adapter;
            in.adapter_mask = b->adapter_mask;
            in.dropout_rng = job->adapter->dropout > 0 ? &drop : NULL;
        }
        double l;
        ER_TRY(model_forward(job->model, &in, &t->acts));
        int rc = model_loss(&t->acts, b->targets, b->loss_mask, 1, &l);
        if (rc < 0)
            return er_error_prefix(rc, "step %ld", t->st.step + 1);
        // Accumulation averages the micro-batch means: scale d(loss)/d(logits) by 1/grad_accum.
        if (c->grad_accum > 1) {
            float s = 1.0f / (float)c->grad_accum;
            size_t nl = (size_t)b->B * b->T * job->model->cfg.V;
            float *g = t->acts.logits;
#pragma omp parallel for schedule(static)
            for (size_t i = 0; i < nl; i++)
                g[i] *= s;
        }
        ER_TRY(model_backward(job->model, &in, &t->acts));
        sum += l;
        *tokens += b->n_tokens;
        t->st.cursor++;
    }
    *loss = sum / c->grad_accum;
    *gnorm = clip_grad_norm(job->grads, job->n, c->clip);
    if (!isfinite(*gnorm))
        return er_error(ER_ERANGE, "step %ld: the gradient norm is not finite (%g); lower --lr or check the data",
                        t->st.step + 1, *gnorm);
    adamw_step(&t->opt, job->params, job->grads, job->decay_mask, lr);
    return ER_OK;
}

static int save_checkpoint(Trainer *t) {
    t->st.config = t->config; // borrowed for the save
    int rc = checkpoint_save(t->ckpt_dir, &t->st, t->job->params, t->job->n, &t->opt);
    t->st.config = NULL;
    return rc;
}

// Restores the run's state from its checkpoint (data order, optimizer, parameters).
static int resume_from_checkpoint(Trainer *t) {
    TrainState st;
    ER_TRY(checkpoint_load(t->ckpt_dir, &st, t->job->params, t->job->n, &t->opt));
    int rc = train_config_check_resume(st.config, t->config, t->ckpt_dir);
    if (rc == ER_OK && (st.rng.s[0] != t->root.s[0] || st.rng.s[1] != t->root.s[1] || st.rng.s[2] != t->root.s[2] ||
                        st.rng.s[3] != t->root.s[3]))
        rc = er_error(ER_EINVAL, "%s: RNG state does not come from --seed %d", t->ckpt_dir, t->cfg->seed);
    if (rc == ER_OK && st.step > t->total_steps)
        rc = er_error(ER_EINVAL, "%s: checkpoint at step %ld is past the %ld steps asked for (a run can be extended, "
                      "not shortened)", t->ckpt_dir, st.step, t->total_steps);
    if (rc == ER_OK && (st.n_order != t->n_train || st.n_batches < 1 || st.cursor > st.n_batches))
        rc = er_error(ER_EFORMAT, "%s: the saved data order covers %d sequences in %d batches (cursor %ld), this run has %d",
                      t->ckpt_dir, st.n_order, st.n_batches, st.cursor, t->n_train);
    for (int i = 0; rc == ER_OK && i < st.n_order; i++)
        if (st.order[i] < 0 || st.order[i] >= t->n_train)
            rc = er_error(ER_EFORMAT, "%s: saved data order has index %d outside [0, %d)", t->ckpt_dir, st.order[i],
                          t->n_train);
    if (rc < 0) {
        train_state_free(&st);
        return rc;
    }
    batches_free(&t->ep);
    t->ep.index = st.order;
    t->ep.start = st.batch_start;
    t->ep.n = st.n_order;
    t->ep.n_batches = st.n_batches;
    st.order = NULL;
    st.batch_start = NULL;
    cJSON_Delete(st.config);
    st.config = NULL;
    t->st.step = st.step;
    t->st.epoch = st.epoch;
    t->st.cursor = st.cursor;
    t->st.tokens = st.tokens;
    state_point_at_epoch(t);
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
    rng_seed(&t.root, (uint64_t)(uint32_t)c->seed);
    t.st.rng = t.root;
    int rc = ER_OK;
    Progress prog;
    int prog_on = 0;
#define CHECK(expr)            \
    do {                       \
        if ((rc = (expr)) < 0) \
            goto done;         \
    } while (0)

    t.seq_len = c->seq_len ? c->seq_len : job->model->cfg.max_pos;
    if (t.seq_len > job->model->cfg.max_pos)
        CHECK(er_error(ER_EINVAL, "--seq-len %d is longer than the model's max_position_embeddings %d", c->seq_len,
                       job->model->cfg.max_pos));
    if (tok_vocab_size(job->tok) > job->model->cfg.V)
        CHECK(er_error(ER_EINVAL, "the tokenizer has %d ids but the model's vocabulary only %d", tok_vocab_size(job->tok),
                       job->model->cfg.V));
    CHECK(seq_builder_init(&t.sb, job->tok, job->style, job->prefix, t.seq_len, c->kind != TRAIN_SFT,
                           c->no_mask));
    CHECK(load_data(&t));
    CHECK(make_epoch(&t, 0));
    state_point_at_epoch(&t);
    if (c->steps > 0) {
        t.total_steps = c->steps;
    } else {
        long micro = (long)c->epochs * t.ep.n_batches;
        t.total_steps = (micro + c->grad_accum - 1) / c->grad_accum;
    }
    t.warmup_steps = c->warmup < 1 ? lround(c->warmup * (double)t.total_steps) : (long)c->warmup;
    t.config = config_to_json(&t);
    t.ckpt_dir = path_join(c->out_dir, "checkpoint");
    if (!t.config || !t.ckpt_dir)
        CHECK(ER_ENOMEM);
    CHECK(adamw_init(&t.opt, job->n, c->lr, c->beta1, c->beta2, c->eps, c->weight_decay));
    int maxT = t.max_len_train > t.max_len_eval ? t.max_len_train : t.max_len_eval;
    CHECK(batch_alloc(&t.batch, c->batch, maxT));
    CHECK(acts_alloc(&t.acts, &job->model->cfg, c->batch, t.max_len_train, ACTS_TRAIN, er_physical_memory()));
    t.eval_idx = er_calloc((size_t)t.n_eval + 1, sizeof(int));
    if (!t.eval_idx)
        CHECK(ER_ENOMEM);
    for (int i = 0; i < t.n_eval; i++)
        t.eval_idx[i] = i;

    long resumed_from = -1;
    if (c->resume) {
        if (!checkpoint_exists(t.ckpt_dir))
            CHECK(er_error(ER_EINVAL, "%s: no checkpoint to resume from", t.ckpt_dir));
        CHECK(resume_from_checkpoint(&t));
        resumed_from = t.st.step;
    } else {
        CHECK(dir_make(c->out_dir));
    }
    CHECK(metrics_open(&t.ml, c->out_dir, c->resume, t.st.step));
    int complete = t.st.step >= t.total_steps; // resuming a finished run: outputs rewritten, run.json kept
    if (!complete)
        CHECK(write_run_json(&t, NULL, resumed_from, 0));

    if (!c->quiet) {
        printf("%s: %d training / %d held-out sequences from %ld records of %s (%ld refused: prompt longer than "
               "--seq-len; %ld truncated)\n",
               job->label, t.n_train, t.n_eval, t.n_records, c->data_path, t.n_skipped, t.n_truncated);
        printf("%s: %zu trained parameters, %ld steps of %d x %d sequences (%d batches per epoch), warmup %ld, "
               "activations %.1f MiB, %d threads\n",
               job->label, job->n, t.total_steps, c->grad_accum, c->batch, t.ep.n_batches, t.warmup_steps,
               t.acts.bytes / 1048576.0, threads_get());
        if (resumed_from >= 0)
            printf("%s: resumed from %s at step %ld\n", job->label, t.ckpt_dir, resumed_from);
        fflush(stdout);
    }
    if (!c->quiet && !complete) {
        // Steps are counted as the run counts them; rate and ETA from where this call starts.
        progress_begin(&prog, stderr, job->label, "step", t.st.step, t.total_steps);
        prog_on = 1;
    }

    double t0 = time_now();
    long tokens0 = t.st.tokens, step0 = t.st.step;
    while (t.st.step < t.total_steps) {
        double lr = lr_schedule(t.st.step, t.warmup_steps, t.total_steps, c->lr, c->min_lr);
        double loss = 0, gnorm = 0;
        long tokens = 0;
        CHECK(train_step(&t, lr, &loss, &gnorm, &tokens));
        t.st.step++;
        t.st.tokens += tokens;
        if (t.st.step == step0 + 1)
            r.first_loss = loss;
        r.last_loss = loss;
        int do_eval = t.n_eval > 0 &&
                      ((c->eval_every > 0 && t.st.step % c->eval_every == 0) || t.st.step == t.total_steps);
        double eval_loss = NAN;
        if (do_eval) {
            CHECK(evaluate(&t, &eval_loss));
            r.eval_loss = eval_loss;
        }
        double el = time_now() - t0;
        double tps = el > 0 ? (double)(t.st.tokens - tokens0) / el : 0;
        r.tokens_per_s = tps;
        // Deterministic fields first; tokens_per_s (wall clock) last, so lines of a resumed run and an
        // uninterrupted one agree byte for byte up to it.
        cJSON *line = cJSON_CreateObject();
        if (!line)
            CHECK(ER_ENOMEM);
        cJSON_AddNumberToObject(line, "step", (double)t.st.step);
        cJSON_AddNumberToObject(line, "epoch",
                                (double)t.st.epoch + (double)t.st.cursor / (double)(t.ep.n_batches ? t.ep.n_batches : 1));
        cJSON_AddNumberToObject(line, "loss", loss);
        cJSON_AddNumberToObject(line, "lr", lr);
        cJSON_AddNumberToObject(line, "grad_norm", gnorm);
        cJSON_AddNumberToObject(line, "tokens", (double)t.st.tokens);
        if (do_eval)
            cJSON_AddNumberToObject(line, "eval_loss", eval_loss);
        cJSON_AddNumberToObject(line, "tokens_per_s", round(tps * 10) / 10);
        rc = metrics_write(&t.ml, line);
        cJSON_Delete(line);
        CHECK(rc);
        if (prog_on) {
            char extra[160];
            int k = snprintf(extra, sizeof extra, "loss %.4f lr %.2e %.0f tok/s", loss, lr, tps);
            if (isfinite(r.eval_loss) && k > 0 && (size_t)k < sizeof extra)
                snprintf(extra + k, sizeof extra - (size_t)k, " eval %.4f", r.eval_loss);
            if (do_eval && !isatty(fileno(stderr))) // an eval result is worth a line of its own in a log
                prog.t_last_print = 0;
            progress_update(&prog, t.st.step, extra);
        }
        if ((c->save_every > 0 && t.st.step % c->save_every == 0) || t.st.step == t.total_steps)
            CHECK(save_checkpoint(&t));
        if (c->stop_after > 0 && t.st.step >= c->stop_after && t.st.step < t.total_steps) {
            if (!c->quiet) {
                progress_end(&prog, "stopped (--stop-after)");
                prog_on = 0;
            }
            r.steps = t.st.step;
            goto done; // as if killed: no final outputs
        }
    }
    if (prog_on) {
        char extra[96];
        snprintf(extra, sizeof extra, "loss %.4f", r.last_loss);
        progress_end(&prog, extra);
        prog_on = 0;
    }
    r.steps = t.st.step;
    if (complete) {
        r.first_loss = r.last_loss = NAN;
        if (t.n_eval > 0)
            CHECK(evaluate(&t, &r.eval_loss));
        CHECK(job->save_final(job->save_ctx, c->out_dir));
        if (!c->quiet)
            printf("%s: the run in %s was already complete (%ld steps); its outputs were written again\n", job->label,
                   c->out_dir, r.steps);
        goto done;
    }
    CHECK(job->save_final(job->save_ctx, c->out_dir));
    CHECK(write_run_json(&t, &r, resumed_from, 1));
    if (!c->quiet) {
        printf("%s: %ld steps, final train loss %.4f", job->label, r.steps, r.last_loss);
        if (isfinite(r.eval_loss))
            printf(", held-out loss %.4f", r.eval_loss);
        printf(", %.0f tokens/s; wrote %s\n", r.tokens_per_s, c->out_dir);
    }
done:
#undef CHECK
    if (prog_on)
        progress_end(&prog, "failed");
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
