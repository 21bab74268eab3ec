// Training sequences: an Example rendered with the model's chat template and tokenized into
//   [prompt (chat template + generation prompt)] [reasoning prefix] [response] [<|im_end|>]
// with, per input position t (target = tokens[t+1]):
//   loss mask    1 where the target is a response token or the end token (SFT), or everywhere
//                (pretraining and QAT: every token of the conversation);
//   adapter mask 0 on prompt input positions, 1 from the first prefix token on (the masked-LoRA
//                rule, docs/design.md), or 1 everywhere for standard LoRA (--no-mask).
// A raw-text Example ({"text"} record) is [text tokens] [<|endoftext|>] with no chat template: loss on
// every position, n_prompt = n_prefix = 0. Only pretraining and QAT (loss_all) take it; SFT refuses it,
// since it has no response to train an adapter on.
// A row has at most seq_len input positions (seq_len + 1 tokens); longer sequences are cut, and an
// example whose prompt and prefix alone leave no response target inside seq_len is refused.
#ifndef TRAIN_SEQUENCE_H
#define TRAIN_SEQUENCE_H

#include <stdint.h>

#include "data/chat.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

typedef struct {
    const Tokenizer *tok;
    ChatStyle style;
    int *prefix;        // (n_prefix) reasoning prefix ids; NULL when empty
    int n_prefix;
    int end_id;         // <|im_end|>
    int eot_id;         // <|endoftext|> ending raw text; -1 when the tokenizer has none
    int seq_len;        // most input positions per row
    int loss_all;       // pretraining: loss on every position
    int no_mask;        // adapter on at every position
} SeqBuilder;

typedef struct {
    int *tokens;   // (n) prompt, prefix, response, end (maybe cut)
    int n;         // tokens; the row has n - 1 input positions
    int n_prompt;  // prompt tokens
    int n_prefix;  // prefix tokens kept
    int truncated; // the sequence was cut to seq_len + 1 tokens
} Sequence;

// `prefix` may be NULL or "" (no reasoning prefix). Errors when the tokenizer has no <|im_end|>.
int seq_builder_init(SeqBuilder *sb, const Tokenizer *tok, ChatStyle style, const char *prefix, int seq_len,
                     int loss_all, int no_mask);
void seq_builder_free(SeqBuilder *sb);

#define SEQ_TOO_LONG 1 // seq_build: the prompt (and prefix) alone leaves no response target

// Returns ER_OK, SEQ_TOO_LONG (nothing allocated), or a negative status. `ctx` names the example in
// errors ("train.jsonl:12"). An example without a response is an error, and so is a raw-text example
// when the builder is not pretraining.
int seq_build(const SeqBuilder *sb, const Example *ex, const char *ctx, Sequence *out);
void sequence_free(Sequence *s);

// Per-position masks of one sequence's n - 1 input positions.
float seq_loss_at(const SeqBuilder *sb, const Sequence *s, int t);
uint8_t seq_adapter_at(const SeqBuilder *sb, const Sequence *s, int t);

// B rows right-padded to the longest (pad id 0, masks 0, targets 0 on padding).
typedef struct {
    int cap_B, cap_T;
    int B, T;
    int *tokens;           // (B, T)
    int *targets;          // (B, T)
    float *loss_mask;      // (B, T)
    uint8_t *adapter_mask; // (B, T)
    int *len;              // (B) valid input positions per row
    long n_tokens;         // valid input positions in the batch
    long n_loss;           // positions with loss
} Batch;

int batch_alloc(Batch *b, int cap_B, int cap_T);
void batch_free(Batch *b);
// Fills b from seqs[idx[0..n)] (n <= cap_B, every row <= cap_T input positions).
int batch_fill(Batch *b, const SeqBuilder *sb, const Sequence *seqs, const int *idx, int n);

#endif
