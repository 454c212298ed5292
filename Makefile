# mtrain: one plain Makefile. CPU backend always; the CUDA backend (kernels/cuda)
# when nvcc is found (CUDA=0 to skip it).
# (the first rule below is a helper library's: name the default goal)
.DEFAULT_GOAL := all
CC       ?= gcc
CXX      ?= g++
# The OpenMP build of OpenBLAS shares our OpenMP thread pool; the pthread
# build spins its own threads, which fight ours for the cores.
BLAS_INC ?= /usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB ?= /usr/lib/x86_64-linux-gnu/openblas-openmp
OPT      ?= -O3 -march=native
CFLAGS   ?= $(OPT) -g
# -fno-trapping-math: no code reads floating-point exception flags, and loops with float compares
# (kernels/cpu/vec_exp.h's clamps) vectorise only without them; results are unchanged (no reassociation)
CFLAGS   += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -fno-trapping-math -fopenmp -I. -I$(BLAS_INC) -I/usr/include/x86_64-linux-gnu/mpich
LDLIBS   += -lyaml -lzstd -ljansson -lxxhash -lpcre2-8 -L$(BLAS_LIB) -Wl,-rpath,$(BLAS_LIB) -lopenblas -lmpich -lm -lpthread
LDFLAGS  += -fopenmp
# C++ only for the tests that run CUDA kernel sources under a CPU emulation
CXXFLAGS ?= $(OPT) -g
CXXFLAGS += -std=c++17 -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas -pthread -I.

ifeq ($(SANITIZE),1)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  CXXFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
  BUILD   ?= build/asan
else
  BUILD   ?= build/rel
endif

LIB_DIRS := config kernels kernels/cpu model data checkpoint parallel cli
LIB_SRC  := $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)

# CUDA: sm_90a (Hopper) and sm_80 machine code; links cuBLAS and the runtime,
# which load the driver only when a GPU is asked for.
NVCC ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA ?= $(if $(NVCC),1,0)
ifeq ($(CUDA),1)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  NVCCFLAGS ?= -O3 -g -std=c++17 -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80
  NVCCFLAGS += -I. -Xcompiler -Wall
  LIB_OBJ  += $(patsubst %.cu,$(BUILD)/%.o,$(wildcard kernels/cuda/*.cu))
  CFLAGS   += -DMTRAIN_CUDA -I$(CUDA_HOME)/include
  LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart -lstdc++
endif
# tests/integration/nccl_mock.sh: parallel/comm_nccl.c on the CPU, through a
# libnccl.so.2 over MPI and CUDA runtime memory calls on host memory
# (tests/mock/), preloaded in front of the real libcudart (its symbols carry
# that library's version, read from its soname)
MOCK_LIBS :=
ifeq ($(CUDA),1)
  CUDART_SONAME := $(shell objdump -p $(CUDA_HOME)/lib64/libcudart.so 2>/dev/null | sed -n 's/^ *SONAME *//p')
  MOCK_LIBS := $(BUILD)/mock/libnccl.so.2 $(BUILD)/mock/libcudart_mock.so
endif
MOCK_CFLAGS := -O2 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -fPIC -shared -I/usr/include/x86_64-linux-gnu/mpich -I$(CUDA_HOME)/include
$(BUILD)/mock/libnccl.so.2: tests/mock/nccl_mock.c
	@mkdir -p $(dir $@)
	$(CC) $(MOCK_CFLAGS) -Wl,-soname,libnccl.so.2 -o $@ $< -lmpich
$(BUILD)/mock/libcudart_mock.so: tests/mock/cudart_mock.c
	@mkdir -p $(dir $@)
	printf '%s {\n  global: cuda*; mock_*;\n  local: *;\n};\n' '$(CUDART_SONAME)' >$(BUILD)/mock/cudart_mock.map
	$(CC) $(MOCK_CFLAGS) -Wl,--version-script=$(BUILD)/mock/cudart_mock.map -o $@ $<

TEST_SRC := $(wildcard tests/unit/test_*.c)
TEST_CXX_SRC := $(wildcard tests/unit/test_*.cpp)
TEST_BIN := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%) $(TEST_CXX_SRC:tests/unit/%.cpp=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard tests/fuzz/*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)
BENCH_SRC := $(wildcard scripts/bench/*.c)
BENCH_BIN := $(BENCH_SRC:scripts/bench/%.c=$(BUILD)/bench/%)

.PHONY: all test bench clean unit-tests deps quickstart fuzz
all: mtrain

# Installs missing system packages once (scripts/install-deps.sh); the stamp
# keeps later builds from asking again.
DEPS_STAMP := build/.deps-build
$(DEPS_STAMP):
	bash scripts/install-deps.sh --build-only
	@mkdir -p build && touch $@
build/.deps-test: $(DEPS_STAMP)
	bash scripts/install-deps.sh
	@touch $@
deps: build/.deps-test

# The README's default job.
quickstart:
	bash scripts/quickstart.sh

# ./mtrain is always the build of the current flavour (release or sanitized),
# so it is re-copied on every make.
.PHONY: mtrain
mtrain: $(BUILD)/mtrain
	@cp $< $@

$(BUILD)/mtrain: $(BUILD)/main.o $(BUILD)/libmtrain.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libmtrain.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/%.o: %.c | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/%.o: %.cu | $(DEPS_STAMP)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libmtrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libmtrain.a $(LDLIBS)

# (the kernel sources they emulate are headers: kernels/cuda/*.cuh)
$(BUILD)/tests/%: tests/unit/%.cpp $(wildcard kernels/cuda/*.cuh) $(BUILD)/libmtrain.a
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libmtrain.a $(LDLIBS)

$(BUILD)/bench/%: scripts/bench/%.c $(BUILD)/libmtrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libmtrain.a $(LDLIBS)

# drivers the reference and integration tests call (not tests themselves)
TOOL_SRC := $(wildcard tests/reference/*.c)
TOOL_BIN := $(TOOL_SRC:tests/reference/%.c=$(BUILD)/tools/%)
$(BUILD)/tools/%: tests/reference/%.c $(BUILD)/libmtrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libmtrain.a $(LDLIBS)

# mutation fuzzers, one per parser (tests/fuzz/fuzz.h); `make fuzz` runs
# each for FUZZ_SECONDS (default 40) on seeds made by tests/fuzz/run.sh
$(BUILD)/fuzz/%: tests/fuzz/%.c $(wildcard tests/fuzz/*.h) $(BUILD)/libmtrain.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libmtrain.a $(LDLIBS)

FUZZ_SECONDS ?= 40
fuzz: $(BUILD)/mtrain $(FUZZ_BIN)
	FUZZ_SECONDS=$(FUZZ_SECONDS) BUILD=$(BUILD) MTRAIN=$(CURDIR)/$(BUILD)/mtrain bash tests/fuzz/run.sh

unit-tests: $(TEST_BIN) $(TOOL_BIN) $(FUZZ_BIN)

# The README's test command. Prints one summary line "N passed, N failed[, N skipped]".
test: build/.deps-test mtrain $(TEST_BIN) $(TOOL_BIN) $(FUZZ_BIN) $(BENCH_BIN) $(MOCK_LIBS)
	BUILD=$(BUILD) bash tests/run.sh

bench: mtrain $(BENCH_BIN)
	BUILD=$(BUILD) bash scripts/bench/run.sh

clean:
	rm -rf build mtrain

-include $(LIB_OBJ:.o=.d) $(BUILD)/main.d
