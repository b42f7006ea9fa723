# Builds the runtime (C11), the bridge (C++17) into torch_pjrt/_C*.so, and the C unit tests.
# Usage: make -j2 [PYTHON=.venv/bin/python]; make ctest; make ctest-asan
PYTHON ?= python3
TORCH_DIR := $(shell $(PYTHON) -c "import torch,os;print(os.path.dirname(torch.__file__))")
TORCH_ABI := $(shell $(PYTHON) -c "import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))")
EXT := $(shell $(PYTHON) -c "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))")
PYINC := $(shell $(PYTHON) -c "import sysconfig;print(sysconfig.get_paths()['include'])")
HDR := build/include/pjrt_c_api.h
# A digest of our own sources, part of every program cache key (runtime.c's identity): a
# changed lowering must never be served a program compiled from the old one, in memory or
# from the persistent cache.
CODE_ID_HDR := build/include/torch_pjrt_code_id.h
# The C tests that run programs need the plugin file; take it from the installed CPU plugin.
TORCH_PJRT_PLUGIN ?= $(shell $(PYTHON) -c "import lammps_jax_pjrt_cpu as p; print(p.PLUGIN_PATH)" 2>/dev/null)
export TORCH_PJRT_PLUGIN

C_SRCS := $(wildcard csrc/runtime/*.c csrc/hlo/*.c csrc/graph/*.c csrc/ops/*.c)
CXX_SRCS := $(wildcard csrc/bridge/*.cpp)
C_OBJS := $(patsubst csrc/%.c,build/obj/%.o,$(C_SRCS))
CXX_OBJS := $(patsubst csrc/%.cpp,build/obj/%.o,$(CXX_SRCS))
C_TESTS := $(patsubst tests/c/%.c,build/tests/%,$(wildcard tests/c/test_*.c))

CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -D_DEFAULT_SOURCE -fPIC -Wall -Wextra -Wno-unused-parameter -Icsrc/include -Ibuild/include
CXXFLAGS ?= -O2 -g
CXXFLAGS += -std=c++17 -fPIC -Wall -Wextra -Wno-unused-parameter -Icsrc/include -Ibuild/include \
  -Icsrc/bridge -isystem $(TORCH_DIR)/include -isystem $(TORCH_DIR)/include/torch/csrc/api/include \
  -isystem $(PYINC) -D_GLIBCXX_USE_CXX11_ABI=$(TORCH_ABI) -DTORCH_EXTENSION_NAME=_C \
  -DTORCH_API_INCLUDE_EXTENSION_H
LDFLAGS_EXT := -shared -L$(TORCH_DIR)/lib -Wl,-rpath,$(TORCH_DIR)/lib \
  -ltorch -ltorch_cpu -lc10 -ltorch_python -ldl -lpthread

EXT_SO := torch_pjrt/_C$(EXT)

# Several people may run make at once in this checkout: the lock makes concurrent builds wait
# instead of compiling the same objects side by side.
all:
	@mkdir -p build
	@flock build/.make.lock $(MAKE) --no-print-directory PYTHON=$(PYTHON) $(EXT_SO)

$(HDR):
	PYTHON=$(PYTHON) bash tools/fetch_pjrt_header.sh build/include

# Rewritten only when the digest changes, so an unchanged tree rebuilds nothing.
$(CODE_ID_HDR): FORCE
	@mkdir -p $(dir $@)
	@id=$$(cat $(sort $(C_SRCS) $(CXX_SRCS) $(wildcard csrc/include/torch_pjrt/*.h csrc/graph/*.h csrc/ops/*.h csrc/hlo/*.h csrc/runtime/*.h)) | sha256sum | cut -c1-16); \
	  printf '#define PJ_CODE_ID "%s"\n' "$$id" > $@.tmp; \
	  if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi
FORCE:

build/obj/runtime/runtime.o: $(CODE_ID_HDR)

# -MMD: each object depends on exactly the headers it includes (build/obj/**/*.d).
build/obj/%.o: csrc/%.c $(HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

build/obj/%.o: csrc/%.cpp $(HDR)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

-include $(C_OBJS:.o=.d) $(CXX_OBJS:.o=.d)

# Link to a temporary name and rename: a process that has the old library mapped keeps it.
$(EXT_SO): $(C_OBJS) $(CXX_OBJS)
	$(CXX) -o $@.tmp $^ $(LDFLAGS_EXT) && mv -f $@.tmp $@

# C unit tests: the C layers only, no PyTorch. ASan variant rebuilds everything instrumented.
build/tests/%: tests/c/%.c $(wildcard tests/c/*.h) $(C_SRCS) $(HDR) $(CODE_ID_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_SAN) -Itests/c $< $(C_SRCS) -o $@ -ldl -lpthread -lm

ctest: $(C_TESTS)
	@set -e; for t in $(C_TESTS); do echo "== $$t"; ./$$t; done

ctest-asan:
	$(MAKE) -B TEST_SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" \
	  C_TESTS="$(patsubst build/tests/%,build/tests-asan/%,$(C_TESTS))" ctest-asan-run

build/tests-asan/%: tests/c/%.c $(wildcard tests/c/*.h) $(C_SRCS) $(HDR) $(CODE_ID_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_SAN) -Itests/c $< $(C_SRCS) -o $@ -ldl -lpthread -lm

ctest-asan-run: $(C_TESTS)
	@set -e; for t in $(C_TESTS); do echo "== $$t"; \
	  ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/c/lsan.supp ./$$t; done

clean:
	rm -rf build/obj build/tests build/tests-asan $(EXT_SO)

.PHONY: all ctest ctest-asan ctest-asan-run clean
