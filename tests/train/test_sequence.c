// Training sequences: prompt / reasoning prefix / response / end token, the loss and adapter masks of
// the masked-LoRA rule, truncation, refusal of prompts that do not fit, and padded batches.
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "train/sequence.h"

static Tokenizer *tok;

static void setup(void) { cr_assert_eq(tok_load(&tok, "data/tiny_tokenizer"), ER_OK, "%s", er_last_error()); }
static void teardown(void) { tok_free(tok); }

static void example(Example *ex, const char *json) {
    cJSON *j = cJSON_Parse(json);
    cr_assert(j);
    cr_assert_eq(example_from_json(j, NULL, "test:1", ex), ER_OK, "%s", er_last_error());
    cJSON_Delete(j);
}

// "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n" in the tiny byte-level vocabulary:
// 508 <|im_start|>, 346 "user", 198 "\n" (Ċ), digits '2' '3' = 0x32-0x21 = 17, 18, '+' = 10, '?' = 30,
// 509 <|im_end|>, 282 "assistant". Prefix "<think>\n" = 510 198. Response "5 ok" = 20 ('5'), 394 (" o"),
// 74 ('k'). Then the end token 509.
static const int expect_tokens[] = {508, 346, 198, 17, 10, 18, 30, 509, 198, 508, 282, 198, 510, 198, 20, 394, 74, 509};
#define N_EXPECT ((int)(sizeof expect_tokens / sizeof expect_tokens[0]))

Test(sequence, prompt_prefix_response_masks, .init = setup, .fini = teardown) {
    SeqBuilder sb;
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 64, 0, 0), ER_OK, "%s", er_last_error());
    Example ex;
    example(&ex, "{\"prompt\": \"2+3?\", \"completion\": \"5 ok\"}");
    Sequence s;
    cr_assert_eq(seq_build(&sb, &ex, "test:1", &s), ER_OK, "%s", er_last_error());
    cr_assert_eq(s.n, N_EXPECT);
    for (int i = 0; i < N_EXPECT; i++)
        cr_assert_eq(s.tokens[i], expect_tokens[i], "token %d: %d, expected %d", i, s.tokens[i], expect_tokens[i]);
    cr_assert_eq(s.n_prompt, 12);
    cr_assert_eq(s.n_prefix, 2);
    cr_assert_eq(s.truncated, 0);
    // 17 input positions. Loss where the target is a response token or the end: t = 13..16 (targets 20,
    // 394, 74, 509); never where the target is a prompt or prefix token (t = 11 predicts <think>, t = 12 "\n").
    for (int t = 0; t < N_EXPECT - 1; t++) {
        cr_assert_eq(seq_loss_at(&sb, &s, t), t >= 13 ? 1.0f : 0.0f, "loss mask at %d", t);
        // adapter off on the prompt's input positions (0..11), on from the first prefix token (12) on
        cr_assert_eq(seq_adapter_at(&sb, &s, t), t >= 12, "adapter mask at %d", t);
    }
    cr_assert_eq(seq_loss_at(&sb, &s, N_EXPECT - 1), 0.0f, "the last token is no input position");
    sequence_free(&s);
    seq_builder_free(&sb);

    // Standard LoRA (--no-mask): the adapter is on everywhere, the loss mask is unchanged.
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 64, 0, 1), ER_OK);
    cr_assert_eq(seq_build(&sb, &ex, "test:1", &s), ER_OK);
    for (int t = 0; t < s.n - 1; t++) {
        cr_assert_eq(seq_adapter_at(&sb, &s, t), 1);
        cr_assert_eq(seq_loss_at(&sb, &s, t), t >= 13 ? 1.0f : 0.0f);
    }
    sequence_free(&s);
    seq_builder_free(&sb);

    // No prefix: the response follows the prompt at once; the last prompt position predicts it.
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "", 64, 0, 0), ER_OK);
    cr_assert_eq(seq_build(&sb, &ex, "test:1", &s), ER_OK);
    cr_assert_eq(s.n, N_EXPECT - 2);
    cr_assert_eq(s.n_prefix, 0);
    cr_assert_eq(s.tokens[12], 20);
    for (int t = 0; t < s.n - 1; t++) {
        cr_assert_eq(seq_loss_at(&sb, &s, t), t >= 11 ? 1.0f : 0.0f, "no-prefix loss mask at %d", t);
        cr_assert_eq(seq_adapter_at(&sb, &s, t), t >= 12, "no-prefix adapter mask at %d", t);
    }
    sequence_free(&s);
    seq_builder_free(&sb);

    // Pretraining: loss on every position, no prefix.
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "", 64, 1, 0), ER_OK);
    cr_assert_eq(seq_build(&sb, &ex, "test:1", &s), ER_OK);
    for (int t = 0; t < s.n - 1; t++)
        cr_assert_eq(seq_loss_at(&sb, &s, t), 1.0f);
    cr_assert_eq(s.tokens[s.n - 1], 509);
    sequence_free(&s);
    seq_builder_free(&sb);
    example_free(&ex);
}

Test(sequence, truncation_and_refusal, .init = setup, .fini = teardown) {
    Example ex;
    example(&ex, "{\"prompt\": \"2+3?\", \"completion\": \"5 ok\"}");
    SeqBuilder sb;
    Sequence s;
    // seq_len 15: 16 tokens kept = prompt, prefix, "5", " o"; "k" and the end token are cut.
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 15, 0, 0), ER_OK);
    cr_assert_eq(seq_build(&sb, &ex, "test:1", &s), ER_OK);
    cr_assert_eq(s.n, 16);
    cr_assert_eq(s.truncated, 1);
    cr_assert_eq(s.tokens[15], 394);
    for (int i = 0; i < s.n; i++)
        cr_assert_eq(s.tokens[i], expect_tokens[i]);
    cr_assert_eq(seq_loss_at(&sb, &s, 14), 1.0f);
    sequence_free(&s);
    seq_builder_free(&sb);

    // seq_len 14 = prompt + prefix: the first response token is still a target (position 13).
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 14, 0, 0), ER_OK);
    cr_assert_eq(seq_build(&sb, &ex, "test:1", &s), ER_OK);
    cr_assert_eq(s.n, 15);
    cr_assert_eq(s.tokens[14], 20);
    sequence_free(&s);
    seq_builder_free(&sb);

    // seq_len 13: no response target fits: refused, nothing allocated.
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 13, 0, 0), ER_OK);
    cr_assert_eq(seq_build(&sb, &ex, "test:1", &s), SEQ_TOO_LONG);
    cr_assert_null(s.tokens);
    seq_builder_free(&sb);
    example_free(&ex);

    // A record without a response is an error naming it.
    example(&ex, "{\"problem\": \"Start with 3. What is the result?\", \"answer\": \"3\"}");
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 64, 0, 0), ER_OK);
    int rc = seq_build(&sb, &ex, "data.jsonl:7", &s);
    cr_assert_lt(rc, 0);
    cr_assert(strstr(er_last_error(), "data.jsonl:7"), "%s", er_last_error());
    cr_assert(strstr(er_last_error(), "--response-key"), "%s", er_last_error());
    seq_builder_free(&sb);
    example_free(&ex);
}

Test(sequence, padded_batches, .init = setup, .fini = teardown) {
    SeqBuilder sb;
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 64, 0, 0), ER_OK);
    Example a, b;
    example(&a, "{\"prompt\": \"2+3?\", \"completion\": \"5 ok\"}");
    example(&b, "{\"prompt\": \"2+3?\", \"completion\": \"5\"}");
    Sequence s[2];
    cr_assert_eq(seq_build(&sb, &a, "t:1", &s[0]), ER_OK);
    cr_assert_eq(seq_build(&sb, &b, "t:2", &s[1]), ER_OK);
    cr_assert_eq(s[1].n, N_EXPECT - 2);
    Batch bt;
    cr_assert_eq(batch_alloc(&bt, 4, 32), ER_OK);
    int idx[2] = {1, 0}; // the short one first
    cr_assert_eq(batch_fill(&bt, &sb, s, idx, 2), ER_OK, "%s", er_last_error());
    cr_assert_eq(bt.B, 2);
    cr_assert_eq(bt.T, N_EXPECT - 1, "padded to the longest row");
    cr_assert_eq(bt.len[0], N_EXPECT - 3);
    cr_assert_eq(bt.len[1], N_EXPECT - 1);
    cr_assert_eq(bt.n_tokens, (N_EXPECT - 3) + (N_EXPECT - 1));
    cr_assert_eq(bt.n_loss, 2 + 4, "row 0 learns \"5\" and the end, row 1 four targets");
    int T = bt.T;
    for (int t = 0; t < T; t++) {
        // row 1 is the long sequence, unpadded
        cr_assert_eq(bt.tokens[T + t], expect_tokens[t]);
        cr_assert_eq(bt.targets[T + t], expect_tokens[t + 1]);
        if (t >= bt.len[0]) { // padding of row 0
            cr_assert_eq(bt.tokens[t], 0);
            cr_assert_eq(bt.targets[t], 0);
            cr_assert_eq(bt.loss_mask[t], 0.0f);
            cr_assert_eq(bt.adapter_mask[t], 0);
        }
    }
    cr_assert_eq(bt.targets[14], 509, "row 0: \"5\" then the end token");
    cr_assert_eq(bt.loss_mask[14], 1.0f);
    cr_assert_eq(bt.loss_mask[12], 0.0f, "prefix target left out of the loss");
    // A row longer than the batch was sized for is refused, not overrun.
    Batch small;
    cr_assert_eq(batch_alloc(&small, 2, 8), ER_OK);
    cr_assert_lt(batch_fill(&small, &sb, s, idx, 2), 0);
    cr_assert_lt(batch_fill(&small, &sb, s, idx, 3), 0);
    batch_free(&small);
    batch_free(&bt);
    sequence_free(&s[0]);
    sequence_free(&s[1]);
    example_free(&a);
    example_free(&b);
    seq_builder_free(&sb);
}

// The tiny tokenizer.json without its <|im_end|> added token, written to `dir`.
static void write_tokenizer_without_end(const char *dir) {
    cJSON *j;
    cr_assert_eq(json_parse_file("data/tiny_tokenizer/tokenizer.json", 1 << 24, &j), ER_OK, "%s", er_last_error());
    cJSON *added = cJSON_GetObjectItemCaseSensitive(j, "added_tokens");
    cr_assert(cJSON_IsArray(added));
    int n = cJSON_GetArraySize(added), removed = 0;
    for (int i = n - 1; i >= 0; i--) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(added, i), "content");
        if (cJSON_IsString(c) && strcmp(c->valuestring, "<|im_end|>") == 0) {
            cJSON_DeleteItemFromArray(added, i);
            removed++;
        }
    }
    cr_assert_eq(removed, 1);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(json_write_file(path, j), ER_OK, "%s", er_last_error());
    cJSON_Delete(j);
}

// Raw text: its tokens and <|endoftext|> (507), no chat template, loss everywhere; only pretraining
// takes it, SFT refuses it naming the record.
Test(sequence, raw_text_records, .init = setup, .fini = teardown) {
    Example ex, chat;
    example(&ex, "{\"text\": \"5 ok\"}");
    example(&chat, "{\"prompt\": \"2+3?\", \"completion\": \"5 ok\"}");
    SeqBuilder sb;
    Sequence s[2];
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "", 64, 1, 0), ER_OK);
    cr_assert_eq(sb.eot_id, 507);
    cr_assert_eq(seq_build(&sb, &ex, "t:1", &s[0]), ER_OK, "%s", er_last_error());
    static const int want[] = {20, 394, 74, 507};
    cr_assert_eq(s[0].n, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(s[0].tokens[i], want[i], "token %d: %d, expected %d", i, s[0].tokens[i], want[i]);
    cr_assert_eq(s[0].n_prompt, 0);
    cr_assert_eq(s[0].n_prefix, 0);
    cr_assert_eq(s[0].truncated, 0);
    for (int t = 0; t < 3; t++)
        cr_assert_eq(seq_loss_at(&sb, &s[0], t), 1.0f, "loss at %d", t);

    // Mixed with a chat record in one pretraining batch: the raw row is padded, its targets shifted.
    cr_assert_eq(seq_build(&sb, &chat, "t:2", &s[1]), ER_OK);
    Batch bt;
    cr_assert_eq(batch_alloc(&bt, 2, 32), ER_OK);
    int idx[2] = {0, 1};
    cr_assert_eq(batch_fill(&bt, &sb, s, idx, 2), ER_OK, "%s", er_last_error());
    cr_assert_eq(bt.T, N_EXPECT - 3, "chat row without prefix: prompt 12 + response 3 + end - 1");
    cr_assert_eq(bt.len[0], 3);
    cr_assert_eq(bt.targets[0], 394);
    cr_assert_eq(bt.targets[2], 507);
    cr_assert_eq(bt.loss_mask[3], 0.0f, "padding");
    cr_assert_eq(bt.n_loss, 3 + N_EXPECT - 3);
    batch_free(&bt);
    sequence_free(&s[1]);
    sequence_free(&s[0]);
    seq_builder_free(&sb);

    // Cut to seq_len + 1 tokens like any row.
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "", 2, 1, 0), ER_OK);
    cr_assert_eq(seq_build(&sb, &ex, "t:1", &s[0]), ER_OK);
    cr_assert_eq(s[0].n, 3);
    cr_assert_eq(s[0].truncated, 1);
    cr_assert_eq(s[0].tokens[2], 74);
    sequence_free(&s[0]);
    seq_builder_free(&sb);

    // SFT (no loss on prompts) has no response to take from raw text: refused, masked or not.
    for (int no_mask = 0; no_mask < 2; no_mask++) {
        cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, "<think>\n", 64, 0, no_mask), ER_OK);
        int rc = seq_build(&sb, &ex, "sft.jsonl:3", &s[0]);
        cr_assert_lt(rc, 0);
        cr_assert_null(s[0].tokens);
        cr_assert(strstr(er_last_error(), "sft.jsonl:3"), "%s", er_last_error());
        cr_assert(strstr(er_last_error(), "raw-text"), "%s", er_last_error());
        seq_builder_free(&sb);
    }
    example_free(&ex);
    example_free(&chat);
}

Test(sequence, needs_end_token, .init = setup, .fini = teardown) {
    SeqBuilder sb;
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, NULL, 1, 0, 0), ER_EINVAL, "seq_len 1 is refused");
    cr_assert_eq(seq_builder_init(&sb, tok, CHAT_CHATML, NULL, 8, 0, 0), ER_OK);
    cr_assert_eq(sb.end_id, 509);
    cr_assert_eq(sb.n_prefix, 0);
    seq_builder_free(&sb);

    char dir[] = "/tmp/er_test_seq_tokXXXXXX";
    cr_assert(mkdtemp(dir));
    write_tokenizer_without_end(dir);
    Tokenizer *t2;
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(tok_load(&t2, path), ER_OK, "%s", er_last_error());
    cr_assert_lt(seq_builder_init(&sb, t2, CHAT_CHATML, "<think>\n", 64, 0, 0), 0);
    cr_assert(strstr(er_last_error(), "<|im_end|>"), "%s", er_last_error());
    tok_free(t2);
    remove(path);
    rmdir(dir);
}
