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
#include "train/checkpoint.h"
#include "train/dist.h"
#include "train/optim.h"
#include "train/run.h"
#include "train/trainer.h"

#define MAX_BUDGETS 16

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
    int n = chat_set_system(msgs, 64, ex->messages, ex->n_messages, c->budget_in == BUDGET_IN_SYSTEM ? line : NULL);
    int last_user = -1;
    for (int i = 0; i < n; i++)
        if (strcmp(msgs[i].role, "user") == 0)
            last_user = i;
    char *user = NULL;
    if (c->budget_in == BUDGET_IN_USER) {
        if (last_user < 0)
            return er_error(ER_EINVAL, "%s:%ld: no user message to state the budget in", c->data_path, ex->line);
        size_t len = strlen(msgs[last_user].content) + strlen(line) + 2;
        if (!(user = er_alloc(len)))
            return ER_ENOMEM;
        snprintf(user, len, "%s %s", msgs[last_user].content, line);
        msgs[last_user].content = user;
    }
    int rc = chat_render(style, msgs, n, CHAT_ADD_GENERATION_PROMPT, text, NULL);
    er_free(user);
    return rc;
}

// One prompt's group of rollouts.
typedef struct {
    int *prompt;       // prompt tokens then the forced reasoning prefix
    int n_prompt;      // prompt + prefix
    int budget;
    GenSample *s;      // (G)
    float *reward;     // (G)
    int *len;          // (G) completion tokens (known on every rank; s only on the rank that rolled out)
    uint32_t hash;     // FNV-1a of the G completions' tokens, in order (metrics: the same rollouts at any N)
    int correct;       // samples graded right
    float *ref, *old;  // per completion token, rollout_offsets order (NULL when not needed)
} Group;

typedef struct {
    const GrpoConfig *c;
    Model m;
    LoraAdapter ad;
    Tokenizer *tok;
    ChatStyle style;
    Dataset d;
    int budgets[MAX_BUDGETS], n_budgets;
    int *prefix, n_prefix;
    Engine eng;
    Activations acts;
    AdamW opt;
    MetricsLog ml;
    TrainState st;
    int max_new;                  // new tokens of the largest budget
    int seq_len;                  // positions per sequence: --seq-len, or what the longest prompt needs
    float dropout;                // the starting adapter's lora_dropout (kept in the saved adapter)
    char data_fp[48];             // file_fingerprint of --data: a resume refuses a changed file
    Group *groups;
    // batch buffers (G rows x seq_len)
    int *tokens, *plen, *clen;
    uint8_t *mask;
    float *logp, *rewards, *adv;
} Grpo;

static void grpo_free(Grpo *g) {
    if (g->groups)
        for (int i = 0; i < g->c->prompts; i++) {
            er_free(g->groups[i].prompt);
            if (g->groups[i].s)
                gen_samples_free(g->groups[i].s, g->c->group);
            er_free(g->groups[i].s);
            er_free(g->groups[i].reward);
            er_free(g->groups[i].len);
            er_free(g->groups[i].ref);
            er_free(g->groups[i].old);
        }
    er_free(g->groups);
    er_free(g->tokens);
    er_free(g->plen);
    er_free(g->clen);
    er_free(g->mask);
    er_free(g->logp);
    er_free(g->rewards);
    er_free(g->adv);
    er_free(g->prefix);
    metrics_close(&g->ml);
    train_state_free(&g->st);
    adamw_free(&g->opt);
    acts_free(&g->acts);
    engine_free(&g->eng);
    dataset_free(&g->d);
    tok_free(g->tok);
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

// Every record with every budget it can be drawn with, rendered and encoded before step 1: a record
// that does not encode or fit fails now, naming its line, not at the step that draws it. Sizes the
// sequences (--seq-len 0: what the longest prompt and budget need) within the model's positions.
static int check_prompts(Grpo *g) {
    const GrpoConfig *c = g->c;
    long need = 0, need_line = 0;
    int need_budget = 0;
    g->max_new = 0;
    for (int i = 0; i < g->d.n; i++) {
        const Example *ex = &g->d.ex[i];
        int nb = ex->budget > 0 ? 1 : g->n_budgets;
        for (int k = 0; k < nb; k++) {
            int budget = ex->budget > 0 ? ex->budget : g->budgets[k], *ids, nid;
            int rc = encode_prompt(g, ex, budget, &ids, &nid);
            if (rc < 0)
                return er_error_prefix(rc, "%s:%ld", c->data_path, ex->line);
            er_free(ids);
            int max_new = rollout_max_new(c, budget);
            long n = (long)nid + g->n_prefix + max_new;
            if (c->seq_len > 0 && n > c->seq_len)
                return er_error(ER_ERANGE, "%s:%ld: the prompt (%d tokens) at budget %d needs %ld positions with the "
                                "prefix and (1+m) x budget + %d answer tokens, more than --seq-len %d", c->data_path,
                                ex->line, nid, budget, n, c->answer_tokens, c->seq_len);
            if (n > need)
                need = n, need_line = ex->line, need_budget = budget;
            g->max_new = max_new > g->max_new ? max_new : g->max_new;
        }
    }
    g->seq_len = c->seq_len > 0 ? c->seq_len : (int)need;
    if (g->seq_len > g->m.cfg.max_pos)
        return c->seq_len > 0
                   ? er_error(ER_ERANGE, "--seq-len %d exceeds the model's %d positions (max_position_embeddings)",
                              c->seq_len, g->m.cfg.max_pos)
                   : er_error(ER_ERANGE, "%s:%ld: the prompt at budget %d needs %ld positions, more than the "
                              "model's %d (max_position_embeddings): use smaller --budgets", c->data_path, need_line,
                              need_budget, need, g->m.cfg.max_pos);
    return ER_OK;
}

static int grpo_setup(Grpo *g) {
    const GrpoConfig *c = g->c;
    ER_TRY(parse_budgets(c->budgets, g->budgets, &g->n_budgets));
    if (c->group < 2)
        return er_error(ER_EINVAL, "--group must be at least 2 (advantages compare samples of one prompt)");
    if (c->prompts < 1 || c->prompts > 256)
        return er_error(ER_EINVAL, "--prompts must be in 1..256");
    if (!strstr(c->budget_template, "{budget}"))
        return er_error(ER_EINVAL, "--budget-template \"%s\" has no {budget}: the prompts would not state the budget",
                        c->budget_template);
    const char *in[] = {c->model_dir, c->adapter_dir, c->data_path}, *flag[] = {"--model", "--adapter", "--data"};
    for (int i = 0; i < 3; i++)
        ER_TRY(dir_output_not_input(c->out_dir, in[i], flag[i]));
    ER_TRY(run_dir_check(c->out_dir, c->resume ? RUN_RESUME : RUN_NEW, c->log));
    ER_TRY(file_fingerprint(c->data_path, g->data_fp, sizeof g->data_fp));
    ER_TRY(model_load(&g->m, c->model_dir, 0));
    const ModelConfig *mc = &g->m.cfg;
    LoraShape shape = model_config_lora_shape(mc);
    ER_TRY(peft_load(&g->ad, c->adapter_dir, &shape, 1));
    if (!g->ad.masked)
        return er_error(ER_EINVAL, "%s: GRPO here trains masked adapters (er_mask \"response\")", c->adapter_dir);
    // Dropout is off in GRPO (TRL's disable_dropout): the rollouts come from the runtime, which has
    // none, and the ratio to the old policy and the KL to the base need the update's log-probs to be
    // those of the same function that sampled. The adapter is saved with its lora_dropout unchanged.
    g->dropout = g->ad.dropout;
    g->ad.dropout = 0;
    ER_TRY(tok_load(&g->tok, c->model_dir));
    ER_TRY(train_chat_style(c->model_dir, &g->style));
    ER_TRY(dataset_load(c->data_path, NULL, 0, &g->d));
    if (g->d.n == 0)
        return er_error(ER_EFORMAT, "%s: no records", c->data_path);
    for (int i = 0; i < g->d.n; i++)
        if (!g->d.ex[i].answer)
            return er_error(ER_EFORMAT, "%s:%ld: record has no gold answer", c->data_path, g->d.ex[i].line);
    const char *pre = g->ad.reasoning_prefix ? g->ad.reasoning_prefix : "";
    if (pre[0])
        ER_TRY(tok_encode(g->tok, pre, strlen(pre), &g->prefix, &g->n_prefix));
    ER_TRY(check_prompts(g));
    ER_TRY(engine_init(&g->eng, &g->m, g->tok, KV_F32, c->group, g->seq_len, 128, 0));
    ER_TRY(acts_alloc(&g->acts, mc, c->group, g->seq_len, ACTS_TRAIN, er_physical_memory()));
    ER_TRY(adamw_init(&g->opt, backend_cpu(), g->ad.n_params, c->lr, 0.9, 0.999, 1e-8, c->weight_decay));
    size_t cells = (size_t)c->group * g->seq_len;
    g->groups = er_calloc((size_t)c->prompts, sizeof(Group));
    g->tokens = er_alloc(sizeof(int) * cells);
    g->mask = er_alloc(cells);
    g->plen = er_alloc(sizeof(int) * (size_t)c->group);
    g->clen = er_alloc(sizeof(int) * (size_t)c->group);
    g->logp = er_alloc(sizeof(float) * cells);
    g->rewards = er_alloc(sizeof(float) * (size_t)c->prompts * c->group);
    g->adv = er_alloc(sizeof(float) * (size_t)c->prompts * c->group);
    if (!g->groups || !g->tokens || !g->mask || !g->plen || !g->clen || !g->logp || !g->rewards || !g->adv)
        return ER_ENOMEM;
    for (int i = 0; i < c->prompts; i++) {
        g->groups[i].s = er_calloc((size_t)c->group, sizeof(GenSample));
        g->groups[i].reward = er_alloc(sizeof(float) * (size_t)c->group);
        g->groups[i].len = er_alloc(sizeof(int) * (size_t)c->group);
        g->groups[i].ref = er_alloc(sizeof(float) * cells);
        g->groups[i].old = er_alloc(sizeof(float) * cells);
        if (!g->groups[i].s || !g->groups[i].reward || !g->groups[i].len || !g->groups[i].ref || !g->groups[i].old)
            return ER_ENOMEM;
    }
    return ER_OK;
}

// Draws prompt p of step `step`, renders it with its budget line and rolls out G samples.
static int rollout(Grpo *g, long step, int p, long *gen_tokens) {
    const GrpoConfig *c = g->c;
    Group *gr = &g->groups[p];
    ErRng r;
    rng_fork(&r, &g->st.rng, ((uint64_t)step << 16) | (uint64_t)p);
    const Example *ex = &g->d.ex[rng_below(&r, (uint32_t)g->d.n)];
    gr->budget = ex->budget > 0 ? ex->budget : g->budgets[rng_below(&r, (uint32_t)g->n_budgets)];
    int *ids = NULL, nid;
    int rc = ER_OK;
    ER_CHECK(encode_prompt(g, ex, gr->budget, &ids, &nid));
    er_free(gr->prompt);
    gr->prompt = er_alloc(sizeof(int) * (size_t)(nid + g->n_prefix));
    if (!gr->prompt)
        ER_CHECK(ER_ENOMEM);
    memcpy(gr->prompt, ids, sizeof(int) * (size_t)nid);
    memcpy(gr->prompt + nid, g->prefix, sizeof(int) * (size_t)g->n_prefix);
    gr->n_prompt = nid + g->n_prefix;

    GenConfig gc;
    gen_config_default(&gc);
    gc.n_samples = c->group;
    gc.max_new = rollout_max_new(c, gr->budget);
    gc.sampler.temperature = (float)c->temperature;
    gc.sampler.top_p = (float)c->top_p;
    gc.seed = rng_u64(&r);
    gc.adapter = &g->ad;
    gc.response_prefix = g->ad.reasoning_prefix;
    gen_samples_free(gr->s, c->group);
    GenStats gs;
    ER_CHECK(engine_generate(&g->eng, ids, nid, &gc, NULL, NULL, gr->s, &gs));
    *gen_tokens += gs.generated_tokens;
    gr->correct = 0;
    for (int i = 0; i < c->group; i++) {
        int ok = grade_response(gr->s[i].text, gr->s[i].answer_at, ex->answer);
        ER_CHECK(ok);
        gr->correct += ok;
        gr->reward[i] = (float)reward_total(ok, gr->s[i].n_tokens, gr->budget, c->barrier_m, c->barrier_p);
        gr->len[i] = gr->s[i].n_tokens;
    }
    gr->hash = 2166136261u;
    for (int i = 0; i < c->group; i++)
        for (int j = 0; j < gr->s[i].n_tokens; j++)
            gr->hash = (gr->hash ^ (uint32_t)gr->s[i].tokens[j]) * 16777619u;
done:
    er_free(ids);
    return rc;
}

// Rows of group p as a RolloutBatch: prompt + prefix, then the sample's tokens (adapter on from the prefix).
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
        g->clen[i] = gr->s[i].n_tokens;
    }
    return (RolloutBatch){G, T, g->tokens, g->mask, g->plen, g->clen};
}

// Under mpirun rank r rolled out groups [lo, hi) (dist_share): every rank gets every group's budget,
// grades, rewards, lengths and token hashes (and the tokens generated in all), so the advantages, the global
// token counts and the metrics are the same on every rank. A sum with zeros where a rank has no group.
static int share_groups(Grpo *g, int lo, int hi, long *gen_tokens) {
    int P = g->c->prompts, G = g->c->group, per = 3 + 2 * G, n = P * per + 1;
    double *v = er_calloc((size_t)n, sizeof(double));
    if (!v)
        return ER_ENOMEM;
    for (int p = lo; p < hi; p++) {
        const Group *gr = &g->groups[p];
        double *row = v + (size_t)p * per;
        row[0] = gr->budget;
        row[1] = gr->correct;
        row[2 + 2 * G] = gr->hash;
        for (int i = 0; i < G; i++) {
            row[2 + i] = gr->reward[i]; // a float: exact in a double
            row[2 + G + i] = gr->len[i];
        }
    }
    v[n - 1] = (double)*gen_tokens;
    int rc = dist_sum_doubles(v, n);
    for (int p = 0; p < P && rc == ER_OK; p++) {
        Group *gr = &g->groups[p];
        const double *row = v + (size_t)p * per;
        gr->budget = (int)row[0];
        gr->correct = (int)row[1];
        gr->hash = (uint32_t)row[2 + 2 * G];
        for (int i = 0; i < G; i++) {
            gr->reward[i] = (float)row[2 + i];
            gr->len[i] = (int)row[2 + G + i];
        }
    }
    *gen_tokens = (long)v[n - 1];
    er_free(v);
    return rc;
}

typedef struct {
    double reward, acc, len, over, clip, kl, entropy, flat, loss, gnorm, lr;
    double len_by_budget[MAX_BUDGETS];
    int n_by_budget[MAX_BUDGETS];
    double rollout_tps, train_tps;
    uint32_t rollout_hash; // the groups' hashes combined in prompt order
} StepMetrics;

static int grpo_step(Grpo *g, long step, StepMetrics *sm) {
    const GrpoConfig *c = g->c;
    int P = c->prompts, G = c->group;
    memset(sm, 0, sizeof *sm);
    double t0 = time_now();
    long gen_tokens = 0;
    int lo, hi; // this rank's prompt groups: whole groups, never split
    dist_share(P, dist_rank(), dist_size(), &lo, &hi);
    for (int p = lo; p < hi; p++)
        ER_TRY(rollout(g, step, p, &gen_tokens));
    ER_TRY(share_groups(g, lo, hi, &gen_tokens));
    double t1 = time_now();
    sm->rollout_tps = gen_tokens / (t1 - t0 + 1e-9);

    // Rewards, advantages, metrics of the rollouts.
    float *rewards = g->rewards;
    unsigned char flat[256];
    long over = 0, n = (long)P * G;
    for (int p = 0; p < P; p++) {
        Group *gr = &g->groups[p];
        int b = 0;
        while (b < g->n_budgets && g->budgets[b] != gr->budget)
            b++;
        for (int i = 0; i < G; i++) {
            rewards[p * G + i] = gr->reward[i];
            sm->reward += gr->reward[i];
            sm->len += gr->len[i];
            over += gr->len[i] > gr->budget;
            if (b < g->n_budgets) {
                sm->len_by_budget[b] += gr->len[i];
                sm->n_by_budget[b]++;
            }
        }
        sm->acc += gr->correct;
        sm->rollout_hash = (sm->rollout_hash ^ gr->hash) * 16777619u;
    }
    sm->reward /= n;
    sm->len /= n;
    sm->acc /= n;
    sm->over = (double)over / n;
    int n_flat = grpo_advantages(rewards, P, G, c->scale, g->adv, flat);
    sm->flat = (double)n_flat / P;

    // Global completion-token count (dapo) and the groups that take part.
    long tokens = 0;
    int used = 0;
    for (int p = 0; p < P; p++)
        if (!(c->drop_flat && flat[p])) {
            used++;
            for (int i = 0; i < G; i++)
                tokens += g->groups[p].len[i];
        }
    PolicyLossConfig lc = {c->eps, c->eps_high, c->beta, c->loss_type, g->max_new, (double)(tokens > 0 ? tokens : 1)};
    float inv_t = (float)(1.0 / c->temperature);
    long train_positions = 0;
    double t2 = time_now();
    for (int it = 0; it < c->iterations && used > 0; it++) {
        lora_zero_grad(&g->ad);
        double loss = 0, clip = 0, kl = 0, ent = 0, positions = 0;
        for (int p = lo; p < hi; p++) {
            if (c->drop_flat && flat[p])
                continue;
            Group *gr = &g->groups[p];
            RolloutBatch rb = group_batch(g, p);
            if (it == 0 && c->beta > 0)
                ER_TRY(policy_logprobs(&g->m, NULL, &g->acts, &rb, inv_t, gr->ref));
            if (it == 0 && c->iterations > 1)
                ER_TRY(policy_logprobs(&g->m, &g->ad, &g->acts, &rb, inv_t, gr->old));
            PolicyLossStats ps;
            ER_TRY(policy_step(&g->m, &g->ad, &g->acts, &rb, inv_t, c->iterations > 1 ? gr->old : NULL,
                               c->beta > 0 ? gr->ref : NULL, g->adv + (size_t)p * G, &lc, 1, g->logp, &ps));
            loss += ps.loss;
            clip += ps.clip_frac * ps.tokens;
            kl += ps.kl * ps.tokens;
            ent += ps.entropy * ps.tokens;
            positions += (double)rb.B * rb.T;
        }
        // The ranks' groups together: the sums of the step, then the gradient.
        double sums[5] = {loss, clip, kl, ent, positions};
        ER_TRY(dist_sum_doubles(sums, 5));
        loss = sums[0], clip = sums[1], kl = sums[2], ent = sums[3];
        train_positions += (long)sums[4];
        ER_TRY(dist_sum_floats(g->ad.grads, g->ad.n_params));
        // grpo, bnpo and dr_grpo normalise within a group: average the groups. dapo used the global count.
        if (c->loss_type != LOSS_DAPO) {
            float s = 1.0f / (float)used;
            for (size_t i = 0; i < g->ad.n_params; i++)
                g->ad.grads[i] *= s;
            loss /= used;
        }
        ER_TRY(clip_grad_norm(g->opt.be, g->ad.grads, g->ad.n_params, c->clip, &sm->gnorm));
        if (!isfinite(sm->gnorm))
            return er_error(ER_ERANGE, "grpo step %ld: the gradient is not finite", step + 1);
        long warm = c->warmup < 1 ? (long)(c->warmup * c->steps) : (long)c->warmup;
        sm->lr = lr_schedule(step, warm, c->steps, c->lr, 0.0);
        ER_TRY(adamw_step(&g->opt, g->ad.params, g->ad.grads, NULL, sm->lr));
        sm->loss = loss;
        sm->clip = tokens > 0 ? clip / tokens : 0;
        sm->kl = tokens > 0 ? kl / tokens : 0;
        sm->entropy = tokens > 0 ? ent / tokens : 0;
    }
    sm->train_tps = train_positions / (time_now() - t2 + 1e-9);
    return ER_OK;
}

static int write_metrics(Grpo *g, long step, const StepMetrics *sm) {
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return ER_ENOMEM;
    cJSON_AddNumberToObject(j, "step", (double)step);
    cJSON_AddNumberToObject(j, "reward", sm->reward);
    cJSON_AddNumberToObject(j, "accuracy", sm->acc);
    cJSON_AddNumberToObject(j, "length", sm->len);
    cJSON *lb = cJSON_AddObjectToObject(j, "length_by_budget");
    for (int b = 0; b < g->n_budgets; b++)
        if (sm->n_by_budget[b]) {
            char k[16];
            snprintf(k, sizeof k, "%d", g->budgets[b]);
            cJSON_AddNumberToObject(lb, k, sm->len_by_budget[b] / sm->n_by_budget[b]);
        }
    cJSON_AddNumberToObject(j, "over_budget", sm->over);
    cJSON_AddNumberToObject(j, "rollout_hash", sm->rollout_hash);
    cJSON_AddNumberToObject(j, "loss", sm->loss);
    cJSON_AddNumberToObject(j, "clip_fraction", sm->clip);
    cJSON_AddNumberToObject(j, "kl", sm->kl);
    cJSON_AddNumberToObject(j, "entropy", sm->entropy);
    cJSON_AddNumberToObject(j, "flat_groups", sm->flat);
    cJSON_AddNumberToObject(j, "grad_norm", sm->gnorm);
    cJSON_AddNumberToObject(j, "lr", sm->lr);
    cJSON_AddNumberToObject(j, "rollout_tokens_per_s", sm->rollout_tps);
    cJSON_AddNumberToObject(j, "train_tokens_per_s", sm->train_tps);
    cJSON_AddNumberToObject(j, "allreduce_s", round(dist_reduce_seconds() * 1000) / 1000); // as sft's
    int rc = metrics_write(&g->ml, j);
    cJSON_Delete(j);
    return rc;
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
    cJSON_AddNumberToObject(j, "epsilon", c->eps);
    cJSON_AddNumberToObject(j, "epsilon_high", c->eps_high);
    cJSON_AddNumberToObject(j, "beta", c->beta);
    cJSON_AddNumberToObject(j, "loss_type", c->loss_type);
    cJSON_AddNumberToObject(j, "iterations", c->iterations);
    cJSON_AddNumberToObject(j, "lr", c->lr);
    cJSON_AddNumberToObject(j, "warmup", c->warmup);
    cJSON_AddNumberToObject(j, "clip", c->clip);
    cJSON_AddNumberToObject(j, "weight_decay", c->weight_decay);
    cJSON_AddNumberToObject(j, "seq_len", g->seq_len);
    cJSON_AddNumberToObject(j, "adapter_dropout", g->dropout);
    cJSON_AddNumberToObject(j, "seed", c->seed);
    cJSON_AddNumberToObject(j, "threads", threads_get());
    cJSON_AddNumberToObject(j, "ranks", dist_size());
    return j;
}

// Continues the run in --out from its checkpoint (*start: the step it was at), or starts one there;
// writes run.json and opens metrics.jsonl.
static int grpo_start(Grpo *g, const char *ckpt, long *start) {
    const GrpoConfig *c = g->c;
    *start = 0;
    // run_dir_check said so already when --resume finds no checkpoint: the run starts from step 0.
    int resume = c->resume && checkpoint_exists(ckpt);
    if (resume) {
        ER_TRY(checkpoint_load(ckpt, &g->st, g->ad.params, g->ad.n_params, &g->opt));
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
    } else {
        rng_seed(&g->st.rng, (uint64_t)c->seed);
        if (!(g->st.config = config_json(g)))
            return ER_ENOMEM;
    }
    if (dist_rank() != 0) // rank 0 alone writes the run dir
        return ER_OK;
    ER_TRY(dir_make(c->out_dir));
    ER_TRY(run_write_json(c->out_dir, g->st.config));
    return metrics_open(&g->ml, c->out_dir, resume, *start);
}

static int save_adapter(void *ctx, const char *dir) { return peft_save((const LoraAdapter *)ctx, dir); }

// Rank 0 writes it, once every rank's adapter and optimizer state are seen to be the same.
static int grpo_save_checkpoint(Grpo *g, const char *ckpt) {
    ER_TRY(dist_check_same(g->ad.params, sizeof(float) * g->ad.n_params, "adapter parameters"));
    ER_TRY(dist_check_same(g->opt.m, sizeof(float) * g->ad.n_params, "AdamW moments"));
    return dist_rank() == 0 ? checkpoint_save(ckpt, &g->st, g->ad.params, g->ad.n_params, &g->opt) : ER_OK;
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
        if (dist_rank() == 0)
            ER_CHECK(write_metrics(&g, s + 1, &sm));
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
        char extra[160];
        snprintf(extra, sizeof extra, "reward %.3f acc %.2f len %.1f kl %.4f", sm.reward, sm.acc, sm.len, sm.kl);
        progress_update(&prog, s + 1, extra);
    }
    progress_end(&prog, NULL);
    g.ad.dropout = g.dropout; // saved as it came
    if (g.st.step == c->steps && dist_rank() == 0)
        ER_CHECK(run_write_outputs(c->out_dir, save_adapter, &g.ad));
done:
    er_free(ckpt);
    grpo_free(&g);
    return rc;
}
