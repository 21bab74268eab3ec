// Packed matrices in model files: the data tensor and its companions, loaded and saved by walking the
// format table (naming in quant/quant.h), so the model code knows no format.
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "quant/blocks.h"
#include "quant/quant.h"


void quant_shape_str(char *buf, size_t n, const StTensor *t) {
    buf[0] = 0;
    for (int d = 0; d < t->ndim && d < 4; d++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%lld", d ? "," : "", (long long)t->shape[d]);
}

void quant_dims_str(char *buf, size_t n, int64_t d0, int64_t d1) {
    if (d1)
        snprintf(buf, n, "%lld,%lld", (long long)d0, (long long)d1);
    else
        snprintf(buf, n, "%lld", (long long)d0);
}

// The second dimension of companion c of w (0: a vector of rows).
static int64_t companion_cols(const WeightFormatInfo *fi, const WeightCompanion *c, const Weight *w) {
    if (c->shape == WC_ROWS)
        return 0;
    return (int64_t)(weight_companion_numel(fi, c, w->rows, w->cols, w->group, w->sparse) / (size_t)w->rows);
}

// The Weight field companion c fills (a typed pointer; copied as bytes to stay clear of aliasing rules).
static const void *companion_get(const Weight *w, const WeightCompanion *c) {
    const void *p;
    memcpy(&p, (const char *)w + c->field, sizeof p);
    return p;
}

static int load_companion(Weight *w, const WeightFormatInfo *fi, const WeightCompanion *c, const char *name,
                          const char *dir, const QuantTensorSource *src) {
    char cname[128];
    snprintf(cname, sizeof cname, "%s%s", name, c->suffix);
    const char *path;
    const StTensor *t = src->find(src->ctx, cname, &path);
    if (!t)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" (the %s of quantized \"%s\") is missing from the model files", dir,
                        cname, c->what, name);
    int64_t d0 = w->rows, d1 = companion_cols(fi, c, w);
    int ok = t->dtype == c->dtype && t->ndim == (d1 ? 2 : 1) && t->shape[0] == d0 && (!d1 || t->shape[1] == d1);
    if (!ok) {
        char got[64], want[64];
        quant_shape_str(got, sizeof got, t);
        quant_dims_str(want, sizeof want, d0, d1);
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" is %s [%s], expected %s [%s] for the %s of \"%s\"", path, cname,
                        dtype_name(t->dtype), got, dtype_name(c->dtype), want, c->what, name);
    }
    const void *data;
    ER_TRY(src->use(src->ctx, t, path, cname, c->nonneg, &data));
    memcpy((char *)w + c->field, &data, sizeof data);
    return ER_OK;
}

int quant_packed_load(Weight *w, WeightFormat f, int group, int sparse, int rows, int cols, const char *name,
                      const char *dir, const QuantTensorSource *src) {
    memset(w, 0, sizeof *w);
    const WeightFormatInfo *fi = weight_format_info(f);
    if (!fi || !fi->quantized)
        return er_error(ER_EINVAL, "quant_packed_load: \"%s\": format %d is not a packed one", name, (int)f);
    if (weight_format_grouped(f) && (group <= 0 || cols % group))
        return er_error(ER_EFORMAT,
                        "%.*s/config.json: quantization_config group_size %d does not divide the %d columns of \"%s\"",
                        path_dir_len(dir), dir, group, cols, name);
    if (sparse < 0 || sparse > cols || (sparse && (!fi->levels || cols > 65536)))
        return er_error(ER_EFORMAT,
                        "%.*s/config.json: quantization_config sparse_per_row %d does not suit \"%s\" (%s, %d columns)",
                        path_dir_len(dir), dir, sparse, name, fi->name, cols);
    if (fi->block && cols % fi->block)
        return er_error(ER_EFORMAT,
                        "%.*s/config.json: quantization_config's %s holds rows in blocks of %d, which do not divide the "
                        "%d columns of \"%s\"",
                        path_dir_len(dir), dir, fi->name, fi->block, cols, name);
    const char *path;
    const StTensor *t = src->find(src->ctx, name, &path);
    if (!t)
        return er_error(ER_EFORMAT, "%s: tensor \"%s\" is missing from the model files", dir, name);
    int64_t rb = (int64_t)weight_row_bytes(f, cols);
    if (t->dtype != fi->dtype || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != rb) {
        char got[64], spec[16];
        quant_shape_str(got, sizeof got, t);
        return er_error(ER_EFORMAT,
                        "%s: tensor \"%s\" is %s [%s], expected %s [%d,%lld] (%s packing of a [%d,%d] matrix, as "
                        "quantization_config says)",
                        path, name, dtype_name(t->dtype), got, dtype_name(fi->dtype), rows, (long long)rb,
                        quant_spec_name(f, group, spec), rows, cols);
    }
    w->fmt = f;
    w->rows = rows;
    w->cols = cols;
    w->group = weight_format_grouped(f) ? group : 0;
    w->sparse = sparse;
    w->data = t->data; // bytes: always aligned
    for (int i = 0; i < fi->n_comp; i++)
        if (weight_companion_stored(&fi->comp[i], sparse))
            ER_TRY(load_companion(w, fi, &fi->comp[i], name, dir, src));
    char cname[128];
    snprintf(cname, sizeof cname, "%s_sparse_cols", name);
    if (!sparse && fi->levels && src->find(src->ctx, cname, &path))
        return er_error(ER_EFORMAT,
                        "%s: tensor \"%s\" holds sparse corrections but %.*s/config.json's quantization_config has no "
                        "sparse_per_row",
                        path, cname, path_dir_len(dir), dir);
    if (fi->block) { // the scales are in the blocks
        size_t nb = (size_t)rows * (size_t)(cols / fi->block), bad = blocks_find_nonfinite(f, t->data, nb);
        if (bad < nb)
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" holds a NaN or infinite scale in block %zu", path, name, bad);
    }
    for (size_t i = 0; i < (size_t)rows * (size_t)sparse; i++)
        if (w->sp_cols[i] >= cols) {
            src->find(src->ctx, cname, &path);
            return er_error(ER_EFORMAT, "%s: tensor \"%s\" holds column %u at index %zu (\"%s\" has %d columns)", path,
                            cname, w->sp_cols[i], i, name, cols);
        }
    return ER_OK;
}

int quant_packed_tensors(const Weight *w, const char *name, StWriteTensor *ts, char (*names)[128]) {
    const WeightFormatInfo *fi = weight_format_info(w->fmt);
    ts[0] = (StWriteTensor){name, fi->dtype, 2, {w->rows, (int64_t)weight_row_bytes(w->fmt, w->cols)}, w->data};
    int n = 1;
    for (int i = 0; i < fi->n_comp; i++) {
        const WeightCompanion *c = &fi->comp[i];
        if (!weight_companion_stored(c, w->sparse))
            continue;
        int64_t d1 = companion_cols(fi, c, w);
        snprintf(names[i], 128, "%s%s", name, c->suffix);
        ts[n++] = (StWriteTensor){names[i], c->dtype, d1 ? 2 : 1, {w->rows, d1}, companion_get(w, c)};
    }
    return n;
}
