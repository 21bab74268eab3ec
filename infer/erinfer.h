// erinfer: the on-device runtime as a small C library. Load a model dir, open a session, generate
// with a per-token streaming callback, read the samples and stats, free. No global state beyond
// the thread's last error message; no call exits or aborts: failures return a negative ErStatus and
// er_last_error() says why in one line. Every function checks its pointers: a NULL is an error
// status (or a NULL result), never a crash.
//
// Ownership: each object is freed once, by its own *_free (NULL is a no-op). An ErModel owns its
// weights, tokenizer, adapter and heads; an ErSession owns its KV cache and the results of its last
// call. A session holds a reference on its model: er_model_free with sessions still open only marks
// the model (it takes no new sessions, adapters or heads) and the last er_session_free releases it,
// so either free order is safe; likewise a batch, and an ErRequest stays its caller's until
// er_request_free, before or after er_batch_free. Whatever you pass in (paths, messages, ErGenParams
// and the strings it points to) is read during the call only: the library keeps its own copy (one exception:
// a model buffer lent with ER_MODEL_SOURCE_BORROW, see er_model_load_from_buffer).
//
// Lifetimes of returned pointers: er_result_sample, er_result_stats, er_result_route and everything
// they point to (text, tokens, answers, votes) belong to the session and stay valid until its next
// generate call (whatever its outcome) or er_session_free. er_last_error points to a buffer of the
// calling thread, rewritten by its next failing call. er_version and er_status_name return static
// strings.
//
// Threads and callbacks: a session's (or a batch's) work, its prefill, decode, sampling and heads, runs
// on ErSessionParams.n_threads threads: the calling thread and workers of its own (OpenMP keeps the
// count per thread), so two sessions of 1 thread each generating on two threads of the app run side by
// side, one core each, and neither changes the count of the app's other threads. A session (or a batch)
// takes one call at a time. A second er_generate* on a session while one runs, from its own token
// callback or from another thread, returns ER_EINVAL ("in use") and changes nothing; er_session_free
// meanwhile stops the running call, which frees the session as it returns (no callback runs after the
// free). Several sessions of one model may generate on different threads at once (they read the model
// only). er_model_load_* while a generation runs on the model (a generate call, or a batch request from
// submission to its end) returns ER_EINVAL, as does a generation starting during a load: load between
// generations. Opening and freeing sessions and batches may overlap calls on other sessions;
// er_model_free must follow every other call on the model (its sessions and batches keep it alive).
// These checks cost a few atomic operations per call and catch misuse, they do not queue calls.
// er_last_error is per thread. The library's own callbacks (ErCallbacks: log, progress, abort) run on
// the thread of the call that reports, never on a worker.
//
// Structs the caller fills (ErSessionParams, ErGenParams, ErCallbacks) start with `size`: fill them with
// their *_init, which sets every default and `size` = sizeof as this header has it. The library reads the
// first `size` bytes: a caller built against an older header (a smaller size) gets the defaults of the
// fields added since; a size past what the library knows is accepted when the bytes it does not know are
// zero (fields a newer header added, left at their default), and refused (ER_EINVAL) when they are not, as
// is a size below the struct's first version or over 1024 bytes past what the library knows (a struct never
// initialised). Later versions only add fields at the end, each with zero meaning what the library did
// before it. The *_init are inline so that sizeof is the caller's; bindings that cannot call them (ctypes,
// Dart FFI) call er_*_init_size(p, sizeof) themselves.
//
//     ErModel *m;  ErSession *s;
//     if (er_model_load(&m, "qwen2.5-0.5b-instruct") < 0) puts(er_last_error());
//     ErSessionParams sp;  er_session_params_init(&sp); // 1 sample, 2048 positions, f32 KV, all cores
//     er_session_open(&s, m, &sp);
//     ErGenParams p;  er_gen_params_init(&p);
//     ErMessage msg = {"user", "What is 7 * 6?"};
//     er_generate(s, &msg, 1, &p, print_token, NULL);
//     printf("%s\n", er_result_sample(s, 0)->text);
//     er_session_free(s);  er_model_free(m);
#ifndef ERINFER_H
#define ERINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Every public function carries ER_API, the one default visibility in a library compiled with
// -fvisibility=hidden: liberinfer.so and the shipped liberinfer.a export these functions and nothing else
// (docs/api.md). A Windows DLL build would define ER_SHARED (and ER_BUILD while compiling the library).
#if defined(_WIN32) && defined(ER_SHARED)
#ifdef ER_BUILD
#define ER_API __declspec(dllexport)
#else
#define ER_API __declspec(dllimport)
#endif
#elif defined(__GNUC__)
#define ER_API __attribute__((visibility("default")))
#else
#define ER_API
#endif

#define ER_VERSION_MAJOR 0
#define ER_VERSION_MINOR 2
#define ER_VERSION_PATCH 0
#define ER_VERSION_STR_(x) #x
#define ER_VERSION_STR(x) ER_VERSION_STR_(x)
#define ER_VERSION_STRING \
    ER_VERSION_STR(ER_VERSION_MAJOR) "." ER_VERSION_STR(ER_VERSION_MINOR) "." ER_VERSION_STR(ER_VERSION_PATCH)
// The library's version, "MAJOR.MINOR.PATCH": compare with ER_VERSION_STRING, the header's.
ER_API const char *er_version(void);

// Statuses: every call that can fail returns ER_OK (0) or one of these negative codes.
#ifndef ER_STATUS_DEFINED // core/error.h, inside the library, defines the same codes
#define ER_STATUS_DEFINED
typedef enum {
    ER_OK = 0,
    ER_EINVAL = -1,       // bad argument or value
    ER_EIO = -2,          // open/read/write failed
    ER_ENOMEM = -3,       // allocation failed or would not fit
    ER_EFORMAT = -4,      // malformed file contents
    ER_EUNSUPPORTED = -5, // valid but not supported by this build
    ER_ERANGE = -6,       // value out of range
    ER_EABORTED = -7,     // stopped by the caller's abort callback
} ErStatus;
#endif
// A status's name ("invalid argument"); "unknown status" for any other value.
ER_API const char *er_status_name(int status);
// The calling thread's last failure in one line, naming the file, field or argument; "no error" before any.
ER_API const char *er_last_error(void);

typedef struct ErModel ErModel;     // weights, tokenizer and chat template of one model dir
typedef struct ErSession ErSession; // KV cache and buffers for one conversation; reuses its prompt

typedef struct {
    const char *role;    // "system" | "user" | "assistant"
    const char *content;
} ErMessage;

// Stop strings per call and bytes per stop string: each sample matches them incrementally (KMP) in a
// fixed-size table it owns, so a stream never allocates.
enum { ER_STOP_MAX = 8, ER_STOP_MAX_LEN = 256 };
// ErGenParams.top_logprobs at most (OpenAI's top_logprobs limit).
enum { ER_TOP_LOGPROBS_MAX = 20 };

typedef struct {
    size_t size;            // sizeof(ErGenParams), set by er_gen_params_init (see "Structs" above)
    int max_new_tokens;     // per sample [256]
    int n_samples;          // parallel samples sharing the prompt [1]
    float temperature;      // 0 = greedy [0]
    int top_k;              // 0 = off [0]
    float top_p;            // 1 = off [1]
    float min_p;            // 0 = off [0]
    uint64_t seed;          // sample i uses stream i of this seed [0]
    int budget;             // hard budget on ErSample.think_len: the answer suffix is forced so that its
                            // "</think>" ends the think block at this many tokens at most (a suffix without
                            // one: after this many tokens); a model that closed it itself is not cut; 0 = off [0]
    int answer_tokens;      // at most budget + this many tokens in all, suffix included [32]
    const char *budget_suffix; // NULL = "\n</think>\n\nFinal answer: "
    const char *response_prefix; // forced at the start of every response; NULL = the adapter's (if any). The
                                 // routed pipeline's direct route answers without it (the base, unprompted)
    const char *const *stop; // (n_stop) stop strings, cut from the text: non-empty, at most ER_STOP_MAX_LEN bytes
    int n_stop;             // 0..ER_STOP_MAX [0]
    const char *route;      // the routed pipeline's route (with an adapter loaded, or on a hybrid-thinking
                            // model): NULL or "auto" = the switcher decides (reasoning without one),
                            // "direct" = the base answers (greedy, one sample), "reasoning" = the adapter
                            // reasons; a forced route runs the pipeline even without heads. On a hybrid-
                            // thinking model (Qwen3: its chat template handles </think>) the route is its
                            // thinking switch, after the same cached prompt: "direct" = thinking off (the
                            // template's empty "<think>\n\n</think>\n\n" forced, enable_thinking=false),
                            // "reasoning" = thinking on ("<think>\n" forced unless response_prefix or the
                            // adapter's prefix says otherwise), by the adapter when one is loaded, else by
                            // the base itself; "auto" without heads leaves the choice to the model [NULL]
    int top_logprobs;       // 0..ER_TOP_LOGPROBS_MAX: the most probable tokens recorded at each step
                            // (ErSample.top_tokens); 0 = none, which costs nothing [0]
} ErGenParams;

enum { ER_FINISH_EOS = 0, ER_FINISH_STOP = 1, ER_FINISH_LENGTH = 2 };

typedef struct {
    const char *text;   // UTF-8, cut at a stop string
    size_t text_len;
    const int *tokens;  // generated token ids (forced ones and a final EOS included)
    int n_tokens;
    int finish;         // ER_FINISH_*
    int budget_cut;     // the hard budget forced the answer suffix
    long answer_at;     // byte offset in text where that suffix ends and the answer starts; -1 when none
    // Log-probabilities under the model itself: log softmax of the raw logits (temperature 1, no top-k /
    // top-p / min-p), whatever distribution the token was drawn from; forced tokens included.
    const float *logprobs;      // (n_tokens) each token's
    const int *top_tokens;      // (n_tokens, n_top) the n_top most probable tokens at each step, the most
    const float *top_logprobs;  // probable first (ties: the lower id), and their log-probs; NULL when n_top is 0
    int n_top;                  // ErGenParams.top_logprobs
    int think_len;      // the think length the budget bounds: tokens through the one completing the first
                        // "</think>" of the output (forced suffix tokens count); all but a final EOS without one
} ErSample;

typedef struct {
    int prompt_tokens;
    int prompt_reused;     // prompt tokens found in the session's cache (not recomputed)
    long generated_tokens; // all samples
    double ttft_s;         // time to the first generated token
    double decode_tokens_per_s;
    double total_s;
    size_t kv_bytes;       // KV cache bytes in use at the peak
} ErStats;

// Streaming: called for each generated token of sample `sample` with the text it releases. Bytes
// that may still become a stop string (and an incomplete UTF-8 character) are held back until they
// are known (the chunk may be empty), and the sample's last call flushes the rest, so the chunks
// concatenate to exactly ErSample.text. Return non-zero to stop that sample; its text then ends
// with what was streamed. A callback may read results and use other sessions; a generate, submit or
// step call on its own session or batch is refused (ER_EINVAL), and a free takes effect as the call
// that runs the callback ends.
typedef int (*ErTokenCallback)(void *user, int sample, const char *text, size_t len);

// Fills the defaults shown in [brackets] above for a struct of `size` bytes (see "Structs" above): ER_EINVAL
// for NULL or a size below the first version's.
ER_API int er_gen_params_init_size(ErGenParams *p, size_t size);
static inline void er_gen_params_init(ErGenParams *p) { er_gen_params_init_size(p, sizeof *p); }

// ---- callbacks ----
// Called on the thread of the call that reports. A callback may read results and use other sessions; a
// call on the session, batch or model it reports about is refused meanwhile (ER_EINVAL, "in use").
enum { ER_LOG_INFO = 0, ER_LOG_WARN = 1 };
// One line (no newline) the library has to say that is not an error: what a load found, a session's size,
// a head fitted on another KV cache type than the session's. Errors go to er_last_error, never here.
typedef void (*ErLogCallback)(void *user, int level, const char *line);
enum { ER_PROGRESS_LOAD = 0, ER_PROGRESS_PREFILL = 1 };
// Long work in steps: ER_PROGRESS_LOAD in load steps (the files, each weight matrix laid out for decode, the
// tokenizer), ER_PROGRESS_PREFILL in prompt positions in the session's cache (reused ones included), before
// the first chunk and after each. A phase's last call has done == total (a prefill that reuses the whole
// prompt: that call alone); the routed pipeline may report its prompt twice.
typedef void (*ErProgressCallback)(void *user, int phase, long done, long total);
// Polled between load steps, before each prefill chunk (128 positions) and before each decode step: non-zero
// stops the call, which returns ER_EABORTED. Nothing is lost: a model load leaves no model; an aborted
// generate leaves no results (what streamed, streamed) and the session ready for the next call, its cache
// keeping the prompt positions computed so far, which a next call with the same prompt reuses.
typedef int (*ErAbortCallback)(void *user);

typedef struct {
    size_t size;                 // sizeof(ErCallbacks), set by er_callbacks_init
    void *user;                  // passed to each callback
    ErLogCallback log;           // NULL = messages dropped [NULL]
    ErProgressCallback progress; // [NULL]
    ErAbortCallback abort;       // [NULL]
} ErCallbacks;

ER_API int er_callbacks_init_size(ErCallbacks *c, size_t size);
static inline void er_callbacks_init(ErCallbacks *c) { er_callbacks_init_size(c, sizeof *c); }

// Loads a model dir (er_model_load_ex with no callbacks).
ER_API int er_model_load(ErModel **out, const char *dir);
// With callbacks (NULL = none; copied, so cb may go once this returns): progress and abort for the load,
// and log for the load and everything after it on the model, its sessions and batches (a session or batch
// with a log of its own uses that instead).
ER_API int er_model_load_ex(ErModel **out, const char *dir, const ErCallbacks *cb);
// The positions the model was trained for (config.json max_position_embeddings): the most a session
// may hold per sample (prompt included). ER_EINVAL for NULL.
ER_API int er_model_max_positions(const ErModel *m);
// Attaches a LoRA adapter (PEFT dir) to the model, replacing the one loaded before. With the masked
// rule it is off on the prompt (whose KV cache is the base model's) and on in the response, which
// starts with the adapter's reasoning prefix unless ErGenParams.response_prefix says otherwise.
// Sessions notice the change: a prompt cached under another unmasked adapter is computed again. An
// adapter whose scale (lora_alpha / r, / sqrt(r) with use_rslora) is above 1e4 is refused. Refused
// (ER_EINVAL) while a generation runs on the model; the loaded one stays.
ER_API int er_model_load_adapter(ErModel *m, const char *dir);
// Where the model's passes run: "cpu" (where it loads) or a GPU, "cuda" or "cuda:N" (a library built with
// CUDA): its weights are copied there (in bf16, a quantized model's dequantized) and so is its adapter, now and
// at every later er_model_load_adapter; the sessions and batches opened afterwards keep their KV cache and
// activations there, and bring each step's logits (and the heads' hidden states) to the host, where sampling,
// the heads and the vote run. Refused while a session or batch is open on the model, and where the device
// cannot be opened (the build has no CUDA, no GPU answers); "cpu" frees the copies.
ER_API int er_model_set_device(ErModel *m, const char *device);
ER_API void er_model_free(ErModel *m);
// The loaded adapter's reasoning prefix (er_reasoning_prefix: what a response starts with unless
// ErGenParams.response_prefix says otherwise); NULL without an adapter or prefix, or for NULL. Owned by the
// model until the next er_model_load_adapter; not to be called while a load runs.
ER_API const char *er_model_reasoning_prefix(const ErModel *m);

enum { ER_KV_F32 = 0, ER_KV_INT8 = 1 };
enum { ER_THREADS_MAX = 256 }; // ErSessionParams.n_threads at most

// How a session (or a batch) is sized and run; filled by er_session_params_init.
typedef struct {
    size_t size;      // sizeof(ErSessionParams), set by er_session_params_init
    int max_samples;  // parallel samples (a batch: rows, over all its live requests) [1]
    int max_tokens;   // positions per sample, prompt included, at most er_model_max_positions [2048]
    int kv_type;      // ER_KV_F32 or ER_KV_INT8 (a byte per value, a quarter of f32's, plus a scale per row)
                      // [ER_KV_F32]
    int n_threads;    // threads its calls run on, 0..ER_THREADS_MAX; 0 = the OpenMP default of the thread
                      // that opens it (all cores unless OMP_NUM_THREADS or omp_set_num_threads says) [0]
    const ErCallbacks *callbacks; // progress and abort for its generate calls (a batch: its submits'
                                  // prefills), and its own log; copied at open; NULL = none [NULL]
} ErSessionParams;

ER_API int er_session_params_init_size(ErSessionParams *p, size_t size);
static inline void er_session_params_init(ErSessionParams *p) { er_session_params_init_size(p, sizeof *p); }

// ---- tokens and the chat template: count a prompt before generating ----
// Like snprintf: each returns the size of its whole result (ids, or bytes without the NUL) and writes what fits
// into out: ids up to cap; text up to cap - 1 bytes and a NUL when cap > 0 (possibly cut inside a UTF-8
// character). A return of cap or more (ids: more than cap) means out was too small: call again with room for
// the return (+ 1 for text). out may be NULL when cap is 0. A negative status on failure. These read only
// what a load never changes, so they may run beside generations, on any thread.
//
// The ids of text (UTF-8, NUL-terminated) as er_generate_raw encodes it: no BOS or EOS is added (chat templates
// place the special tokens). parse_special != 0: special tokens written in the text ("<|im_end|>") become
// their ids, as er_generate_raw does; 0: they stay plain text (for text a user typed). Invalid UTF-8: ER_EINVAL.
ER_API int er_tokenize(const ErModel *m, const char *text, int32_t *out, int cap, int parse_special);
// The text of n ids (special tokens as their text). Bytes that do not form valid UTF-8 become U+FFFD; an id
// outside the vocabulary is ER_ERANGE.
ER_API int er_detokenize(const ErModel *m, const int32_t *tokens, int n, char *out, size_t cap);
// n messages rendered with the model's chat template; add_generation_prompt != 0 opens the assistant turn,
// which gives the text er_generate feeds the model for these messages.
ER_API int er_apply_template(const ErModel *m, const ErMessage *msgs, int n, int add_generation_prompt, char *out,
                             size_t cap);

// A session for up to p->max_samples parallel samples of up to p->max_tokens positions. Memory is
// reserved here: a size that does not fit is refused (ER_ENOMEM), and max_samples x max_tokens above
// INT_MAX positions (more than a KV cache can address) with ER_ERANGE.
ER_API int er_session_open(ErSession **out, ErModel *m, const ErSessionParams *p);
// Called during a call on the session (from its token callback, say), it stops that call, which frees
// the session as it returns.
ER_API void er_session_free(ErSession *s);

// Renders the messages with the model's chat template (assistant turn opened) and generates. ER_EINVAL
// while another call uses the session or a load changes the model (see "Threads" above).
ER_API int er_generate(ErSession *s, const ErMessage *msgs, int n_msgs, const ErGenParams *p, ErTokenCallback cb,
                       void *user);
// Generates from text fed as is (no chat template).
ER_API int er_generate_raw(ErSession *s, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user);

// Results of the last generate call, owned by the session until the next one. er_result_count is
// negative (ER_EINVAL) for NULL; the others return NULL for NULL or an index out of range.
ER_API int er_result_count(const ErSession *s);
ER_API const ErSample *er_result_sample(const ErSession *s, int i);
ER_API const ErStats *er_result_stats(const ErSession *s);

// ---- loading a model from memory or a file descriptor ----
// For a model without a path: an app's bundled asset (AAsset_getBuffer, or the fd, offset and length of
// AAsset_openFileDescriptor64), the fd of an Android content URI. The model is one file: a GGUF (weights,
// config, tokenizer and chat template inside), or a safetensors file whose config.json and tokenizer.json
// come as buffers in an ErModelSource. The bytes tell the format ("GGUF" first, else safetensors); both are
// parsed by the readers er_model_load uses. A failure names the source ("<buffer>", "fd 7", or the
// ErModelSource field: "<config_json>", "<tokenizer_json>", ...) and the problem in one line.

// len bytes at data that the caller owns (JSON need not end in NUL). data NULL (len 0): not given.
typedef struct {
    const void *data;
    size_t len;
} ErBuffer;

// ErModelSource.flags: er_model_load_from_buffer uses the model bytes in place instead of copying them.
enum { ER_MODEL_SOURCE_BORROW = 1 };

// What comes with the model file. Every buffer here is read during the call only.
typedef struct {
    size_t size;    // sizeof(ErModelSource), as er_model_source_init sets it: a size this library does not know
                    // (a struct from another version of this header, or one never initialised) is refused
    unsigned flags; // ER_MODEL_SOURCE_BORROW or 0 [0]
    ErBuffer config_json;            // config.json: needed with a safetensors file; a GGUF holds its own (refused)
    ErBuffer tokenizer_json;         // tokenizer.json: needed with a safetensors file; with a GGUF it replaces the
                                     // file's tokenizer, and its chat template goes with it (below)
    ErBuffer tokenizer_config_json;  // with tokenizer_json only (optional): eos / pad / bos tokens and the chat
                                     // template's style, as beside a model dir (absent: ChatML)
    ErBuffer generation_config_json; // with tokenizer_json only (optional): more eos_token_id, as beside a model dir
} ErModelSource;

// Zeroes *src and sets src->size; NULL is a no-op.
ER_API void er_model_source_init(ErModelSource *src);
// The model file held in len bytes at data; src may be NULL (a GGUF alone). The bytes are copied during the
// call: data may be freed or reused once it returns, and the model keeps len bytes of its own for its life
// (the caller's and the copy are both held during the call). With ER_MODEL_SOURCE_BORROW in src->flags the
// model uses data in place, no copy: the caller keeps those len bytes readable and unchanged from the call
// until the model is released (er_model_free, and the free of its last session or batch), or until the call
// returns when it fails. The library never writes them. No alignment is needed (a weight misaligned for its
// type is copied). What is used in place is what er_model_load would use from a mapped file: float matrices,
// and a safetensors file's packed ones or a GGUF's block-type ones (q4_0, q8_0, k-quants, ...) unless the decode
// kernels re-lay them (the AVX512-VNNI kernels, on a CPU that has them; a llama GGUF's q / k rows are copies either way).
ER_API int er_model_load_from_buffer(ErModel **out, const void *data, size_t len, const ErModelSource *src);
// The model file held in the file open as fd, `length` bytes from byte `offset` of the file (-1: to its end):
// the fd, offset and length of AAsset_openFileDescriptor64, or 0 and -1 for a whole file. The offset counts
// from the start of the file, whatever the fd's position, which is neither read nor moved. The bytes are
// mapped (or read where they cannot be) during the call; the fd is not closed, and may be closed as soon as
// the call returns. The model maps the file as er_model_load does: keep it unchanged, and never truncate it,
// while the model lives. A pipe or socket (a content URI served through a pipe) is read from where it
// stands to its end (or `length` bytes): offset must be 0, and what is read is consumed. A closed fd, a
// directory, a device or a range past the end of the file is refused. src as for er_model_load_from_buffer
// (ER_MODEL_SOURCE_BORROW has no effect: the library maps or reads the bytes itself).
ER_API int er_model_load_from_fd(ErModel **out, int fd, int64_t offset, int64_t length, const ErModelSource *src);

// ---- the routed pipeline: switcher and verifier heads (written by `ertrain heads`) ----
// With a switcher and/or a verifier loaded, er_generate runs the pipeline: the base prefills the
// prompt and the switcher scores it; below its threshold the base answers directly (greedy, one
// sample, no budget; on a hybrid-thinking model with its thinking off); otherwise the adapter's reasoning
// prefix (a hybrid model: its thinking on, with or without an adapter) is forced and n_samples samples
// decode with the adapter (ErGenParams as usual), sharing the prompt's KV cache; the verifier scores
// each sample from its own cache, and the answer is the extracted final answer with the largest sum
// of verifier scores (ties: the highest single score). No switcher: every query reasons (when an
// adapter is loaded); no verifier: a plain majority vote. The switcher reads every prompt position,
// so with one loaded each call prefills its whole prompt (no reuse across chat turns). A head is
// tied to the model it was trained on: loading it for another model is refused, and so is loading one
// while a generation runs on the model. `path` is NAME, NAME.safetensors or NAME.json (the head is the
// pair of files).
ER_API int er_model_load_switcher(ErModel *m, const char *path);
ER_API int er_model_load_verifier(ErModel *m, const char *path);
// Positions a generate call holds beyond its prompt and max_new_tokens with what is loaded now: the
// adapter's reasoning prefix (a hybrid-thinking model: the longer of it and its think blocks) and the
// verifier's prompt (appended to each sample). Size a session's
// max_tokens as prompt + max_new_tokens + this (plus a response_prefix of your own). ER_EINVAL while a
// load runs on the model.
ER_API int er_model_extra_positions(const ErModel *m);

enum { ER_ROUTE_DIRECT = 0, ER_ROUTE_REASONING = 1 };

typedef struct {
    int route;                   // ER_ROUTE_*
    float switcher_score;        // P(needs reasoning); -1 without a switcher
    float switcher_threshold;    // the switcher's threshold; -1 without one
    const float *verifier_scores;  // (er_result_count) P(correct) per sample; NULL without a verifier
                                   // or on the direct route
    const char *const *answers;    // (er_result_count) each sample's extracted answer; NULL where none
    int n_votes;                   // distinct answers, in order of first appearance
    const char *const *vote_answers; // (n_votes)
    const double *vote_weights;      // (n_votes) summed verifier scores (sample counts without a verifier)
    const int *vote_counts;          // (n_votes) samples voting for each
    const char *answer;            // the winner; NULL when no sample has an answer
    double prefill_s, switcher_s, generate_s, verify_s;
    const char *response_prefix;   // what the route forced at the start of each response, before ErSample.text
                                   // (not part of it): the reasoning prefix, or on a hybrid model the direct
                                   // route's "<think>\n\n</think>\n\n"; NULL = none
} ErRoute;

// The pipeline's side of the last generate call, owned by the session; NULL when no pipeline ran (no
// heads loaded and no route forced).
ER_API const ErRoute *er_result_route(const ErSession *s);

// ---- embeddings: one vector per text, for search (retrieval) ----
enum { ER_POOL_MODEL = 0, ER_POOL_MEAN = 1, ER_POOL_LAST = 2 };

typedef struct {
    size_t size;    // sizeof(ErEmbedParams), set by er_embed_params_init (see "Structs" above)
    int pooling;    // ER_POOL_MODEL: as the model says (sentence-transformers' Pooling module config: the last token
                    // for Qwen3-Embedding; a GGUF's pooling_type; mean when it says nothing), or ER_POOL_MEAN /
                    // ER_POOL_LAST: the mean or the last of the final hidden states (after the final norm) [ER_POOL_MODEL]
    int dimensions; // 0 = er_model_embedding_size; 1..that: the first this many values, normalised after the cut
                    // (Matryoshka truncation, which Qwen3-Embedding is trained for) [0]
    int normalize;  // L2-normalise: dot products are then cosine similarities [1]
    int query;      // prepend the model's query prompt (config_sentence_transformers.json's prompts.query, Qwen3-
                    // Embedding's "Instruct: ...\nQuery:") to each text: for search queries, not for the documents
                    // searched; ER_EINVAL when the model has none [0]
} ErEmbedParams;

ER_API int er_embed_params_init_size(ErEmbedParams *p, size_t size);
static inline void er_embed_params_init(ErEmbedParams *p) { er_embed_params_init_size(p, sizeof *p); }
// The length of an embedding: the model's hidden size.
ER_API int er_model_embedding_size(const ErModel *m);
// The query prompt ErEmbedParams.query prepends (owned by the model); NULL when the model has none.
ER_API const char *er_model_query_prompt(const ErModel *m);
// Embeds n texts (UTF-8, tokenized as Hugging Face's tokenizer(text) does: special tokens in the text parsed, and
// the tokenizer's template tokens added, Qwen3-Embedding's closing <|endoftext|>) with the base model (no adapter):
// out gets n rows of p->dimensions (0: er_model_embedding_size) floats, cap floats at most. Each text is one prefill
// of at most the session's max_tokens in a KV sequence of its own; the session's cached prompt stays for the next
// generate. Returns the tokens embedded in all (an API's usage), or a negative status (ER_ERANGE naming a text that
// is too long or empty).
ER_API int er_embed(ErSession *s, const char *const *texts, int n, const ErEmbedParams *p, float *out, size_t cap);

// ---- several requests decoded together ----
// An ErBatch holds the samples of several generate calls ("requests") in one KV cache and decodes
// them together: each er_batch_step runs one forward over the rows of every live request (one read
// of the weights per step, however many requests), each request with its own ErGenParams, seed,
// stop strings, budget and callback. A request decodes the same tokens as it would alone in a
// session whose cache held the same earlier prompt (sample i draws from stream i of its seed and the
// rows of a forward do not interact; bitwise while a step holds at most 8 rows, past that the last
// bits follow the matrix library's blocking). A submitted prompt reuses the longest prefix it shares
// with one of the batch's cached prompts (max_rows of them, the least recently used replaced). With a
// switcher or verifier loaded, or a forced route with an adapter, a request runs the routed pipeline
// as er_generate does: the switcher scores its prompt at submission, the route's samples decode in the
// batch's steps, and the verifier scores them and the vote runs in the step that finishes them;
// er_request_route reports it. A batch takes one call at a time, as a session does: er_batch_submit or
// er_batch_step while another call runs on the batch (from a callback inside er_batch_step, or on
// another thread) returns ER_EINVAL; er_request_free or er_batch_free from a callback takes effect when
// the step ends, and no callback of what was freed runs after the free. Sessions and batches of one
// model may generate at the same time; a model with live requests refuses er_model_load_*.
typedef struct ErBatch ErBatch;
typedef struct ErRequest ErRequest;

// Room for p->max_samples rows (samples over all live requests) of up to p->max_tokens positions each
// (prompt included), with p's KV type, threads and callbacks (as a session's). The batch caches as many
// prompts as it has rows: 2 x rows x max_tokens above INT_MAX positions is refused (ER_ERANGE), as in
// er_session_open.
ER_API int er_batch_open(ErBatch **out, ErModel *m, const ErSessionParams *p);
// Frees the batch. Requests still decoding are stopped: they fail (er_request_status ER_EINVAL, no
// results). Every request, done or not, is still freed by er_request_free, before or after this.
ER_API void er_batch_free(ErBatch *b);
// Rows not held by live requests: a request of n samples may be submitted while n <= this.
ER_API int er_batch_free_rows(const ErBatch *b);
// Prefills the text (fed as is) and starts its samples; they decode from the next step on.
ER_API int er_batch_submit(ErBatch *b, const char *text, const ErGenParams *p, ErTokenCallback cb, void *user,
                           ErRequest **out);
// One decode step of every live request (callbacks run here); requests whose samples all finished
// are done afterwards. Returns the number of live requests left (0 when er_batch_free came during the
// step: the batch is gone), or a negative status: a bad argument, or the batch in use by another call.
ER_API int er_batch_step(ErBatch *b);
// 1 while the request decodes, ER_OK once it is done, a negative status when it failed.
ER_API int er_request_status(const ErRequest *r);
// Its results once done (as er_result_*; count 0 and NULL before): valid until er_request_free.
ER_API int er_request_count(const ErRequest *r);
ER_API const ErSample *er_request_sample(const ErRequest *r, int i);
ER_API const ErStats *er_request_stats(const ErRequest *r);
// While the request decodes (in its token callback, or between steps) the tokens of sample i so far: an
// ErSample with tokens, n_tokens, logprobs and the top tokens filled, the rest empty (text NULL). In the
// callback, the token just streamed is the last one. Owned by the request, valid until the next
// er_batch_step or er_request_free; NULL for an index out of range, a failed request or one that is done
// (er_request_sample has the whole sample then).
ER_API const ErSample *er_request_progress(const ErRequest *r, int i);
// The routed pipeline's side of a done request (as er_result_route); NULL when no pipeline ran.
ER_API const ErRoute *er_request_route(const ErRequest *r);
// Frees a request, before or after its batch; one still decoding is stopped first (its rows go back to
// the batch). A request still decoding is freed from the thread that steps its batch (or from a callback
// of that batch): its batch's one-thread rule.
ER_API void er_request_free(ErRequest *r);

#ifdef __cplusplus
}
#endif

#endif
