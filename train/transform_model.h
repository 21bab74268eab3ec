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
//        balances the ranges of q and k.
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

// A test model with the outlier channels of real LLMs ("Massive Activations in Large Language Models",
// Sun et al., arXiv 2402.17762; QuaRot, arXiv 2404.00456; SpinQuant, arXiv 2405.16406), made from a
// float model by the inverse of the transforms above, so it computes the same function (and has the
// same NLL) while its weights and activations carry the outliers a quantizer must cope with. Per layer,
// `channels` residual channels and `channels` MLP channels are drawn (seeded, without repeats), each
// with a factor α drawn log-uniformly from [lo, hi]:
//   - residual channel j: ln1[j] and ln2[j] *= α, the columns j of q, k, v, gate, up /= α: the
//     normalised residual stream every projection reads has channel j α times larger (massive
//     activations), and those weight columns are α times smaller than their rows' range;
//   - MLP channel j: up row j *= α, down column j /= α: the down_proj input (where massive
//     activations first appear in real models) has channel j α times larger.
// The final norm is left alone (the model may be tied). *ratio gets the largest α·|γ_j| / median_j |γ_j|
// over the layers' norms: how far the loudest normalised channel stands above the typical one.
// Being the inverses of the norm folding and of the closed-form T_u, the outliers are undone exactly by
// rotate / fpt (and so fpt-trained's start): a test for quantizers without transforms, not of them.
int transform_model_add_outliers(Model *m, int channels, float lo, float hi, uint64_t seed, double *ratio);

#endif
