# Builds the runtime (C11), the bridge (C++17, or C++20 for torch >= 2.14) into
# torch_pjrt/_C*.so, and the C unit tests.
# Usage: make -j2 [PYTHON=.venv/bin/python]; make ctest; make ctest-asan
PYTHON ?= python3
# One interpreter start for what the bridge needs to know of PYTHON's torch: its directory,
# C++ ABI, release, and the C++ standard its headers require (ATen's headers from 2.14 on
# refuse anything older than C++20; 2.13's are built and tested with C++17).
TORCH_INFO := $(shell $(PYTHON) -c "import torch,os;v=torch.__version__.split('+')[0];print(os.path.dirname(torch.__file__),int(torch._C._GLIBCXX_USE_CXX11_ABI),v,'c++20' if tuple(map(int,v.split('.')[:2]))>=(2,14) else 'c++17')")
TORCH_DIR := $(word 1,$(TORCH_INFO))
TORCH_ABI := $(word 2,$(TORCH_INFO))
TORCH_VER := $(word 3,$(TORCH_INFO))
CXX_STD := $(word 4,$(TORCH_INFO))
EXT := $(shell $(PYTHON) -c "import sysconfig;print(sysconfig.get_config_var('EXT_SUFFIX'))")
PYINC := $(shell $(PYTHON) -c "import sysconfig;print(sysconfig.get_paths()['include'])")
HDR := build/include/.pjrt-headers
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
# The bridge's objects are compiled against one torch's headers: each release gets its own
# directory, so switching a checkout between venvs of two releases never links objects of the
# other one (and switching back relinks without recompiling). The C layers know no torch.
CXX_OBJ_DIR := build/obj/torch-$(TORCH_VER)
CXX_OBJS := $(patsubst csrc/%.cpp,$(CXX_OBJ_DIR)/%.o,$(CXX_SRCS))
# Names the torch the library was last linked for; rewritten only when that changes, so the
# library is relinked exactly when PYTHON's torch (release, ABI or location) differs.
TORCH_STAMP := build/torch-link.stamp
C_TESTS := $(patsubst tests/c/%.c,build/tests/%,$(wildcard tests/c/test_*.c))

CFLAGS ?= -O2 -g
CFLAGS += -std=c11 -D_DEFAULT_SOURCE -fPIC -Wall -Wextra -Wno-unused-parameter -Icsrc/include -Ibuild/include
# -g1 (line tables: backtraces keep file and line) rather than -g for the bridge: full debug
# info of the torch headers every bridge file includes more than doubles its compile time (34 s
# against 14 s a file here), which is most of a fresh setup. CXXFLAGS="-O2 -g" for a debugger.
CXXFLAGS ?= -O2 -g1
CXXFLAGS += -std=$(CXX_STD) -fPIC -Wall -Wextra -Wno-unused-parameter -Icsrc/include -Ibuild/include \
  -Icsrc/bridge -isystem $(TORCH_DIR)/include -isystem $(TORCH_DIR)/include/torch/csrc/api/include \
  -isystem $(PYINC) -D_GLIBCXX_USE_CXX11_ABI=$(TORCH_ABI) -DTORCH_EXTENSION_NAME=_C \
  -DTORCH_API_INCLUDE_EXTENSION_H
LDFLAGS_EXT := -shared -L$(TORCH_DIR)/lib -Wl,-rpath,$(TORCH_DIR)/lib \
  -ltorch -ltorch_cpu -lc10 -ltorch_python -ldl -lpthread
# The libstdc++ that torch itself loads, named on the link line ahead of the compiler's own
# -lstdc++, so every libstdc++ symbol the bridge uses comes from that shared library. A
# toolchain that links libstdc++ statically (as the H200 device machine's /opt/gcc does) would
# otherwise put a second copy of the stream and locale code into the extension, with exported
# symbols that bind partly to the process's copy: `stream << int` then finds no num_put facet and
# every error message c10::str formats in the bridge segfaulted (or lost its numbers).
TORCH_LIBSTDCXX := $(shell ldd $(TORCH_DIR)/lib/libc10.so 2>/dev/null | awk '/libstdc\+\+/ {print $$3; exit}')

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

$(TORCH_STAMP): FORCE
	@mkdir -p $(dir $@)
	@printf '%s\n' "$(TORCH_INFO)" > $@.tmp; \
	  if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv -f $@.tmp $@; fi

# -MMD: each object depends on exactly the headers it includes (build/obj/**/*.d).
build/obj/%.o: csrc/%.c $(HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

# The precompiled PyTorch headers (csrc/bridge/torch_headers_pch.h), built per torch release with
# the bridge's own flags, and force-included ahead of every bridge file: a typical bridge file
# compiles in about 5 s instead of 14-20 s, and a fresh `make -j2` (setup's largest part) took
# 4 min 49 s instead of 7 min 02 s on the 2-core development machine. The header is copied beside its
# .gch because the compiler finds the .gch next to the header that -include names; if the .gch
# is unusable (other flags), the copy is read as a plain header and -Winvalid-pch says so.
PCH_H := $(CXX_OBJ_DIR)/torch_headers_pch.h
PCH := $(PCH_H).gch

$(PCH): csrc/bridge/torch_headers_pch.h $(HDR)
	@mkdir -p $(dir $@)
	cp $< $(PCH_H)
	$(CXX) $(CXXFLAGS) -MMD -MP -MF $(PCH).d -MT $@ -x c++-header $(PCH_H) -o $@.tmp
	mv -f $@.tmp $@

$(CXX_OBJ_DIR)/%.o: csrc/%.cpp $(HDR) $(PCH)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -include $(PCH_H) -Winvalid-pch -MMD -MP -c $< -o $@

-include $(C_OBJS:.o=.d) $(CXX_OBJS:.o=.d) $(PCH).d

# Link to a temporary name and rename: a process that has the old library mapped keeps it.
$(EXT_SO): $(C_OBJS) $(CXX_OBJS) $(TORCH_STAMP)
	$(CXX) -o $@.tmp $(C_OBJS) $(CXX_OBJS) $(TORCH_LIBSTDCXX) $(LDFLAGS_EXT)
	@if nm -D --defined-only $@.tmp 2>/dev/null | grep -q ' _ZNSo9_M_insert'; then \
	  echo "error: $@ holds its own copy of libstdc++'s stream code (a static libstdc++);" \
	    "error messages would crash. Build with a compiler whose libstdc++ is shared." >&2; \
	  rm -f $@.tmp; exit 1; fi
	mv -f $@.tmp $@

# C unit tests: the C layers only, no PyTorch. They link the runtime's own objects (built once,
# for the extension too); the ASan variant compiles the C sources once, instrumented, into
# build/obj-asan and links every test against those.
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer
C_OBJS_ASAN := $(patsubst csrc/%.c,build/obj-asan/%.o,$(C_SRCS))
C_TESTS_ASAN := $(patsubst build/tests/%,build/tests-asan/%,$(C_TESTS))
TEST_DEPS := $(wildcard tests/c/*.h csrc/include/torch_pjrt/*.h) $(HDR)

build/tests/%: tests/c/%.c $(TEST_DEPS) $(C_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/c $< $(C_OBJS) -o $@ -ldl -lpthread -lm

# The plugin's own cost per tiny execution (benchmarks/bench_host_overhead.py --floors runs it).
build/bench/plugin_execute_floor: benchmarks/plugin_execute_floor.c $(TEST_DEPS) $(C_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(C_OBJS) -o $@ -ldl -lpthread -lm

# Compile time of dumped programs on the plugin alone (benchmarks/compile_time.c).
build/bench/compile_time: benchmarks/compile_time.c $(TEST_DEPS) $(C_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< $(C_OBJS) -o $@ -ldl -lpthread -lm

ctest: $(C_TESTS)
	@set -e; for t in $(C_TESTS); do echo "== $$t"; ./$$t; done

build/obj-asan/%.o: csrc/%.c $(HDR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -MMD -MP -c $< -o $@

build/obj-asan/runtime/runtime.o: $(CODE_ID_HDR)

-include $(C_OBJS_ASAN:.o=.d)

build/tests-asan/%: tests/c/%.c $(TEST_DEPS) $(C_OBJS_ASAN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ASAN_FLAGS) -Itests/c $< $(C_OBJS_ASAN) -o $@ -ldl -lpthread -lm

ctest-asan: $(C_TESTS_ASAN)
	@set -e; for t in $(C_TESTS_ASAN); do echo "== $$t"; \
	  ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 LSAN_OPTIONS=suppressions=$(CURDIR)/tests/c/lsan.supp ./$$t; done

clean:
	rm -rf build/obj build/obj-asan build/tests build/tests-asan $(EXT_SO)

.PHONY: all ctest ctest-asan clean
