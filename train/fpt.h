// Trained function-preserving transforms (FPTQuant: van Breugel, Bondarenko, Whatmough, Nagel,
// "FPTQuant: Function-Preserving Transforms for LLM Quantization", arXiv 2506.04985). The closed-form
// transforms of train/transform_model.h ("fpt") are the initialisation; on top of them every transform
// gets trainable parameters θ, all at the identity when θ starts:
//
//   T_r  a residual rotation Q = Cayley(A) = (I - A)⁻¹(I + A), A = P - Pᵀ skew-symmetric (P (C, C)), the
//        parametrisation SpinQuant (Liu et al., arXiv 2405.16406) uses to stay on the orthogonal group;
//        readers (embed, q, k, v, gate, up, lm_head) W <- W·Q, writers (o, down) W <- Qᵀ·W. Exact because
//        the closed-form T_r already folded every RMSNorm scale (the norms are all ones).
//   T_u  per layer a log-scale u (FF): up rows *= e^u, down columns /= e^u.
//   T_v  per layer and KV head an invertible M (HS, HS), any matrix (the paper's T_v): v rows (and bias)
//        <- M·v, the o columns of the head's query group <- o·M⁻¹.
//   T_k  per layer, KV head and RoPE pair i a log-scale α and an angle θ: k pair rows (and bias) <-
//        e^α R(θ)·k, the group's q pair rows <- e^-α R(θ)·q; R(θ) commutes with RoPE's rotation of the
//        pair, so q·k is unchanged (the paper's pre-RoPE transform). Not on Qwen3, whose per-head q/k
//        RMSNorms sit between the projections and RoPE: no transform of the rows is exact there (α and θ
//        stay at the identity).
// W'(θ) = T_r ∘ (T_u, T_v, T_k)(W_fpt); the inner three act on the output side of q/k/v/up and the input
// side of o/down, T_r on the residual side, so the two commute. fpt_train ends by writing W'(θ) into the
// model (the merge): the merged float model computes the same logits (fp32 rounding aside), which it
// checks on a calibration sequence before returning.
//
// Training in the paper's two stages, straight-through estimator through the quantizer. The local stage's
// objective is data-aware where the paper's is data-free (an L4 norm of the merged weights):
//   local (per layer projection, on calibration activations): minimise the mean over the rows of every
//        layer projection of the row's relative output error (e H' eᵀ) / (w H' wᵀ), e = Q(w) - w the
//        fake quantizer's error (c->q's formats, unweighted, without GPTQ) of the transformed row w and
//        H' the second moment of the projection's inputs in the transformed model: the base's moments
//        (quantize_input_moments over every calibration sequence, once) carried through the transforms,
//        QᵀHQ for the readers of the residual stream, B H Bᵀ (B = blockdiag of the query heads' M) for
//        o_proj, S H S (S = diag e^u) for down_proj; so T_r, T_v and T_u act on both sides of the
//        error. Relative per row, so no transform can win by shrinking one side of a pair. Through the
//        quantizer: quant_ste_error_row's scale-aware straight-through gradient (with a plain STE the
//        error would have none). A step costs about 8 Σ rows·cols² flops over the projections (down_proj's
//        (FF, FF) moments dominate) beside the quantizer;
//   end to end: the student is the fake-quantized transformed model Q(W'(θ)) (train/qat.h's
//        quantize-dequantize step with c->q's formats, unweighted, without GPTQ), the teacher the float
//        model. Not exactly the deployed quantizer: ertrain quantize then quantizes the merged model
//        Fisher-weighted (with --calib) and, for the LUT formats, with GPTQ codes; both depend on W'(θ)
//        itself (its gradients, its inputs' second moments), so they are measured after the merge;
//        loss: KL(teacher || student) of the next-token distributions, mean over every position of
//        one calibration sequence per step (cycling); reported as the mean over all of them before and
//        after training. dL/dQ(W') is taken as dL/dW' (STE) and pulled
//        back through W'(θ) to θ; AdamW (no weight decay) on θ.
// Memory: three copies of the fp32 parameters besides the model's own (the fpt base, the transformed
// weights, the gradient pulled back), a fourth with a local stage (the errors) and its input moments
// (quantize_input_moments's), and the KL's (T, V) teacher probabilities.
#ifndef TRAIN_FPT_H
#define TRAIN_FPT_H

#include <stdio.h>

#include <cjson/cJSON.h>

#include "model/model.h"
#include "train/quantize.h"
#include "train/sequence.h"

typedef struct {
    int C, FF, HS, NKV, NH, L;
    size_t n;         // floats in theta
    float *theta;     // (n): P (C, C), then per layer: u (FF), M (NKV, HS, HS), α (NKV, HS/2), θ (NKV, HS/2)
    size_t layer_n;   // floats per layer
    int keys;         // T_k trained (0 on Qwen3: α and θ stay 0)
} FptParams;

// θ at the identity for m's shapes (T_k needs an even head_dim). Free with fpt_params_free (safe zeroed).
int fpt_params_init(FptParams *p, const Model *m);
void fpt_params_free(FptParams *p);

// out (m->n_param_floats, the layout of m->param_mem) = W'(θ) of the base weights `base` (same layout,
// a model whose norms are folded: train/transform_model.h's rotate). out != base.
int fpt_params_apply(const FptParams *p, const Model *m, const float *base, float *out);
// dtheta (p->n) = d loss / dθ from grad (layout of grad_mem) = d loss / dW'(θ) at the base weights,
// and gq (C, C; NULL = none) = d loss / dQ of the loss's other uses of the rotation Q = Cayley(P).
// scratch: two buffers of m->n_param_floats.
int fpt_params_backward(const FptParams *p, const Model *m, const float *base, const float *grad, const float *gq,
                        float *scratch0, float *scratch1, float *dtheta);

// The local objective above at W' = w (layout of param_mem: the layer projections are read) with errors e
// (same layout) taken as inputs, and moments = the base's (quantize_input_moments's layout): *loss, and
// its gradients: gw, ge (layout of grad_mem) += in W' (through the denominators) and in e; gq (C, C) = in
// Q through the moments; dtheta += the direct gradient of u and M (through the moments; the weights'
// dependence on θ is fpt_params_backward's).
int fpt_local_objective(const FptParams *p, const Model *m, const float *moments, const float *w, const float *e,
                        float *gw, float *ge, float *gq, float *dtheta, double *loss);
// KL(p || softmax(logits)) per row, mean over N rows of V; p (N, V) teacher probabilities. With
// dlogits != NULL its gradient (may alias logits).
double fpt_kl_loss(const float *p, const float *logits, float *dlogits, int N, int V);

typedef struct {
    long local_steps, steps;  // local stage steps, then end-to-end steps (either needs the sequences below)
    double lr;                // AdamW peak learning rate (linear warmup over 10% of each stage, cosine to 10%)
    const QuantizeOptions *q; // the target the student is fake-quantized to
    const SeqBuilder *sb;     // calibration data: seqs[0, n_seqs) (the local stage's moments: all of them; the
                              // end-to-end stage: one per step, in order, cycling)
    const Sequence *seqs;
    int n_seqs, max_len;
    const cJSON *settings;    // every other setting the result depends on (calibration file, seed, ...): the
                              // checkpoint records them and resume refuses others (NULL = none)
    const char *dir;          // run dir: metrics.jsonl and checkpoint/ (NULL = neither)
    int save_every;           // checkpoint every N steps (0 = only at the end)
    int resume;               // continue from dir/checkpoint
    long stop_after;          // stop (checkpointed) after this many steps of this call (0 = run to the end)
    FILE *log;                // progress (NULL = silent)
} FptTrainConfig;

typedef struct {
    double local_first, local_last; // local objective at the first and last local step
    double kl_before, kl_after;     // end-to-end KL, token-weighted mean over all n_seqs sequences, at θ =
                                    // identity and at the trained θ (complete runs with steps > 0, else NAN)
    long steps_done;
    int complete;
} FptTrainResult;

// The merge must preserve the function: the logits of m with the weights `merged` against those with
// `base` (both the layout of param_mem) on tokens (T; NULL = a fixed 16-token sequence), max |Δ| /
// max |logit| <= 1e-4 (fp32 rounding; the tests see ~3e-6), else an error. Leaves m->param_mem = merged.
int fpt_merge_check(Model *m, const float *base, const float *merged, const int *tokens, int T);

// Trains θ on m (trainable fp32, the closed-form fpt already applied), then merges W'(θ) into m's
// weights (only when the run is complete), refusing a merge whose logits differ from the float model's
// by more than 1e-4 relative. r may be NULL.
int fpt_train(Model *m, const FptTrainConfig *c, FptTrainResult *r);

#endif
