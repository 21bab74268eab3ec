// heads_run (train/heads.h): the shared part of `ertrain heads`; each head plugs in as a HeadJob.
#include "train/heads.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/progress.h"
#include "core/rng.h"
#include "data/chat.h"
#include "lora/peft.h"
#include "model/head.h"
#include "train/dist.h"

void heads_config_default(HeadsConfig *c) {
    memset(c, 0, sizeof *c);
    c->kv = KV_F32;
    c->val_split = 0.2;
    c->max_new = 512;
    c->answer_tokens = 32;
}

void head_job_free(HeadJob *j) {
    if (j->free)
        j->free(j->self);
    memset(j, 0, sizeof *j);
}

// The record's prompt rendered as erinfer eval renders it: chat template, the system message in front.
static int render_prompt(const Tokenizer *tok, ChatStyle style, const Example *ex, const char *system, int **ids,
                         int *n) {
    ChatMessage *m = er_calloc((size_t)ex->n_messages + 1, sizeof *m);
    if (!m)
        return ER_ENOMEM;
    int k = chat_set_system(m, ex->n_messages + 1, ex->messages, ex->n_messages, system);
    char *text;
    int rc = chat_render(style, m, k, CHAT_ADD_GENERATION_PROMPT, &text, NULL);
    er_free(m);
    ER_TRY(rc);
    rc = tok_encode(tok, text, strlen(text), ids, n);
    er_free(text);
    return rc;
}

// Every record is checked before the model loads: a bad record fails in seconds.
static int check_records(const HeadsData *hd, const HeadJob *jobs, int n_jobs) {
    const HeadsConfig *c = hd->c;
    int need_gold = 0;
    for (int j = 0; j < n_jobs; j++)
        need_gold |= jobs[j].need_gold;
    if (hd->d.n < 2)
        return er_error(ER_EFORMAT, "%s: %d records; need at least 2", c->data_path, hd->d.n);
    for (int i = 0; i < hd->d.n; i++) {
        const Example *ex = &hd->d.ex[i];
        if (!ex->messages)
            return er_error(ER_EFORMAT, "%s:%ld: a {\"text\"} record has no prompt", c->data_path, ex->line);
        if (!ex->answer && need_gold)
            return er_error(ER_EFORMAT, "%s:%ld: record has no gold answer (\"answer\", a \\boxed{} solution or a "
                            "\"#### X\" line): the verifier and --derive-labels grade against it", c->data_path,
                            ex->line);
        for (int j = 0; j < n_jobs; j++)
            if (jobs[j].check)
                ER_TRY(jobs[j].check(jobs[j].self, hd, ex));
    }
    return ER_OK;
}

// The split: the last n_val records of a seeded shuffle are held out, at least two (one when only three
// records), leaving two to train on; the first half of them (rounded up) calibrates, the rest reports.
static int split_records(HeadsData *hd) {
    int n = hd->d.n, n_val = (int)floor(hd->c->val_split * n + 0.5);
    if (hd->c->val_split > 0 && n_val < 2)
        n_val = 2;
    if (n_val > n - 2)
        n_val = n - 2 > 0 ? n - 2 : 0;
    int *order = er_alloc(sizeof(int) * (size_t)n);
    hd->split = er_calloc((size_t)n, 1);
    if (!order || !hd->split) {
        er_free(order);
        return ER_ENOMEM;
    }
    ErRng split;
    rng_seed(&split, (uint64_t)hd->c->seed);
    for (int i = 0; i < n; i++)
        order[i] = i;
    shuffle_indices(order, n, &split);
    hd->n_cal = (n_val + 1) / 2;
    hd->n_report = n_val - hd->n_cal;
    for (int i = 0; i < n_val; i++)
        hd->split[order[n - 1 - i]] = i < hd->n_cal ? HEADS_CALIBRATE : HEADS_REPORT;
    er_free(order);
    return ER_OK;
}

// Records in the file (lines with something on them), to say how many --limit leaves out.
static int count_records(const char *path, int *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return er_error(ER_EIO, "%s: cannot open", path);
    int c, blank = 1;
    *n = 0;
    while ((c = getc(f)) != EOF) {
        if (c == '\n') {
            *n += !blank;
            blank = 1;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            blank = 0;
        }
    }
    *n += !blank;
    fclose(f);
    return ER_OK;
}

// Each record's prompt tokens; *max_prompt = the longest.
static int render_prompts(HeadsData *hd, ChatStyle style, int *max_prompt) {
    const HeadsConfig *c = hd->c;
    hd->ids = er_calloc((size_t)hd->d.n, sizeof(int *));
    hd->nids = er_calloc((size_t)hd->d.n, sizeof(int));
    if (!hd->ids || !hd->nids)
        return ER_ENOMEM;
    *max_prompt = 0;
    for (int i = 0; i < hd->d.n; i++) {
        int rc = render_prompt(hd->tok, style, &hd->d.ex[i], c->system, &hd->ids[i], &hd->nids[i]);
        if (rc < 0)
            return er_error_prefix(rc, "%s:%ld", c->data_path, hd->d.ex[i].line);
        *max_prompt = hd->nids[i] > *max_prompt ? hd->nids[i] : *max_prompt;
    }
    return ER_OK;
}

// The engine, sized for the longest prompt, prefix, generation and tail any job asks for.
static int engine_for_jobs(HeadsData *hd, const HeadJob *jobs, int n_jobs, int max_prompt, int tail) {
    const char *prefix = hd->reasoning.response_prefix;
    int n_pre = 0, *pre = NULL;
    if (prefix)
        ER_TRY(tok_encode(hd->tok, prefix, strlen(prefix), &pre, &n_pre));
    er_free(pre);
    int n_seqs = 1, gen_max = hd->c->max_new;
    for (int j = 0; j < n_jobs; j++) {
        n_seqs = jobs[j].n_seqs > n_seqs ? jobs[j].n_seqs : n_seqs;
        gen_max = jobs[j].max_new > gen_max ? jobs[j].max_new : gen_max;
    }
    int max_len = max_prompt + n_pre + gen_max + tail + 2;
    size_t limit = 0;
    ER_TRY(hd->dev.be->ops->mem_available(hd->dev.be, &limit));
    return engine_init(&hd->e, hd->dev.model, hd->tok, hd->c->kv, n_seqs, max_len, 128, limit);
}

static int heads_data_load(HeadsData *hd, HeadJob *jobs, int n_jobs) {
    const HeadsConfig *c = hd->c;
    ER_TRY(dataset_load(c->data_path, NULL, c->limit, &hd->d));
    hd->n_file = hd->d.n;
    if (c->limit > 0 && hd->d.n == c->limit)
        ER_TRY(count_records(c->data_path, &hd->n_file));
    ER_TRY(check_records(hd, jobs, n_jobs));
    ER_TRY(model_load(&hd->m, c->model_dir, 0));
    ER_TRY(tok_load(&hd->tok, c->model_dir));
    ChatStyle style = CHAT_CHATML;
    ER_TRY(chat_style_from_config(c->model_dir, &style));
    const ModelConfig *mc = &hd->m.cfg;
    LoraShape s = model_config_lora_shape(mc);
    hd->hybrid = chat_style_hybrid(style);
    if (!c->adapter_dir && !hd->hybrid)
        return er_error(ER_EINVAL, "heads: no reasoning adapter (--adapter): only a hybrid-thinking model (Qwen3's "
                        "chat template) reasons without one, and %s's template is %s", c->model_dir,
                        chat_style_name(style));
    if (c->adapter_dir)
        ER_TRY(peft_load(&hd->ad, c->adapter_dir, &s, 0));
    if (c->adapter_dir && !hd->ad.masked && c->log)
        fprintf(c->log, "heads: warning: %s is a standard (unmasked) LoRA: the prompt's hidden states include it\n",
                c->adapter_dir);
    hd->ad.dropout = 0; // passes only: no dropout
    hd->job = (TrainJob){.label = "heads", .model = &hd->m, .adapter = c->adapter_dir ? &hd->ad : NULL};
    ER_TRY(train_device_open(&hd->dev, &hd->job, c->device ? c->device : "cpu", c->place_on_cpu));
    int max_prompt;
    ER_TRY(render_prompts(hd, style, &max_prompt));
    gen_config_default(&hd->reasoning);
    hd->reasoning.max_new = c->max_new;
    hd->reasoning.adapter = hd->dev.adapter;
    hd->reasoning.response_prefix = c->prefix ? c->prefix : hd->ad.reasoning_prefix;
    if (hd->hybrid && !hd->reasoning.response_prefix) // thinking on, as the runtime's pipeline forces it
        hd->reasoning.response_prefix = CHAT_THINK_ON;
    hd->reasoning.budget = c->budget;
    hd->reasoning.answer_tokens = c->answer_tokens;
    int tail = 0;
    for (int j = 0; j < n_jobs; j++) {
        int t = jobs[j].prepare ? jobs[j].prepare(jobs[j].self, hd) : 0;
        ER_TRY(t);
        tail = t > tail ? t : tail;
    }
    ER_TRY(engine_for_jobs(hd, jobs, n_jobs, max_prompt, tail));
    return split_records(hd);
}

static void heads_data_free(HeadsData *hd) {
    engine_free(&hd->e);
    if (hd->dev.be)
        train_device_close(&hd->dev);
    for (int i = 0; hd->ids && i < hd->d.n; i++)
        er_free(hd->ids[i]);
    er_free(hd->ids);
    er_free(hd->nids);
    er_free(hd->split);
    lora_free(&hd->ad);
    tok_free(hd->tok);
    model_free(&hd->m);
    dataset_free(&hd->d);
    memset(hd, 0, sizeof *hd);
}

// The start line: the records used (of how many in the file), the split and the heads.
static void print_start(const HeadsData *hd, const HeadJob *jobs, int n_jobs, FILE *log) {
    int n = hd->d.n, held = hd->n_cal + hd->n_report;
    if (hd->n_file > n)
        fprintf(log, "heads: using %d of the %d records in %s (--limit %d)", n, hd->n_file, hd->c->data_path, n);
    else
        fprintf(log, "heads: using all %d records of %s%s", n, hd->c->data_path,
                hd->c->limit ? "" : " (--limit N uses the first N)");
    fprintf(log, ": %d to train, %d to calibrate the thresholds, %d to report the metrics; hidden size %d; ", n - held,
            hd->n_cal, hd->n_report, hd->m.cfg.C);
    for (int j = 0; j < n_jobs; j++)
        fprintf(log, "%s%s", j ? " + " : "", jobs[j].what);
    fprintf(log, "\nheads: running on %s (%s)%s%s\n", hd->dev.where, hd->dev.be->device, hd->dev.why_cpu ? ": " : "",
            hd->dev.why_cpu ? hd->dev.why_cpu : "");
}

// Once the first records are done: the time per record so far and what the rest will take at that pace.
static void print_estimate(const Progress *prog, int done, int total, FILE *log) {
    double per = (time_now() - prog->t_start) / done;
    char eta[32];
    double s = per * (total - done);
    if (s < 60)
        snprintf(eta, sizeof eta, "%.0f s", s);
    else if (s < 3600)
        snprintf(eta, sizeof eta, "%.0f min", s / 60);
    else
        snprintf(eta, sizeof eta, "%.1f h", s / 3600);
    fprintf(log, "%sheads: %.2f s per record so far: about %s more for the %d left%s\n", prog->tty ? "\r\033[K" : "",
            per, eta, total - done, s >= 600 ? " (--limit N uses fewer records)" : "");
}

// The one pass: every job collects each record's rows; errors name the record.
static int collect_pass(HeadsData *hd, HeadJob *jobs, int n_jobs) {
    FILE *log = hd->c->log;
    if (log)
        print_start(hd, jobs, n_jobs, log);
    Progress prog;
    int lo, hi; // this rank's records; every rank's rows are gathered after the pass
    dist_share(hd->d.n, dist_rank(), dist_size(), &lo, &hi);
    if (log)
        progress_begin(&prog, log, "heads: collect", "record", lo, hi);
    // The pace once 2% of the records (at least 8) are done: responses differ in length from record to
    // record, so fewer say little.
    int estimate_at = (hi - lo) / 50 > 8 ? (hi - lo) / 50 : 8;
    for (int i = lo; i < hi; i++) {
        for (int j = 0; j < n_jobs; j++) {
            int rc = jobs[j].collect(jobs[j].self, hd, i);
            if (rc < 0) {
                if (log && prog.tty && prog.t_last_print > prog.t_start)
                    fputc('\n', log);
                return er_error_prefix(rc, "%s:%ld", hd->c->data_path, hd->d.ex[i].line);
            }
        }
        if (log && i + 1 - lo == estimate_at && hi - lo > estimate_at)
            print_estimate(&prog, estimate_at, hi - lo, log);
        if (log) {
            char extra[96];
            snprintf(extra, sizeof extra, "%ld tokens generated", hd->gen_tokens);
            progress_update(&prog, i + 1, extra);
        }
    }
    if (log)
        progress_end(&prog, NULL);
    for (int j = 0; j < n_jobs; j++) {
        if (!jobs[j].gather && dist_size() > 1)
            return er_error(ER_EUNSUPPORTED, "heads: %s cannot gather its rows from %d ranks", jobs[j].what, dist_size());
        if (jobs[j].gather)
            ER_TRY(jobs[j].gather(jobs[j].self, hd));
    }
    double gen = (double)hd->gen_tokens;
    ER_TRY(dist_sum_doubles(&gen, 1));
    hd->gen_tokens = (long)gen;
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].report)
            jobs[j].report(jobs[j].self, hd, hd->c->out);
    return ER_OK;
}

// run.json: the settings, the model's fingerprint, the counts and each head's results (taken over).
static int write_run(const HeadsData *hd, cJSON **results, double seconds) {
    const HeadsConfig *c = hd->c;
    cJSON *run = cJSON_CreateObject();
    if (!run)
        return ER_ENOMEM;
    char fp[17];
    model_fingerprint(&hd->m, fp);
    cJSON_AddStringToObject(run, "command", "heads");
    cJSON_AddStringToObject(run, "version", ERTRAIN_VERSION);
    cJSON_AddNumberToObject(run, "seed", c->seed);
    cJSON_AddItemToObject(run, "config", c->settings ? cJSON_Duplicate(c->settings, 1) : cJSON_CreateObject());
    cJSON_AddStringToObject(run, "model_fingerprint", fp);
    cJSON *n = cJSON_AddObjectToObject(run, "counts");
    cJSON_AddNumberToObject(n, "records", hd->d.n);
    cJSON_AddNumberToObject(n, "records_in_file", hd->n_file);
    cJSON_AddNumberToObject(n, "calibration", hd->n_cal);
    cJSON_AddNumberToObject(n, "report", hd->n_report);
    cJSON_AddNumberToObject(n, "generated_tokens", (double)hd->gen_tokens);
    cJSON_AddItemToObject(run, "result", *results);
    *results = NULL;
    cJSON_AddNumberToObject(run, "seconds", seconds);
    int rc = run_write_json(c->out_dir, run);
    cJSON_Delete(run);
    return rc;
}

int heads_run(const HeadsConfig *c, HeadJob *jobs, int n_jobs, HeadsResult *res) {
    memset(res, 0, sizeof *res);
    if (n_jobs < 1)
        return er_error(ER_EINVAL, "heads: no head to train");
    if (!c->out_dir)
        return er_error(ER_EINVAL, "heads: no output directory for run.json and metrics.jsonl");
    double t_start = time_now();
    int rc = ER_OK;
    HeadsData hd = {.c = c};
    MetricsLog ml = {0};
    cJSON *results = NULL;
    ER_CHECK(heads_data_load(&hd, jobs, n_jobs));
    ER_CHECK(collect_pass(&hd, jobs, n_jobs));
    if (dist_rank() != 0) // the rows are every rank's now: rank 0 fits, calibrates and writes
        goto done;
    ER_CHECK(dir_make(c->out_dir));
    ER_CHECK(metrics_open(&ml, c->out_dir, "metrics.jsonl", 0, 0));
    if (!(results = cJSON_CreateObject()))
        ER_CHECK(ER_ENOMEM);
    for (int j = 0; j < n_jobs; j++)
        ER_CHECK(jobs[j].train(jobs[j].self, &hd, &ml, results));
    res->records = hd.d.n;
    res->calibration = hd.n_cal;
    res->report = hd.n_report;
    res->generated_tokens = hd.gen_tokens;
    res->seconds = time_now() - t_start;
    ER_CHECK(write_run(&hd, &results, res->seconds));
done:
    cJSON_Delete(results);
    metrics_close(&ml);
    heads_data_free(&hd);
    return rc;
}
