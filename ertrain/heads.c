// ertrain heads: trains the switcher (MLP on the prompt's EMA features: does this prompt need
// reasoning?) and the verifier (linear on a response's verification features: is this answer
// right?) for one base model + reasoning adapter, on a JSONL dataset with gold answers. The run is
// heads_run (train/heads.h) with the switcher (switcher_train/) and the verifier (verifier_train/)
// as its jobs; this file parses the flags, checks them and prints. run.json and metrics.jsonl go to
// --out (default: the directory of the first head written).
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/args.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "core/threads.h"
#include "ertrain/cli.h"
#include "model/head.h"
#include "switcher_train/switcher.h"
#include "train/dist.h"
#include "train/heads.h"
#include "verifier_train/verifier.h"

// The parsed flags: the runner's configs, and the flags that go to more than one of them.
typedef struct {
    HeadsConfig h;
    SwitcherConfig sw;
    VerifierConfig vf;
    const char *kv;
    int threads, batch;
    double noise, lr, weight_decay;
} HeadsFlags;

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path)
        return er_strdup(slash ? "/" : ".");
    char *d = er_alloc((size_t)(slash - path) + 1);
    if (d) {
        memcpy(d, path, (size_t)(slash - path));
        d[slash - path] = 0;
    }
    return d;
}

// Whether two output paths name one head (however spelled, NAME or either of its files; the files need
// not exist yet).
static int same_file(const char *a, const char *b) {
    char *da = dir_of(a), *db = dir_of(b), *ra = da ? path_resolve(da) : NULL, *rb = db ? path_resolve(db) : NULL;
    const char *ba = strrchr(a, '/'), *bb = strrchr(b, '/');
    ba = ba ? ba + 1 : a;
    bb = bb ? bb + 1 : b;
    size_t na = trained_head_name_len(ba), nb = trained_head_name_len(bb);
    int same = ra && rb && strcmp(ra, rb) == 0 && na == nb && strncmp(ba, bb, na) == 0;
    er_free(da);
    er_free(db);
    er_free(ra);
    er_free(rb);
    return same;
}

// run.json's "config": every flag as given.
static cJSON *flags_json(const HeadsFlags *f) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    const HeadsConfig *h = &f->h;
    const SwitcherConfig *s = &f->sw;
    const VerifierConfig *v = &f->vf;
    const char *strs[][2] = {{"model", h->model_dir},    {"adapter", h->adapter_dir},  {"data", h->data_path},
                             {"switcher_out", s->out},   {"verifier_out", v->out},     {"system", h->system},
                             {"kv", f->kv},              {"prefix", h->prefix},        {"verify_prompt", v->verify_prompt},
                             {"device", h->device}};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (strs[i][1])
            cJSON_AddStringToObject(j, strs[i][0], strs[i][1]);
    struct {
        const char *k;
        double v;
    } nums[] = {{"limit", h->limit},
                {"seed", h->seed},
                {"threads", f->threads},
                {"derive_labels", s->derive_labels},
                {"chunk", s->chunk},
                {"alpha", s->alpha},
                {"hidden", s->hidden},
                {"dropout", s->dropout},
                {"noise", f->noise},
                {"target_recall", s->target_recall},
                {"samples", v->samples},
                {"temperature", v->temperature},
                {"max_new", h->max_new},
                {"direct_max_new", s->direct_max_new},
                {"budget", h->budget},
                {"answer_tokens", h->answer_tokens},
                {"verifier_adapter_on", v->adapter_on},
                {"switcher_epochs", s->fit.epochs},
                {"verifier_epochs", v->fit.epochs},
                {"batch", f->batch},
                {"lr", f->lr},
                {"weight_decay", f->weight_decay},
                {"val_split", h->val_split},
                {"allow_one_class", h->allow_one_class}};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        cJSON_AddNumberToObject(j, nums[i].k, nums[i].v);
    return j;
}

// Parses argv into f; ARGS_HELP after --help.
static int parse_flags(int argc, char **argv, HeadsFlags *f) {
    HeadsConfig *h = &f->h;
    SwitcherConfig *s = &f->sw;
    VerifierConfig *v = &f->vf;
    ArgSpec specs[] = {
        {"model", ARG_STR, &h->model_dir, "base model dir (HF layout, with its tokenizer): the model the heads read", 1,
         0, 0},
        {"adapter", ARG_STR, &h->adapter_dir, "reasoning adapter dir (PEFT): samples for the verifier, derived labels "
         "(optional on a hybrid-thinking model, Qwen3: the base then reasons with its thinking on)", 0, 0, 0},
        {"data", ARG_STR, &h->data_path, "JSONL records with gold answers (and \"needs_reasoning\" unless "
                                         "--derive-labels)", 1, 0, 0},
        {"switcher-out", ARG_STR, &s->out, "write the switcher here (FILE.safetensors + FILE.json)", 0, 0, 0},
        {"verifier-out", ARG_STR, &v->out, "write the verifier here (FILE.safetensors + FILE.json)", 0, 0, 0},
        {"out", ARG_STR, &h->out_dir, "dir for run.json and metrics.jsonl [the directory of the first head]", 0, 0, 0},
        {"system", ARG_STR, &h->system, "system message in front of every prompt (as erinfer eval --system)", 0, 0, 0},
        {"limit", ARG_INT, &h->limit, "use only the first N records (0 = all; the run prints its pace per record "
                                      "after 2% of them)", 0, 0, 1 << 30},
        {"val-split", ARG_FLOAT, &h->val_split, "fraction of the records held out: half calibrate the thresholds, half "
                                                "report the metrics at them", 0, 0, 0.9},
        {"allow-one-class", ARG_FLAG, &h->allow_one_class, "write a head even when its training rows hold one label "
                                                           "only (refused otherwise)", 0, 0, 0},
        {"seed", ARG_INT, &h->seed, "seed of the split, sampling, init, order, dropout and noise", 0, 0, 2147483647},
        {"threads", ARG_INT, &f->threads, "threads (0 = all cores)", 0, 0, 4096},
        {"device", ARG_STR, &h->device, "where the passes run: cpu, cuda or cuda:N; the heads then read the features "
                                        "of that device's base (bf16 on a GPU), like erinfer --device [cpu]", 0, 0, 0},
        {"kv", ARG_STR, &f->kv, "KV cache type the features are computed on: f32 or int8, the erinfer --kv the "
                                "heads will run with (recorded in each head)", 0, 0, 0},
        {"chunk", ARG_INT, &s->chunk, "switcher: prompt positions per chunk of the EMA", 0, 1, 1 << 20},
        {"alpha", ARG_FLOAT, &s->alpha, "switcher: EMA weight of each new chunk's mean", 0, 1e-6, 1},
        {"hidden", ARG_INT, &s->hidden, "switcher: hidden units of the MLP", 0, 1, 4096},
        {"dropout", ARG_FLOAT, &s->dropout, "switcher: dropout on the hidden units", 0, 0, 0.95},
        {"noise", ARG_FLOAT, &f->noise, "switcher: Gaussian noise sigma on standardised features (0 = off)", 0, 0, 10},
        {"derive-labels", ARG_FLAG, &s->derive_labels, "switcher: label = base direct answer wrong and adapter's right "
                                                       "(instead of the records' \"needs_reasoning\")", 0, 0, 0},
        {"target-recall", ARG_FLOAT, &s->target_recall, "switcher: threshold reaching this held-out recall of "
                                                        "reasoning-needed prompts (0 = best accuracy)", 0, 0, 1},
        {"switcher-epochs", ARG_INT, &s->fit.epochs, "switcher: training epochs", 0, 1, 1000000},
        {"verify-prompt", ARG_TEXT, &v->verify_prompt, "verifier: text appended to each response", 0, 0, 0},
        {"verifier-adapter-on", ARG_FLAG, &v->adapter_on, "verifier: adapter on for the verification tokens "
                                                          "(default off: base features, as in the paper)", 0, 0, 0},
        {"samples", ARG_INT, &v->samples, "verifier: responses sampled from the adapter per training prompt", 0, 1, 256},
        {"temperature", ARG_FLOAT, &v->temperature, "verifier: sampling temperature", 0, 0, 100},
        {"verifier-epochs", ARG_INT, &v->fit.epochs, "verifier: training epochs", 0, 1, 1000000},
        {"max-new", ARG_INT, &h->max_new, "tokens per reasoning response", 0, 1, 1 << 20},
        {"direct-max-new", ARG_INT, &s->direct_max_new, "tokens of the base's direct answer (--derive-labels)", 0, 1,
         1 << 20},
        {"budget", ARG_INT, &h->budget, "hard budget on reasoning responses (0 = off), as erinfer --budget", 0, 0,
         1 << 20},
        {"answer-tokens", ARG_INT, &h->answer_tokens, "tokens allowed after the budget, suffix included", 0, 1, 1 << 20},
        {"prefix", ARG_TEXT, &h->prefix, "reasoning prefix forced in reasoning responses [the adapter's]", 0, 0, 0},
        {"batch", ARG_INT, &f->batch, "rows per AdamW step", 0, 1, 1 << 20},
        {"lr", ARG_FLOAT, &f->lr, "AdamW learning rate", 0, 1e-12, 10},
        {"weight-decay", ARG_FLOAT, &f->weight_decay, "AdamW weight decay (weights only)", 0, 0, 10},
    };
    return args_parse(argc, argv, specs, (int)(sizeof specs / sizeof specs[0]),
                      "ertrain heads --model DIR [--adapter DIR] --data FILE.jsonl [--switcher-out FILE] "
                      "[--verifier-out FILE] [--derive-labels] [--target-recall R] [--samples 16] [...]");
}

// A head's two files (NAME.safetensors and NAME.json, as model/head.c names them), checked before any work:
// each must be a path that can be written, and no input file.
static int check_head_out(const char *out, const HeadsConfig *h) {
    size_t n = trained_head_name_len(out); // NAME, NAME.safetensors or NAME.json: the names head_paths writes
    static const char *ext[] = {".safetensors", ".json"};
    for (int i = 0; i < 2; i++) {
        char p[4096];
        snprintf(p, sizeof p, "%.*s%s", (int)n, out, ext[i]);
        char *d = dir_of(p);
        if (!d)
            return ER_ENOMEM;
        // Without --out the head's dir is the run's, which heads_run makes: it need only be makeable.
        int rc = !h->out_dir && !path_exists(d) ? dir_output_check(d) : file_output_check(p);
        er_free(d);
        ER_TRY(rc);
        ER_TRY(file_output_not_input(p, h->data_path, "--data"));
        ER_TRY(file_output_not_input(p, h->model_dir, "--model"));
        ER_TRY(file_output_not_input(p, h->adapter_dir, "--adapter"));
    }
    return ER_OK;
}

// The checks no runner can make: what the flags mean together.
static int check_flags(HeadsFlags *f) {
    const char *sw = f->sw.out, *vf = f->vf.out;
    if (!sw && !vf)
        return er_error(ER_EINVAL, "nothing to train: give --switcher-out FILE and/or --verifier-out FILE");
    if (strcmp(f->kv, "f32") != 0 && strcmp(f->kv, "int8") != 0)
        return er_error(ER_EINVAL, "--kv must be f32 or int8, got \"%s\"", f->kv);
    if (!(f->h.val_split > 0))
        return er_error(ER_EINVAL, "--val-split must be above 0: the thresholds are calibrated on held-out records");
    if (sw && vf && same_file(sw, vf))
        return er_error(ER_EINVAL, "--switcher-out and --verifier-out are both \"%s\": the second head would "
                        "overwrite the first", sw);
    if ((sw && check_head_out(sw, &f->h) < 0) || (vf && check_head_out(vf, &f->h) < 0))
        return er_last_status();
    if (f->h.out_dir && dir_output_check(f->h.out_dir) < 0)
        return er_last_status();
    f->h.kv = strcmp(f->kv, "int8") == 0 ? KV_INT8 : KV_F32;
    f->sw.fit.noise = (float)f->noise;
    f->sw.fit.batch = f->vf.fit.batch = f->batch;
    f->sw.fit.lr = f->vf.fit.lr = f->lr;
    f->sw.fit.weight_decay = f->vf.fit.weight_decay = f->weight_decay;
    return ER_OK;
}

// The run of the parsed flags: one job per head asked for, report on stdout, notes on stderr.
static int run_heads(HeadsFlags *f) {
    int rc = ER_OK;
    HeadJob jobs[2] = {0};
    int n_jobs = 0;
    char *out_dir = f->h.out_dir ? er_strdup(f->h.out_dir) : dir_of(f->sw.out ? f->sw.out : f->vf.out);
    cJSON *settings = flags_json(f);
    if (!out_dir || !settings)
        ER_CHECK(ER_ENOMEM);
    if (f->sw.out)
        ER_CHECK(switcher_job(&f->sw, &jobs[n_jobs++]));
    if (f->vf.out)
        ER_CHECK(verifier_job(&f->vf, &jobs[n_jobs++]));
    // Each head's dir is made before the work (heads_run makes only the run's): a head elsewhere would
    // otherwise fail at its save, after the collect pass.
    const char *outs[2] = {f->sw.out, f->vf.out};
    for (int i = 0; i < 2 && dist_rank() == 0; i++) {
        char *d = outs[i] ? dir_of(outs[i]) : NULL;
        if (outs[i] && !d)
            ER_CHECK(ER_ENOMEM);
        rc = d ? dir_make(d) : ER_OK;
        er_free(d);
        ER_CHECK(rc);
    }
    f->h.out_dir = out_dir;
    f->h.settings = settings;
    f->h.out = dist_rank() == 0 ? stdout : NULL; // under mpirun rank 0 speaks for the job
    f->h.log = dist_rank() == 0 ? stderr : NULL;
    HeadsResult res;
    ER_CHECK(heads_run(&f->h, jobs, n_jobs, &res));
done:
    for (int j = 0; j < n_jobs; j++)
        head_job_free(&jobs[j]);
    cJSON_Delete(settings);
    er_free(out_dir);
    return rc;
}

int cmd_heads(int argc, char **argv) {
    HeadsFlags f = {.kv = "f32"};
    heads_config_default(&f.h);
    switcher_config_default(&f.sw);
    verifier_config_default(&f.vf);
    f.batch = f.sw.fit.batch;
    f.noise = f.sw.fit.noise;
    f.lr = f.sw.fit.lr;
    f.weight_decay = f.sw.fit.weight_decay;
    int rc = parse_flags(argc, argv, &f);
    if (rc == ARGS_HELP)
        return 0;
    if (rc < 0 || check_flags(&f) < 0)
        return cli_fail("heads");
    f.h.place_on_cpu = train_flags_place_on_cpu();
    threads_set(f.threads);
    return run_heads(&f) < 0 ? cli_fail("heads") : 0;
}
