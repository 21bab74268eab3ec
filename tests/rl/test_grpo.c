// GRPO's formulas on hand-computed cases, and the policy-loss gradient into the adapter against
// finite differences through the whole model.
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/threads.h"
#include "rl/grpo.h"
#include "rl/grpo_train.h"
#include "rl/policy.h"
#include "tests/common/helpers.h"
#include "tests/common/fd.h"

Test(grpo, soft_barrier_reward_table) {
    // B = 100, m = 0.2: L_low = 80, L_high = 120.
    struct { int correct, L, B; double m, p, want; } t[] = {
        {1, 10, 100, 0.2, 0.0, 1.0},   {1, 80, 100, 0.2, 0.0, 1.0},  {1, 81, 100, 0.2, 0.0, 0.975},
        {1, 100, 100, 0.2, 0.0, 0.5},  {1, 120, 100, 0.2, 0.0, 0.0}, {1, 121, 100, 0.2, 0.0, 0.0},
        {1, 100, 100, 0.2, 0.3, 0.65}, {1, 120, 100, 0.2, 0.3, 0.3}, {1, 500, 100, 0.2, 0.3, 0.3},
        {0, 10, 100, 0.2, 0.3, 0.0},   {0, 100, 100, 0.2, 0.3, 0.0}, {1, 64, 64, 0.0, 0.0, 1.0},
        {1, 65, 64, 0.0, 0.5, 0.5},    {1, 48, 64, 0.5, 0.0, 0.75},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        double r = reward_total(t[i].correct, t[i].L, t[i].B, t[i].m, t[i].p);
        cr_assert(fabs(r - t[i].want) < 1e-12, "case %zu: correct=%d L=%d B=%d m=%g p=%g -> %g, want %g", i,
                  t[i].correct, t[i].L, t[i].B, t[i].m, t[i].p, r, t[i].want);
    }
}

Test(grpo, advantages) {
    float r[8] = {1, 0, 0, 1, 0.5f, 0.5f, 0.5f, 0.5f}, adv[8];
    unsigned char flat[2];
    int nf = grpo_advantages(r, 2, 4, SCALE_GROUP, adv, flat);
    double s = sqrt(1.0 / 3.0); // sample std of {1, 0, 0, 1}
    cr_assert_eq(nf, 1);
    cr_assert(!flat[0] && flat[1]);
    cr_assert_float_eq(adv[0], 0.5 / (s + 1e-4), 1e-6);
    cr_assert_float_eq(adv[1], -0.5 / (s + 1e-4), 1e-6);
    for (int i = 4; i < 8; i++)
        cr_assert_eq(adv[i], 0.0f);
    grpo_advantages(r, 2, 4, SCALE_NONE, adv, flat);
    cr_assert_float_eq(adv[0], 0.5, 1e-7);
    grpo_advantages(r, 2, 4, SCALE_BATCH, adv, flat);
    double bm = 0.5, bs = 0;
    for (int i = 0; i < 8; i++)
        bs += (r[i] - bm) * (r[i] - bm);
    bs = sqrt(bs / 7);
    cr_assert_float_eq(adv[0], 0.5 / (bs + 1e-4), 1e-6);
}

// Two sequences (2 tokens and 1 token), rho = 1, advantages +1 and -3, no KL: per-token losses
// -1, -1, +3. Each loss type's normalisation by hand.
Test(grpo, loss_type_normalisation) {
    float lp[3] = {-1, -2, -0.5f}, adv[2] = {1, -3}, d[3];
    int off[2] = {0, 2}, len[2] = {2, 1};
    PolicyLossStats st;
    struct { LossType t; double want; } cases[] = {
        {LOSS_GRPO, (-1.0 + 3.0) / 2}, {LOSS_BNPO, 1.0 / 3}, {LOSS_DR_GRPO, 1.0 / (2 * 4)}, {LOSS_DAPO, 1.0 / 10}};
    for (int k = 0; k < 4; k++) {
        PolicyLossConfig c = {.eps = 0.2, .eps_high = 0.2, .type = cases[k].t, .max_completion_len = 4, .global_tokens = 10};
        cr_assert_eq(grpo_policy_loss(lp, lp, NULL, adv, off, len, 2, &c, d, &st), 0);
        cr_assert_float_eq(st.loss, cases[k].want, 1e-9, "loss type %d: %g vs %g", k, st.loss, cases[k].want);
    }
    // grpo: d/dlogp of token 0 = -A * rho / (len * n_seq) = -1 / 4
    PolicyLossConfig c = {.eps = 0.2, .eps_high = 0.2, .type = LOSS_GRPO};
    grpo_policy_loss(lp, lp, NULL, adv, off, len, 2, &c, d, &st);
    cr_assert_float_eq(d[0], -0.25, 1e-7);
    cr_assert_float_eq(d[2], 1.5, 1e-7);
}

Test(grpo, clipping) {
    // One token each: rho = 1.5 with A = +1 (clipped above 1.2), rho = 0.5 with A = +1 (not clipped),
    // rho = 0.5 with A = -1 (clipped below 0.8), rho = 1.5 with A = -1 (not clipped).
    float old[4] = {0, 0, 0, 0}, lp[4] = {(float)log(1.5), (float)log(0.5), (float)log(0.5), (float)log(1.5)};
    float adv[4] = {1, 1, -1, -1}, d[4];
    int off[4] = {0, 1, 2, 3}, len[4] = {1, 1, 1, 1};
    PolicyLossConfig c = {.eps = 0.2, .eps_high = 0.2, .type = LOSS_BNPO};
    PolicyLossStats st;
    cr_assert_eq(grpo_policy_loss(lp, old, NULL, adv, off, len, 4, &c, d, &st), 0);
    cr_assert_float_eq(st.clip_frac, 0.5, 1e-12);
    cr_assert_float_eq(st.loss, (-1.2 - 0.5 + 0.8 + 1.5) / 4, 1e-6);
    cr_assert_eq(d[0], 0.0f);
    cr_assert_float_eq(d[1], -0.5 / 4, 1e-6);
    cr_assert_eq(d[2], 0.0f);
    cr_assert_float_eq(d[3], 1.5 / 4, 1e-6);
    // eps_high widens only the upper side: rho = 1.5 is inside [0.8, 1.6].
    c.eps_high = 0.6;
    grpo_policy_loss(lp, old, NULL, adv, off, len, 4, &c, d, &st);
    cr_assert_float_eq(d[0], -1.5 / 4, 1e-6);
}

// d loss / d logp against finite differences, with KL and with clipping both active and inactive.
Test(grpo, loss_gradient_wrt_logprobs) {
    ErRng r;
    rng_seed(&r, 3);
    enum { S = 3, N = 9 };
    float lp[N], old[N], ref[N], adv[S] = {0.8f, -1.1f, 0.3f}, d[N], dd[N];
    int off[S] = {0, 4, 6}, len[S] = {4, 2, 3};
    for (int i = 0; i < N; i++) {
        old[i] = -1.0f - rng_uniform(&r);
        lp[i] = old[i] + 0.6f * (rng_uniform(&r) - 0.5f); // some ratios leave [0.8, 1.2]
        ref[i] = old[i] + 0.3f * (rng_uniform(&r) - 0.5f);
    }
    for (int t = 0; t < 4; t++) {
        PolicyLossConfig c = {.eps = 0.2, .eps_high = 0.28, .beta = 0.04, .type = (LossType)t, .max_completion_len = 5,
                              .global_tokens = 12};
        PolicyLossStats st;
        cr_assert_eq(grpo_policy_loss(lp, old, ref, adv, off, len, S, &c, d, &st), 0);
        cr_assert(st.clip_frac > 0 && st.clip_frac < 1, "the case must clip some tokens (%g)", st.clip_frac);
        for (int i = 0; i < N; i++) {
            float x0 = lp[i];
            const float h = 1e-3f;
            lp[i] = x0 + h;
            grpo_policy_loss(lp, old, ref, adv, off, len, S, &c, dd, &st);
            double a = st.loss;
            lp[i] = x0 - h;
            grpo_policy_loss(lp, old, ref, adv, off, len, S, &c, dd, &st);
            double b = st.loss;
            lp[i] = x0;
            double fd = (a - b) / (2 * h);
            cr_assert(fabs(fd - d[i]) <= 1e-3 * fabs(d[i]) + 2e-5, "loss type %d token %d: fd %g vs %g", t, i, fd, d[i]);
        }
    }
}

// Through the model: the policy loss's gradient into the adapter (masked, tempered log-probs, KL
// against the adapter-off reference, clipping active on some tokens) against finite differences.
Test(grpo, policy_gradient_into_adapter) {
    threads_set(1);
    ModelConfig mc = {.arch = ARCH_QWEN2, .C = 16, .FF = 24, .L = 2, .NH = 4, .NKV = 2, .HS = 4, .V = 11,
                      .max_pos = 64, .rope_theta = 10000.0f, .eps = 1e-6f, .tied = 1, .qkv_bias = 1,
                      .dtype = DT_F32, .bos_id = -1, .eos_id = -1};
    Model m;
    cr_assert_eq(model_build_random(&m, &mc, 0.3f, 5), 0);
    m.trainable = 0;
    LoraShape s = model_config_lora_shape(&mc);
    LoraAdapter ad;
    cr_assert_eq(lora_init(&ad, &s, 2, 4.0f, 0, 0.0f, LORA_ALL_TARGETS, 1, 7), 0);
    helper_perturb_adapter(&ad, 0.05f, 8);
    enum { B = 2, T = 7 };
    int tokens[B * T], prompt_len[B] = {3, 2}, comp_len[B] = {4, 3};
    uint8_t mask[B * T];
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            tokens[b * T + t] = (b * 5 + t * 3 + 1) % mc.V;
            mask[b * T + t] = t >= prompt_len[b];
        }
    RolloutBatch rb = {B, T, tokens, mask, prompt_len, comp_len};
    Activations a;
    cr_assert_eq(acts_alloc(&a, &mc, B, T, ACTS_TRAIN, 0), 0);
    float inv_t = 1.0f / 0.8f, old[16], ref[16], lp[16], adv[B] = {1.3f, -0.7f};
    cr_assert_eq(policy_logprobs(&m, NULL, &a, &rb, inv_t, ref), 0);
    cr_assert_eq(policy_logprobs(&m, &ad, &a, &rb, inv_t, old), 0);
    for (int i = 0; i < 7; i++) // an older policy: some ratios leave the clip range
        old[i] += (i % 3 == 0) ? 0.4f : -0.05f;
    PolicyLossConfig c = {.eps = 0.2, .eps_high = 0.2, .beta = 0.05, .type = LOSS_GRPO};
    PolicyLossStats st;
    lora_zero_grad(&ad);
    cr_assert_eq(policy_step(&m, &ad, &a, &rb, inv_t, old, ref, adv, &c, 1, lp, &st), 0);
    cr_assert(st.clip_frac > 0 && st.clip_frac < 1, "clip fraction %g", st.clip_frac);
    int checked = 0;
    for (int l = 0; l < mc.L; l++)
        for (int t = 0; t < LT_COUNT; t += 3) {
            LoraMat *mt = &ad.mats[l * LT_COUNT + t];
            float *ps[2] = {mt->A, mt->B}, *gs[2] = {mt->gA, mt->gB};
            size_t ns[2] = {(size_t)ad.r * mt->in, (size_t)mt->out * ad.r};
            for (int k = 0; k < 2; k++) {
                size_t best = fd_argmax_abs(gs[k], ns[k]);
                float w0 = ps[k][best];
                const float h = 1e-2f;
                PolicyLossStats s1, s2;
                ps[k][best] = w0 + h;
                policy_step(&m, &ad, &a, &rb, inv_t, old, ref, adv, &c, 0, lp, &s1);
                ps[k][best] = w0 - h;
                policy_step(&m, &ad, &a, &rb, inv_t, old, ref, adv, &c, 0, lp, &s2);
                ps[k][best] = w0;
                double fd = (s1.loss - s2.loss) / (2 * h), an = gs[k][best];
                cr_assert(fabs(an) > 1e-6, "layer %d target %d: zero gradient", l, t);
                cr_assert(fabs(fd - an) <= 2e-2 * fabs(an) + 1e-5, "layer %d %s lora_%s: fd %.6g vs %.6g", l,
                          lora_target_name((LoraTarget)t), k ? "B" : "A", fd, an);
                checked++;
            }
        }
    cr_assert(checked >= 8);
    acts_free(&a);
    lora_free(&ad);
    model_free(&m);
}

// The budget statement ends the record's own system message (kept: a record's instructions are part of
// its prompt), is a system message of its own when the record has none, or ends the last user message; a
// record with no user message to carry it is refused.
Test(grpo, budget_statement_placement) {
    GrpoConfig c;
    grpo_config_default(&c);
    c.data_path = "prompts.jsonl";
    ChatMessage with_sys[] = {{"system", "Be brief."}, {"user", "Start with 4. Add 2."}};
    Example ex = {.messages = with_sys, .n_messages = 2, .line = 3};
    char *text;
    cr_assert_eq(grpo_prompt_text(&c, CHAT_CHATML, &ex, 64, &text), ER_OK);
    cr_expect_str_eq(text, "<|im_start|>system\nBe brief.\nThink for at most 64 tokens.<|im_end|>\n"
                           "<|im_start|>user\nStart with 4. Add 2.<|im_end|>\n<|im_start|>assistant\n");
    er_free(text);
    Example no_sys = {.messages = with_sys + 1, .n_messages = 1, .line = 4};
    cr_assert_eq(grpo_prompt_text(&c, CHAT_CHATML, &no_sys, 64, &text), ER_OK);
    cr_expect_str_eq(text, "<|im_start|>system\nThink for at most 64 tokens.<|im_end|>\n"
                           "<|im_start|>user\nStart with 4. Add 2.<|im_end|>\n<|im_start|>assistant\n");
    er_free(text);

    c.budget_in = BUDGET_IN_USER;
    c.budget_template = "Budget: {budget}.";
    cr_assert_eq(grpo_prompt_text(&c, CHAT_CHATML, &ex, 32, &text), ER_OK);
    cr_expect_str_eq(text, "<|im_start|>system\nBe brief.<|im_end|>\n"
                           "<|im_start|>user\nStart with 4. Add 2. Budget: 32.<|im_end|>\n<|im_start|>assistant\n");
    er_free(text);

    ChatMessage sys_only[] = {{"system", "Be brief."}};
    Example bad = {.messages = sys_only, .n_messages = 1, .line = 7};
    cr_expect_eq(grpo_prompt_text(&c, CHAT_CHATML, &bad, 32, &text), ER_EINVAL);
    cr_expect(strstr(er_last_error(), "prompts.jsonl:7") != NULL, "%s", er_last_error());
}

// One length L: the budget factor counts the thinking through </think> (GenSample.think_len), not the answer
// after it nor the EOS. 18 thinking tokens and a one-token close (L = 19 <= (1 - m) B = 19.2) then 10
// answer tokens and EOS (30 generated) at B = 24, m = 0.2 earn the full factor; 20 thinking tokens
// (L = 21) are 1.8 tokens into the ramp: 1 - 1.8 / 9.6. Counting every generated token gave both 0.
Test(grpo, reward_counts_L_not_the_answer) {
    GrpoConfig c;
    grpo_config_default(&c);
    char text[] = "add 3 to 4 ... 7\n</think>\n\nFinal answer: 7";
    GenSample s = {.text = text, .n_tokens = 30, .think_len = 19, .answer_at = -1, .finish = FINISH_EOS};
    GrpoSampleReward r;
    cr_assert_eq(grpo_sample_reward(&c, &s, 1, 24, "7", &r), ER_OK);
    cr_assert_eq(r.correct, 1);
    cr_assert_eq(r.length, 19);
    cr_assert_float_eq(r.budget_term, 1.0, 1e-12);
    s.think_len = 21, s.n_tokens = 32;
    cr_assert_eq(grpo_sample_reward(&c, &s, 1, 24, "7", &r), ER_OK);
    cr_assert_float_eq(r.budget_term, 1.0 - 1.8 / 9.6, 1e-9);
    // The same answer with its think block never closed: wrong and unformatted, whatever its length.
    char open_text[] = "add 3 to 4 so the answer: 7. Wait";
    GenSample u = {.text = open_text, .n_tokens = 12, .think_len = 12, .answer_at = -1, .finish = FINISH_LENGTH};
    cr_assert_eq(grpo_sample_reward(&c, &u, 1, 24, "7", &r), ER_OK);
    cr_assert_eq(r.correct, 0);
    cr_assert_eq(r.unformatted, 1);
    cr_assert_eq(r.reward, 0.0);
}

// Qwen3's native thinking: the model opens the block itself (nothing forced, think_open 0) and the
// answer after its close is graded, the length L counting the whole block; an answer inside a block
// that never closed is no answer either way.
Test(grpo, reward_on_native_thinking) {
    GrpoConfig c;
    grpo_config_default(&c);
    char text[] = "<think>\nadd 3 to 4 ... the answer: 9\n</think>\n\nFinal answer: 7";
    GenSample s = {.text = text, .n_tokens = 30, .think_len = 19, .answer_at = -1, .finish = FINISH_EOS};
    GrpoSampleReward r;
    cr_assert_eq(grpo_sample_reward(&c, &s, 0, 24, "7", &r), ER_OK);
    cr_assert_eq(r.correct, 1, "the answer after </think>, not the 9 inside it");
    cr_assert_eq(r.length, 19);
    cr_assert_float_eq(r.budget_term, 1.0, 1e-12);
    char open_text[] = "<think>\nadd 3 to 4 so the answer: 7. Wait";
    GenSample u = {.text = open_text, .n_tokens = 12, .think_len = 12, .answer_at = -1, .finish = FINISH_LENGTH};
    cr_assert_eq(grpo_sample_reward(&c, &u, 0, 24, "7", &r), ER_OK);
    cr_assert_eq(r.correct, 0);
    cr_assert_eq(r.unformatted, 1);
}
