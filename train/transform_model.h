// Function-preserving transforms of a trainable fp32 model before quantization (FPTQuant style). Each
// transform multiplies a pair of neighbouring weights by an invertible matrix and its inverse, merged
// into the weights, so the model computes the same logits (up to fp32 rounding) at no run-time cost
// while its weights get flatter ranges. Applied in this order:
//
//   T_r  (rotate) RMSNorm scales are folded into the matrices that read them (ln1 -> q/k/v columns,
//        ln2 -> gate/up columns, the final norm -> lm_head columns) and set to 1; then the residual
//        stream is rotated by a seeded randomized Hadamard matrix Q (C, C), see quant/transform.h:
//        embed <- embed·Q, readers (q, k, v, gate, up, lm_head) W <- W·Q, writers (o, down) W <- Qᵀ·W.
//        RMSNorm with unit scale commutes with Q, hence the fold first. Tied embeddings: with a final
//        norm of all ones the tie survives (embed and lm_head take the same W·Q); otherwise the model is
//        UNTIED: it is rebuilt with a separate lm_head (a copy of embed) and cfg.tied = 0, so model_save
//        writes "lm_head.weight" and tie_word_embeddings false, and model_load reads it back. The
//        rebuild replaces every buffer of the Model (pointers into the old param_mem go stale, the
//        gradients restart at zero) and needs memory for one more trainable model (less the old
//        gradients, freed first). The saved model is V·C values larger (its own lm_head).
//   T_u  (up/down) per-channel scale s (FF): up rows *= s, down columns /= s (exact: silu(gate)·up is
//        linear in up). s_j = sqrt(max|down[:, j]| / max|up[j, :]|), so both sides end with range
//        sqrt(max|up_j|·max|down_j|): no channel of down is left with an outsized column.
//   T_v  (value/output) per KV head h an invertible M_h = D_h·Q_hᵀ (HS, HS): v rows (and bias) of h
//        <- M_h·v_h, o columns of every query head in h's group <- o·M_h⁻¹ (exact: attention mixes v
//        rows with weights that sum to 1). Q_h is a seeded randomized Hadamard rotation of the head
//        (spreads outlier value channels, which int8 KV caches dislike); D_h then balances each v row
//        against its o columns, d = sqrt(max|o[:, d] over the group| / max|v_h[d, :]|).
//   T_k  (query/key) per KV head h and RoPE frequency pair i (dims i and i+HS/2, HF rotate_half): a
//        scaled rotation A = a·R(θ), which commutes with RoPE's rotation: k pair rows (and bias) <- A·k,
//        q pair rows of the group's query heads <- A⁻ᵀ·q = (1/a)·R(θ)·q, so q·k is unchanged. θ makes
//        the two key rows of the pair equal in energy (tan 2θ = (|k_i|² - |k_j|²) / (2 k_i·k_j)), which
//        halves a lone outlier key channel across the pair; then a = sqrt(max|q pair| / max|k pair|)
//        balances the ranges of q and k. Not on Qwen3: its per-head RMSNorms of q and k (q_norm, k_norm) sit
//        between the projections and RoPE, where no transform of the rows is exact; "fpt" there is T_r, T_u
//        and T_v, and T_k asked for by name is refused.
//
// The model must be trainable fp32 (model_build_random, or model_load with MODEL_LOAD_TRAINABLE; an
// inference load keeps read-only mmapped matrices and is refused). Transform before anything else
// is attached to the model: untying rebuilds the Model struct from model_build_random, so fields
// beyond the weights and the config (a quantization config) start from its defaults. LoRA adapters
// trained on the untransformed model do not fit the transformed one. Cost: two (V, C)·(C, C)
// products for embed and lm_head dominate; untying adds a model_build_random of the untied size.
#ifndef TRAIN_TRANSFORM_MODEL_H
#define TRAIN_TRANSFORM_MODEL_H

#include <stdint.h>

#include "model/model.h"
#include "quant/transform.h"

// Applies function-preserving transforms to a trainable fp32 model in place. mode: "none", "rotate"
// (T_r only), "fpt" (all: T_r, T_u, T_v, T_k), "fpt-trained" (the same closed-form fpt: the
// initialisation train/fpt.h trains from); also a list joined by ',' or '+' of "rotate" ("r"), "u",
// "v", "k", "fpt". seed picks the random signs of the rotations. "none" accepts any model.
int transform_model(Model *m, const char *mode, uint64_t seed);
// transform_model with flags; refuses (ER_EINVAL / ER_EUNSUPPORTED) a model it cannot transform
// exactly, before changing anything.
int transform_model_apply(Model *m, unsigned flags, uint64_t seed);

// A test model with the outlier channels of real LLMs, made from a float model by exact
// function-preserving changes (the same logits, the same NLL), seeded. `channels` residual channels are
// drawn once (the same in every layer, as the massive-activation dimensions of real models are), each
// layer also draws `channels` MLP channels, and every channel gets its own factor α, log-uniform in
// [lo, hi]:
//   - residual outliers (with S, the (C, C) second moment of the normalised residual stream on calibration
//     data, quantize_stream_moments): the norms are folded (a tied model whose final norm is not all ones
//     is untied, as rotate does) and the residual stream is rotated so that each drawn channel carries
//     one of the stream's `channels` dominant directions (the top eigenvectors of S; the other channels
//     an orthonormal completion of seeded Gaussian vectors). Trained models concentrate a large share of
//     the residual energy in a few directions (*share gets it); aligned with the basis, those become
//     channels several times louder than the median in the stream itself, which no norm folding or
//     per-channel scale removes ("Massive Activations in Large Language Models", Sun et al., arXiv
//     2402.17762; QuaRot, arXiv 2404.00456, and SpinQuant, arXiv 2405.16406, rotate such channels away);
//   - norm-scale outliers on the same channels: ln1[j], ln2[j] *= α and the columns j of q, k, v, gate,
//     up /= α, as the LayerNorm scales of real models amplify their outlier channels (Outlier Suppression,
//     Wei et al., arXiv 2209.13325, which removes them by folding the scales into the next weights);
//   - MLP channel j: up row j *= α, down column j /= α: the down_proj input (where massive activations
//     first appear in real models) has channel j α times larger.
// Without S only the last two, which folding the norms and the closed-form T_u undo exactly (rotate /
// fpt start with both), so such a model tests quantizers without transforms, not transforms; the
// residual alignment is what they have to undo by learning or by a rotation of their own. idx (channels,
// may be NULL) gets the residual channels; *share (may be NULL) the dominant directions' share of S's
// trace (0 without S). channels <= min(C, FF), and <= OUTLIERS_MAX_ALIGNED with S.
enum { OUTLIERS_MAX_ALIGNED = 64 };
int transform_model_add_outliers(Model *m, const double *S, int channels, float lo, float hi, uint64_t seed,
                                 int *idx, double *share);
// Second moments of the normalised residual stream (each position's vector divided by its RMS, before
// the norm's scale), summed over the B x T positions of one forward of m (every position counts: pass
// rows without padding): into S (C, C), pooled over every norm input (ln1 and ln2 of each layer, then the
// final norm; NULL = not wanted), and diag (2L + 1, C), per norm input in that order; *tokens += B x T.
// a: ACTS_TRAIN activations (every layer kept) of at least that shape. _mean divides the sums into means
// over the tokens (S also over the 2L + 1 inputs).
int transform_stream_moments_add(Model *m, const ModelInput *in, Activations *a, double *S, double *diag,
                                 long *tokens);
void transform_stream_moments_mean(const ModelConfig *c, double *S, double *diag, long tokens);
// *ratio = how far the loudest channel of the normalised stream the layers' projections read stands above
// the median one: max over the ln1 / ln2 inputs of max_j |γ_j|·rms_j / median_j |γ_j|·rms_j, with rms_j²
// from diag ((2L + 1, C), quantize_stream_moments' per-input second moments of m itself).
int transform_stream_ratio(const Model *m, const double *diag, double *ratio);

#endif
