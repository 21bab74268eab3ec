// ertrain quantize: a float HF model dir -> a quantized HF model dir (layout and naming in
// quant/quant.h) that model_load, erinfer and ertrain sft/grpo take like any model dir.
//
// Steps: load; optional function-preserving transforms (closed-form, or fpt-trained: the closed-form fpt
// trained on the calibration sequences and merged, train/fpt.h); optional Fisher sensitivity (squared
// gradients of the LM loss on calibration sequences, accumulated per weight) used as the importance
// of every weight by the quantizers (quant/quantizer.h); for q2lut / q4lut with calibration data, the
// second moments of every projection's inputs for the GPTQ code assignment; quantize every projection
// (and the embedding / lm_head as asked); report bits per weight, bytes, per-layer relative error and,
// with calibration data, NLL before/after; save with the tokenizer files and run.json.
#ifndef TRAIN_QUANTIZE_H
#define TRAIN_QUANTIZE_H

#include <stdint.h>
#include <stdio.h>

#include "model/model.h"
#include "quant/quantizer.h"
#include "train/sequence.h"

typedef struct {
    const char *weights;      // a quantize_parse_weights spec (quantize_weights_list) for the seven projections;
                              // quantize_run also takes bf16 (the float model stored as bf16, nothing quantized)
    const char *embeddings;   // int8 | q8_0 | fp (NULL = q8_0 with GGUF block weights, else int8)
    const char *lm_head;      // a weights spec | fp (NULL = the weights' format; q4 for q2lut); for a tied model
                              // only its embedding format (quantize_run unties it for another)
    const char *scale_search; // lp | minmax (NULL = lp)
    double p;                 // Lp exponent of the scale search (0 = 2)
    int kmeans_iters;         // q2lut Lloyd iterations (0 = 25)
    int sparse;               // q2lut / q4lut: dense-and-sparse corrections per row of the layer projections
                              // (0 = none; quant/quantizer.h)
    const char *method_note;  // recorded in quantization_config.method after the base method (e.g. "fisher")
    const char *transforms;   // recorded in quantization_config.transforms (NULL = none)
    const float *const *hessians; // per parameter (n_params; NULL entries allowed, NULL = none): the (cols, cols)
                                  // input second moment of a matrix, for the codebook formats' output-error
                                  // assignment (quant/quantizer.h)
} QuantizeOptions;

typedef struct {
    double bits_per_weight;   // the seven projections of every layer, scales included
    double model_bits_per_weight; // every parameter
    size_t bytes_before, bytes_after; // every parameter, as stored
    double max_rel_error;     // worst matrix ||W - Q||/||W||
    double mean_rel_error;    // mean over the layers' projections
} QuantizeReport;

// "q2rtn" is q2lut with a uniform codebook (4 evenly spaced levels, RTN with the Lp clipping search,
// quant/quantizer.h): stored as weights "q2lut", method "rtn-lp" (or "rtn-minmax"), so the q2lut kernels
// run it; *uniform = 1 for it. "q4_k_m" and "q5_k_m" are the mixes of quant_mix_format (*f their base format,
// *mix QUANT_MIX_K_M). Every other spec as quant_parse_spec.
int quantize_parse_weights(const char *spec, WeightFormat *f, int *group, int *mix, int *uniform);
// The specs quantize_parse_weights takes, for messages and help texts: quant_spec_list's, then the mixes and q2rtn
// (joined by sep, the last by last: "q8, q4, ..., q2lut or q2rtn"); buf of n bytes, truncated.
const char *quantize_weights_list(char *buf, size_t n, const char *sep, const char *last);

// What quantize_model will give each matrix of m under o, checked against m's shapes (one-line errors
// naming the flag) before any work: q is the quantization_config the output gets.
typedef struct {
    QuantConfig q;
    int linear_uniform, head_uniform; // q2rtn for the projections / the untied lm_head
    int minmax;                       // --scale-search minmax
} QuantizePlan;
int quantize_plan(const Model *m, const QuantizeOptions *o, QuantizePlan *plan);
// The quantizer options of parameter p under the plan (qo->fmt WF_F32: p stays float).
void quantize_plan_options(const Model *m, const QuantizePlan *plan, const QuantizeOptions *o, const ParamTensor *p,
                           QuantOptions *qo);

// Quantizes the float matrices of m in place (m->quant set; m becomes frozen). importance, when not
// NULL, has n_params entries: per-weight importances (rows, cols) for matrices, NULL entries allowed.
// Per-layer errors go to `log` (NULL = quiet).
int quantize_model(Model *m, const QuantizeOptions *o, const float *const *importance, FILE *log, QuantizeReport *rep);

// The input second moments XᵀX of every layer projection and of the lm_head over sequences [i0, i1) of
// seqs (built by sb, at most max_len tokens) on m's weights as they are (m trainable: its forward keeps
// the activations). *hmem (er_free) holds per layer, one after the other: (C, C) q/k/v_proj's input,
// (qd, qd) o_proj's (qd = heads x head_dim), (C, C) gate/up_proj's, (FF, FF) down_proj's; then (C, C) the
// lm_head's. With hs, *hs (n_params entries, er_free) points at each parameter's block (NULL for those
// that have none). An error names the first block that is not finite.
int quantize_input_moments(Model *m, const SeqBuilder *sb, const Sequence *seqs, int i0, int i1, int max_len,
                           float **hmem, const float ***hs);

// model_untie (model/model.h), refused on a quantized model: a tied model rebuilt untied, so that the lm_head
// can get another format than the embedding (e.g. int8 embeddings and a W4 lm_head, which decode reads
// in full every token). Exact: the logits do not change. A no-op on untied models.
int quantize_untie(Model *m);

// The source as stored, for the size report.
typedef struct {
    size_t params, bytes;
    int bf16; // stored as bf16: a quantized dir keeps that float dtype for what it does not quantize
} QuantizeSource;

// Loads a float model dir to quantize (MODEL_LOAD_TRAINABLE when `trainable` or when transforms are
// asked), refusing a quantized one; applies the transforms (none | rotate | fpt | a list, seeded) and,
// when o asks a tied model for an lm_head format other than the embedding's, unties it. On error
// nothing stays loaded. Reports one line per step to log (NULL = quiet).
int quantize_load(Model *m, const char *model_dir, const char *transforms, uint64_t seed, const QuantizeOptions *o,
                  int trainable, FILE *log, QuantizeSource *src);
// Writes the model dir as `ertrain quantize` does: model_save (packed tensors, quantization_config)
// and the tokenizer files of src_dir (a note to log when it has none; NULL = quiet).
int quantize_write_dir(const Model *m, const char *src_dir, const char *out_dir, int as_bf16, FILE *log);
// Token-weighted mean NLL (loss on every position, like the calibration pass) of m on the first n
// records of a JSONL file, with the tokenizer and chat style of tokenizer_dir; *n_seq (may be NULL)
// gets the sequences used.
int quantize_data_nll(Model *m, const char *tokenizer_dir, const char *path, const char *response_key, int n,
                      int seq_len, double *nll, int *n_seq);

// transform_stream_moments_add's means (train/transform_model.h) over the first n records of a JSONL file,
// tokenized as quantize's calibration is: S (C, C; NULL = not wanted), diag (2L + 1, C).
int quantize_stream_moments(Model *m, const char *tokenizer_dir, const char *path, const char *response_key, int n,
                            int seq_len, double *S, double *diag);

// Fisher sensitivities (squared gradients of the loss on every position, summed over the first n records
// of a JSONL file, tokenized as quantize's calibration is) of a trainable m: *fmem (layout of grad_mem)
// and *imp (n_params, NULL for none) pointing into it, as quantize_model takes them. Free both.
int quantize_fisher(Model *m, const char *tokenizer_dir, const char *path, const char *response_key, int n,
                    int seq_len, float **fmem, const float ***imp);

typedef struct {
    const char *model_dir, *out_dir;
    QuantizeOptions q;
    const char *transforms;   // none | rotate | fpt | fpt-trained | a list (train/transform_model.h, train/fpt.h),
                              // applied before quantizing
    long fpt_local_steps;     // fpt-trained: local steps, then fpt_steps end-to-end steps, both on the
    long fpt_steps;           // first calib_n calibration sequences (ertrain quantize: 100 and 200)
    double fpt_lr;            // fpt-trained AdamW learning rate (> 0; ertrain quantize: 1e-3)
    int fpt_save_every;       // fpt-trained checkpoint interval (0 = at the end only)
    int resume;               // fpt-trained: continue the run in out_dir (its checkpoint/)
    const char *calib;        // JSONL (any dataset record type), NULL = none
    const char *response_key; // record field holding the response (NULL = the record type's own)
    int calib_n;              // sequences for the Fisher pass (the next calib_n are held out for NLL)
    int seq_len;
    const char *sensitivity;  // fisher | none (NULL = fisher with --calib, else none)
    const char *error_feedback; // gptq | none: q2lut / q4lut codes assigned against the calibration inputs' second
                                // moments (NULL = gptq for those formats with --calib, else none)
    uint64_t seed;
    int threads;
    FILE *log;                // progress, notes and the report (NULL = silent; ertrain quantize: stdout)
} QuantizeConfig;

typedef struct {
    QuantizeReport rep;
    double nll_before, nll_after; // NAN without --calib
    int nll_sequences, nll_held_out;
    double fpt_local_first, fpt_local_last, fpt_kl_before, fpt_kl_after; // fpt-trained objectives (else NAN)
} QuantizeResult;

// The whole command.
int quantize_run(const QuantizeConfig *c, QuantizeResult *res);

#endif
