# ertrain / erinfer build.
#   make                 build/erinfer + build/liberinfer.a and build/liberinfer.so (the runtime, shipped: links
#                        alone, exports the public API only), build/ertrain + build/libertrain.a (the training
#                        tier), build/example; checks that liberinfer.a links alone and that neither library
#                        prints, exits or aborts (check-runtime)
#   make test            Criterion suite (runs the PyTorch reference generator first), check-source (layering and
#                        function length: scripts/check_layers.py, scripts/check_functions.py), check-symbols
#                        (scripts/check_symbols.py) and tests/link/ (erinfer beside llama.cpp, OpenBLAS flags)
#   make install         PREFIX=/usr/local DESTDIR= SHARED=1: liberinfer.a, liberinfer.so, erinfer.h, erinfer.pc;
#                        make install-check builds the example against an installed copy (docs/api.md)
#   make bench           benchmarks (ratios against peers / physical limits)
#   (test, test-simd, bench, demo and fuzz first install missing Debian packages with scripts/deps.sh)
#   make SAN=1 test      the same under ASan + UBSan (objects in build/san/)
#   make ARCH=           portable build, objects in build/portable/ (default ARCH=-march=native); every x86 build
#                        carries the AVX2 and AVX512-VNNI kernels of quant/ and picks one at run time
#   make test-simd       those kernel sets each under the kernel, model and engine suites (ER_SIMD=...)
#   make BLAS=0          no OpenBLAS: the built-in GEMM (the runtime library must build this way); BLAS=1 finds
#                        OpenBLAS through `pkg-config openblas`
#   make TILES=0         without the tiled decode kernels (quant_tile; objects in .../notiles/): the
#                        x86 reference of make test-aarch64's token comparison
#   make CUDA=1          with the CUDA backend (model/cuda/: nvcc, cuBLAS from CUDA_HOME, default /usr/local/cuda)
#                        in build/cuda/; make CUDA=1 cuda-check builds everything so (CI's compile and link check)
#   make CUDA_EMU=1 test-cuda-emu   (test-only) the CUDA backend's kernels and cuBLAS calls emulated on the CPU
#                        (tests/cuda_emu/, no GPU or CUDA library; ASan + UBSan) against the CPU backend, in
#                        build/cuda_emu/; test-cuda-emu-programs: erinfer and ertrain on it against --device cpu
#   make test-aarch64    the runtime cross-built for aarch64 and its suites under qemu (make CROSS=aarch64-linux-gnu-
#                        builds it alone into build/aarch64/; section "aarch64" below)
#   make fuzz            libFuzzer targets (tests/fuzz/, clang, ASan + UBSan), FUZZ_TIME s each (default 30)
#   make fuzz FUZZ_TARGETS=fuzz_config   one target (or a list); make fuzz-build only builds them (build/fuzz/)

# A bare `make` builds the programs and libraries (the rule `all` below) and nothing else.
.DEFAULT_GOAL := all

ARCH ?= -march=native
SAN ?= 0
BLAS ?= 1
TILES ?= 1
PY ?= /usr/bin/python3
QUICK ?= 0
# SHARED=0: no liberinfer.so (built by default beside the static archive; make install SHARED=0 installs the
# archive alone).
SHARED ?= 1
# aarch64 (phones), cross-built here: make CROSS=aarch64-linux-gnu- (the aarch64 section below has the
# rest). ARMv8.0 is the baseline (NEON is always there); dotprod is chosen at run time (quant/qkernel_neon.c).
CROSS ?=
ifneq ($(CROSS),)
CC := $(CROSS)gcc
ARCH := -march=armv8-a
override BLAS := 0
endif

# Each configuration builds into its own dir so objects never mix.
BUILD := build
ifeq ($(SAN),1)
BUILD := build/san
endif
ifeq ($(BLAS),0)
BUILD := $(BUILD)/noblas
endif
ifeq ($(TILES),0)
BUILD := $(BUILD)/notiles
endif
# Another x86 target than the default: build/portable for ARCH= (x86-64), else build/<ARCH's letters>.
ifeq ($(CROSS)$(filter -march=native,$(ARCH)),)
BUILD := $(BUILD)/$(if $(strip $(ARCH)),$(subst =,_,$(subst $(subst ,, ),,$(subst -,,$(ARCH)))),portable)
endif

CC ?= gcc
CFLAGS := -std=c11 -D_GNU_SOURCE -O2 $(ARCH) -g -Wall -Wextra -Wno-unused-parameter -fopenmp -I. -MMD -MP
LDLIBS := -lcjson -lpcre2-8 -lutf8proc -lm
LDFLAGS := -fopenmp
ifeq ($(TILES),0)
CFLAGS += -DER_NO_TILES
endif

# OpenBLAS through pkg-config (Debian's libopenblas-openmp-dev: openblas.pc names the OpenMP build, whose threads
# share our pool). An RPATH to each of its -L dirs keeps the programs on the library pkg-config named, whichever
# libopenblas.so.0 the system's alternatives pick. The goals that install the dependencies first (scripts/deps.sh,
# then make again) get the error from that second make, so a bare machine can still run `make test`.
# The sub-makes of test, test-simd, test-aarch64, test-mpi, fuzz, bench, demo and paper build on every core.
NPROC := $(shell nproc 2>/dev/null || echo 2)
DEPS_GOALS := test test-simd bench demo paper fuzz test-mpi test-aarch64 clean
ifeq ($(BLAS),1)
OPENBLAS_CFLAGS := $(strip $(shell pkg-config --cflags openblas 2>/dev/null))
OPENBLAS_LIBS := $(strip $(shell pkg-config --libs openblas 2>/dev/null))
comma := ,
OPENBLAS_RPATH := $(patsubst -L%,-Wl$(comma)-rpath$(comma)%,$(shell pkg-config --libs-only-L openblas 2>/dev/null))
ifeq ($(OPENBLAS_LIBS),)
ifneq ($(filter-out $(DEPS_GOALS),$(or $(MAKECMDGOALS),all)),)
$(error BLAS=1: `pkg-config --libs openblas` finds no OpenBLAS (install libopenblas-openmp-dev: scripts/deps.sh; \
  or point PKG_CONFIG_PATH at an openblas.pc; or build without it: make BLAS=0))
endif
endif
CFLAGS += -DER_BLAS $(OPENBLAS_CFLAGS)
LDLIBS += $(OPENBLAS_LIBS) $(OPENBLAS_RPATH)
endif
ifeq ($(SAN),1)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
# Data parallel (make MPI=1, OpenMPI: MPI=1 scripts/deps.sh): only train/dist.c sees mpi.h, and only
# the programs above the training tier link libmpi; liberinfer's objects and its links-alone check
# stay as without MPI. Objects go to their own dir. `make MPI=1 test-mpi` runs the mpirun tests.
MPI ?= 0
ifeq ($(MPI),1)
BUILD := $(BUILD)/mpi
MPI_LIBS := $(shell mpicc --showme:link)
endif

# CUDA=1: the CUDA backend (model/cuda/: kernels by nvcc, host code by $(CC)) joins liberinfer, with
# cudart and cuBLAS from CUDA_HOME; -DER_CUDA lets backend_open offer "cuda". The whole configuration
# builds into its own dir (ER_CUDA changes C objects too). Rules: the CUDA section at the end.
CUDA ?= 0
ifeq ($(CUDA),1)
CUDA_HOME ?= /usr/local/cuda
NVCC := $(CUDA_HOME)/bin/nvcc
ifeq ($(wildcard $(NVCC)),)
$(error make CUDA=1: no nvcc at $(NVCC) (install the CUDA toolkit or set CUDA_HOME))
endif
BUILD := $(BUILD)/cuda
# Machine code for each of CUDA_ARCHS (A100 80, A10/A40/RTX 30xx 86, L4/L40/RTX 40xx 89, H100/H200 90)
# plus the PTX of the first (lowest), which any newer GPU compiles at load time. Lowest first;
# CUDA_ARCHS="90" narrows the build (faster to compile). cuda-check lists the object's arches.
CUDA_ARCHS ?= 80 86 89 90
CUDA_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_$(firstword $(CUDA_ARCHS)),code=compute_$(firstword $(CUDA_ARCHS))
# The host side of the kernels is library code like the C objects: hidden symbols, position-independent.
NVCCFLAGS := -O3 -lineinfo -std=c++17 $(CUDA_GENCODE) -Xcompiler -Wall,-Wextra,-fvisibility=hidden,-fPIC -I. -MMD -MP
CFLAGS += -DER_CUDA -I$(CUDA_HOME)/include
# nvcc's kernel launch stubs need the C++ runtime (static-local guards).
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
endif
# The per-target flags of MPI=1 (and NCCL), once BUILD is final. With CUDA=1 too, the gradients of a
# device are summed by NCCL when CUDA_HOME has it (NCCL=0 keeps the host-staged MPI_Allreduce).
ifeq ($(MPI),1)
$(BUILD)/obj/train/dist.o: CFLAGS += -DER_MPI $(shell mpicc --showme:compile)
$(BUILD)/ertrain $(BUILD)/test_all $(BUILD)/bench/%: LDLIBS += $(MPI_LIBS)
ifeq ($(CUDA),1)
NCCL ?= $(if $(wildcard $(CUDA_HOME)/include/nccl.h),1,0)
ifeq ($(NCCL),1)
$(BUILD)/obj/train/dist.o: CFLAGS += -DER_NCCL
$(BUILD)/ertrain $(BUILD)/test_all $(BUILD)/bench/%: LDLIBS += -lnccl
endif
endif
endif

# CUDA_EMU=1 (test-only; section "CUDA emulated" at the end): the CUDA backend with its kernels compiled as
# host C++ and run by an emulator (tests/cuda_emu/), no GPU, driver, cudart or cuBLAS; under ASan + UBSan.
CUDA_EMU ?= 0
ifeq ($(CUDA_EMU),1)
ifeq ($(CUDA),1)
$(error make CUDA_EMU=1 and CUDA=1 exclude each other)
endif
BUILD := build/cuda_emu
# The emulated kernels are test-only C++, neither position-independent nor hidden: no .so of them.
override SHARED := 0
EMU_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
CFLAGS += -DER_CUDA -DER_CUDA_EMU -Itests/cuda_emu/include $(EMU_SAN)
LDFLAGS += -fsanitize=address,undefined
LDLIBS += $(BUILD)/libcuda_emu.a -lstdc++
endif

# ---- aarch64: make CROSS=aarch64-linux-gnu- [all | test-aarch64] (ARM64=1 scripts/deps.sh installs the
# cross compiler, qemu-user and the arm64 -dev packages). Objects in build/aarch64/, no BLAS. erinfer and
# example are static (copied to a phone alone); Debian has no static libcjson, so every aarch64 program
# links cJSON compiled from Debian's source package (deps.sh unpacks it into CJSON_SRC).
ifneq ($(CROSS),)
BUILD := build/aarch64
CJSON_SRC ?= /usr/local/src/cjson
CJSON_OBJ := $(BUILD)/obj/cjson/cJSON.o
LDLIBS := $(CJSON_OBJ) $(filter-out -lcjson,$(LDLIBS))
# The one link warning -w hides: libgomp's offload-plugin loader calls dlopen, which a static binary can
# only serve with this glibc's shared objects; erinfer never offloads, so the call never runs.
$(BUILD)/erinfer $(BUILD)/example: LDFLAGS += -static -Wl,--no-warnings
# GCC 12.2's aarch64 vectorizer stops with an internal error (vect_transform_reduction) on some tests'
# double reductions (test_sampler.c, test_merge.c); the library's own code compiles with the full flags.
$(BUILD)/obj/tests/%.o: CFLAGS += -fno-tree-loop-vectorize
$(BUILD)/erinfer $(BUILD)/example $(BUILD)/ertrain $(BUILD)/test_all $(BUILD)/liberinfer.ok: | $(CJSON_OBJ)
# Criterion for arm64 sits outside dpkg's database (scripts/deps.sh says why); an RPATH, unlike a RUNPATH,
# also serves libcriterion's own libnanomsg.
CRITERION_ARM64 ?= /usr/local/lib/aarch64-criterion
$(BUILD)/test_all: LDFLAGS += -L$(CRITERION_ARM64) -Wl,--disable-new-dtags,-rpath,$(CRITERION_ARM64)
$(CJSON_OBJ): $(CJSON_SRC)/cJSON.c
	@mkdir -p $(dir $@)
	$(CC) -std=c89 -O2 $(ARCH) -g -fPIC -c $< -o $@
endif

# make test-aarch64 (CI runs it after make test): the x86 build (the token comparison's reference), then
# the aarch64 build and, under qemu (the kernel runs aarch64 programs through it, scripts/deps.sh):
#   - every suite of the runtime's test folders (core quant lora model data infer) on `-cpu max` (a core
#     with dotprod and i8mm); the training tier's suites (train rl switcher_train verifier_train) are left
#     out: they are not on the device, and two of them exceed Criterion's 60 s per test under emulation;
#   - the kernel and forward suites on `-cpu cortex-a53` (ARMv8.0, no dot-product extensions): any
#     instruction beyond the baseline would stop them with SIGILL;
#   - the kernel suites on `-cpu neoverse-n1` (dotprod without i8mm: q8 and q4 on SDOT at every N);
#   - the tiny base's greedy tokens against x86's on both CPU models (scripts/aarch64_tokens.sh). The
#     reference is x86 without BLAS and without the tiled decode kernels (build/noblas/notiles): OpenBLAS
#     sums a prefill's products in another order, and so do the AVX512-VNNI tiled kernels each row's block
#     sums (the same integers), and the int8 rounding of the decode inputs can turn that last-bit difference
#     into another token; the engine's own GEMM and its other kernels compute the same bits on both CPUs.
lparen := (
AARCH64_SUITES = $(sort $(shell sed -n 's/^Test$(lparen)\([a-z_0-9]*\),.*/\1/p' $(wildcard $(RUNTIME_DIRS:%=tests/%/*.c))))
AARCH64_A53_SUITES := quant_kernels quant_formats quant_model reference kvcache engine api example
AARCH64_N1_SUITES := quant_kernels quant_model
AARCH64_RUN = OMP_WAIT_POLICY=passive ER_REF_DIR=$(REF_DIR) ER_BUILD=$(BUILD) $(BUILD)/test_all --jobs 2
.PHONY: test-aarch64 test-aarch64-run
test-aarch64:
	ARM64=1 bash scripts/deps.sh
	$(MAKE) -j$(NPROC) --no-print-directory all
	$(MAKE) -j$(NPROC) --no-print-directory BLAS=0 TILES=0 build/noblas/notiles/erinfer build/noblas/notiles/ertrain
	$(MAKE) -j$(NPROC) --no-print-directory CROSS=aarch64-linux-gnu- test-aarch64-run

test-aarch64-run: all $(BUILD)/test_all ref check-symbols
	QEMU_CPU=max $(AARCH64_RUN) --filter '@($(subst $(space),|,$(AARCH64_SUITES)))/*'
	QEMU_CPU=cortex-a53 $(AARCH64_RUN) --filter '@($(subst $(space),|,$(AARCH64_A53_SUITES)))/*'
	QEMU_CPU=neoverse-n1 $(AARCH64_RUN) --filter '@($(subst $(space),|,$(AARCH64_N1_SUITES)))/*'
	bash scripts/aarch64_tokens.sh build/noblas/notiles $(BUILD)

# Two libraries, one way up (docs/design.md): liberinfer is the on-device runtime and links alone (no
# training object, no BLAS needed: `make BLAS=0`); libertrain is the training tier above it. The
# programs sit on top: erinfer/ is erinfer, ertrain/ is ertrain, and cli/ is the command-line code both
# link (erinfer eval and the generation flags: ertrain eval is erinfer eval split across MPI ranks).
RUNTIME_DIRS := core quant lora model data infer
TRAIN_DIRS := train rl switcher_train verifier_train
# core/args.c, the flag parser, prints --help and the command list: the programs link it, the
# library (which never prints) does not.
ARGS_SRC := core/args.c
RUNTIME_SRC := $(filter-out $(ARGS_SRC),$(foreach d,$(RUNTIME_DIRS),$(wildcard $(d)/*.c)))
TRAIN_SRC := $(foreach d,$(TRAIN_DIRS),$(wildcard $(d)/*.c))
CLI_SRC := $(wildcard cli/*.c)
# erinfer serve (erinfer/server*.c, on GNU libmicrohttpd) is part of the erinfer program, never of liberinfer.
# The aarch64 build leaves it out (a static erinfer would need arm64 libmicrohttpd and GnuTLS): there
# erinfer/main.c has no serve command. The tests link the JSON half (no HTTP library in it).
SERVER_SRC := $(wildcard erinfer/server*.c)
# erinfer memory (erinfer/memory*.c, on libsqlite3 with FTS5) likewise: the erinfer program and the tests link it,
# liberinfer never; the aarch64 build leaves it out (-DER_NO_MEMORY) as it leaves out serve. The store without the
# command (memory.c, memory_search.c, memory_scan.c) is what the tests and the fuzz target link.
MEMORY_SRC := $(wildcard erinfer/memory*.c)
MEMORY_STORE_SRC := $(filter-out erinfer/memory_cmd.c,$(MEMORY_SRC))
ERINFER_SRC := $(filter-out $(SERVER_SRC) $(MEMORY_SRC),$(wildcard erinfer/*.c)) $(CLI_SRC) $(ARGS_SRC)
ERTRAIN_SRC := $(wildcard ertrain/*.c) $(CLI_SRC) $(ARGS_SRC)
# tests/link/: the build and link checks make test runs after the suites (erinfer beside llama.cpp, OpenBLAS through
# pkg-config), not Criterion suites.
TEST_SRC := $(filter-out tests/fuzz/% tests/link/%,$(wildcard tests/*/*.c))
BENCH_SRC := $(wildcard bench/*.c)
ifeq ($(CROSS),)
ERINFER_SRC += $(SERVER_SRC) $(MEMORY_SRC)
$(BUILD)/erinfer: LDLIBS += -lmicrohttpd -lpthread -lsqlite3
TEST_SRC += $(MEMORY_STORE_SRC)
$(BUILD)/test_all: LDLIBS += -lsqlite3
else
$(BUILD)/obj/erinfer/main.o $(BUILD)/obj/erinfer/chat.o: CFLAGS += -DER_NO_SERVE -DER_NO_MEMORY
TEST_SRC := $(filter-out tests/infer/test_memory.c,$(TEST_SRC))
endif
TEST_SRC += erinfer/server_json.c

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
RUNTIME_OBJ := $(call obj,$(RUNTIME_SRC))
TRAIN_OBJ := $(call obj,$(TRAIN_SRC))

# x86: the SIMD kernels of quant/ (quant/qkernel.c, quant/qkernel_blocks.c) compiled twice, for AVX2 + FMA + F16C
# and for AVX512-VNNI, whatever ARCH says (QK_SUFFIX names each copy's symbols apart, quant/qkernel.h): quant/matmul.c
# picks one at run time, so that a portable build (ARCH=) runs the best kernels of the x86 CPU it lands on.
QK_X86_SRC := quant/qkernel.c quant/qkernel_blocks.c
QK_FLAGS_avx2 := -mavx2 -mfma -mf16c -mno-avx512f -DQK_SUFFIX=avx2
QK_FLAGS_avx512 := -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni -DQK_SUFFIX=avx512
ifneq ($(findstring x86_64,$(shell $(CC) -dumpmachine)),)
qk_x86 = $(filter-out $(QK_X86_SRC:%.c=$(1)/%.o),$(2)) $(foreach v,avx2 avx512,$(QK_X86_SRC:%.c=$(1)/%.$(v).o))
else
qk_x86 = $(2)
endif
RUNTIME_OBJ := $(call qk_x86,$(BUILD)/obj,$(RUNTIME_OBJ))

# The libraries' files (docs/design.md, "Libraries and symbols"; docs/api.md, "Building an application"):
#   liberinfer.a           SHIPPED (make install): the runtime's objects prelinked into one (ld -r) whose hidden
#                          symbols are then made local (objcopy --localize-hidden), so the public API is its only
#                          global definition. An application may link it beside llama.cpp, whose ggml has names
#                          that ours have too (gguf_find_tensor, ggml_type_name ...): a global one of ours would
#                          be exported from the program and interpose on ggml's inside libllama.
#   liberinfer.so.X.Y.Z    SHIPPED: the same objects, SONAME liberinfer.so.X (ER_VERSION_* of infer/erinfer.h), the
#                          version script infer/liberinfer.map exporting er_* only; liberinfer.so.X and
#                          liberinfer.so link to it, here as where it is installed.
#   liberinfer-internal.a  the same objects as compiled, for what calls internal functions: erinfer, ertrain, the
#                          tests and the benchmarks. Never installed.
#   libertrain.a           the training tier, internal too (no public header; ertrain, the tests, the benchmarks).
# Every library object is compiled -fvisibility=hidden (infer/erinfer.h's ER_API alone gives default visibility)
# and -fPIC for the .so (with hidden symbols the code is what the default PIE build made of it).
# scripts/check_symbols.py checks the rule in make test (check-symbols).
RUNTIME_LIB := $(BUILD)/liberinfer.a
RUNTIME_INTERNAL := $(BUILD)/liberinfer-internal.a
TRAIN_LIB := $(BUILD)/libertrain.a
LIB_VISIBILITY := -fvisibility=hidden -fPIC
LIB_C_OBJ := $(RUNTIME_OBJ) $(TRAIN_OBJ) $(call obj,$(wildcard model/cuda/*.c))
$(LIB_C_OBJ): CFLAGS += $(LIB_VISIBILITY)
# The flags are written to a file the objects depend on, so objects compiled without them are rebuilt.
LIB_FLAGS_FILE := $(BUILD)/obj/lib-flags
$(shell mkdir -p $(dir $(LIB_FLAGS_FILE)); echo '$(LIB_VISIBILITY)' | cmp -s - $(LIB_FLAGS_FILE) || \
  echo '$(LIB_VISIBILITY)' >$(LIB_FLAGS_FILE))
$(LIB_C_OBJ): $(LIB_FLAGS_FILE)
er_version = $(shell sed -n 's/^[#]define ER_VERSION_$(1) *\([0-9][0-9]*\)$$/\1/p' infer/erinfer.h)
ER_MAJOR := $(call er_version,MAJOR)
ER_VERSION := $(ER_MAJOR).$(call er_version,MINOR).$(call er_version,PATCH)
SO_NAME := liberinfer.so.$(ER_MAJOR)
RUNTIME_SO := $(BUILD)/liberinfer.so.$(ER_VERSION)
SHARED_LIB := $(if $(filter 1,$(SHARED)),$(RUNTIME_SO))

.PHONY: all test test-run bench bench-run demo clean ref check-runtime check-source check-symbols
all: $(BUILD)/ertrain $(BUILD)/erinfer $(BUILD)/example $(SHARED_LIB) check-runtime

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.avx2.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(QK_FLAGS_avx2) -c $< -o $@

$(BUILD)/obj/%.avx512.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(QK_FLAGS_avx512) -c $< -o $@

$(RUNTIME_INTERNAL): $(RUNTIME_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(TRAIN_LIB): $(TRAIN_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# One object, so that the links between our files are resolved before the hidden names become local.
$(RUNTIME_LIB): $(RUNTIME_OBJ)
	@mkdir -p $(dir $@)
	$(CROSS)ld -r $^ -o $(BUILD)/liberinfer.o
	$(CROSS)objcopy --localize-hidden $(BUILD)/liberinfer.o
	rm -f $@ && ar rcs $@ $(BUILD)/liberinfer.o

# -z defs: the .so names every library it needs (what liberinfer.ok checks for the archive).
$(RUNTIME_SO): $(RUNTIME_OBJ) infer/liberinfer.map
	$(CC) -shared $(LDFLAGS) -Wl,-soname,$(SO_NAME) -Wl,--version-script=infer/liberinfer.map -Wl,-z,defs \
	  $(filter %.o,$^) $(LDLIBS) -o $@
	ln -sf $(notdir $@) $(BUILD)/$(SO_NAME) && ln -sf $(SO_NAME) $(BUILD)/liberinfer.so
$(RUNTIME_SO): | $(CJSON_OBJ) # aarch64: cJSON from source (the CROSS section), compiled -fPIC for this link

$(BUILD)/erinfer: $(call obj,$(ERINFER_SRC)) $(RUNTIME_INTERNAL)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/ertrain: $(call obj,$(ERTRAIN_SRC)) $(TRAIN_LIB) $(RUNTIME_INTERNAL)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# The embedding example: uses only infer/erinfer.h (on the include path as an installed copy would be) and links
# the shipped archive like an application would.
$(BUILD)/obj/infer/examples/example.o: CFLAGS += -Iinfer
$(BUILD)/example: $(BUILD)/obj/infer/examples/example.o $(RUNTIME_LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# The runtime library stands alone: linking every object of the shipped archive into a program with an
# empty main leaves no undefined symbol but those of libc, libm, OpenMP, OpenBLAS (BLAS=1) and the Debian
# libraries it names (cJSON, PCRE2, utf8proc). Any reference into a training folder fails this link.
$(BUILD)/liberinfer.ok: $(RUNTIME_LIB)
	printf 'int main(void) { return 0; }\n' > $(BUILD)/liberinfer-check.c
	$(CC) $(LDFLAGS) $(BUILD)/liberinfer-check.c -Wl,--whole-archive $< -Wl,--no-whole-archive $(LDLIBS) \
	  -o $(BUILD)/liberinfer-check 2>$(BUILD)/liberinfer-check.log || \
	  { cat $(BUILD)/liberinfer-check.log; echo "$<: does not link alone (see above)"; exit 1; }
	rm -f $(BUILD)/liberinfer-check $(BUILD)/liberinfer-check.c && touch $@

# Library code never prints, exits or aborts (docs/design.md): no object of either library refers to
# stdout, stderr, printf, puts, exit or abort (streams come from the caller).
LIB_FORBIDDEN := stdout stderr printf puts putchar perror vprintf exit abort
$(BUILD)/libs-quiet.ok: $(RUNTIME_INTERNAL) $(TRAIN_LIB)
	@bad=$$(nm -A -u $^ | grep -wE '$(subst $(space),|,$(LIB_FORBIDDEN))'); \
	if [ -n "$$bad" ]; then echo "$$bad"; echo "library objects above print, exit or abort"; exit 1; fi
	touch $@
space := $(subst ,, )
check-runtime: $(BUILD)/liberinfer.ok $(BUILD)/libs-quiet.ok

# The symbol rule: the shipped liberinfer.a and liberinfer.so define no global symbol but the ER_API functions of
# infer/erinfer.h (and define all of them), and no object of the internal archives gives default visibility to
# anything else. The script first checks itself on small libraries with a leaked symbol (--self-test).
check-symbols: $(RUNTIME_LIB) $(SHARED_LIB) $(RUNTIME_INTERNAL) $(TRAIN_LIB)
	$(PY) scripts/check_symbols.py --self-test --cc '$(CC)' --cross '$(CROSS)'
	$(PY) scripts/check_symbols.py --header infer/erinfer.h --shipped $(RUNTIME_LIB) $(SHARED_LIB) \
	  --internal $(RUNTIME_INTERNAL) $(TRAIN_LIB)

# make install [PREFIX=/usr/local] [DESTDIR=] [SHARED=0]: lib/liberinfer.a, lib/liberinfer.so.X.Y.Z with its
# .so.X and .so links (not with SHARED=0), include/erinfer.h and lib/pkgconfig/erinfer.pc, whose Libs.private are
# what this configuration links the archive with (OpenMP, libm, OpenBLAS through pkg-config when BLAS=1) and
# Requires.private the Debian libraries with a .pc. Nothing of the training tier is installed.
PREFIX ?= /usr/local
PC_LIBS_PRIVATE := $(strip $(LDFLAGS) $(filter-out -lcjson -lpcre2-8 -lutf8proc,$(LDLIBS)))
.PHONY: install install-check
install: $(RUNTIME_LIB) $(SHARED_LIB) check-runtime
	install -d '$(DESTDIR)$(PREFIX)/lib/pkgconfig' '$(DESTDIR)$(PREFIX)/include'
	install -m 644 infer/erinfer.h '$(DESTDIR)$(PREFIX)/include/erinfer.h'
	install -m 644 $(RUNTIME_LIB) '$(DESTDIR)$(PREFIX)/lib/liberinfer.a'
ifeq ($(SHARED),1)
	install -m 755 $(RUNTIME_SO) '$(DESTDIR)$(PREFIX)/lib/$(notdir $(RUNTIME_SO))'
	ln -sf $(notdir $(RUNTIME_SO)) '$(DESTDIR)$(PREFIX)/lib/$(SO_NAME)'
	ln -sf $(SO_NAME) '$(DESTDIR)$(PREFIX)/lib/liberinfer.so'
endif
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(ER_VERSION)|' -e 's|@LIBS_PRIVATE@|$(PC_LIBS_PRIVATE)|' \
	  infer/erinfer.pc.in > '$(DESTDIR)$(PREFIX)/lib/pkgconfig/erinfer.pc'

# CI, after make test: installs into temporary prefixes (under $(BUILD)/install-check/) and builds
# infer/examples/example.c against each copy with `pkg-config --cflags --libs erinfer` alone: linked to the .so
# (run through LD_LIBRARY_PATH), and from an archive-only install (SHARED=0) with `pkg-config --static`; both run
# on the tiny base; and a staged install (DESTDIR) lands under DESTDIR naming PREFIX (scripts/install_check.sh).
INSTALL_CHECK := $(BUILD)/install-check
install-check: all
	rm -rf $(INSTALL_CHECK)
	$(MAKE) --no-print-directory install PREFIX=$(CURDIR)/$(INSTALL_CHECK)/shared
	$(MAKE) --no-print-directory install SHARED=0 PREFIX=$(CURDIR)/$(INSTALL_CHECK)/static
	$(MAKE) --no-print-directory install DESTDIR=$(CURDIR)/$(INSTALL_CHECK)/stage PREFIX=/opt/erinfer
	CC='$(CC)' bash scripts/install_check.sh $(INSTALL_CHECK)

# erinfer beside real llama.cpp in one process (tests/link/beside_llama.c, run by make test): the shipped archive
# (and the .so) linked with node-llama-cpp's libllama and libggml; skipped loudly without node or the package.
BESIDE_LLAMA = CC='$(CC)' LDFLAGS='$(LDFLAGS)' LIBS='$(LDLIBS)' SHARED_LIB='$(SHARED_LIB)' \
  bash tests/link/beside_llama.sh $(BUILD)
.PHONY: test-beside-llama
test-beside-llama: all
	$(BESIDE_LLAMA)

# The layering (includes, declarations, test helpers) and function length, read from the sources.
check-source:
	$(PY) scripts/check_layers.py
	$(PY) scripts/check_functions.py

# Every OpenMP region of the code under test through tests/common/omp_probe.c (the team each one got).
$(BUILD)/test_all: LDFLAGS += -Wl,--wrap=GOMP_parallel
$(BUILD)/test_all: $(call obj,$(TEST_SRC) $(ARGS_SRC)) $(TRAIN_LIB) $(RUNTIME_INTERNAL)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcriterion -o $@

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(call obj,$(ARGS_SRC)) $(TRAIN_LIB) $(RUNTIME_INTERNAL)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@
# erinfer memory's vector scan (bench/run_memory.sh) links the store, like the erinfer program (its objects before
# the archive they call into).
$(BUILD)/bench/memory_scan: $(BUILD)/obj/bench/memory_scan.o $(call obj,$(MEMORY_STORE_SRC) $(ARGS_SRC)) $(RUNTIME_INTERNAL)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lsqlite3 -o $@

# Reference checkpoints and expected outputs from the PyTorch reference (scripts/ref/). Tests
# that need them skip loudly when torch is missing.
REF_DIR := build/ref
ref: $(REF_DIR)/.done
$(REF_DIR)/.done: scripts/ref/make_ref.py scripts/ref/make_lora_ref.py scripts/ref/qwen2_ref.py
	@if $(PY) -c 'import torch' 2>/dev/null; then \
	  $(PY) scripts/ref/make_ref.py --out $(REF_DIR) && \
	  $(PY) scripts/ref/make_lora_ref.py --out $(REF_DIR) && touch $@; \
	else echo "WARNING: $(PY) has no torch: PyTorch reference tests will be SKIPPED (run scripts/deps.sh)"; fi

# test, bench and demo install what is missing first (scripts/deps.sh: a quick check when all is
# there), then build in a second make so that nothing compiles before the headers are installed.
test:
	bash scripts/deps.sh
	$(MAKE) -j$(NPROC) --no-print-directory test-run

# Two test jobs at once, each with OpenMP threads: waiting threads sleep instead of spinning on the
# cores the other job needs (spinning makes the suite several times slower on 2 cores).
test-run: all $(BUILD)/test_all $(BUILD)/bench/llama_quantize ref check-source check-symbols
	OMP_WAIT_POLICY=passive ER_REF_DIR=$(REF_DIR) ER_BUILD=$(BUILD) $(BUILD)/test_all --jobs $(TEST_JOBS)
	$(BESIDE_LLAMA)
	bash tests/link/make_blas.sh
# The x86 kernel sets every build carries (quant/matmul.c picks one at run time), each run on this CPU: a portable
# build (ARCH=, objects in build/portable/, or beside SAN=1's and BLAS=0's) and its kernel, model, GGUF and engine suites under ER_SIMD=avx512, avx2
# and portable. CI runs it after make test; quant_kernels checks that the set asked for is the one that ran, so on a
# CPU without AVX512-VNNI the first run fails rather than testing another set.
SIMD_SUITES := quant_kernels quant_blocks quant_formats quant_model gguf gguf_llama gguf_quantize reference kvcache \
  engine api
.PHONY: test-simd
test-simd:
	bash scripts/deps.sh
	$(MAKE) -j$(NPROC) --no-print-directory ARCH= all $(BUILD)/portable/test_all $(BUILD)/portable/bench/llama_quantize ref
	for s in avx512 avx2 portable; do \
	  ER_SIMD=$$s OMP_WAIT_POLICY=passive ER_REF_DIR=$(REF_DIR) ER_BUILD=$(BUILD)/portable $(BUILD)/portable/test_all \
	    --jobs 2 --filter '@($(subst $(space),|,$(SIMD_SUITES)))/*' || exit 1; \
	done

# Under SAN=1 one test at a time: with two at once Criterion's own runner leaks 96 bytes now and then (allocated
# inside libcriterion, in the runner process), which LeakSanitizer reports at its exit and fails the run.
TEST_JOBS := $(if $(filter 1,$(SAN)),1,2)

# OpenMPI and the MPI=1 build too: bench/run_mpi.sh compares 2 ranks against 1.
bench:
	MPI=1 bash scripts/deps.sh
	$(MAKE) -j$(NPROC) --no-print-directory MPI=1 all
	$(MAKE) -j$(NPROC) --no-print-directory bench-run

bench-run: all $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRC))
	BUILD=$(BUILD) PY=$(PY) bash bench/run.sh

# The paper's effects measured on fresh held-out problems, from the tiny base (models/tiny-base), each against its
# target (scripts/paper.sh): make demo is the short run (9.5 minutes on 2 idle cores) into docs/results.md,
# make paper the long one (about 35 minutes) into docs/paper.md; QUICK=1: the same wiring on tiny sizes (CI).
demo:
	bash scripts/deps.sh
	$(MAKE) -j$(NPROC) all
	DEMO=1 QUICK=$(QUICK) bash scripts/paper.sh

.PHONY: paper
paper:
	bash scripts/deps.sh
	$(MAKE) -j$(NPROC) all
	QUICK=$(QUICK) bash scripts/paper.sh

# erinfer memory's recall@5 on the synthetic memory task, BM25 / vectors / fused, with the tiny base's embeddings
# (scripts/memory_recall.sh; N=, SEED=, MODEL= pass through; about 10 s on 2 cores; docs/memory.md).
.PHONY: memory-recall
memory-recall: $(BUILD)/ertrain $(BUILD)/erinfer
	BUILD=$(BUILD) PY=$(PY) bash scripts/memory_recall.sh

clean:
	rm -rf build

# The data-parallel runs under mpirun (localhost, --oversubscribe; OpenMPI installed first, the build is
# MPI=1's): 2 ranks against 1 for sft, pretrain, qat, grpo and heads, an error and a rank killed mid-run
# ending the job, the resume (tests/train/test_mpi.py). SAN=1: under ASan, OpenMPI's own leaks suppressed
# (tests/train/lsan_openmpi.supp).
.PHONY: test-mpi test-mpi-run
test-mpi:
	MPI=1 bash scripts/deps.sh
	$(MAKE) -j$(NPROC) --no-print-directory MPI=1 test-mpi-run

test-mpi-run: all
	LSAN_OPTIONS=suppressions=$(CURDIR)/tests/train/lsan_openmpi.supp:fast_unwind_on_malloc=0 ER_BUILD=$(BUILD) \
	  $(PY) tests/train/test_mpi.py

-include $(shell find build -name '*.d' 2>/dev/null)

# ---------------------------------------------------------------------------------------------
# Fuzzing: one libFuzzer binary per tests/fuzz/fuzz_*.c, linked against the runtime library's sources
# (core quant lora model data infer) compiled with clang, ASan + UBSan and no BLAS into build/fuzz/.
# tests/fuzz/run.sh runs each for FUZZ_TIME seconds on a scratch copy of its corpus and fails on any
# crash, leak, timeout or sanitizer report; reproducers land in build/fuzz/crashes/<target>/.
FUZZ_CC ?= clang
FUZZ_TIME ?= 30
FUZZ_OUT := build/fuzz
FUZZ_ALL := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_TARGETS ?= $(FUZZ_ALL)
FUZZ_LIB_SRC := $(RUNTIME_SRC)
FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS := -std=c11 -D_GNU_SOURCE -g -O1 $(ARCH) -Wall -Wextra -Wno-unused-parameter -Wno-pass-failed -fopenmp \
               -I. -MMD -MP $(FUZZ_SAN)
FUZZ_LDLIBS := -lcjson -lpcre2-8 -lutf8proc -lm -lpthread

.PHONY: fuzz fuzz-run fuzz-build
fuzz-build: $(addprefix $(FUZZ_OUT)/,$(FUZZ_TARGETS))

# As test and bench: clang and its runtimes are installed first when missing.
fuzz:
	bash scripts/deps.sh
	$(MAKE) -j$(NPROC) --no-print-directory fuzz-run

fuzz-run: fuzz-build
	bash tests/fuzz/run.sh $(FUZZ_OUT) $(FUZZ_TIME) $(FUZZ_TARGETS)

# Library objects get coverage instrumentation without libFuzzer's main; each target links it.
$(FUZZ_OUT)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@
$(FUZZ_OUT)/obj/%.avx2.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(QK_FLAGS_avx2) -fsanitize=fuzzer-no-link -c $< -o $@
$(FUZZ_OUT)/obj/%.avx512.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(QK_FLAGS_avx512) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_OUT)/liberinfer.a: $(call qk_x86,$(FUZZ_OUT)/obj,$(patsubst %.c,$(FUZZ_OUT)/obj/%.o,$(FUZZ_LIB_SRC)))
	rm -f $@ && ar rcs $@ $^

$(FUZZ_OUT)/fuzz_%: $(FUZZ_OUT)/obj/tests/fuzz/fuzz_%.o $(FUZZ_OUT)/liberinfer.a
	$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -fopenmp $^ $(FUZZ_LDLIBS) -o $@
# erinfer serve's request parser (erinfer/server_json.c, no HTTP library in it) is linked in for its target.
$(FUZZ_OUT)/fuzz_serve_request: $(FUZZ_OUT)/obj/erinfer/server_json.o
$(FUZZ_OUT)/fuzz_serve_request: FUZZ_LDLIBS := $(FUZZ_OUT)/liberinfer.a $(FUZZ_LDLIBS)
# The memory store (erinfer/memory*.c without the command) and libsqlite3 for its import and filter target.
$(FUZZ_OUT)/fuzz_memory: $(patsubst %.c,$(FUZZ_OUT)/obj/%.o,$(MEMORY_STORE_SRC))
$(FUZZ_OUT)/fuzz_memory: FUZZ_LDLIBS := $(FUZZ_OUT)/liberinfer.a $(FUZZ_LDLIBS) -lsqlite3

# ---------------------------------------------------------------------------------------------
# CUDA (make CUDA=1, configured at the top): model/cuda/*.cu by nvcc and model/cuda/*.c by $(CC), into
# liberinfer. `make CUDA=1 cuda-check` builds everything that way: the compile and link check CI runs
# (no GPU there; scripts/gpu_check.sh runs the CUDA tests on one).
ifeq ($(CUDA),1)
CUDA_OBJ := $(patsubst %.cu,$(BUILD)/obj/%.o,$(wildcard model/cuda/*.cu)) $(call obj,$(wildcard model/cuda/*.c))
$(RUNTIME_LIB) $(RUNTIME_INTERNAL) $(RUNTIME_SO): $(CUDA_OBJ)

# The arches the objects were compiled for: a changed CUDA_ARCHS rewrites the file, which recompiles them.
CUDA_ARCHS_FILE := $(BUILD)/obj/model/cuda/archs
$(shell mkdir -p $(dir $(CUDA_ARCHS_FILE)); echo '$(CUDA_ARCHS)' | cmp -s - $(CUDA_ARCHS_FILE) || \
  echo '$(CUDA_ARCHS)' >$(CUDA_ARCHS_FILE))
$(BUILD)/obj/%.o: %.cu $(CUDA_ARCHS_FILE)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# Besides building: the kernels' object holds machine code for every arch of CUDA_ARCHS and the PTX
# of the first (a GPU none of them covers would fail with "no kernel image is available"), and with
# MPI=1 NCCL=1 the gradient sum calls NCCL.
.PHONY: cuda-check
cuda-check: all $(BUILD)/test_all $(BUILD)/bench/train_step $(BUILD)/bench/gpu_decode $(BUILD)/bench/gpu_grpo_step
	$(PY) scripts/check_cuda_archs.py "$(CUDA_ARCHS)" \
	  $(patsubst %.cu,$(BUILD)/obj/%.o,$(wildcard model/cuda/*.cu))
ifeq ($(MPI)$(NCCL),11)
	@nm -u $(BUILD)/obj/train/dist.o | grep -q ncclAllReduce || \
	  { echo "cuda-check: $(BUILD)/obj/train/dist.o does not call ncclAllReduce (NCCL=1)"; exit 1; }
	@echo "cuda-check: the gradient all-reduce of $(BUILD)/ertrain goes through NCCL"
endif
endif

# ---------------------------------------------------------------------------------------------
# CUDA emulated (make CUDA_EMU=1, configured at the top; docs/gpu.md "Emulated CUDA"): model/cuda/kernels.cu,
# each `k<<<...>>>(args)` rewritten by sed into the emulator's launch (a launch configuration must not
# contain '>'), compiled by g++ with tests/cuda_emu/include/ first on the include path; backend.c as in
# CUDA=1; tests/cuda_emu/emu.cpp (cudart, the kernels' threads) and cublas.cpp in libcuda_emu.a, which the
# programs link instead of libcudart and libcublas. `make CUDA_EMU=1 test-cuda-emu` runs the backend
# suite on it (CI, after the CUDA compile check).
ifeq ($(CUDA_EMU),1)
EMU_CXXFLAGS := -std=c++17 -O2 -g $(ARCH) -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -I. \
                -Itests/cuda_emu/include -MMD -MP $(EMU_SAN)
EMU_KERNELS := $(patsubst %.cu,$(BUILD)/obj/%.o,$(wildcard model/cuda/*.cu))
$(RUNTIME_LIB) $(RUNTIME_INTERNAL): $(EMU_KERNELS) $(call obj,$(wildcard model/cuda/*.c))
$(BUILD)/erinfer $(BUILD)/ertrain $(BUILD)/example $(BUILD)/test_all $(BUILD)/test_backend $(BUILD)/liberinfer.ok: \
  $(BUILD)/libcuda_emu.a

EMU_LAUNCH_SED := s/([A-Za-z_][A-Za-z0-9_]*)<<<([^>]*)>>>/cuda_emu::launch(\1, "\1", \2)/g
.PRECIOUS: $(BUILD)/gen/%.cpp
$(BUILD)/gen/%.cpp: %.cu
	@mkdir -p $(dir $@)
	{ printf '#line 1 "%s"\n' $<; sed -E '$(EMU_LAUNCH_SED)' $<; } > $@

$(BUILD)/obj/model/cuda/%.o: $(BUILD)/gen/model/cuda/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -include cuda_runtime.h -c $< -o $@

$(BUILD)/obj/tests/cuda_emu/%.o: $(BUILD)/gen/tests/cuda_emu/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -include cuda_runtime.h -c $< -o $@

# The emulator's own tests (tests/cuda_emu/test_emu.cu): barriers, shuffles, launch errors, bf16, cuBLAS checks.
$(BUILD)/test_emu: $(BUILD)/obj/tests/cuda_emu/test_emu.o $(BUILD)/libcuda_emu.a
	$(CXX) $(LDFLAGS) $^ -lcriterion -o $@

# The emulator itself without ASan (its stack switches would cost a clear of a stack's shadow each).
$(BUILD)/obj/tests/cuda_emu/emu.o: tests/cuda_emu/emu.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -fno-sanitize=address -DCUDA_EMU_ASAN -c $< -o $@

$(BUILD)/obj/tests/cuda_emu/cublas.o: tests/cuda_emu/cublas.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(BUILD)/libcuda_emu.a: $(BUILD)/obj/tests/cuda_emu/emu.o $(BUILD)/obj/tests/cuda_emu/cublas.o
	rm -f $@ && ar rcs $@ $^

# The backend suite alone (tests/model/test_backend.c on the runtime library): the whole test_all would build
# every suite and the training tier under the sanitizers for tests that do not touch the device.
$(BUILD)/test_backend: $(call obj,tests/model/test_backend.c) $(RUNTIME_INTERNAL)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcriterion -o $@

# Without leak checks: Criterion's runner leaks now and then with 2 jobs (see TEST_JOBS), and the emulator keeps
# its fibers for the next launch. ER_TEST_SKIP_LARGE=1 skips the 0.5B-shape test (loudly: tens of GFLOP emulated).
.PHONY: test-cuda-emu
test-cuda-emu: $(BUILD)/test_backend $(BUILD)/test_emu
	ASAN_OPTIONS=detect_leaks=0 $(BUILD)/test_emu --jobs 2
	ASAN_OPTIONS=detect_leaks=0 OMP_WAIT_POLICY=passive ER_TEST_DEVICE=cuda ER_TEST_SKIP_LARGE=1 ER_BUILD=$(BUILD) \
	  $(BUILD)/test_backend --jobs 2

# Whole programs through the emulation (scripts/cuda_emu_programs.sh): erinfer generate and eval, ertrain grpo and
# heads, each with --device cpu and --device cuda from this build, compared.
.PHONY: test-cuda-emu-programs
test-cuda-emu-programs: $(BUILD)/ertrain $(BUILD)/erinfer
	bash scripts/cuda_emu_programs.sh $(BUILD)
endif
