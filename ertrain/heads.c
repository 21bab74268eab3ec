// ertrain heads: trains the switcher (MLP on the prompt's EMA features: does this prompt need
// reasoning?) and the verifier (linear on a response's verification features: is this answer
// right?) for one base model + reasoning adapter, on a JSONL dataset with gold answers. One pass
// over the records collects features and labels through the runtime engine (the same code erinfer
// runs), a held-out split of the records calibrates the thresholds, and each head is saved with
// its feature spec and the model's fingerprint (model/head.h). run.json and metrics.jsonl go to
// --out (default: the directory of the first head written).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/progress.h"
#include "core/threads.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "lora/peft.h"
#include "model/head.h"
#include "switcher_train/head_fit.h"
#include "switcher_train/switcher.h"
#include "ertrain/cli.h"
#include "train/run.h"
#include "verifier_train/verifier.h"

typedef struct {
    const char *model, *adapter, *data, *switcher_out, *verifier_out, *out, *system, *kv, *prefix, *verify_prompt;
    int limit, seed, threads, derive_labels, chunk, hidden, samples, max_new, direct_max_new, budget, answer_tokens;
    int verifier_adapter_on, switcher_epochs, verifier_epochs, batch;
    double val_split, alpha, dropout, noise, target_recall, temperature, lr, weight_decay;
} HeadsFlags;

// The record's prompt rendered as erinfer eval renders it: chat template, --system in front.
static int render_prompt(const Tokenizer *tok, ChatStyle style, const Example *ex, const char *system, int **ids,
                         int *n) {
    ChatMessage *m = er_calloc((size_t)ex->n_messages + 1, sizeof *m);
    if (!m)
        return ER_ENOMEM;
    int k = 0, has_sys = ex->n_messages > 0 && strcmp(ex->messages[0].role, "system") == 0;
    if (system)
        m[k++] = (ChatMessage){"system", system};
    for (int i = (system && has_sys) ? 1 : 0; i < ex->n_messages; i++)
        m[k++] = ex->messages[i];
    char *text;
    int rc = chat_render(style, m, k, CHAT_ADD_GENERATION_PROMPT, &text, NULL);
    er_free(m);
    if (rc < 0)
        return rc;
    rc = tok_encode(tok, text, strlen(text), ids, n);
    er_free(text);
    return rc;
}

typedef struct {
    float *x, *y;  // (n, C), (n)
    int n, cap, C;
} Rows;

static int rows_reserve(Rows *r, int more) {
    if (r->n + more <= r->cap)
        return ER_OK;
    int cap = (r->cap ? r->cap * 2 : 64);
    while (cap < r->n + more)
        cap *= 2;
    float *x = er_realloc_array(r->x, (size_t)cap * r->C, sizeof(float));
    if (!x)
        return ER_ENOMEM;
    r->x = x;
    float *y = er_realloc_array(r->y, (size_t)cap, sizeof(float));
    if (!y)
        return ER_ENOMEM;
    r->y = y;
    r->cap = cap;
    return ER_OK;
}

static void rows_free(Rows *r) {
    er_free(r->x);
    er_free(r->y);
    memset(r, 0, sizeof *r);
}

// Trains, calibrates and saves one head; adds its results to `res`.
static int train_head(const HeadsFlags *f, HeadRole role, const Rows *tr, const Rows *va, const Model *m,
                      MetricsLog *ml, const char *path, cJSON *res) {
    const char *name = role == HEAD_SWITCHER ? "switcher" : "verifier";
    if (tr->n < 2)
        return er_error(ER_EINVAL, "%s: %d training rows; need at least 2 (more records, or a smaller --val-split)",
                        name, tr->n);
    int pos = 0;
    for (int i = 0; i < tr->n; i++)
        pos += tr->y[i] > 0.5f;
    TrainedHead t = {0};
    t.role = role;
    t.chunk = f->chunk;
    t.alpha = (float)f->alpha;
    t.adapter_on = f->verifier_adapter_on;
    model_fingerprint(m, t.fingerprint);
    int rc = head_init(&t.net, role == HEAD_SWITCHER ? HEAD_MLP : HEAD_LINEAR, tr->C, f->hidden, (float)f->dropout, 1,
                       (uint64_t)f->seed + (role == HEAD_SWITCHER ? 101 : 202));
    if (rc < 0)
        return rc;
    if (role == HEAD_VERIFIER && !(t.verify_prompt = er_strdup(f->verify_prompt)))
        rc = ER_ENOMEM;
    HeadFitConfig c;
    head_fit_config_default(&c);
    c.epochs = role == HEAD_SWITCHER ? f->switcher_epochs : f->verifier_epochs;
    c.batch = f->batch;
    c.lr = f->lr;
    c.weight_decay = f->weight_decay;
    c.noise = role == HEAD_SWITCHER ? (float)f->noise : 0.0f;
    c.seed = (uint64_t)f->seed + (role == HEAD_SWITCHER ? 1 : 2);
    c.label = name;
    c.metrics = ml;
    HeadFitResult fr;
    fprintf(stderr, "%s: training on %d rows (%.1f%% positive), %d held out\n", name, tr->n,
            100.0 * pos / tr->n, va->n);
    if (rc == ER_OK)
        rc = head_fit(&t.net, tr->x, tr->y, tr->n, va->x, va->y, va->n, &c, &fr);
    float *pt = NULL, *pv = NULL;
    if (rc == ER_OK) {
        pt = er_alloc(sizeof(float) * (size_t)tr->n);
        pv = er_alloc(sizeof(float) * (size_t)(va->n > 0 ? va->n : 1));
        if (!pt || !pv)
            rc = ER_ENOMEM;
    }
    if (rc == ER_OK)
        rc = head_predict(&t.net, tr->x, tr->n, pt);
    if (rc == ER_OK && va->n > 0)
        rc = head_predict(&t.net, va->x, va->n, pv);
    if (rc == ER_OK) {
        // Calibrate on the held-out split (on the training rows when nothing is held out).
        const float *cs = va->n > 0 ? pv : pt, *cy = va->n > 0 ? va->y : tr->y;
        int cn = va->n > 0 ? va->n : tr->n;
        double target = role == HEAD_SWITCHER ? f->target_recall : 0;
        t.threshold = threshold_choose(cs, cy, cn, target);
        if (role == HEAD_SWITCHER && t.threshold >= 1.0f)
            rc = er_error(ER_EINVAL, "switcher: the best-accuracy threshold on the held-out records is 1, which sends "
                          "no prompt to reasoning; pass --target-recall R (e.g. 0.9) or give more records that need "
                          "reasoning");
        double auc_t = roc_auc(pt, tr->y, tr->n), auc_v = roc_auc(pv, va->y, va->n);
        double acc_t = accuracy_at(pt, tr->y, tr->n, t.threshold), acc_v = accuracy_at(pv, va->y, va->n, t.threshold);
        int vpos = 0, tp = 0;
        for (int i = 0; i < va->n; i++) {
            vpos += va->y[i] > 0.5f;
            tp += va->y[i] > 0.5f && pv[i] >= t.threshold;
        }
        t.metrics = cJSON_CreateObject();
        if (!t.metrics) {
            rc = ER_ENOMEM;
        } else {
            cJSON_AddNumberToObject(t.metrics, "n_train", tr->n);
            cJSON_AddNumberToObject(t.metrics, "n_val", va->n);
            cJSON_AddNumberToObject(t.metrics, "train_positive_rate", (double)pos / tr->n);
            cJSON_AddNumberToObject(t.metrics, "train_loss_first", fr.first_loss);
            cJSON_AddNumberToObject(t.metrics, "train_loss_last", fr.last_loss);
            if (isfinite(fr.val_loss))
                cJSON_AddNumberToObject(t.metrics, "val_loss", fr.val_loss);
            if (isfinite(auc_t))
                cJSON_AddNumberToObject(t.metrics, "train_roc_auc", auc_t);
            if (isfinite(auc_v))
                cJSON_AddNumberToObject(t.metrics, "val_roc_auc", auc_v);
            cJSON_AddNumberToObject(t.metrics, "train_accuracy", acc_t);
            if (va->n > 0)
                cJSON_AddNumberToObject(t.metrics, "val_accuracy", acc_v);
            if (vpos > 0)
                cJSON_AddNumberToObject(t.metrics, "val_recall", (double)tp / vpos);
            cJSON_AddNumberToObject(t.metrics, "threshold", t.threshold);
            cJSON_AddStringToObject(t.metrics, "threshold_rule",
                                    target > 0 ? "target_recall" : "best_accuracy");
            if (target > 0)
                cJSON_AddNumberToObject(t.metrics, "target_recall", target);
            cJSON_AddItemToObject(res, name, cJSON_Duplicate(t.metrics, 1));
        }
        char auc_s[32] = "n/a (one class)", acc_s[32] = "n/a";
        double auc = va->n > 0 ? auc_v : auc_t;
        if (isfinite(auc))
            snprintf(auc_s, sizeof auc_s, "%.4f", auc);
        snprintf(acc_s, sizeof acc_s, "%.4f", va->n > 0 ? acc_v : acc_t);
        printf("%s: %s ROC-AUC %s, accuracy %s at threshold %.4f (%s); train loss %.4f -> %.4f\n", name,
               va->n > 0 ? "held-out" : "training (nothing held out)", auc_s, acc_s, t.threshold,
               target > 0 ? "target recall" : "best accuracy", fr.first_loss, fr.last_loss);
    }
    if (rc == ER_OK)
        rc = trained_head_save(&t, path);
    if (rc == ER_OK)
        printf("%s: wrote %s\n", name, path);
    er_free(pt);
    er_free(pv);
    trained_head_free(&t);
    return rc;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash)
        return er_strdup(".");
    char *d = er_alloc((size_t)(slash - path) + 1);
    if (d) {
        memcpy(d, path, (size_t)(slash - path));
        d[slash - path] = 0;
    }
    return d;
}

// Whether two output paths name one file (however spelled; the files need not exist yet).
static int same_file(const char *a, const char *b) {
    char *da = dir_of(a), *db = dir_of(b), *ra = da ? path_resolve(da) : NULL, *rb = db ? path_resolve(db) : NULL;
    const char *ba = strrchr(a, '/'), *bb = strrchr(b, '/');
    int same = ra && rb && strcmp(ra, rb) == 0 && strcmp(ba ? ba + 1 : a, bb ? bb + 1 : b) == 0;
    er_free(da);
    er_free(db);
    er_free(ra);
    er_free(rb);
    return same;
}

static cJSON *flags_json(const HeadsFlags *f) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    const char *strs[][2] = {{"model", f->model},       {"adapter", f->adapter},           {"data", f->data},
                             {"switcher_out", f->switcher_out}, {"verifier_out", f->verifier_out}, {"system", f->system},
                             {"kv", f->kv},             {"prefix", f->prefix},             {"verify_prompt", f->verify_prompt}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (strs[i][1])
            cJSON_AddStringToObject(j, strs[i][0], strs[i][1]);
    struct {
        const char *k;
        double v;
    } nums[] = {{"limit", f->limit},
                {"seed", f->seed},
                {"threads", f->threads},
                {"derive_labels", f->derive_labels},
                {"chunk", f->chunk},
                {"alpha", f->alpha},
                {"hidden", f->hidden},
                {"dropout", f->dropout},
                {"noise", f->noise},
                {"target_recall", f->target_recall},
                {"samples", f->samples},
                {"temperature", f->temperature},
                {"max_new", f->max_new},
                {"direct_max_new", f->direct_max_new},
                {"budget", f->budget},
                {"answer_tokens", f->answer_tokens},
                {"verifier_adapter_on", f->verifier_adapter_on},
                {"switcher_epochs", f->switcher_epochs},
                {"verifier_epochs", f->verifier_epochs},
                {"batch", f->batch},
                {"lr", f->lr},
                {"weight_decay", f->weight_decay},
                {"val_split", f->val_split}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        cJSON_AddNumberToObject(j, nums[i].k, nums[i].v);
    return j;
}

int cmd_heads(int argc, char **argv) {
    HeadsFlags f = {0};
    f.kv = "f32";
    f.verify_prompt = "\nIs this solution correct?";
    f.val_split = 0.2;
    f.chunk = HEAD_DEFAULT_CHUNK;
    f.alpha = HEAD_DEFAULT_ALPHA;
    f.hidden = 8;
    f.dropout = 0.2;
    f.noise = 0.5;
    f.samples = 16;
    f.temperature = 0.8;
    f.max_new = 512;
    f.direct_max_new = 64;
    f.answer_tokens = 32;
    f.switcher_epochs = 100;
    f.verifier_epochs = 100;
    f.batch = 32;
    f.lr = 1e-3;
    f.weight_decay = 0.01;
    ArgSpec specs[] = {
        {"model", ARG_STR, &f.model, "base model dir (HF layout, with its tokenizer): the model the heads read", 1, 0, 0},
        {"adapter", ARG_STR, &f.adapter, "reasoning adapter dir (PEFT): samples for the verifier, derived labels", 1, 0, 0},
        {"data", ARG_STR, &f.data, "JSONL records with gold answers (and \"needs_reasoning\" unless --derive-labels)", 1,
         0, 0},
        {"switcher-out", ARG_STR, &f.switcher_out, "write the switcher here (FILE.safetensors + FILE.json)", 0, 0, 0},
        {"verifier-out", ARG_STR, &f.verifier_out, "write the verifier here (FILE.safetensors + FILE.json)", 0, 0, 0},
        {"out", ARG_STR, &f.out, "dir for run.json and metrics.jsonl [the directory of the first head]", 0, 0, 0},
        {"system", ARG_STR, &f.system, "system message in front of every prompt (as erinfer eval --system)", 0, 0, 0},
        {"limit", ARG_INT, &f.limit, "use only the first N records (0 = all)", 0, 0, 1 << 30},
        {"val-split", ARG_FLOAT, &f.val_split, "fraction of the records held out for calibration and metrics", 0, 0,
         0.9},
        {"seed", ARG_INT, &f.seed, "seed of the split, sampling, init, order, dropout and noise", 0, 0, 2147483647},
        {"threads", ARG_INT, &f.threads, "threads (0 = all cores)", 0, 0, 4096},
        {"kv", ARG_STR, &f.kv, "KV cache type while collecting: f32 or int8 (as erinfer --kv)", 0, 0, 0},
        {"chunk", ARG_INT, &f.chunk, "switcher: prompt positions per chunk of the EMA", 0, 1, 1 << 20},
        {"alpha", ARG_FLOAT, &f.alpha, "switcher: EMA weight of each new chunk's mean", 0, 1e-6, 1},
        {"hidden", ARG_INT, &f.hidden, "switcher: hidden units of the MLP", 0, 1, 4096},
        {"dropout", ARG_FLOAT, &f.dropout, "switcher: dropout on the hidden units", 0, 0, 0.95},
        {"noise", ARG_FLOAT, &f.noise, "switcher: Gaussian noise sigma on standardised features (0 = off)", 0, 0, 10},
        {"derive-labels", ARG_FLAG, &f.derive_labels, "switcher: label = base direct answer wrong and adapter's right "
                                                      "(instead of the records' \"needs_reasoning\")", 0, 0, 0},
        {"target-recall", ARG_FLOAT, &f.target_recall, "switcher: threshold reaching this held-out recall of "
                                                       "reasoning-needed prompts (0 = best accuracy)", 0, 0, 1},
        {"switcher-epochs", ARG_INT, &f.switcher_epochs, "switcher: training epochs", 0, 1, 1000000},
        {"verify-prompt", ARG_TEXT, &f.verify_prompt, "verifier: text appended to each response", 0, 0,
         0},
        {"verifier-adapter-on", ARG_FLAG, &f.verifier_adapter_on, "verifier: adapter on for the verification tokens "
                                                                  "(default off: base features, as in the paper)", 0, 0, 0},
        {"samples", ARG_INT, &f.samples, "verifier: responses sampled from the adapter per training prompt", 0, 1, 256},
        {"temperature", ARG_FLOAT, &f.temperature, "verifier: sampling temperature", 0, 0, 100},
        {"verifier-epochs", ARG_INT, &f.verifier_epochs, "verifier: training epochs", 0, 1, 1000000},
        {"max-new", ARG_INT, &f.max_new, "tokens per reasoning response", 0, 1, 1 << 20},
        {"direct-max-new", ARG_INT, &f.direct_max_new, "tokens of the base's direct answer (--derive-labels)", 0, 1, 1 << 20},
        {"budget", ARG_INT, &f.budget, "hard budget on reasoning responses (0 = off), as erinfer --budget", 0, 0, 1 << 20},
        {"answer-tokens", ARG_INT, &f.answer_tokens, "tokens allowed after the budget, suffix included", 0, 1, 1 << 20},
        {"prefix", ARG_TEXT, &f.prefix, "reasoning prefix forced in reasoning responses [the adapter's]", 0, 0, 0},
        {"batch", ARG_INT, &f.batch, "rows per AdamW step", 0, 1, 1 << 20},
        {"lr", ARG_FLOAT, &f.lr, "AdamW learning rate", 0, 1e-12, 10},
        {"weight-decay", ARG_FLOAT, &f.weight_decay, "AdamW weight decay (weights only)", 0, 0, 10},
    };
    int rc = args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                        "ertrain heads --model DIR --adapter DIR --data FILE.jsonl [--switcher-out FILE] "
                        "[--verifier-out FILE] [--derive-labels] [--target-recall R] [--samples 16] [...]");
    if (rc == ARGS_HELP)
        return 0;
    if (rc == ER_OK && !f.switcher_out && !f.verifier_out)
        rc = er_error(ER_EINVAL, "nothing to train: give --switcher-out FILE and/or --verifier-out FILE");
    if (rc == ER_OK && strcmp(f.kv, "f32") != 0 && strcmp(f.kv, "int8") != 0)
        rc = er_error(ER_EINVAL, "--kv must be f32 or int8, got \"%s\"", f.kv);
    if (rc == ER_OK && !(f.val_split > 0))
        rc = er_error(ER_EINVAL, "--val-split must be above 0: the thresholds are calibrated on held-out records");
    if (rc == ER_OK && f.switcher_out && f.verifier_out && same_file(f.switcher_out, f.verifier_out))
        rc = er_error(ER_EINVAL, "--switcher-out and --verifier-out are both \"%s\": the second head would overwrite "
                      "the first", f.switcher_out);
    if (rc < 0)
        return cli_fail("heads");
    threads_set(f.threads);
    double t_start = time_now();

    // Everything is loaded and checked before any generation: a bad record fails in seconds.
    Dataset d = {0};
    Model m = {0};
    Tokenizer *tok = NULL;
    LoraAdapter ad = {0};
    int have_model = 0, have_ad = 0;
    ChatStyle style = CHAT_CHATML;
    char *out_dir = f.out ? er_strdup(f.out) : dir_of(f.switcher_out ? f.switcher_out : f.verifier_out);
    const char *vprompt = f.verify_prompt, *prefix = f.prefix;
    if (!out_dir)
        rc = ER_ENOMEM;
    if (rc == ER_OK)
        rc = dataset_load(f.data, NULL, f.limit, &d);
    if (rc == ER_OK && d.n < 2)
        rc = er_error(ER_EFORMAT, "%s: %d records; need at least 2", f.data, d.n);
    for (int i = 0; rc == ER_OK && i < d.n; i++) {
        const Example *ex = &d.ex[i];
        if (!ex->messages)
            rc = er_error(ER_EFORMAT, "%s:%ld: a {\"text\"} record has no prompt", f.data, ex->line);
        else if (!ex->answer && (f.verifier_out || f.derive_labels))
            rc = er_error(ER_EFORMAT, "%s:%ld: record has no gold answer (\"answer\", a \\boxed{} solution or a \"#### X\" "
                          "line): the verifier and --derive-labels grade against it", f.data, ex->line);
        else if (f.switcher_out && !f.derive_labels && ex->needs_reasoning < 0)
            rc = er_error(ER_EFORMAT, "%s:%ld: record has no \"needs_reasoning\": add it or pass --derive-labels to derive "
                          "the switcher's labels by running both routes", f.data, ex->line);
    }
    if (rc == ER_OK) {
        rc = model_load(&m, f.model, 0);
        have_model = rc == ER_OK;
    }
    if (rc == ER_OK)
        rc = tok_load(&tok, f.model);
    if (rc == ER_OK)
        rc = chat_style_from_config(f.model, &style);
    if (rc == ER_OK) {
        LoraShape s = {m.cfg.L, m.cfg.C, m.cfg.NH * m.cfg.HS, m.cfg.NKV * m.cfg.HS, m.cfg.FF};
        rc = peft_load(&ad, f.adapter, &s, 0);
        have_ad = rc == ER_OK;
    }
    if (rc == ER_OK && !ad.masked)
        fprintf(stderr, "heads: warning: %s is a standard (unmasked) LoRA: the prompt's hidden states include it\n",
                f.adapter);

    // Prompts, and the engine sized for the longest.
    int **ids = rc == ER_OK ? er_calloc((size_t)d.n, sizeof(int *)) : NULL;
    int *nids = rc == ER_OK ? er_calloc((size_t)d.n, sizeof(int)) : NULL;
    if (rc == ER_OK && (!ids || !nids))
        rc = ER_ENOMEM;
    int max_prompt = 0, n_vq = 0, n_pre = 0, *vq = NULL, *pre = NULL;
    for (int i = 0; rc == ER_OK && i < d.n; i++) {
        rc = render_prompt(tok, style, &d.ex[i], f.system, &ids[i], &nids[i]);
        if (rc < 0)
            rc = er_error_prefix(rc, "%s:%ld", f.data, d.ex[i].line);
        max_prompt = nids[i] > max_prompt ? nids[i] : max_prompt;
    }
    const char *reason_prefix = prefix ? prefix : have_ad ? ad.reasoning_prefix : NULL;
    if (rc == ER_OK)
        rc = tok_encode(tok, vprompt, strlen(vprompt), &vq, &n_vq);
    if (rc == ER_OK && n_vq < 1)
        rc = er_error(ER_EINVAL, "--verify-prompt encodes to no tokens");
    if (rc == ER_OK && reason_prefix)
        rc = tok_encode(tok, reason_prefix, strlen(reason_prefix), &pre, &n_pre);
    Engine e = {0};
    int have_engine = 0;
    int gen_max = f.max_new > f.direct_max_new ? f.max_new : f.direct_max_new;
    int max_len = max_prompt + n_pre + gen_max + n_vq + 2;
    int n_samples = f.verifier_out ? f.samples : 1;
    if (rc == ER_OK) {
        rc = engine_init(&e, &m, tok, strcmp(f.kv, "int8") == 0 ? KV_INT8 : KV_F32, n_samples, max_len, 128,
                         er_physical_memory());
        have_engine = rc == ER_OK;
    }
    GenConfig direct, reasoning;
    gen_config_default(&direct);
    direct.max_new = f.direct_max_new;
    gen_config_default(&reasoning);
    reasoning.max_new = f.max_new;
    reasoning.adapter = have_ad ? &ad : NULL;
    reasoning.response_prefix = reason_prefix;
    reasoning.budget = f.budget;
    reasoning.answer_tokens = f.answer_tokens;
    PromptFeatureSpec spec = {f.chunk, (float)f.alpha};

    // The split: held-out records calibrate and measure; their verifier rows stay with them.
    int *order = rc == ER_OK ? er_alloc(sizeof(int) * (size_t)d.n) : NULL;
    uint8_t *is_val = rc == ER_OK ? er_calloc((size_t)d.n, 1) : NULL;
    if (rc == ER_OK && (!order || !is_val))
        rc = ER_ENOMEM;
    int n_val = (int)floor(f.val_split * d.n + 0.5);
    if (f.val_split > 0 && n_val < 1)
        n_val = 1;
    if (n_val > d.n - 2)
        n_val = d.n - 2 > 0 ? d.n - 2 : 0;
    if (rc == ER_OK) {
        ErRng split;
        rng_seed(&split, (uint64_t)f.seed);
        for (int i = 0; i < d.n; i++)
            order[i] = i;
        shuffle_indices(order, d.n, &split);
        for (int i = 0; i < n_val; i++)
            is_val[order[d.n - 1 - i]] = 1;
    }

    // One pass: features and labels for both heads.
    int C = m.cfg.C;
    Rows sw_tr = {.C = C}, sw_va = {.C = C}, vf_tr = {.C = C}, vf_va = {.C = C};
    long gen_tokens = 0;
    int base_right = 0, adapter_right = 0, sw_pos = 0;
    double vf_right = 0;
    float *labels = rc == ER_OK ? er_alloc(sizeof(float) * (size_t)n_samples) : NULL;
    if (rc == ER_OK && !labels)
        rc = ER_ENOMEM;
    if (rc == ER_OK)
        fprintf(stderr, "heads: %d records (%d held out), hidden size %d, %s%s\n", d.n, n_val, C,
                f.switcher_out ? (f.derive_labels ? "switcher (derived labels)" : "switcher") : "",
                f.verifier_out ? (f.switcher_out ? " + verifier" : "verifier") : "");
    Progress prog;
    progress_begin(&prog, stderr, "heads: collect", "record", 0, d.n);
    for (int i = 0; rc == ER_OK && i < d.n; i++) {
        const Example *ex = &d.ex[i];
        if (f.switcher_out) {
            Rows *r = is_val[i] ? &sw_va : &sw_tr;
            rc = rows_reserve(r, 1);
            if (rc == ER_OK)
                rc = switcher_features(&e, ids[i], nids[i], &ad, &spec, r->x + (size_t)r->n * C);
            int label = ex->needs_reasoning, b = 0, a = 0;
            if (rc == ER_OK && f.derive_labels)
                rc = switcher_derive_label(&e, ids[i], nids[i], &direct, &reasoning, ex->answer, &label, &b, &a,
                                           &gen_tokens);
            if (rc == ER_OK) {
                r->y[r->n++] = (float)label;
                base_right += b;
                adapter_right += a;
                sw_pos += label;
            }
        }
        if (rc == ER_OK && f.verifier_out) {
            Rows *r = is_val[i] ? &vf_va : &vf_tr;
            GenConfig g = reasoning;
            g.n_samples = f.samples;
            g.sampler.temperature = (float)f.temperature;
            g.seed = (uint64_t)f.seed * 1000003u + (uint64_t)i; // every prompt its own streams
            rc = rows_reserve(r, f.samples);
            if (rc == ER_OK)
                rc = verifier_collect(&e, ids[i], nids[i], &g, vq, n_vq, f.verifier_adapter_on, ex->answer,
                                      r->x + (size_t)r->n * C, labels, &gen_tokens);
            for (int k = 0; rc == ER_OK && k < f.samples; k++) {
                r->y[r->n++] = labels[k];
                vf_right += labels[k];
            }
        }
        if (rc < 0) {
            rc = er_error_prefix(rc, "%s:%ld", f.data, ex->line);
            break;
        }
        char extra[96];
        snprintf(extra, sizeof extra, "%ld tokens generated", gen_tokens);
        progress_update(&prog, i + 1, extra);
    }
    if (rc == ER_OK) {
        progress_end(&prog, NULL);
        if (f.switcher_out && f.derive_labels)
            printf("switcher labels: base direct right %d/%d, adapter right %d/%d, reasoning needed %d/%d\n",
                   base_right, d.n, adapter_right, d.n, sw_pos, d.n);
        if (f.verifier_out)
            printf("verifier labels: %.0f/%d sampled responses correct (%.1f%%)\n", vf_right, d.n * f.samples,
                   100.0 * vf_right / (d.n * f.samples));
    } else if (prog.tty && prog.t_last_print > prog.t_start) {
        fputc('\n', stderr);
    }

    // Train, calibrate, save; run.json and metrics.jsonl.
    MetricsLog ml = {0};
    int have_ml = 0;
    if (rc == ER_OK)
        rc = dir_make(out_dir);
    if (rc == ER_OK) {
        rc = metrics_open(&ml, out_dir, 0, 0);
        have_ml = rc == ER_OK;
    }
    cJSON *results = cJSON_CreateObject();
    if (rc == ER_OK && !results)
        rc = ER_ENOMEM;
    if (rc == ER_OK && f.switcher_out)
        rc = train_head(&f, HEAD_SWITCHER, &sw_tr, &sw_va, &m, &ml, f.switcher_out, results);
    if (rc == ER_OK && f.verifier_out)
        rc = train_head(&f, HEAD_VERIFIER, &vf_tr, &vf_va, &m, &ml, f.verifier_out, results);
    if (rc == ER_OK) {
        cJSON *run = cJSON_CreateObject();
        if (!run) {
            rc = ER_ENOMEM;
        } else {
            char fp[17];
            model_fingerprint(&m, fp);
            cJSON_AddStringToObject(run, "command", "heads");
            cJSON_AddStringToObject(run, "version", ERTRAIN_VERSION);
            cJSON_AddNumberToObject(run, "seed", f.seed);
            cJSON_AddItemToObject(run, "config", flags_json(&f));
            cJSON_AddStringToObject(run, "model_fingerprint", fp);
            cJSON *n = cJSON_AddObjectToObject(run, "counts");
            cJSON_AddNumberToObject(n, "records", d.n);
            cJSON_AddNumberToObject(n, "held_out", n_val);
            cJSON_AddNumberToObject(n, "generated_tokens", (double)gen_tokens);
            cJSON_AddItemToObject(run, "result", results);
            results = NULL;
            cJSON_AddNumberToObject(run, "seconds", time_now() - t_start);
            rc = run_write_json(out_dir, run);
            cJSON_Delete(run);
        }
    }
    cJSON_Delete(results);
    if (have_ml)
        metrics_close(&ml);
    rows_free(&sw_tr);
    rows_free(&sw_va);
    rows_free(&vf_tr);
    rows_free(&vf_va);
    er_free(labels);
    er_free(order);
    er_free(is_val);
    if (have_engine)
        engine_free(&e);
    for (int i = 0; ids && i < d.n; i++)
        er_free(ids[i]);
    er_free(ids);
    er_free(nids);
    er_free(vq);
    er_free(pre);
    if (have_ad)
        lora_free(&ad);
    tok_free(tok);
    if (have_model)
        model_free(&m);
    dataset_free(&d);
    er_free(out_dir);
    return rc < 0 ? cli_fail("heads") : 0;
}
