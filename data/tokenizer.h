// Hugging Face byte-level BPE tokenizer (tokenizer.json), exact against `tokenizers`:
// added tokens are split out of the raw text first (leftmost-longest, with lstrip / rstrip /
// single_word / normalized), the rest is normalized (NFC via utf8proc), split by the
// pre-tokenizer regex (PCRE2, UTF + UCP), byte-level mapped and merged by BPE rank.
//
// Encoding never adds special tokens (HF `add_special_tokens=False`): chat templates and
// training code place BOS/EOS themselves. A loaded Tokenizer is read-only apart from an
// internal word cache that is safe to share, so any number of threads may encode and decode
// with one Tokenizer at the same time.
#ifndef DATA_TOKENIZER_H
#define DATA_TOKENIZER_H

#include <stddef.h>

#include "core/gguf.h"
#include "core/json.h"

typedef struct Tokenizer Tokenizer;

// `path_or_dir` is a tokenizer.json, a model dir holding one, or a GGUF model file (".gguf": the
// tokenizer.ggml.* arrays of llama.cpp's gpt2 BPE with pre-tokenizer "qwen2"; the special ids from
// tokenizer.ggml.eos/eot/padding/bos_token_id). tokenizer_config.json
// (eos_token, pad_token, bos_token) and generation_config.json (eos_token_id, int or list)
// next to it are read when present. Unsupported features are refused with a message naming
// the file and the field.
int tok_load(Tokenizer **out, const char *path_or_dir);
// The same from a GGUF file already open (gguf_open_bytes: a buffer, an fd); f is only read during the call.
int tok_load_gguf(Tokenizer **out, const GgufFile *f);
// The same from texts in memory: tokenizer.json, and tokenizer_config.json and generation_config.json where
// given (NULL or a NULL text: absent, as a file missing beside tokenizer.json). Messages name them by their
// JsonText names.
int tok_load_texts(Tokenizer **out, const JsonText *tokenizer, const JsonText *config, const JsonText *generation);
void tok_free(Tokenizer *tok);

// UTF-8 text (need not be NUL-terminated; may contain NUL) -> token ids in a new array
// (free with er_free; *ids may be NULL when *n == 0). Added tokens in the text are parsed.
// Invalid UTF-8 is refused (ER_EINVAL, naming the byte offset).
int tok_encode(const Tokenizer *tok, const char *text, size_t len, int **ids, int *n);

// Same, with `special_as_text` != 0 treating special added tokens as plain text (HF
// `split_special_tokens=True`): use it for untrusted user text that must not inject
// control tokens.
int tok_encode_ex(const Tokenizer *tok, const char *text, size_t len, int special_as_text, int **ids,
                  int *n);

// Token ids -> UTF-8 text in a new NUL-terminated buffer (free with er_free). Byte sequences
// that are not valid UTF-8 become U+FFFD exactly as Rust's String::from_utf8_lossy does.
// An id with no token is an error (ER_ERANGE).
int tok_decode(const Tokenizer *tok, const int *ids, int n, char **text, size_t *len);

// n raw bytes -> valid UTF-8 in a new NUL-terminated buffer (free with er_free), with the same
// U+FFFD rule as tok_decode. Streaming callers convert pieces cut at tok_utf8_complete.
int tok_text_from_bytes(const char *bytes, size_t n, char **text, size_t *len);
// How many of n raw bytes more bytes cannot change under tok_text_from_bytes: all but a trailing
// UTF-8 sequence that is incomplete yet well-formed so far. Converting a stream in pieces cut there
// gives exactly the conversion of the whole.
size_t tok_utf8_complete(const char *bytes, size_t n);

// Raw bytes of one token (before UTF-8 repair): what it contributes to a decode. NULL for an
// id with no token. Useful for streaming output token by token.
const char *tok_token_bytes(const Tokenizer *tok, int id, size_t *len);

// The special tokens HF's add_special_tokens=True puts around one text: tokenizer.json's TemplateProcessing
// post-processor ("single"), *n_pre ids before it and the returned count after it (ids owned by the tokenizer).
// None for the Qwen language models; Qwen3-Embedding appends <|endoftext|>. Encoding never adds them: callers that
// want them (embeddings) do.
enum { TOK_MAX_TEMPLATE = 4 };
int tok_template(const Tokenizer *tok, const int **pre, int *n_pre, const int **post);

// Number of ids: the largest id of the vocabulary or the added tokens, plus one.
int tok_vocab_size(const Tokenizer *tok);
// Id of a vocabulary entry as written in tokenizer.json (byte-level form, e.g. "Ġthe") or
// of an added token's content ("<|im_end|>"); -1 when absent.
int tok_token_id(const Tokenizer *tok, const char *name);
// Vocabulary string of an id as written in tokenizer.json; NULL when the id has none.
const char *tok_token_str(const Tokenizer *tok, int id);
int tok_is_special(const Tokenizer *tok, int id); // a `special` added token

// Ids from tokenizer_config.json / generation_config.json; -1 when not configured.
int tok_eos_id(const Tokenizer *tok); // tokenizer_config eos_token, else the first generation eos
int tok_pad_id(const Tokenizer *tok);
int tok_bos_id(const Tokenizer *tok);
// All end-of-sequence ids (tokenizer_config eos_token and every generation_config
// eos_token_id, without repeats). Returns the count; *ids stays owned by the tokenizer.
int tok_eos_ids(const Tokenizer *tok, const int **ids);
int tok_is_eos(const Tokenizer *tok, int id);

// The tokenizer as llama.cpp's tokenizer.ggml.* keys for a model of n_vocab ids (>= tok_vocab_size): model
// "gpt2", pre "qwen2" (refused unless the pre-tokenizer is Qwen2's split), tokens and token types (normal;
// control for special added tokens, user defined for the others; ids without a token "[PAD<id>]", unused,
// as llama.cpp's converter writes), merges in rank order, eos / padding / bos ids, add_bos_token false.
int tok_gguf_put(const Tokenizer *tok, int n_vocab, GgufWriter *w);
// The tokenizer of a GGUF model file as dir/tokenizer.json and dir/tokenizer_config.json (special tokens,
// chat template): what commands that write a model dir from a GGUF base put beside it.
int tok_gguf_write_json(const char *gguf, const char *dir);

#endif
