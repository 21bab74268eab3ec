// fuzz_safetensors: the input is a whole .safetensors file, written to a scratch file and opened with safetensors_open
// (core/safetensors.h), and opened from an exact-size buffer (safetensors_open_bytes). When it opens, every tensor and
// metadata entry is looked up again and read with safetensors_read_tensor, and the promises of the header (data inside
// the mapping, sizes that add up, exact coverage of the buffer) are checked.
#include "tests/fuzz/fuzz_common.h"

#include "core/alloc.h"
#include "core/bytes.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_root_dir("safetensors");
    return 0;
}

static void check_open_file(const StFile *f) {
    const char *lo = f->map, *hi = (const char *)f->map + f->map_size;
    size_t covered = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const StTensor *t = &f->tensors[i];
        FUZZ_CHECK(t->name != NULL, "tensor %d has no name", i);
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "tensor %s ndim %d", t->name, t->ndim);
        FUZZ_CHECK((size_t)st_numel(t) * dtype_size(t->dtype) == t->nbytes, "tensor %s: numel * size != nbytes",
                   t->name);
        FUZZ_CHECK(t->nbytes == 0 || ((const char *)t->data >= lo && (const char *)t->data + t->nbytes <= hi),
                   "tensor %s lies outside the mapping", t->name);
        FUZZ_CHECK(safetensors_find(f, t->name) == t, "safetensors_find(%s) is another tensor", t->name);
        covered += t->nbytes;
        // Touch every byte the parser vouched for, through the public copy routine.
        void *dst = er_alloc(t->nbytes);
        if (!dst)
            continue;
        int rc = safetensors_read_tensor(f, t->name, t->dtype, t->ndim, t->shape, dst);
        FUZZ_CHECK(rc == ER_OK, "reading %s with its own dtype and shape: %s", t->name, er_last_error());
        // The same tensor asked for with another dtype must be refused, not copied.
        ErDType other = t->dtype == DT_F32 ? DT_U8 : DT_F32;
        FUZZ_CHECK(safetensors_read_tensor(f, t->name, other, t->ndim, t->shape, dst) < 0,
                   "%s read with a wrong dtype", t->name);
        er_free(dst);
    }
    // Sorted by offset, the tensors tile the data buffer: it ends exactly at the end of the file.
    if (f->n_tensors > 0) {
        const StTensor *last = &f->tensors[f->n_tensors - 1];
        const StTensor *first = &f->tensors[0];
        if (last->nbytes)
            FUZZ_CHECK((const char *)last->data + last->nbytes == hi, "the last tensor does not end the file");
        FUZZ_CHECK((size_t)(hi - (const char *)first->data) == covered, "tensors do not tile the data buffer");
    }
    for (int i = 0; i < f->n_meta; i++) {
        const char *v = safetensors_meta(f, f->meta_keys[i]);
        FUZZ_CHECK(v != NULL, "metadata key %s not found again", f->meta_keys[i]);
    }
    FUZZ_CHECK(safetensors_find(f, "\x01not-a-tensor") == NULL, "found a tensor that is not there");
}

// The same bytes from memory (safetensors_open_bytes, as er_model_load_from_buffer reads them), in a heap
// block of exactly their size: ASan sees a read past the end that a mapping's last page would hide. The
// verdict is the file's.
static int open_from_memory(const uint8_t *data, size_t size, int file_rc) {
    uint8_t *exact = malloc(size ? size : 1);
    FUZZ_CHECK(exact != NULL, "out of memory");
    memcpy(exact, data, size);
    ByteRange r;
    StFile f;
    FUZZ_CHECK(bytes_from_buffer(&r, exact, size, "<buffer>", 1) == ER_OK, "bytes_from_buffer failed");
    int rc = safetensors_open_bytes(&f, &r);
    FUZZ_CHECK((rc < 0) == (file_rc < 0), "the file %s but the same bytes in memory %s",
               file_rc < 0 ? "is refused" : "opens", rc < 0 ? "are refused" : "open");
    if (rc == ER_OK) {
        check_open_file(&f);
        safetensors_close(&f);
    }
    free(exact);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[FUZZ_PATH_MAX];
    fuzz_write("in.safetensors", data, size);
    StFile f;
    int rc = safetensors_open(&f, fuzz_path(path, "in.safetensors"));
    open_from_memory(data, size, rc);
    if (rc < 0)
        return fuzz_refused("refused");
    check_open_file(&f);
    safetensors_close(&f);
    return 0;
}
