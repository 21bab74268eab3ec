// The transformer (Qwen2, Qwen3 and Llama families): weights from Hugging Face dirs, THE forward used by training and
// inference, the backward, and saving back to an HF dir.
#ifndef MODEL_MODEL_H
#define MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/gguf.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "model/backend.h"
#include "model/config.h"
#include "lora/lora.h"
#include "model/kvcache.h"
#include "quant/quant.h"
#include "quant/weight.h"

typedef struct {
    Weight wq, wk, wv, wo;     // (NH*HS, C), (NKV*HS, C), (NKV*HS, C), (C, NH*HS)
    Weight wgate, wup, wdown;  // (FF, C), (FF, C), (C, FF)
    float *bq, *bk, *bv;       // (NH*HS), (NKV*HS), (NKV*HS); NULL without q/k/v biases
    float *ln1, *ln2;          // (C) input_layernorm, post_attention_layernorm
    float *q_norm, *k_norm;    // (HS) each: Qwen3's per-head RMSNorm of q and k before RoPE; NULL otherwise
} LayerWeights;

// Gradient buffers of a trainable model, laid out like LayerWeights (fp32).
typedef struct {
    float *wq, *wk, *wv, *wo, *wgate, *wup, *wdown, *bq, *bk, *bv, *ln1, *ln2, *q_norm, *k_norm;
} LayerGrads;

// One named parameter tensor, in HF naming, for saving, optimizers and gradient checks.
typedef struct {
    char name[96];
    int ndim;
    int64_t shape[2];
    size_t numel;
    Weight *w;    // matrices: the weight (any format); NULL for vectors
    float *data;  // fp32 values: vectors always; matrices only when fp32
    float *grad;  // same shape, when the model is trainable; else NULL
} ParamTensor;

typedef struct {
    ModelConfig cfg;
    Weight embed;         // (V, C)
    Weight lm_head;       // (V, C); a copy of `embed` when tied
    float *norm;          // (C)
    LayerWeights *layers; // (L)
    LayerGrads *grads;    // (L) when trainable
    float *g_embed, *g_norm, *g_lm_head; // when trainable; g_lm_head == g_embed when tied
    ParamTensor *params;  // every parameter once (a tied lm_head is not listed)
    int n_params;
    int trainable;        // all parameters fp32 in param_mem, gradients in grad_mem
    float *param_mem;     // owned fp32 storage (all params when trainable; vectors otherwise)
    float *grad_mem;      // same layout as param_mem when trainable
    size_t n_param_floats;
    void *owned_mats;     // matrices copied from files that could not be used in place
    StFile *files;        // mmapped safetensors shards backing the weights
    int n_files;
    GgufFile *gguf;       // the mapped GGUF file backing the weights (model/gguf_model.h), else NULL
    QuantConfig quant;    // config.json's quantization_config (enabled = 0 for a float model)
    Backend *be;          // where every buffer above lives; NULL = the CPU (model_to_backend places a copy)
} Model;

enum { MODEL_LOAD_TRAINABLE = 1 }; // convert everything to fp32 and allocate gradients

// Loads config.json and model.safetensors (or the shards of model.safetensors.index.json) from `dir`.
// F32/BF16/F16 files; without MODEL_LOAD_TRAINABLE, matrices stay in the file's dtype, mmapped.
// A quantized dir (config.json has a quantization_config, layout in quant/quant.h) keeps its packed
// matrices packed and mmapped; it is refused with MODEL_LOAD_TRAINABLE (a quantized base is frozen:
// train a LoRA adapter on it instead).
// A path ending in ".gguf" is a GGUF model file instead (model/gguf_model.h).
int model_load(Model *m, const char *dir, int flags);
// The same from config.json's text and one safetensors file already open (from a buffer or an fd: core/bytes.h),
// which m takes over (*file is zeroed; closed on failure too). Messages name them by config->name and file->path.
int model_load_safetensors(Model *m, const JsonText *config, StFile *file, int flags);
// For loaders in model/: the parameter table and fp32 arenas for m->cfg (trainable: every tensor fp32
// with gradients; else vectors only, the loader places the matrices).
int model_setup(Model *m, int trainable);
// A trainable fp32 model with HF-style random init (normal(0, std) matrices, unit norms, zero biases).
int model_build_random(Model *m, const ModelConfig *cfg, float std, uint64_t seed);
// The same values, frozen: matrices bf16 (the base of LoRA training at the scale of a GPU), vectors fp32.
int model_build_random_bf16(Model *m, const ModelConfig *cfg, float std, uint64_t seed);
// Writes config.json and model.safetensors (fp32, or bf16 when as_bf16) atomically into `dir`.
// Quantized matrices are written packed with their scales / zeros / codebooks, and m->quant as
// config.json's quantization_config; every matrix must have the format m->quant says it has.
int model_save(const Model *m, const char *dir, int as_bf16);
// Replaces the matrix of parameter p with *w, taking ownership of w->owned (*w is cleared). A model
// holding a quantized matrix is frozen: a trainable model loses its gradients (trainable = 0).
int model_set_weight(Model *m, ParamTensor *p, Weight *w);
// The format m->quant gives parameter p (WF_F32 meaning "float, as stored"); its group size and sparse
// corrections per row into *group and *sparse.
WeightFormat model_quant_format(const Model *m, const ParamTensor *p, int *group, int *sparse);
// The same for the config q (which need not be m's yet: ertrain quantize's plan): the embedding's, the lm_head's
// or the layer projections' format (a mix's per layer, quant_mix_format), through quant_block_fallback.
WeightFormat model_quant_format_in(const Model *m, const QuantConfig *q, const ParamTensor *p, int *group, int *sparse);
// A tied model rebuilt untied: trainable fp32, lm_head a copy of the embedding, tie_word_embeddings
// false, the logits unchanged. Every buffer of the Model is replaced (pointers into the old ones go
// stale). The old gradients go first, so the peak is the old parameters plus one new trainable model;
// should that allocation fail, *m stays a valid model without gradients (trainable = 0). A no-op on
// untied models.
int model_untie(Model *m);
// Lays the q4, q8, q4g32 and GGUF block-format matrices of a CPU model out for the decode kernels
// (quant_tile; a no-op where the build has no such kernel): products and rows read the same values, but the model
// can no longer be saved. The tiled rows are copies in the process's memory (not shared with other processes
// mapping the same file); the file pages they replace are released, and *released (may be NULL) gets their bytes.
// Once any are, the matrices left in a file's mapping are copied out and released as well (their page-cache folios
// would otherwise map the released pages back). For models that only decode (er_model_load, erinfer bench). Pages
// of a caller's buffer the model borrows (core/bytes.h) are never released: only the caller may. On ER_ENOMEM some
// matrices may be tiled, each one whole, and the model stays valid. step (NULL = none) is called after each matrix
// with the matrices done and their total; a non-zero return stops there (ER_EABORTED, the model valid as above).
int model_tile_for_decode(Model *m, size_t *released, int (*step)(void *user, int done, int total), void *user);
void model_free(Model *m);
void model_zero_grad(Model *m);
// A copy of src placed on backend be (dst->be = be): the same parameter table and layout, every buffer
// the backend's (param_mem and grad_mem offsets as in src, so a download of param_mem gives src's
// layout back; the CPU backend shares src's frozen matrices, which src must then outlive). Frozen
// matrices take the backend's format (model/backend.h, weight_upload). model_free releases it.
int model_to_backend(Model *dst, const Model *src, Backend *be);
const ParamTensor *model_find_param(const Model *m, const char *name);
// The shapes a LoRA adapter for a model of config c has (lora/ sits below model/, so it is built here).
LoraShape model_config_lora_shape(const ModelConfig *c);

// ---- the forward ----

typedef struct {
    int B, T;                    // B sequences x T new positions (rows right-padded to T)
    const int *tokens;           // (B, T)
    const int *len;              // (B) valid new positions per row; NULL = T
    const uint8_t *adapter_mask; // (B, T) 1 where the adapter applies to that input position; NULL = everywhere
    const LoraAdapter *adapter;  // NULL = base model
    ErRng *dropout_rng;          // adapter dropout while training (ACTS_TRAIN); NULL = no dropout
    // The keeper of keys and values. NULL: this pass's own (training, scoring; positions start at 0).
    // Else row b appends its new positions to sequence kv_slots[b], after the positions it holds.
    KVCache *kv;
    const int *kv_slots;         // (B)
} ModelInput;

// What a pass keeps, chosen when the activations are sized:
typedef enum {
    ACTS_SCORE,  // one reused layer of buffers; logits at every position
    ACTS_TRAIN,  // every layer's intermediates for the backward; logits at every position
    ACTS_DECODE, // one reused layer; logits only at each row's last valid position: (B, V)
    // What ACTS_TRAIN gives the backward, keeping only each layer's input: the backward recomputes a
    // layer's intermediates first (one more forward, about L times less activation memory; the same
    // gradients bit for bit). Activations sized so report mode ACTS_TRAIN and recompute 1.
    ACTS_TRAIN_RECOMPUTE,
    // Or-ed into ACTS_TRAIN, ACTS_TRAIN_RECOMPUTE or ACTS_SCORE: this pass's logits are consumed by
    // model_loss only. The logits buffer holds loss_rows rows (ACTS_LOSS_CHUNK_FLOATS of them, at least
    // one, at most B*T) instead of B*T: model_forward stops after the final norm (lnf) and model_loss
    // runs the LM head, the cross-entropy and, with grad, the head's backward a chunk of rows at a time
    // (dln += dlogits · lm_head, g_lm_head += when trainable), so model_backward starts from dln. The
    // loss and each row's dloss/dlogits are the full pass's bits where the head's product rounds a row
    // alike at the chunk's size and at B*T; the gradients agree to fp32 rounding (g_lm_head adds the rows
    // chunk by chunk; dln is a product of the chunk's rows, which OpenBLAS may round otherwise). a->logits
    // is NULL in such a pass: no caller can read logits that were never there (GRPO's log-probs, quantize
    // and fpt size theirs without the flag). A loss refused as not finite stops at the chunk that makes it,
    // before its head gradient: g_lm_head then holds the chunks before it (finite), so a caller that goes on
    // after the refusal zeroes the gradients first.
    ACTS_LOSS_ONLY = 0x10,
} ActsMode;

// The logits rows a loss-only pass keeps at a time: 64 MiB of fp32 (110 rows at Qwen2.5's V = 152064),
// enough rows for the head's product to run at full speed, small beside a 2048-token sequence's 1.2 GB.
#define ACTS_LOSS_CHUNK_FLOATS ((size_t)1 << 24)

// Activations: the keeper of intermediates, sized once for up to B x T positions.
// Qwen3 (per-head q/k norms): q and k are the normalised heads; qr, kr the projections before the norm
// (training keeps them apart; a forward-only pass normalises in place, qr = q and kr = k), rstdq, rstdk each
// head's 1/rms. Other architectures: the four are empty.
typedef struct {
    float *res, *ln1, *rstd1, *q, *k, *v, *lse, *atty, *res2, *ln2, *rstd2, *gate, *up, *hmlp;
    float *qr, *kr, *rstdq, *rstdk; // (N, NH*HS), (N, NKV*HS), (N*NH), (N*NKV)
} LayerActs;

typedef struct {
    Backend *be;           // where every buffer lives but `layer`, `pos` and `pos0` (host)
    int B, T;              // capacity
    ActsMode mode;
    int nB, nT;            // shape of the last forward pass
    ModelConfig cfg;
    int recompute;         // ACTS_TRAIN_RECOMPUTE: layer is (1), layer_in keeps each layer's input
    LayerActs *layer;      // (L) when training keeps every layer, else (1) reused by every layer
    float *layer_in;       // (L, B,T,C) recomputation: each layer's input
    float *resf;           // (B,T,C) output of the last layer
    float *lnf, *rstdf;    // (B,T,C), (B,T)
    float *logits;         // (B,T,V), or (B,V) for ACTS_DECODE; after the loss with grad, dloss/dlogits;
                           // NULL with ACTS_LOSS_ONLY
    int loss_only;         // ACTS_LOSS_ONLY: the head and the loss run in model_loss, loss_rows at a time
    int loss_rows;         // rows of the loss-only logits chunk (loss_chunk, (loss_rows, V))
    float *loss_chunk;     // loss-only: one chunk's logits, then its dloss/dlogits, inside model_loss only
    Model *head_model;     // loss-only: the model of the last forward, whose head model_loss applies
    int head_done;         // loss-only: model_loss with grad ran the head's backward into dln (and g_lm_head)
    float *tmp;            // (B,T,C) attention / MLP output before the residual add
    float *wscratch;       // (QUANT_TILE_ROWS, max in) rows of non-fp32 weights widened by the products
    float *scores;         // (attn_threads, NH / NKV, attn_keys) attention scores of a query's heads per thread
    int attn_threads;      // threads the attention runs on (those of the allocation)
    int attn_keys;         // keys one query may see: max(T, max_position_embeddings)
    double *row_loss;      // (B*T) the loss's per-row terms, summed in row order
    // backward scratch
    float *dres, *dln, *dq, *dk, *dv, *datty, *dgate, *dup, *dh; // dres (B,T,C) ends as d(embedding output)
    float *dqr, *dkr;      // (B*T, NH*HS), (B*T, NKV*HS) Qwen3: d(q, k before their norms); else empty
    float *dkh, *dvh;      // (B,NH,T,HS) each query head's dK / dV before a KV group's heads are summed
    float *lora_h;         // (L or 1, LT_COUNT, B*T, r) adapter activations x·Aᵀ, sized on first use
    float *lora_dh;        // (B*T, r) the adapter backward's d(x·Aᵀ)
    float *lora_x;         // (L, LT_COUNT, B*T, max in) adapter inputs after dropout (training with dropout)
    uint8_t *lora_keep;    // same shape: 1 where dropout kept the input
    float *lora_dx;        // (B*T, max in) an adapter's input gradient before the dropout mask
    int lora_r, lora_xw;
    float *cos_tab, *sin_tab; // (P, HS/2) for positions < P
    int P;
    int *pos;              // (B*T) absolute positions of this pass (host)
    int *pos0;             // (B) position of each row's first new token (host)
    // A KV pass's inputs, built in kv_host and placed in kv_buf (kv_cap ints each, grown on use): each
    // position's cache row (B*T; -1 past a row's len), pos0 (B), len (B), the block tables (B, max blocks).
    int *kv_host, *kv_buf;
    size_t kv_cap;
    // this pass's inputs placed on the backend (B*T each)
    int *tokens_buf, *targets_buf, *pos_buf;
    float *mask_buf;
    uint8_t *amask_buf;
    const uint8_t *amask;  // the adapter mask of this pass: amask_buf, or NULL = everywhere
    size_t bytes;          // total allocated
    void *mem;
} Activations;

// Computes the memory first and refuses with the estimate when it exceeds max_bytes (0 = no limit).
// acts_alloc_on places them on backend be (a model placed there runs its passes with them); acts_alloc
// on the CPU. mode may carry ACTS_LOSS_ONLY (sized with the smaller logits buffer from the start, so a
// limit sees what the pass needs).
int acts_alloc(Activations *a, const ModelConfig *cfg, int B, int T, ActsMode mode, size_t max_bytes);
int acts_alloc_on(Activations *a, Backend *be, const ModelConfig *cfg, int B, int T, ActsMode mode,
                  size_t max_bytes);
size_t acts_bytes(const ModelConfig *cfg, int B, int T, ActsMode mode);
void acts_free(Activations *a);
// TEST ONLY: the loss-only chunk cut to rows (1 .. the rows allocated), so tests reach several chunks and
// a chunk of one row on a tiny model, whose whole pass fits one chunk. Not for callers: it saves nothing.
int acts_set_loss_rows(Activations *a, int rows);

// THE forward: logits into a->logits (see ActsMode; a loss-only pass stops at a->lnf).
int model_forward(Model *m, const ModelInput *in, Activations *a);
// Masked mean cross-entropy of a->logits against targets (B,T) with mask (B,T) (NULL = all ones);
// with grad != 0 the logits become dloss/dlogits, ready for model_backward (a loss-only pass: the head's
// backward is done, dln holds d loss / d lnf).
int model_loss(Activations *a, const int *targets, const float *mask, int grad, double *loss);
// model_loss with grad, dloss/dlogits scaled by `scale` (fp32, as the backend's scale op would after the
// loss): the gradient of scale x loss, for callers that weigh a pass's loss (accumulation, ranks).
int model_loss_scaled(Activations *a, const int *targets, const float *mask, float scale, double *loss);
// Accumulates parameter gradients into m->grad_mem (trainable models) and leaves the gradient of
// the loss w.r.t. the embedding output in a->dres (B,T,C). Needs an ACTS_TRAIN forward, and after a
// loss-only one, model_loss with grad on it.
int model_backward(Model *m, const ModelInput *in, Activations *a);

#endif
