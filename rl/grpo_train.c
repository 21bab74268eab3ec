#include "rl/grpo_train.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/progress.h"
#include "core/rng.h"
#include "core/threads.h"
#include "data/chat.h"
#include "data/dataset.h"
#include "data/grade.h"
#include "data/tokenizer.h"
#include "infer/engine.h"
#include "lora/peft.h"
#include "rl/policy.h"
#include "rl/reward_cmd.h"
#include "rl/rollout.h"
#include "train/checkpoint.h"
#include "train/device.h"
#include "train/dist.h"
#include "train/optim.h"
#include "train/run.h"
#include "train/trainer.h"

#define MAX_BUDGETS 16
#define MAX_PROMPTS 256 // --prompts at most


void grpo_config_default(GrpoConfig *c) {
    memset(c, 0, sizeof *c);
    c->budgets = "64,128,256";
    c->budget_template = "Think for at most {budget} tokens.";
    c->budget_in = BUDGET_IN_SYSTEM;
    c->group = 8;
    c->prompts = 4;
    c->steps = 100;
    c->temperature = 0.8;
    c->top_p = 1.0;
    c->barrier_m = 0.2;
    c->barrier_p = 0.0;
    c->answer_tokens = 16;
    c->scale = SCALE_GROUP;
    c->eps = 0.2;
    c->eps_high = 0.2;
    c->beta = 1e-3;
    c->kl_ref = KL_REF_INIT;
    c->reward_timeout = 60;
    c->eval_every = 10;
    c->log_completions = 10;
    c->loss_type = LOSS_DAPO;
    c->iterations = 1;
    c->lr = 2e-5;
    c->warmup = 0;
    c->clip = 1.0;
    c->seq_len = 0;
}

static int parse_budgets(const char *s, int *out, int *n) {
    *n = 0;
    for (const char *p = s; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 20) || (*end && *end != ','))
            return er_error(ER_EINVAL, "--budgets: expected positive integers separated by commas, got \"%s\"", s);
        if (*n == MAX_BUDGETS)
            return er_error(ER_EINVAL, "--budgets: at most %d budgets", MAX_BUDGETS);
        out[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (*n == 0)
        return er_error(ER_EINVAL, "--budgets is empty");
    return ER_OK;
}

// The budget line with {budget} replaced.
static void budget_line(char *buf, size_t n, const char *tmpl, int budget) {
    const char *at = strstr(tmpl, "{budget}");
    if (!at)
        snprintf(buf, n, "%s", tmpl);
    else
        snprintf(buf, n, "%.*s%d%s", (int)(at - tmpl), tmpl, budget, at + 8);
}

int grpo_prompt_text(const GrpoConfig *c, ChatStyle style, const Example *ex, int budget, char **text) {
    char line[512];
    budget_line(line, sizeof line, c->budget_template, budget);
    ChatMessage msgs[64];
    int n = ex->n_messages < 63 ? ex->n_messages : 63;
    memcpy(msgs, ex->messages, sizeof(ChatMessage) * (size_t)n);
    char *own = NULL; // the rewritten message (the record's own strings stay untouched)
    if (c->budget_in == BUDGET_IN_SYSTEM) {
        if (n > 0 && strcmp(msgs[0].role, "system") == 0) { // the record's system message, then the budget line
            size_t len = strlen(msgs[0].content) + strlen(line) + 2;
            if (!(own = er_alloc(len)))
                return ER_ENOMEM;
            snprintf(own, len, "%s\n%s", msgs[0].content, line);
            msgs[0].content = own;
        } else {
            memmove(msgs + 1, msgs, sizeof(ChatMessage) * (size_t)n++);
            msgs[0] = (ChatMessage){"system", line};
        }
    } else {
        int last_user = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(msgs[i].role, "user") == 0)
                last_user = i;
        if (last_user < 0)
            return er_error(ER_EINVAL, "%s:%ld: no user message to state the budget in", c->data_path, ex->line);
        size_t len = strlen(msgs[last_user].content) + strlen(line) + 2;
        if (!(own = er_alloc(len)))
            return ER_ENOMEM;
        snprintf(own, len, "%s %s", msgs[last_user].content, line);
        msgs[last_user].content = own;
    }
    int rc = chat_render(style, msgs, n, CHAT_ADD_GENERATION_PROMPT, text, NULL);
    er_free(own);
    return rc;
}

// Reward terms of a sample, logged separately (rewards/<name>/mean): the paper's correct x barrier, the
// format term, then the external program's terms.
enum { TERM_BUDGET, TERM_FORMAT, TERM_CMD0, MAX_TERMS = TERM_CMD0 + 8 };

// One prompt's group of rollouts.
typedef struct {
    int rec;           // the record (index in d)
    int *prompt;       // prompt tokens then the forced reasoning prefix
    int n_prompt;      // prompt + prefix
    int budget;
    int mine;          // rolled out on this rank (s holds the samples; the rest is known on every rank)
    GenSample *s;      // (G)
    float *reward;     // (G) the total
    float *terms;      // (G, MAX_TERMS)
    int *len;          // (G) L (data/grade.h): what the budget bounds
    int *ntok;         // (G) generated tokens: what the loss reads
    unsigned char *ok, *unformatted, *truncated; // (G)
    uint32_t hash;     // FNV-1a of the G completions' tokens, in order (metrics: the same rollouts at any N)
    int correct;       // samples graded right
    int flat;          // every reward equal: no learning signal
} Group;

typedef struct {
    const GrpoConfig *c;
    Model m;
    LoraAdapter ad;
    LoraAdapter ref;              // --kl-ref init: the adapter the run started from, frozen
    // Where the rollouts, the passes and AdamW run (train/device.h): dev.model and dev.adapter are m and ad, or
    // copies placed on a device, whose parameters come back to ad for checkpoints and saves (grpo_to_host).
    TrainJob job;
    TrainDevice dev;
    LoraAdapter dev_ref;          // ref placed there (dev.placed and --kl-ref init)
    Tokenizer *tok;
    ChatStyle style;
    Dataset d, eval;
    int budgets[MAX_BUDGETS], n_budgets;
    int *prefix, n_prefix;
    int think_open;               // the reasoning prefix opens a think block (data/grade.h)
    DecodeBatch batch;            // every group's samples decoded together (rl/rollout.h)
    RewardCmd *cmd;               // --reward-cmd (NULL = none)
    Activations acts;
    AdamW opt;
    MetricsLog ml, completions;
    TrainState st;
    int *order;                   // (d.n) the epoch's prompt order: a seeded shuffle of st.epoch
    long order_epoch;             // the epoch order holds (-1 = none yet)
    int max_new;                  // new tokens of the largest budget
    int seq_len;                  // positions per sequence: --seq-len, or what the longest prompt needs
    float dropout;                // the starting adapter's lora_dropout (kept in the saved adapter)
    char data_fp[48], eval_fp[48]; // file_fingerprint of --data, --eval-data: a resume refuses a changed file
    int n_terms;                  // TERM_CMD0 + the external program's terms
    char term_names[MAX_TERMS][32];
    double best_eval;             // best eval accuracy so far (-1 = none)
    double last_eval;             // the latest eval accuracy (-1 = none yet)
    int max_groups;               // groups a step may draw: --max-draws, or --prompts
    Group *groups;                // (max_groups)
    int *sel;                     // (prompts) the groups that take part in the loss
    float *ref_lp, *old_lp;       // (prompts, G x seq_len) per completion token of the selected groups
    // batch buffers (G rows x seq_len)
    int *tokens, *plen, *clen;
    uint8_t *mask;
    float *logp, *rewards, *adv;  // rewards, adv: (max_groups x G)
} Grpo;

static void grpo_free(Grpo *g) {
    if (g->groups)
        for (int i = 0; i < g->max_groups; i++) {
            Group *gr = &g->groups[i];
            er_free(gr->prompt);
            if (gr->s)
                gen_samples_free(gr->s, g->c->group);
            er_free(gr->s);
            er_free(gr->reward);
            er_free(gr->terms);
            er_free(gr->len);
            er_free(gr->ntok);
            er_free(gr->ok);
            er_free(gr->unformatted);
            er_free(gr->truncated);
        }
    er_free(g->groups);
    er_free(g->sel);
    er_free(g->ref_lp);
    er_free(g->old_lp);
    er_free(g->order);
    er_free(g->tokens);
    er_free(g->plen);
    er_free(g->clen);
    er_free(g->mask);
    er_free(g->logp);
    er_free(g->rewards);
    er_free(g->adv);
    er_free(g->prefix);
    reward_cmd_free(g->cmd);
    metrics_close(&g->ml);
    metrics_close(&g->completions);
    train_state_free(&g->st);
    adamw_free(&g->opt);
    acts_free(&g->acts);
    decode_batch_free(&g->batch);
    if (g->dev_ref.mats)
        lora_backend_free(&g->dev_ref, g->dev.be);
    if (g->dev.be)
        train_device_close(&g->dev);
    dataset_free(&g->d);
    dataset_free(&g->eval);
    tok_free(g->tok);
    lora_free(&g->ref);
    lora_free(&g->ad);
    model_free(&g->m);
}

// New tokens a rollout at budget b may take: up to (1 + m) b, then the answer allowance.
static int rollout_max_new(const GrpoConfig *c, int budget) {
    return (int)ceil((1.0 + c->barrier_m) * budget) + c->answer_tokens;
}

// The tokens of ex's prompt stating `budget`.
static int encode_prompt(const Grpo *g, const Example *ex, int budget, int **ids, int *n) {
    char *text;
    ER_TRY(grpo_prompt_text(g->c, g->style, ex, budget, &text));
    int rc = tok_encode(g->tok, text, strlen(text), ids, n);
    er_free(text);
    return rc;
}

// Every record of d (read from path) with every budget it can be drawn with, rendered and encoded
// before step 1: a record that does not encode or fit fails now, naming its line, not at the step that
// draws it. *need: the positions the longest prompt at its largest budget takes (and where).
static int check_records(Grpo *g, const Dataset *d, const char *path, long *need, long *need_line, int *need_budget) {
    const GrpoConfig *c = g->c;
    for (int i = 0; i < d->n; i++) {
        const Example *ex = &d->ex[i];
        if (!ex->answer)
            return er_error(ER_EFORMAT, "%s:%ld: record has no gold answer", path, ex->line);
        int nb = ex->budget > 0 ? 1 : g->n_budgets;
        for (int k = 0; k < nb; k++) {
            int budget = ex->budget > 0 ? ex->budget : g->budgets[k], *ids, nid;
            int rc = encode_prompt(g, ex, budget, &ids, &nid);
            if (rc < 0)
                return er_error_prefix(rc, "%s:%ld", path, ex->line);
            er_free(ids);
            int max_new = rollout_max_new(c, budget);
            long n = (long)nid + g->n_prefix + max_new;
            if (c->seq_len > 0 && n > c->seq_len)
                return er_error(ER_ERANGE, "%s:%ld: the prompt (%d tokens) at budget %d needs %ld positions with the "
                                "prefix and (1+m) x budget + %d answer tokens, more than --seq-len %d", path,
                                ex->line, nid, budget, n, c->answer_tokens, c->seq_len);
            if (n > *need)
                *need = n, *need_line = ex->line, *need_budget = budget;
            g->max_new = max_new > g->max_new ? max_new : g->max_new;
        }
    }
    return ER_OK;
}

// The training and eval records checked (check_records); sizes the sequences (--seq-len 0: what the
// longest prompt and budget need) within the model's positions.
static int check_prompts(Grpo *g) {
    const GrpoConfig *c = g->c;
    long need = 0, need_line = 0;
    int need_budget = 0;
    const char *need_path = c->data_path;
    g->max_new = 0;
    ER_TRY(check_records(g, &g->d, c->data_path, &need, &need_line, &need_budget));
    long train_need = need;
    if (c->eval_data)
        ER_TRY(check_records(g, &g->eval, c->eval_data, &need, &need_line, &need_budget));
    if (need > train_need)
        need_path = c->eval_data;
    g->seq_len = c->seq_len > 0 ? c->seq_len : (int)need;
    if (g->seq_len > g->m.cfg.max_pos)
        return c->seq_len > 0
                   ? er_error(ER_ERANGE, "--seq-len %d exceeds the model's %d positions (max_position_embeddings)",
                              c->seq_len, g->m.cfg.max_pos)
                   : er_error(ER_ERANGE, "%s:%ld: the prompt at budget %d needs %ld positions, more than the "
                              "model's %d (max_position_embeddings): use smaller --budgets", need_path, need_line,
                              need_budget, need, g->m.cfg.max_pos);
    return ER_OK;
}

// The flags' values that only make sense together, before any file is read.
static int check_config(const GrpoConfig *c) {
    if (c->group < 2)
        return er_error(ER_EINVAL, "--group must be at least 2 (advantages compare samples of one prompt)");
    if (c->prompts < 1 || c->prompts > MAX_PROMPTS)
        return er_error(ER_EINVAL, "--prompts must be in 1..%d", MAX_PROMPTS);
    if (c->max_draws && (c->max_draws < c->prompts || c->max_draws > 4096))
        return er_error(ER_EINVAL, "--max-draws %d: expected 0 (off) or %d (--prompts) to 4096", c->max_draws,
                        c->prompts);
    if (!strstr(c->budget_template, "{budget}"))
        return er_error(ER_EINVAL, "--budget-template \"%s\" has no {budget}: the prompts would not state the budget",
                        c->budget_template);
    if (c->eval_data && c->eval_every < 1)
        return er_error(ER_EINVAL, "--eval-every must be at least 1 with --eval-data");
    return ER_OK;
}

// The model, the adapter (and the KL reference: on resume the copy saved with the run), the tokenizer
// and the records.
static int load_inputs(Grpo *g) {
    const GrpoConfig *c = g->c;
    ER_TRY(model_load(&g->m, c->model_dir, 0));
    LoraShape shape = model_config_lora_shape(&g->m.cfg);
    ER_TRY(peft_load(&g->ad, c->adapter_dir, &shape, 1));
    if (!g->ad.masked)
        return er_error(ER_EINVAL, "%s: GRPO here trains masked adapters (er_mask \"response\")", c->adapter_dir);
    if (c->kl_ref == KL_REF_INIT && c->beta > 0) {
        char *saved = path_join(c->out_dir, "checkpoint/reference");
        if (!saved)
            return ER_ENOMEM;
        int rc = peft_load(&g->ref, c->resume && path_is_dir(saved) ? saved : c->adapter_dir, &shape, 0);
        er_free(saved);
        ER_TRY(rc);
        g->ref.dropout = 0;
    }
    // Dropout is off in GRPO (TRL's disable_dropout): the rollouts come from the runtime, which has
    // none, and the ratio to the old policy and the KL to the reference need the update's log-probs to
    // be those of the same function that sampled. The adapter is saved with its lora_dropout unchanged.
    g->dropout = g->ad.dropout;
    g->ad.dropout = 0;
    ER_TRY(tok_load(&g->tok, c->model_dir));
    ER_TRY(train_chat_style(c->model_dir, &g->style));
    ER_TRY(dataset_load(c->data_path, NULL, 0, &g->d));
    if (g->d.n == 0)
        return er_error(ER_EFORMAT, "%s: no records", c->data_path);
    if (c->eval_data) {
        ER_TRY(dataset_load(c->eval_data, NULL, c->eval_n, &g->eval));
        if (g->eval.n == 0)
            return er_error(ER_EFORMAT, "%s: no records", c->eval_data);
    }
    // A hybrid-thinking base (Qwen3) thinks after "<think>\n": an adapter without a prefix of its own gets that
    // one, the reasoning route's (infer/pipeline.h), so rollouts, rewards and the saved adapter match the runtime.
    if (!g->ad.reasoning_prefix && chat_style_hybrid(g->style) && !(g->ad.reasoning_prefix = er_strdup(CHAT_THINK_ON)))
        return ER_ENOMEM;
    const char *pre = g->ad.reasoning_prefix ? g->ad.reasoning_prefix : "";
    g->think_open = grade_think_opens(pre);
    if (pre[0])
        ER_TRY(tok_encode(g->tok, pre, strlen(pre), &g->prefix, &g->n_prefix));
    return ER_OK;
}

static int alloc_groups(Grpo *g) {
    const GrpoConfig *c = g->c;
    int G = c->group;
    size_t cells = (size_t)G * g->seq_len;
    g->max_groups = c->max_draws > 0 ? c->max_draws : c->prompts;
    g->groups = er_calloc((size_t)g->max_groups, sizeof(Group));
    g->sel = er_alloc(sizeof(int) * (size_t)c->prompts);
    g->ref_lp = er_alloc(sizeof(float) * cells * (size_t)c->prompts);
    g->old_lp = er_alloc(sizeof(float) * cells * (size_t)c->prompts);
    g->order = er_alloc(sizeof(int) * (size_t)g->d.n);
    g->tokens = er_alloc(sizeof(int) * cells);
    g->mask = er_alloc(cells);
    g->plen = er_alloc(sizeof(int) * (size_t)G);
    g->clen = er_alloc(sizeof(int) * (size_t)G);
    g->logp = er_alloc(sizeof(float) * cells);
    g->rewards = er_alloc(sizeof(float) * (size_t)g->max_groups * G);
    g->adv = er_alloc(sizeof(float) * (size_t)g->max_groups * G);
    if (!g->groups || !g->sel || !g->ref_lp || !g->old_lp || !g->order || !g->tokens || !g->mask || !g->plen ||
        !g->clen || !g->logp || !g->rewards || !g->adv)
        return ER_ENOMEM;
    for (int i = 0; i < g->max_groups; i++) {
        Group *gr = &g->groups[i];
        gr->s = er_calloc((size_t)G, sizeof(GenSample));
        gr->reward = er_alloc(sizeof(float) * (size_t)G);
        gr->terms = er_alloc(sizeof(float) * (size_t)G * MAX_TERMS);
        gr->len = er_alloc(sizeof(int) * (size_t)G);
        gr->ntok = er_alloc(sizeof(int) * (size_t)G);
        gr->ok = er_alloc((size_t)G);
        gr->unformatted = er_alloc((size_t)G);
        gr->truncated = er_alloc((size_t)G);
        if (!gr->s || !gr->reward || !gr->terms || !gr->len || !gr->ntok || !gr->ok || !gr->unformatted ||
            !gr->truncated)
            return ER_ENOMEM;
    }
    return ER_OK;
}

static int grpo_setup(Grpo *g) {
    const GrpoConfig *c = g->c;
    ER_TRY(parse_budgets(c->budgets, g->budgets, &g->n_budgets));
    ER_TRY(check_config(c));
    const char *in[] = {c->model_dir, c->adapter_dir, c->data_path, c->eval_data};
    const char *flag[] = {"--model", "--adapter", "--data", "--eval-data"};
    for (int i = 0; i < 4; i++)
        if (in[i])
            ER_TRY(dir_output_not_input(c->out_dir, in[i], flag[i]));
    ER_TRY(run_dir_check(c->out_dir, c->resume ? RUN_RESUME : RUN_NEW, c->log));
    ER_TRY(file_fingerprint(c->data_path, g->data_fp, sizeof g->data_fp));
    if (c->eval_data)
        ER_TRY(file_fingerprint(c->eval_data, g->eval_fp, sizeof g->eval_fp));
    ER_TRY(load_inputs(g));
    ER_TRY(check_prompts(g));
    g->n_terms = TERM_CMD0;
    snprintf(g->term_names[TERM_BUDGET], 32, "budget");
    snprintf(g->term_names[TERM_FORMAT], 32, "format");
    g->best_eval = g->last_eval = -1;
    g->order_epoch = -1;
    if (c->reward_cmd)
        ER_TRY(reward_cmd_start(c->reward_cmd, c->reward_timeout, &g->cmd));
    // Room for this rank's share of a round's groups (a round draws at most --prompts), and their prompts
    // cached (a prompt drawn again reuses its KV).
    int share = (c->prompts + dist_size() - 1) / dist_size();
    g->job = (TrainJob){.label = "grpo", .model = &g->m, .adapter = &g->ad, .params = g->ad.params,
                        .grads = g->ad.grads, .n = g->ad.n_params};
    ER_TRY(train_device_open(&g->dev, &g->job, c->device, c->place_on_cpu));
    Backend *be = g->dev.be;
    if (g->dev.placed && g->ref.mats)
        ER_TRY(lora_to_backend(&g->dev_ref, &g->ref, be));
    ER_TRY(decode_batch_init(&g->batch, g->dev.model, g->tok, g->dev.adapter, KV_F32, share * c->group, share,
                             g->seq_len, 128, 0));
    size_t limit = 0;
    ER_TRY(be->ops->mem_available(be, &limit));
    ER_TRY(acts_alloc_on(&g->acts, be, &g->m.cfg, c->group, g->seq_len, ACTS_TRAIN, limit));
    ER_TRY(adamw_init(&g->opt, be, g->ad.n_params, c->lr, 0.9, 0.999, 1e-8, c->weight_decay));
    if (c->log && dist_rank() == 0)
        fprintf(c->log, "grpo: running on %s (%s)%s%s\n", g->dev.where, be->device, g->dev.why_cpu ? ": " : "",
                g->dev.why_cpu ? g->dev.why_cpu : "");
    return alloc_groups(g);
}

// The next record in the epoch's order: a seeded shuffle of every record, drawn without replacement
// (TRL's sampler), a new shuffle each epoch. Every rank draws the same sequence.
static int next_record(Grpo *g) {
    TrainState *st = &g->st;
    if (st->cursor >= g->d.n) {
        st->epoch++;
        st->cursor = 0;
    }
    if (g->order_epoch != st->epoch) {
        ErRng r;
        rng_fork(&r, &st->rng, (1ULL << 62) | (uint64_t)st->epoch);
        for (int i = 0; i < g->d.n; i++)
            g->order[i] = i;
        for (int i = g->d.n - 1; i > 0; i--) { // Fisher-Yates
            int k = (int)rng_below(&r, (uint32_t)i + 1), t = g->order[i];
            g->order[i] = g->order[k];
            g->order[k] = t;
        }
        g->order_epoch = st->epoch;
    }
    return g->order[st->cursor++];
}

// The generation settings of a rollout at `budget`, sample i from stream i of seed.
static GenConfig rollout_config(const Grpo *g, int budget, double temperature, int n, uint64_t seed) {
    GenConfig gc;
    gen_config_default(&gc);
    gc.n_samples = n;
    gc.max_new = rollout_max_new(g->c, budget);
    gc.sampler.temperature = (float)temperature;
    gc.sampler.top_p = (float)g->c->top_p;
    gc.seed = seed;
    gc.adapter = g->dev.adapter;
    gc.response_prefix = g->ad.reasoning_prefix;
    return gc;
}

int grpo_sample_reward(const GrpoConfig *c, const GenSample *s, int think_open, int budget, const char *gold,
                       GrpoSampleReward *r) {
    int unformatted = 0, ok = grade_response(s->text, s->answer_at, think_open, gold, &unformatted);
    ER_TRY(ok);
    r->correct = ok;
    r->unformatted = unformatted;
    r->length = s->think_len;
    r->budget_term = reward_total(ok, s->think_len, budget, c->barrier_m, c->barrier_p);
    r->format_term = unformatted ? 0.0 : 1.0;
    r->reward = r->budget_term + c->format_weight * r->format_term;
    return ER_OK;
}

// Grades sample i of gr against ex and sets its reward terms (grpo_sample_reward).
static int score_sample(Grpo *g, Group *gr, int i, const Example *ex) {
    const GenSample *s = &gr->s[i];
    GrpoSampleReward r;
    ER_TRY(grpo_sample_reward(g->c, s, g->think_open, gr->budget, ex->answer, &r));
    float *t = gr->terms + (size_t)i * MAX_TERMS;
    gr->ok[i] = (unsigned char)r.correct;
    gr->unformatted[i] = (unsigned char)r.unformatted;
    gr->truncated[i] = s->finish == FINISH_LENGTH;
    gr->len[i] = r.length;
    gr->ntok[i] = s->n_tokens;
    t[TERM_BUDGET] = (float)r.budget_term;
    t[TERM_FORMAT] = (float)r.format_term;
    gr->reward[i] = (float)r.reward;
    return ER_OK;
}

// The external program's terms of gr's samples (--reward-cmd), added to their rewards. The first reply
// names the terms; every later one must name the same, in the same order (the metrics, and the ranks'
// shared sums, index them by position).
static int add_cmd_terms(Grpo *g, Group *gr, const Example *ex) {
    int G = g->c->group, rc = ER_OK;
    RewardQuery *q = er_alloc(sizeof(RewardQuery) * (size_t)G);
    RewardTerms *t = er_alloc(sizeof(RewardTerms) * (size_t)G);
    if (!q || !t)
        ER_CHECK(ER_ENOMEM);
    for (int i = 0; i < G; i++)
        q[i] = (RewardQuery){ex->prompt, gr->s[i].text, ex->answer, gr->budget, gr->len[i]};
    ER_CHECK(reward_cmd_score_many(g->cmd, q, G, t));
    for (int i = 0; i < G; i++) {
        if (g->n_terms == TERM_CMD0) { // the first reply of the run
            for (int k = 0; k < t[i].n; k++)
                snprintf(g->term_names[TERM_CMD0 + k], 32, "%s", t[i].name[k]);
            g->n_terms = TERM_CMD0 + t[i].n;
        }
        int same = t[i].n == g->n_terms - TERM_CMD0;
        for (int k = 0; same && k < t[i].n; k++)
            same = strcmp(t[i].name[k], g->term_names[TERM_CMD0 + k]) == 0;
        if (!same)
            ER_CHECK(er_error(ER_EFORMAT, "--reward-cmd: a reply names other terms than the first reply's (its "
                              "first: \"%s\")", g->term_names[TERM_CMD0]));
        for (int k = 0; k < t[i].n; k++) {
            gr->terms[(size_t)i * MAX_TERMS + TERM_CMD0 + k] = (float)t[i].value[k];
            gr->reward[i] += (float)t[i].value[k];
        }
    }
done:
    er_free(q);
    er_free(t);
    return rc;
}

// Draws the records and budgets of groups [a, b) (every rank draws them all, the same on each).
static void draw_round(Grpo *g, long step, int a, int b, int lo, int hi, uint64_t *seeds) {
    for (int p = a; p < b; p++) {
        Group *gr = &g->groups[p];
        ErRng r;
        rng_fork(&r, &g->st.rng, ((uint64_t)step << 16) | (uint64_t)p);
        gr->rec = next_record(g);
        const Example *ex = &g->d.ex[gr->rec];
        gr->budget = ex->budget > 0 ? ex->budget : g->budgets[rng_below(&r, (uint32_t)g->n_budgets)];
        seeds[p - a] = rng_u64(&r);
        gr->mine = p >= lo && p < hi;
    }
}

// Grades group gr's samples and hashes their tokens.
static int score_group(Grpo *g, Group *gr) {
    const Example *ex = &g->d.ex[gr->rec];
    gr->correct = 0;
    for (int i = 0; i < g->c->group; i++) {
        ER_TRY(score_sample(g, gr, i, ex));
        gr->correct += gr->ok[i];
    }
    if (g->cmd)
        ER_TRY(add_cmd_terms(g, gr, ex));
    gr->hash = 2166136261u;
    for (int i = 0; i < g->c->group; i++)
        for (int j = 0; j < gr->s[i].n_tokens; j++)
            gr->hash = (gr->hash ^ (uint32_t)gr->s[i].tokens[j]) * 16777619u;
    return ER_OK;
}

// Rolls out groups [a, b) of this step: every rank draws their records and budgets; this rank decodes its
// share [lo, hi), all its groups' samples in one batch (rl/rollout.h), and grades them.
static int rollout_round(Grpo *g, long step, int a, int b, int lo, int hi, long *gen_tokens) {
    const GrpoConfig *c = g->c;
    uint64_t seeds[MAX_PROMPTS]; // a round draws at most --prompts groups
    RolloutGroup rg[MAX_PROMPTS];
    draw_round(g, step, a, b, lo, hi, seeds);
    for (int p = lo; p < hi; p++) {
        Group *gr = &g->groups[p];
        const Example *ex = &g->d.ex[gr->rec];
        int *ids, nid;
        int rc = encode_prompt(g, ex, gr->budget, &ids, &nid);
        if (rc < 0)
            return er_error_prefix(rc, "grpo step %ld, %s:%ld", step + 1, c->data_path, ex->line);
        er_free(gr->prompt);
        if ((gr->prompt = er_alloc(sizeof(int) * (size_t)(nid + g->n_prefix))))
            memcpy(gr->prompt, ids, sizeof(int) * (size_t)nid);
        er_free(ids);
        if (!gr->prompt)
            return ER_ENOMEM;
        memcpy(gr->prompt + nid, g->prefix, sizeof(int) * (size_t)g->n_prefix);
        gr->n_prompt = nid + g->n_prefix;
        gen_samples_free(gr->s, c->group);
        // The prompt's own tokens: the engine forces the prefix (GenConfig.response_prefix).
        rg[p - lo] = (RolloutGroup){gr->prompt, nid, rollout_config(g, gr->budget, c->temperature, c->group,
                                                                     seeds[p - a]), gr->s};
    }
    if (hi > lo) {
        int rc = rollout_groups(&g->batch, rg, hi - lo, gen_tokens);
        if (rc < 0)
            return er_error_prefix(rc, "grpo step %ld", step + 1);
    }
    for (int p = lo; p < hi; p++) {
        int rc = score_group(g, &g->groups[p]);
        if (rc < 0)
            return er_error_prefix(rc, "grpo step %ld, %s:%ld", step + 1, c->data_path, g->d.ex[g->groups[p].rec].line);
    }
    return ER_OK;
}

// Rows of group p as a RolloutBatch: prompt + prefix, then the sample's tokens (adapter on from the
// prefix). With --mask-truncated a completion cut at the token limit has no tokens in the loss.
static RolloutBatch group_batch(Grpo *g, int p) {
    const Group *gr = &g->groups[p];
    int G = g->c->group, T = 0;
    for (int i = 0; i < G; i++)
        T = gr->n_prompt + gr->s[i].n_tokens > T ? gr->n_prompt + gr->s[i].n_tokens : T;
    for (int i = 0; i < G; i++) {
        int *row = g->tokens + (size_t)i * T;
        uint8_t *mrow = g->mask + (size_t)i * T;
        memcpy(row, gr->prompt, sizeof(int) * (size_t)gr->n_prompt);
        memcpy(row + gr->n_prompt, gr->s[i].tokens, sizeof(int) * (size_t)gr->s[i].n_tokens);
        int used = gr->n_prompt + gr->s[i].n_tokens;
        for (int t = used; t < T; t++)
            row[t] = 0;
        for (int t = 0; t < T; t++)
            mrow[t] = t >= gr->n_prompt - g->n_prefix && t < used;
        g->plen[i] = gr->n_prompt;
        g->clen[i] = g->c->mask_truncated && gr->truncated[i] ? 0 : gr->s[i].n_tokens;
    }
    return (RolloutBatch){G, T, g->tokens, g->mask, g->plen, g->clen};
}

// Under mpirun rank r rolled out groups [lo, hi) of [a, b) (dist_share): every rank gets every group's
// record, budget, grades, rewards and their terms, lengths and token hashes (and the tokens generated in all),
// so the advantages, the global token counts and the metrics are the same on every rank. A sum with zeros
// where a rank has no group.
static int share_groups(Grpo *g, int a, int b, int lo, int hi, long *gen_tokens) {
    int G = g->c->group, T = MAX_TERMS, per = 4 + G * (6 + T), n = (b - a) * per + 1;
    double *v = er_calloc((size_t)n, sizeof(double));
    if (!v)
        return ER_ENOMEM;
    for (int p = lo; p < hi; p++) {
        const Group *gr = &g->groups[p];
        double *row = v + (size_t)(p - a) * per, *smp = row + 4;
        row[0] = gr->budget;
        row[1] = gr->correct;
        row[2] = gr->hash;
        row[3] = gr->rec;
        for (int i = 0; i < G; i++, smp += 6 + T) {
            smp[0] = gr->reward[i]; // floats and small integers: exact in a double
            smp[1] = gr->len[i];
            smp[2] = gr->ntok[i];
            smp[3] = gr->ok[i];
            smp[4] = gr->unformatted[i];
            smp[5] = gr->truncated[i];
            for (int k = 0; k < T; k++)
                smp[6 + k] = gr->terms[(size_t)i * T + k];
        }
    }
    v[n - 1] = (double)*gen_tokens;
    int rc = dist_sum_doubles(v, n);
    for (int p = a; p < b && rc == ER_OK; p++) {
        Group *gr = &g->groups[p];
        const double *row = v + (size_t)(p - a) * per, *smp = row + 4;
        gr->budget = (int)row[0];
        gr->correct = (int)row[1];
        gr->hash = (uint32_t)row[2];
        gr->rec = (int)row[3];
        gr->flat = 1;
        for (int i = 0; i < G; i++, smp += 6 + T) {
            gr->reward[i] = (float)smp[0];
            gr->len[i] = (int)smp[1];
            gr->ntok[i] = (int)smp[2];
            gr->ok[i] = (unsigned char)smp[3];
            gr->unformatted[i] = (unsigned char)smp[4];
            gr->truncated[i] = (unsigned char)smp[5];
            for (int k = 0; k < T; k++)
                gr->terms[(size_t)i * T + k] = (float)smp[6 + k];
            gr->flat &= gr->reward[i] == gr->reward[0];
        }
    }
    *gen_tokens = (long)v[n - 1];
    er_free(v);
    return rc;
}

typedef struct {
    double reward, reward_std, acc, len, over, truncated, unformatted;
    double term[MAX_TERMS];
    double clip, clip_low, clip_high, kl, entropy, flat, loss, gnorm, lr;
    double len_by_budget[MAX_BUDGETS], len_min[MAX_BUDGETS], len_max[MAX_BUDGETS];
    int n_by_budget[MAX_BUDGETS];
    int drawn, used;               // groups rolled out; groups in the loss
    double rollout_tps, train_tps;
    uint32_t rollout_hash;         // the groups' hashes combined in draw order
    int evaluated;                 // the eval fields hold this step's eval
    double eval_acc, eval_unformatted, eval_len[MAX_BUDGETS], eval_acc_by[MAX_BUDGETS];
    int eval_n[MAX_BUDGETS];
} StepMetrics;

// Draws and rolls out the step's groups: --prompts of them, or with --max-draws (dynamic sampling) more
// rounds until --prompts groups have a reward spread or --max-draws were drawn. Returns the groups drawn.
static int draw_groups(Grpo *g, long step, long *gen_tokens, int *drawn) {
    const GrpoConfig *c = g->c;
    int P = c->prompts, n = 0, spread = 0;
    do {
        int k = n == 0 ? P : P - spread;
        if (n + k > g->max_groups)
            k = g->max_groups - n;
        int lo, hi; // this rank's share of the round: whole groups, never split
        dist_share(k, dist_rank(), dist_size(), &lo, &hi);
        ER_TRY(rollout_round(g, step, n, n + k, n + lo, n + hi, gen_tokens));
        ER_TRY(share_groups(g, n, n + k, n + lo, n + hi, gen_tokens));
        for (int p = n; p < n + k; p++)
            spread += !g->groups[p].flat;
        n += k;
    } while (c->max_draws > 0 && spread < P && n < c->max_draws);
    *drawn = n;
    return ER_OK;
}

// The rollout metrics of the groups drawn.
static void rollout_metrics(const Grpo *g, int drawn, StepMetrics *sm) {
    int G = g->c->group;
    long n = (long)drawn * G;
    for (int b = 0; b < g->n_budgets; b++)
        sm->len_min[b] = 1e300, sm->len_max[b] = -1;
    for (int p = 0; p < drawn; p++) {
        const Group *gr = &g->groups[p];
        int b = 0;
        while (b < g->n_budgets && g->budgets[b] != gr->budget)
            b++;
        for (int i = 0; i < G; i++) {
            sm->reward += gr->reward[i];
            sm->len += gr->len[i];
            sm->over += gr->len[i] > gr->budget;
            sm->truncated += gr->truncated[i];
            sm->unformatted += gr->unformatted[i];
            for (int k = 0; k < g->n_terms; k++)
                sm->term[k] += gr->terms[(size_t)i * MAX_TERMS + k];
            if (b < g->n_budgets) {
                sm->len_by_budget[b] += gr->len[i];
                sm->len_min[b] = fmin(sm->len_min[b], gr->len[i]);
                sm->len_max[b] = fmax(sm->len_max[b], gr->len[i]);
                sm->n_by_budget[b]++;
            }
        }
        sm->acc += gr->correct;
        sm->flat += gr->flat;
        sm->rollout_hash = (sm->rollout_hash ^ gr->hash) * 16777619u;
    }
    sm->reward /= n;
    for (int p = 0; p < drawn; p++)
        for (int i = 0; i < G; i++)
            sm->reward_std += (g->groups[p].reward[i] - sm->reward) * (g->groups[p].reward[i] - sm->reward);
    sm->reward_std = n > 1 ? sqrt(sm->reward_std / (n - 1)) : 0;
    sm->len /= n;
    sm->acc /= n;
    sm->over /= n;
    sm->truncated /= n;
    sm->unformatted /= n;
    for (int k = 0; k < g->n_terms; k++)
        sm->term[k] /= n;
    sm->flat /= drawn;
    sm->drawn = drawn;
}

// The groups in the loss: all --prompts drawn (less the flat ones with --drop-flat), or with dynamic
// sampling the first --prompts with a reward spread. Returns their number; *tokens: their completion
// tokens in the loss (dapo's global count).
static int select_groups(Grpo *g, int drawn, long *tokens) {
    const GrpoConfig *c = g->c;
    int used = 0;
    *tokens = 0;
    for (int p = 0; p < drawn && used < c->prompts; p++) {
        const Group *gr = &g->groups[p];
        if (gr->flat && (c->drop_flat || c->max_draws > 0))
            continue;
        g->sel[used++] = p;
        for (int i = 0; i < c->group; i++)
            *tokens += c->mask_truncated && gr->truncated[i] ? 0 : gr->ntok[i];
    }
    return used;
}

// One policy update over the selected groups this rank rolled out, the ranks' gradients summed.
static int policy_update(Grpo *g, long step, int it, int used, const PolicyLossConfig *lc, long tokens,
                         StepMetrics *sm, long *train_positions) {
    const GrpoConfig *c = g->c;
    int G = c->group;
    size_t cells = (size_t)G * g->seq_len;
    float inv_t = (float)(1.0 / c->temperature);
    Backend *be = g->dev.be;
    size_t n = g->ad.n_params;
    const LoraAdapter *ref_ad = c->kl_ref != KL_REF_INIT ? NULL : g->dev.placed ? &g->dev_ref : &g->ref;
    ER_TRY(be->ops->zero(be, g->dev.grads, sizeof(float) * n));
    double sums[7] = {0}; // loss, clipped, low, high, kl, entropy (token sums), positions
    for (int k = 0; k < used; k++) {
        Group *gr = &g->groups[g->sel[k]];
        if (!gr->mine)
            continue;
        RolloutBatch rb = group_batch(g, g->sel[k]);
        float *ref = g->ref_lp + cells * k, *old = g->old_lp + cells * k;
        if (it == 0 && c->beta > 0)
            ER_TRY(policy_logprobs(g->dev.model, ref_ad, &g->acts, &rb, inv_t, ref));
        if (it == 0 && c->iterations > 1)
            ER_TRY(policy_logprobs(g->dev.model, g->dev.adapter, &g->acts, &rb, inv_t, old));
        PolicyLossStats ps;
        ER_TRY(policy_step(g->dev.model, g->dev.adapter, &g->acts, &rb, inv_t, c->iterations > 1 ? old : NULL,
                           c->beta > 0 ? ref : NULL, g->adv + (size_t)g->sel[k] * G, lc, 1, g->logp, &ps));
        double tk = (double)ps.tokens;
        double add[7] = {ps.loss, ps.clip_frac * tk, ps.clip_low * tk, ps.clip_high * tk, ps.kl * tk,
                         ps.entropy * tk, (double)rb.B * rb.T};
        for (int i = 0; i < 7; i++)
            sums[i] += add[i];
    }
    // The ranks' groups together: the sums of the step, then the gradient.
    ER_TRY(dist_sum_doubles(sums, 7));
    *train_positions += (long)sums[6];
    ER_TRY(train_device_sum_grads(&g->dev, &g->job));
    // grpo, bnpo and dr_grpo normalise within a group: average the groups. dapo used the global count.
    if (c->loss_type != LOSS_DAPO) {
        ER_TRY(be->ops->scale(be, g->dev.grads, n, 1.0f / (float)used));
        sums[0] /= used;
    }
    ER_TRY(clip_grad_norm(be, g->dev.grads, n, c->clip, &sm->gnorm));
    if (!isfinite(sm->gnorm))
        return er_error(ER_ERANGE, "grpo step %ld: the gradient is not finite", step + 1);
    long warm = c->warmup < 1 ? (long)(c->warmup * c->steps) : (long)c->warmup;
    sm->lr = lr_schedule(step, warm, c->steps, c->lr, 0.0);
    ER_TRY(adamw_step(&g->opt, g->dev.params, g->dev.grads, NULL, sm->lr));
    double per = tokens > 0 ? 1.0 / tokens : 0;
    sm->loss = sums[0];
    sm->clip = sums[1] * per, sm->clip_low = sums[2] * per, sm->clip_high = sums[3] * per;
    sm->kl = sums[4] * per, sm->entropy = sums[5] * per;
    return ER_OK;
}

static int grpo_step(Grpo *g, long step, StepMetrics *sm) {
    const GrpoConfig *c = g->c;
    memset(sm, 0, sizeof *sm);
    double t0 = time_now();
    long gen_tokens = 0;
    int drawn;
    ER_TRY(draw_groups(g, step, &gen_tokens, &drawn));
    sm->rollout_tps = gen_tokens / (time_now() - t0 + 1e-9);
    rollout_metrics(g, drawn, sm);
    // Advantages over every group drawn (a batch std sees them all), then the groups that take part.
    for (int p = 0; p < drawn; p++)
        memcpy(g->rewards + (size_t)p * c->group, g->groups[p].reward, sizeof(float) * (size_t)c->group);
    grpo_advantages(g->rewards, drawn, c->group, c->scale, g->adv, NULL);
    long tokens;
    int used = select_groups(g, drawn, &tokens);
    sm->used = used;
    PolicyLossConfig lc = {c->eps, c->eps_high, c->beta, c->loss_type, g->max_new, (double)(tokens > 0 ? tokens : 1)};
    long train_positions = 0;
    double t2 = time_now();
    for (int it = 0; it < c->iterations && used > 0; it++)
        ER_TRY(policy_update(g, step, it, used, &lc, tokens, sm, &train_positions));
    sm->train_tps = train_positions / (time_now() - t2 + 1e-9);
    return ER_OK;
}

// A {budget: value} object of the budgets with samples.
static void add_by_budget(cJSON *j, const char *key, const Grpo *g, const double *v, const int *n, int mean) {
    cJSON *o = cJSON_AddObjectToObject(j, key);
    for (int b = 0; b < g->n_budgets; b++)
        if (n[b]) {
            char k[16];
            snprintf(k, sizeof k, "%d", g->budgets[b]);
            cJSON_AddNumberToObject(o, k, mean ? v[b] / n[b] : v[b]);
        }
}

// One metrics.jsonl line: today's fields, TRL's names beside them, the eval on eval steps; the timing
// fields last.
static int write_metrics(Grpo *g, long step, const StepMetrics *sm) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return ER_ENOMEM;
    cJSON_AddNumberToObject(j, "step", (double)step);
    cJSON_AddNumberToObject(j, "reward", sm->reward);
    cJSON_AddNumberToObject(j, "reward_std", sm->reward_std);
    for (int k = 0; k < g->n_terms; k++) {
        char name[64];
        snprintf(name, sizeof name, "rewards/%s/mean", g->term_names[k]);
        cJSON_AddNumberToObject(j, name, sm->term[k]);
    }
    cJSON_AddNumberToObject(j, "accuracy", sm->acc);
    cJSON_AddNumberToObject(j, "length", sm->len);
    add_by_budget(j, "length_by_budget", g, sm->len_by_budget, sm->n_by_budget, 1);
    add_by_budget(j, "length_min_by_budget", g, sm->len_min, sm->n_by_budget, 0);
    add_by_budget(j, "length_max_by_budget", g, sm->len_max, sm->n_by_budget, 0);
    cJSON_AddNumberToObject(j, "over_budget", sm->over);
    cJSON_AddNumberToObject(j, "truncated", sm->truncated);
    cJSON_AddNumberToObject(j, "unformatted", sm->unformatted);
    cJSON_AddNumberToObject(j, "rollout_hash", sm->rollout_hash);
    cJSON_AddNumberToObject(j, "prompts_drawn", sm->drawn);
    cJSON_AddNumberToObject(j, "groups_in_loss", sm->used);
    cJSON_AddNumberToObject(j, "loss", sm->loss);
    cJSON_AddNumberToObject(j, "clip_fraction", sm->clip);
    cJSON_AddNumberToObject(j, "clip_ratio/low_mean", sm->clip_low);
    cJSON_AddNumberToObject(j, "clip_ratio/high_mean", sm->clip_high);
    cJSON_AddNumberToObject(j, "clip_ratio/region_mean", sm->clip);
    cJSON_AddNumberToObject(j, "kl", sm->kl);
    cJSON_AddNumberToObject(j, "entropy", sm->entropy);
    cJSON_AddNumberToObject(j, "flat_groups", sm->flat);
    cJSON_AddNumberToObject(j, "grad_norm", sm->gnorm);
    cJSON_AddNumberToObject(j, "lr", sm->lr);
    if (sm->evaluated) {
        cJSON_AddNumberToObject(j, "eval_accuracy", sm->eval_acc);
        cJSON_AddNumberToObject(j, "eval_unformatted", sm->eval_unformatted);
        add_by_budget(j, "eval_accuracy_by_budget", g, sm->eval_acc_by, sm->eval_n, 1);
        add_by_budget(j, "eval_length_by_budget", g, sm->eval_len, sm->eval_n, 1);
    }
    cJSON_AddNumberToObject(j, "rollout_tokens_per_s", sm->rollout_tps);
    cJSON_AddNumberToObject(j, "train_tokens_per_s", sm->train_tps);
    cJSON_AddNumberToObject(j, "allreduce_s", round(dist_reduce_seconds() * 1000) / 1000); // as sft's
    int rc = metrics_write(&g->ml, j);
    cJSON_Delete(j);
    return rc;
}

// A few of rank 0's completions of the step (the first sample of each of its first groups) with their
// reward terms, to completions.jsonl.
static int write_completions(Grpo *g, long step) {
    for (int p = 0, n = 0; p < g->c->prompts && n < 4; p++) {
        const Group *gr = &g->groups[p];
        if (!gr->mine)
            continue;
        n++;
        cJSON *j = cJSON_CreateObject();
        if (!j)
            return ER_ENOMEM;
        const Example *ex = &g->d.ex[gr->rec];
        cJSON_AddNumberToObject(j, "step", (double)step);
        cJSON_AddNumberToObject(j, "record_line", (double)ex->line);
        cJSON_AddNumberToObject(j, "budget", gr->budget);
        cJSON_AddStringToObject(j, "prompt", ex->prompt ? ex->prompt : "");
        cJSON_AddStringToObject(j, "completion", gr->s[0].text ? gr->s[0].text : "");
        cJSON_AddStringToObject(j, "answer", ex->answer);
        cJSON_AddNumberToObject(j, "length", gr->len[0]);
        cJSON_AddNumberToObject(j, "tokens", gr->ntok[0]);
        cJSON_AddBoolToObject(j, "correct", gr->ok[0]);
        cJSON_AddBoolToObject(j, "unformatted", gr->unformatted[0]);
        cJSON_AddBoolToObject(j, "truncated", gr->truncated[0]);
        cJSON_AddNumberToObject(j, "reward", gr->reward[0]);
        cJSON *t = cJSON_AddObjectToObject(j, "rewards");
        for (int k = 0; k < g->n_terms; k++)
            cJSON_AddNumberToObject(t, g->term_names[k], gr->terms[k]);
        int rc = metrics_write(&g->completions, j);
        cJSON_Delete(j);
        ER_TRY(rc);
    }
    return ER_OK;
}

// Greedy decoding of the eval records at every budget they can be drawn with (the record's own, or each
// of --budgets), all of this rank's in one batch: accuracy, unformatted share, and accuracy and mean L per
// budget. The records are shared across ranks.
static int grpo_eval(Grpo *g, StepMetrics *sm) {
    const GrpoConfig *c = g->c;
    int lo, hi, nb = g->n_budgets, n = 0, rc = ER_OK;
    dist_share(g->eval.n, dist_rank(), dist_size(), &lo, &hi);
    size_t cap = (size_t)(hi - lo) * (size_t)nb + 1;
    RolloutGroup *rg = er_calloc(cap, sizeof(RolloutGroup));
    GenSample *s = er_calloc(cap, sizeof(GenSample));
    int *rec = er_calloc(cap, sizeof(int)), *bud = er_calloc(cap, sizeof(int)); // record, budget of each
    double v[4 * MAX_BUDGETS + 3] = {0}; // per budget: samples, correct, unformatted, sum of L; then the totals
    if (!rg || !s || !rec || !bud)
        ER_CHECK(ER_ENOMEM);
    for (int i = lo; i < hi; i++) {
        const Example *ex = &g->eval.ex[i];
        for (int k = 0; k < (ex->budget > 0 ? 1 : nb); k++, n++) {
            int budget = ex->budget > 0 ? ex->budget : g->budgets[k], *ids, nid;
            rc = encode_prompt(g, ex, budget, &ids, &nid);
            if (rc < 0)
                ER_CHECK(er_error_prefix(rc, "eval, %s:%ld", c->eval_data, ex->line));
            rg[n] = (RolloutGroup){ids, nid, rollout_config(g, budget, 0.0, 1, 0), &s[n]};
            rec[n] = i;
            bud[n] = budget;
        }
    }
    if (n > 0)
        ER_CHECK(rollout_groups(&g->batch, rg, n, NULL));
    for (int j = 0; j < n; j++) {
        const Example *ex = &g->eval.ex[rec[j]];
        int unformatted = 0, ok = grade_response(s[j].text, s[j].answer_at, g->think_open, ex->answer, &unformatted);
        if (ok < 0)
            ER_CHECK(er_error_prefix(ok, "eval, %s:%ld", c->eval_data, ex->line));
        int b = 0;
        while (b < nb && g->budgets[b] != bud[j])
            b++;
        double add[4] = {1, ok, unformatted, s[j].think_len};
        for (int t = 0; t < 4; t++) {
            if (b < nb)
                v[4 * b + t] += add[t];
            if (t < 3)
                v[4 * MAX_BUDGETS + t] += add[t];
        }
    }
    ER_CHECK(dist_sum_doubles(v, 4 * MAX_BUDGETS + 3));
    for (int b = 0; b < nb; b++) {
        sm->eval_n[b] = (int)v[4 * b];
        sm->eval_acc_by[b] = v[4 * b + 1];
        sm->eval_len[b] = v[4 * b + 3];
    }
    double total = v[4 * MAX_BUDGETS];
    sm->evaluated = 1;
    sm->eval_acc = total > 0 ? v[4 * MAX_BUDGETS + 1] / total : 0;
    sm->eval_unformatted = total > 0 ? v[4 * MAX_BUDGETS + 2] / total : 0;
done:
    for (int j = 0; j < n; j++)
        er_free((void *)rg[j].prompt);
    if (s)
        gen_samples_free(s, n);
    er_free(s);
    er_free(rg);
    er_free(rec);
    er_free(bud);
    return rc;
}

// The trained adapter's parameters into g->ad (from the device where it is placed); *opt: AdamW with its moments
// on the host (NULL: not wanted).
static int grpo_to_host(Grpo *g, AdamW **opt) {
    AdamW *host;
    ER_TRY(train_device_to_host(&g->dev, &g->job, &g->opt, &host));
    if (opt)
        *opt = host;
    return ER_OK;
}

// The adapter of the best eval accuracy so far, in OUT/best (with best/eval.json: its step and accuracy);
// each file replaced as a whole.
static int save_best(Grpo *g, long step, double acc) {
    char *dir = path_join(g->c->out_dir, "best"), *stage = NULL, *json = NULL;
    cJSON *j = cJSON_CreateObject();
    int rc = ER_OK;
    if (!dir || !j)
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(grpo_to_host(g, NULL));
    ER_CHECK(dir_stage_open(dir, &stage));
    g->ad.dropout = g->dropout; // saved as it came
    rc = peft_save(&g->ad, stage);
    g->ad.dropout = 0;
    ER_CHECK(rc);
    cJSON_AddNumberToObject(j, "step", (double)step);
    cJSON_AddNumberToObject(j, "eval_accuracy", acc);
    if (!(json = path_join(stage, "eval.json")))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(json_write_file(json, j));
    rc = dir_stage_move_into(stage, dir);
    stage = NULL;
done:
    dir_stage_abort(stage);
    cJSON_Delete(j);
    er_free(json);
    er_free(dir);
    return rc;
}

// The best eval accuracy a resumed run had reached (best/eval.json), or -1.
static double load_best(const Grpo *g) {
    char *p = path_join(g->c->out_dir, "best/eval.json"), *text = NULL;
    size_t n;
    double acc = -1;
    if (p && path_exists(p) && file_read_all(p, 1 << 16, &text, &n) == ER_OK) {
        cJSON *j = cJSON_Parse(text);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "eval_accuracy");
        if (cJSON_IsNumber(a))
            acc = a->valuedouble;
        cJSON_Delete(j);
    }
    er_free(text);
    er_free(p);
    return acc;
}

static cJSON *config_json(const Grpo *g) {
    const GrpoConfig *c = g->c;
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "command", "grpo");
    cJSON_AddStringToObject(j, "version", ERTRAIN_VERSION);
    run_add_path(j, "model", c->model_dir);
    run_add_path(j, "adapter", c->adapter_dir);
    run_add_path(j, "data", c->data_path);
    cJSON_AddStringToObject(j, "data_fingerprint", g->data_fp);
    cJSON_AddStringToObject(j, "budgets", c->budgets);
    cJSON_AddStringToObject(j, "budget_template", c->budget_template);
    cJSON_AddStringToObject(j, "budget_in", c->budget_in == BUDGET_IN_USER ? "user" : "system");
    cJSON_AddNumberToObject(j, "group", c->group);
    cJSON_AddNumberToObject(j, "prompts", c->prompts);
    cJSON_AddNumberToObject(j, "steps", c->steps);
    cJSON_AddNumberToObject(j, "temperature", c->temperature);
    cJSON_AddNumberToObject(j, "top_p", c->top_p);
    cJSON_AddNumberToObject(j, "barrier_m", c->barrier_m);
    cJSON_AddNumberToObject(j, "barrier_p", c->barrier_p);
    cJSON_AddNumberToObject(j, "answer_tokens", c->answer_tokens);
    cJSON_AddNumberToObject(j, "scale_rewards", c->scale);
    cJSON_AddBoolToObject(j, "drop_flat", c->drop_flat);
    cJSON_AddNumberToObject(j, "max_draws", c->max_draws);
    cJSON_AddBoolToObject(j, "mask_truncated", c->mask_truncated);
    cJSON_AddNumberToObject(j, "format_weight", c->format_weight);
    if (c->reward_cmd)
        cJSON_AddStringToObject(j, "reward_cmd", c->reward_cmd);
    cJSON_AddNumberToObject(j, "epsilon", c->eps);
    cJSON_AddNumberToObject(j, "epsilon_high", c->eps_high);
    cJSON_AddNumberToObject(j, "beta", c->beta);
    cJSON_AddStringToObject(j, "kl_ref", c->kl_ref == KL_REF_INIT ? "init" : "base");
    cJSON_AddNumberToObject(j, "loss_type", c->loss_type);
    cJSON_AddNumberToObject(j, "iterations", c->iterations);
    cJSON_AddNumberToObject(j, "lr", c->lr);
    cJSON_AddNumberToObject(j, "warmup", c->warmup);
    cJSON_AddNumberToObject(j, "clip", c->clip);
    cJSON_AddNumberToObject(j, "weight_decay", c->weight_decay);
    cJSON_AddNumberToObject(j, "seq_len", g->seq_len);
    cJSON_AddNumberToObject(j, "adapter_dropout", g->dropout);
    if (c->eval_data) {
        run_add_path(j, "eval_data", c->eval_data);
        cJSON_AddStringToObject(j, "eval_data_fingerprint", g->eval_fp);
        cJSON_AddNumberToObject(j, "eval_every", c->eval_every);
        cJSON_AddNumberToObject(j, "eval_n", c->eval_n);
    }
    cJSON_AddNumberToObject(j, "seed", c->seed);
    cJSON_AddNumberToObject(j, "threads", threads_get());
    cJSON_AddNumberToObject(j, "ranks", dist_size());
    return j;
}

// Continues the run in --out from its checkpoint (*start: the step it was at), or starts one there;
// writes run.json, the KL reference (checkpoint/reference: a resume reads it back) and opens
// metrics.jsonl and completions.jsonl.
static int grpo_start(Grpo *g, const char *ckpt, long *start) {
    const GrpoConfig *c = g->c;
    *start = 0;
    // run_dir_check said so already when --resume finds no checkpoint: the run starts from step 0.
    int resume = c->resume && checkpoint_exists(ckpt);
    if (resume) {
        AdamW *host = g->dev.placed ? &g->dev.host_opt : &g->opt;
        ER_TRY(checkpoint_load(ckpt, &g->st, g->ad.params, g->ad.n_params, host));
        ER_TRY(train_device_from_host(&g->dev, &g->job, &g->opt, host));
        cJSON *now = config_json(g);
        if (!now)
            return ER_ENOMEM;
        int rc = train_config_check_resume(g->st.config, now, ckpt);
        // The run goes on with this configuration: an extended run records its new length.
        cJSON_Delete(g->st.config);
        g->st.config = now;
        ER_TRY(rc);
        if (g->st.step > c->steps)
            return er_error(ER_EINVAL, "%s: checkpoint at step %ld is past the %d steps asked for (a run can be "
                            "extended, not shortened)", ckpt, g->st.step, c->steps);
        *start = g->st.step;
        g->best_eval = load_best(g);
    } else {
        rng_seed(&g->st.rng, (uint64_t)c->seed);
        g->st.cursor = g->d.n; // the first draw starts epoch 0
        g->st.epoch = -1;
        if (!(g->st.config = config_json(g)))
            return ER_ENOMEM;
    }
    if (dist_rank() != 0) // rank 0 alone writes the run dir
        return ER_OK;
    ER_TRY(dir_make(c->out_dir));
    ER_TRY(run_write_json(c->out_dir, g->st.config));
    if (!resume && c->kl_ref == KL_REF_INIT && c->beta > 0) {
        char *ref = path_join(ckpt, "reference"), *stage = NULL;
        int rc = ref ? dir_make(ckpt) : ER_ENOMEM;
        if (rc == ER_OK && (rc = dir_stage_open(ref, &stage)) == ER_OK && (rc = peft_save(&g->ref, stage)) == ER_OK)
            rc = dir_stage_commit(stage, ref), stage = NULL;
        dir_stage_abort(stage);
        er_free(ref);
        ER_TRY(rc);
    }
    ER_TRY(metrics_open(&g->ml, c->out_dir, "metrics.jsonl", resume, *start));
    return c->log_completions > 0 ? metrics_open(&g->completions, c->out_dir, "completions.jsonl", resume, *start)
                                  : ER_OK;
}

static int save_adapter(void *ctx, const char *dir) { return peft_save((const LoraAdapter *)ctx, dir); }

// Rank 0 writes it, once every rank's adapter and optimizer state are seen to be the same.
static int grpo_save_checkpoint(Grpo *g, const char *ckpt) {
    AdamW *opt;
    ER_TRY(grpo_to_host(g, &opt));
    ER_TRY(dist_check_same(g->ad.params, sizeof(float) * g->ad.n_params, "adapter parameters"));
    ER_TRY(dist_check_same(opt->m, sizeof(float) * g->ad.n_params, "AdamW moments"));
    return dist_rank() == 0 ? checkpoint_save(ckpt, &g->st, g->ad.params, g->ad.n_params, opt) : ER_OK;
}

// After step s: the eval (every --eval-every steps and at the last), the best adapter, the logs.
static int after_step(Grpo *g, long s, StepMetrics *sm) {
    const GrpoConfig *c = g->c;
    if (c->eval_data && ((s + 1) % c->eval_every == 0 || s + 1 == c->steps)) {
        ER_TRY(grpo_eval(g, sm));
        g->last_eval = sm->eval_acc;
        if (sm->eval_acc > g->best_eval) {
            g->best_eval = sm->eval_acc;
            if (dist_rank() == 0)
                ER_TRY(save_best(g, s + 1, sm->eval_acc));
        }
    }
    if (dist_rank() != 0)
        return ER_OK;
    ER_TRY(write_metrics(g, s + 1, sm));
    if (c->log_completions > 0 && ((s + 1) % c->log_completions == 0 || s == 0))
        ER_TRY(write_completions(g, s + 1));
    return ER_OK;
}

int grpo_train(const GrpoConfig *c, GrpoResult *res) {
    memset(res, 0, sizeof *res);
    Grpo g;
    memset(&g, 0, sizeof g);
    g.c = c;
    char *ckpt = NULL;
    long start = 0;
    int rc = ER_OK;
    ER_CHECK(grpo_setup(&g));
    if (!(ckpt = path_join(c->out_dir, "checkpoint")))
        ER_CHECK(ER_ENOMEM);
    ER_CHECK(grpo_start(&g, ckpt, &start));
    Progress prog;
    progress_begin(&prog, c->log, "grpo", "step", start, c->steps);
    for (long s = start; s < c->steps; s++) {
        StepMetrics sm;
        ER_CHECK(grpo_step(&g, s, &sm));
        ER_CHECK(after_step(&g, s, &sm));
        if (s == start) {
            res->first_reward = sm.reward;
            res->first_length = sm.len;
        }
        res->last_reward = sm.reward;
        res->last_length = sm.len;
        res->steps = s + 1;
        g.st.step = s + 1;
        if ((c->save_every > 0 && (s + 1) % c->save_every == 0) || s + 1 == c->steps)
            ER_CHECK(grpo_save_checkpoint(&g, ckpt));
        if (c->stop_after > 0 && s + 1 == c->stop_after) // the test hook: as if killed here
            break;
        char extra[200];
        int k = snprintf(extra, sizeof extra, "reward %.3f acc %.2f len %.1f kl %.4f", sm.reward, sm.acc, sm.len,
                         sm.kl);
        if (c->max_draws > 0)
            k += snprintf(extra + k, sizeof extra - (size_t)k, " drawn %d", sm.drawn);
        if (g.last_eval >= 0)
            snprintf(extra + k, sizeof extra - (size_t)k, " eval %.2f", g.last_eval);
        progress_update(&prog, s + 1, extra);
    }
    progress_end(&prog, NULL);
    ER_CHECK(grpo_to_host(&g, NULL));
    g.ad.dropout = g.dropout; // saved as it came
    if (g.st.step == c->steps && dist_rank() == 0)
        ER_CHECK(run_write_outputs(c->out_dir, save_adapter, &g.ad));
done:
    er_free(ckpt);
    grpo_free(&g);
    return rc;
}
