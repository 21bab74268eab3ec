#include "train/sequence.h"

#include <string.h>

#include "core/alloc.h"
#include "core/error.h"

int seq_builder_init(SeqBuilder *sb, const Tokenizer *tok, ChatStyle style, const char *prefix, int seq_len,
                     int loss_all, int no_mask) {
    memset(sb, 0, sizeof *sb);
    if (seq_len < 2)
        return er_error(ER_EINVAL, "sequence length %d is too short (need at least 2 positions)", seq_len);
    sb->tok = tok;
    sb->style = style;
    sb->seq_len = seq_len;
    sb->loss_all = loss_all;
    sb->no_mask = no_mask;
    sb->end_id = tok_token_id(tok, "<|im_end|>");
    if (sb->end_id < 0)
        return er_error(ER_EINVAL, "tokenizer has no <|im_end|> token to end responses with");
    sb->eot_id = tok_token_id(tok, "<|endoftext|>");
    if (prefix && prefix[0]) {
        int rc = tok_encode(tok, prefix, strlen(prefix), &sb->prefix, &sb->n_prefix);
        if (rc < 0)
            return er_error_prefix(rc, "reasoning prefix");
    }
    return ER_OK;
}

void seq_builder_free(SeqBuilder *sb) {
    er_free(sb->prefix);
    memset(sb, 0, sizeof *sb);
}

void sequence_free(Sequence *s) {
    er_free(s->tokens);
    memset(s, 0, sizeof *s);
}

// Raw text: its tokens, then <|endoftext|> so the model learns where a document ends.
static int seq_build_text(const SeqBuilder *sb, const Example *ex, const char *ctx, Sequence *out) {
    if (!sb->loss_all)
        return er_error(ER_EFORMAT, "%s: a raw-text {\"text\"} record has no prompt or response; only pretraining "
                        "and QAT use it (remove it from SFT data)", ctx);
    int *t = NULL, nt = 0;
    int rc = tok_encode(sb->tok, ex->text, strlen(ex->text), &t, &nt);
    if (rc < 0)
        return er_error_prefix(rc, "%s", ctx);
    long full = (long)nt + (sb->eot_id >= 0);
    if (full < 2)
        ER_CHECK(er_error(ER_EFORMAT, "%s: the text renders to %ld token(s); a row needs at least 2", ctx, full));
    int n = full > sb->seq_len + 1 ? sb->seq_len + 1 : (int)full;
    int *grown = er_realloc_array(t, (size_t)n, sizeof *t);
    if (!grown)
        ER_CHECK(ER_ENOMEM);
    t = grown;
    if (nt < n)
        t[nt] = sb->eot_id;
    out->tokens = t;
    out->n = n;
    out->truncated = full > n;
    t = NULL; // out owns it
done:
    er_free(t);
    return rc;
}

// The rendered prompt's tokens, then the response's.
static int encode_parts(const SeqBuilder *sb, const Example *ex, int **prompt, int *np, int **resp, int *nr) {
    char *text = NULL;
    size_t text_len = 0;
    ER_TRY(chat_render(sb->style, ex->messages, ex->n_messages, CHAT_ADD_GENERATION_PROMPT, &text, &text_len));
    int rc = tok_encode(sb->tok, text, text_len, prompt, np);
    er_free(text);
    ER_TRY(rc);
    // The response is tokenized on its own, after the prefix, exactly as the runtime sees it: the prefix
    // is forced token by token and the model continues from there.
    return tok_encode(sb->tok, ex->response, strlen(ex->response), resp, nr);
}

int seq_build(const SeqBuilder *sb, const Example *ex, const char *ctx, Sequence *out) {
    memset(out, 0, sizeof *out);
    if (ex->text)
        return seq_build_text(sb, ex, ctx, out);
    if (!ex->response)
        return er_error(ER_EFORMAT, "%s: record has no response to train on (choose its field with --response-key)",
                        ctx);
    int *prompt = NULL, *resp = NULL, np = 0, nr = 0;
    int rc = encode_parts(sb, ex, &prompt, &np, &resp, &nr);
    if (rc < 0)
        ER_CHECK(er_error_prefix(rc, "%s", ctx));
    if (np == 0)
        ER_CHECK(er_error(ER_EFORMAT, "%s: the prompt renders to no tokens", ctx));
    // The first response token must be a target inside the row: prompt + prefix <= seq_len positions.
    if (np + sb->n_prefix > sb->seq_len) {
        rc = SEQ_TOO_LONG;
        goto done;
    }
    long full = (long)np + sb->n_prefix + nr + 1;
    int n = full > sb->seq_len + 1 ? sb->seq_len + 1 : (int)full;
    int *t = er_alloc(sizeof(int) * (size_t)n);
    if (!t)
        ER_CHECK(ER_ENOMEM);
    int k = 0;
    for (int i = 0; i < np; i++)
        t[k++] = prompt[i];
    for (int i = 0; i < sb->n_prefix; i++)
        t[k++] = sb->prefix[i];
    for (int i = 0; i < nr && k < n; i++)
        t[k++] = resp[i];
    if (k < n)
        t[k++] = sb->end_id;
    out->tokens = t;
    out->n = n;
    out->n_prompt = np;
    out->n_prefix = sb->n_prefix;
    out->truncated = full > n;
done:
    er_free(prompt);
    er_free(resp);
    return rc;
}

float seq_loss_at(const SeqBuilder *sb, const Sequence *s, int t) {
    if (t < 0 || t >= s->n - 1)
        return 0.0f;
    if (sb->loss_all)
        return 1.0f;
    return t + 1 >= s->n_prompt + s->n_prefix ? 1.0f : 0.0f;
}

uint8_t seq_adapter_at(const SeqBuilder *sb, const Sequence *s, int t) {
    if (t < 0 || t >= s->n - 1)
        return 0;
    return sb->no_mask || t >= s->n_prompt;
}

int batch_alloc(Batch *b, int cap_B, int cap_T) {
    memset(b, 0, sizeof *b);
    if (cap_B < 1 || cap_T < 1)
        return er_error(ER_EINVAL, "batch: %d rows x %d positions is empty", cap_B, cap_T);
    size_t N = (size_t)cap_B * cap_T;
    b->tokens = er_calloc(N, sizeof(int));
    b->targets = er_calloc(N, sizeof(int));
    b->loss_mask = er_calloc(N, sizeof(float));
    b->adapter_mask = er_calloc(N, 1);
    b->len = er_calloc((size_t)cap_B, sizeof(int));
    if (!b->tokens || !b->targets || !b->loss_mask || !b->adapter_mask || !b->len) {
        batch_free(b);
        return ER_ENOMEM;
    }
    b->cap_B = cap_B;
    b->cap_T = cap_T;
    return ER_OK;
}

void batch_free(Batch *b) {
    er_free(b->tokens);
    er_free(b->targets);
    er_free(b->loss_mask);
    er_free(b->adapter_mask);
    er_free(b->len);
    memset(b, 0, sizeof *b);
}

int batch_fill(Batch *b, const SeqBuilder *sb, const Sequence *seqs, const int *idx, int n) {
    if (n < 1 || n > b->cap_B)
        return er_error(ER_EINVAL, "batch: %d rows do not fit a batch of %d", n, b->cap_B);
    int T = 0;
    for (int i = 0; i < n; i++) {
        int len = seqs[idx[i]].n - 1;
        if (len < 1 || len > b->cap_T)
            return er_error(ER_EINVAL, "batch: a row of %d positions does not fit %d", len, b->cap_T);
        T = len > T ? len : T;
    }
    b->B = n;
    b->T = T;
    b->n_tokens = b->n_loss = 0;
    for (int i = 0; i < n; i++) {
        const Sequence *s = &seqs[idx[i]];
        int len = s->n - 1;
        b->len[i] = len;
        b->n_tokens += len;
        for (int t = 0; t < T; t++) {
            size_t p = (size_t)i * T + t;
            int valid = t < len;
            b->tokens[p] = valid ? s->tokens[t] : 0;
            b->targets[p] = valid ? s->tokens[t + 1] : 0;
            b->loss_mask[p] = seq_loss_at(sb, s, t);
            b->adapter_mask[p] = seq_adapter_at(sb, s, t);
            b->n_loss += b->loss_mask[p] != 0.0f;
        }
    }
    return ER_OK;
}
