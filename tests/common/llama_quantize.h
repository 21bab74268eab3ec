// llama.cpp's own quantizer on GGUF files we write: llama_model_quantize from the libllama that node-llama-cpp
// ships prebuilt (scripts/llama_cpp.sh installs it into build/node_modules), loaded with dlopen, as no llama.cpp
// header ships with it and nothing links it. Skips loudly where node / npm are missing, like the llama.cpp
// comparisons of tests/common/gguf_helpers.h.
#ifndef TESTS_COMMON_LLAMA_QUANTIZE_H
#define TESTS_COMMON_LLAMA_QUANTIZE_H

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

// Relative to the repository root, the tests' working directory.
#define LLAMA_QUANTIZE_LIB "build/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libllama.v0.5.0.so"

// llama.cpp's enum llama_ftype (include/llama.h): the file types llama_model_quantize makes.
enum { LLAMA_FTYPE_MOSTLY_Q8_0 = 7, LLAMA_FTYPE_MOSTLY_Q4_K_M = 15, LLAMA_FTYPE_MOSTLY_Q5_K_M = 17 };

// llama.cpp's struct llama_model_quantize_params, of which only the first two fields are set here. llama.h
// (ggml-org/llama.cpp, 2025 releases up to today's) begins it with
//     int32_t nthread; enum llama_ftype ftype; enum ggml_type output_tensor_type; ...
// and what follows changes from release to release (more types and bools, then pointers: imatrix,
// kv_overrides, ...): 56 bytes in today's llama.h, 64 written by the llama_model_quantize_default_params of
// node-llama-cpp 3.22.1's build (disassembled: nthread 0 and ftype 7 at offsets 0 and 4, as llama.h has it).
// The rest keeps the library's defaults. The struct is far larger than any release's: on x86-64 (SysV) a
// struct over 16 bytes is returned through a hidden pointer to the caller's memory, into which the callee
// writes its own size only; llama_model_quantize takes it by pointer.
typedef struct {
    int32_t nthread;
    int32_t ftype; // enum llama_ftype (an int)
    unsigned char rest[504];
} LlamaQuantizeParams;

// llama.cpp's log (llama_log_set: every tensor's line and the metadata, 60 lines a file) cut to its warnings
// and errors, which say where a mix fell back to another type. ggml's enum ggml_log_level: 3 WARN, 4 ERROR,
// 5 CONT (continues the message before).
static inline void llama_quantize_log(int level, const char *text, void *user) {
    static int shown;
    if (level != 5)
        shown = level == 3 || level == 4;
    if (shown)
        fputs(text, stderr);
}

// llama.cpp quantizes the GGUF file `in` to `out` as file type ftype (LLAMA_FTYPE_*) on nthread threads:
// llama_model_quantize's status (0: done). Installs node-llama-cpp first; skips the test loudly where that
// cannot be done (scripts/llama_cpp.sh --install exits 1 exactly where a llama.cpp run exits 77: node or npm
// missing, or the npm install failing).
static inline int llama_quantize_file(const char *in, const char *out, int ftype, int nthread) {
#if !defined(__x86_64__)
    cr_skip_test("!!!!!! llama.cpp's quantizer comes from node-llama-cpp's linux-x64 binaries: SKIPPED here !!!!!!");
#endif
    // Kept open: llama.cpp's C++ statics would not survive a dlclose well.
    static void *lib;
    static LlamaQuantizeParams (*defaults)(void);
    static uint32_t (*quantize)(const char *, const char *, const LlamaQuantizeParams *);
    void (*log_set)(void (*)(int, const char *, void *), void *);
    if (!lib) {
        int st = system("bash scripts/llama_cpp.sh --install 2>&1");
        if (WIFEXITED(st) && (WEXITSTATUS(st) == 1 || WEXITSTATUS(st) == 77))
            cr_skip_test("!!!!!! node / npm or node-llama-cpp unavailable: llama.cpp's quantizer is SKIPPED !!!!!!");
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "scripts/llama_cpp.sh --install failed (status %d)", st);
        lib = dlopen(LLAMA_QUANTIZE_LIB, RTLD_NOW | RTLD_LOCAL);
        cr_assert(lib, "dlopen %s: %s", LLAMA_QUANTIZE_LIB, dlerror());
        *(void **)&defaults = dlsym(lib, "llama_model_quantize_default_params");
        *(void **)&quantize = dlsym(lib, "llama_model_quantize");
        *(void **)&log_set = dlsym(lib, "llama_log_set");
        cr_assert(defaults && quantize && log_set, "%s lacks llama_model_quantize: %s", LLAMA_QUANTIZE_LIB, dlerror());
        log_set(llama_quantize_log, NULL);
    }
    LlamaQuantizeParams p = defaults();
    p.nthread = nthread;
    p.ftype = ftype;
    return (int)quantize(in, out, &p);
}

#endif
