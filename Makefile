# ggml-lens: `make run` serves the demo, `make test` sets up and runs every test tier.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
HOST   ?= 127.0.0.1
PORT   ?= 8000
# graphviz draws the DAG; a CJK font lets it (and the browser tests) measure and show Chinese labels;
# bubblewrap and libseccomp are the playground's kernel boundary (app/sandbox/boundary.py)
APT_RUN  := graphviz fonts-wqy-zenhei bubblewrap libseccomp2
# redis-server: the classroom test's queue (a class's own Redis may be anywhere)
APT_TEST := $(APT_RUN) chromium stress-ng redis-server

.PHONY: run test test-numpy test-load test-classroom load test-models test-sweep package-check package-check-nocc screenshots messages bench size setup setup-test clean

$(VENV)/bin/activate:
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Debian packages: installed only when missing (needs root or sudo on a fresh machine).
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/activate
	$(PIP) install --quiet -e '.[model]'
	touch $@

# The bundled real model (Gemma 3 270M, 253 MB): its chunks come from PyPI with the package; this
# joins them into the data directory once, checking the sha256 (engine/models/bundled.py).
DATA  ?= $(or $(GGML_LENS_DATA),var)
MODEL := $(DATA)/models/gemma-3-270m-q4_k_m.gguf
$(MODEL): | $(VENV)/.installed
	GGML_LENS_DATA=$(DATA) $(VENV)/bin/ggml-lens install-model

# The oracle (ggml-python builds ggml from source) is built for AVX2+FMA+F16C whatever the CPU:
# the engine reproduces that build's arithmetic bit for bit, so -march=native must not vary it.
# It includes ggml's RPC backend: a real second backend whose buffers are not host memory, served
# on loopback by the scheduler tests (tests/support/rpc_server.py).
ORACLE_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_RPC=ON
# Real llama.cpp, the oracle for the model tests: the same AVX2 build; its multimodal library
# (mtmd), which the tests never load, is left out (it is most of the ~17 minutes pip would take).
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF

# The oracles are built once per version and build flags into a wheel cache outside the checkout
# (a second clone on the same machine, or CI after a session, installs them in seconds).
WHEELS ?= $(HOME)/.cache/ggml-lens/wheels

# $(call oracle,package,cmake args): install the package built from source with those flags,
# from the wheel cache when it holds that build
define oracle
	@spec="$$(grep -o '$(1)==[0-9.]*' pyproject.toml)"; \
	dir="$(WHEELS)/$$spec-$$(echo '$(2)' | sha256sum | cut -c1-12)"; \
	if ! ls "$$dir"/*.whl >/dev/null 2>&1; then \
	  echo "building $$spec from source ($(2))"; \
	  CMAKE_ARGS="$(2)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) wheel --quiet --no-cache-dir --no-deps \
	    --no-binary $(1) -w "$$dir.part" "$$spec" && rm -rf "$$dir" && mv "$$dir.part" "$$dir"; \
	fi; \
	$(PIP) install --quiet "$$dir"/*.whl
endef

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/activate
	$(call oracle,ggml-python,$(ORACLE_CMAKE_ARGS))
	$(call oracle,llama-cpp-python,$(LLAMA_CMAKE_ARGS))
	$(PIP) install --quiet -e '.[test,model]'
	touch $@

# engine/c/libm.c (the C library's float functions, as ggml calls them) and engine/c/*.c with
# engine/c/*.h (ggml's hottest inner loops) are compiled by the install; this rebuilds them when
# they change
$(VENV)/.libm: engine/c/libm.c $(wildcard engine/c/*.c) $(wildcard engine/c/*.h) | $(VENV)/.installed
	$(PIP) install --quiet --no-deps -e .
	touch $@

setup: $(VENV)/.installed $(VENV)/.libm $(MODEL)
	$(call apt_install,$(APT_RUN))

# llama.cpp's test vocabularies with their tokenizer test vectors and Unicode tables, from the
# llama-cpp-python sdist on PyPI (kept in ~/.cache/ggml-lens/sdist): tests never download them
VOCAB := var/cache/llama-src/.complete-vectors
$(VOCAB): | $(VENV)/.installed
	$(PY) -m tests.support.vocab >/dev/null

# llama.cpp's own tools (llama-quantize, llama-perplexity, llama-fit-params), the oracles of
# `ggml-lens quantize`, `perplexity` and `plan --fit`: built by CMake from the llama.cpp that
# llama-cpp-python's sdist vendors (the one $(VOCAB) keeps in SDISTS), the same AVX2 build as the
# other oracles, once per version and flags into ~/.cache/ggml-lens/tools-<version>-<hash>/ (bin/,
# and lib/ with the shared libraries they load); var/cache/llama-tools names it for the tests
# (tests/support/llamacpp_tools.py). About 7 CPU-minutes.
SDISTS ?= $(or $(GGML_LENS_SDISTS),$(HOME)/.cache/ggml-lens/sdist)
LLAMA_TOOLS_VERSION := 0.3.36
LLAMA_TOOLS_CMAKE_ARGS := -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
	-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF \
	-DCMAKE_BUILD_TYPE=Release
LLAMA_TOOLS_TARGETS := llama-quantize llama-perplexity llama-fit-params
.PHONY: llama-tools
llama-tools: | $(VOCAB)
	$(call apt_install,cmake g++)
	@dir="$(HOME)/.cache/ggml-lens/tools-$(LLAMA_TOOLS_VERSION)-$$(echo '$(LLAMA_TOOLS_CMAKE_ARGS)' | sha256sum | cut -c1-12)"; \
	missing=""; for t in $(LLAMA_TOOLS_TARGETS); do [ -x "$$dir/bin/$$t" ] || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  echo "building$$missing from llama-cpp-python $(LLAMA_TOOLS_VERSION)'s llama.cpp ($(LLAMA_TOOLS_CMAKE_ARGS))"; \
	  work=$$(mktemp -d) && tar -xzf "$(SDISTS)/llama_cpp_python-$(LLAMA_TOOLS_VERSION).tar.gz" -C "$$work" && \
	  cmake -S "$$work/llama_cpp_python-$(LLAMA_TOOLS_VERSION)/vendor/llama.cpp" -B "$$work/build" \
	    $(LLAMA_TOOLS_CMAKE_ARGS) >"$$work/build.log" 2>&1 && \
	  cmake --build "$$work/build" --target $(LLAMA_TOOLS_TARGETS) -j$$(nproc) >>"$$work/build.log" 2>&1 && \
	  rm -rf "$$dir.part" && mkdir -p "$$dir.part/bin" "$$dir.part/lib" && \
	  cp $(addprefix "$$work/build/bin/",$(LLAMA_TOOLS_TARGETS)) "$$dir.part/bin/" && \
	  cp -P "$$work/build/bin/"*.so* "$$dir.part/lib/" && rm -rf "$$dir" && mv "$$dir.part" "$$dir"; \
	  status=$$?; [ $$status = 0 ] || tail -30 "$$work/build.log"; rm -rf "$$work"; [ $$status = 0 ] || exit $$status; \
	fi; \
	mkdir -p var/cache && ln -sfn "$$dir" var/cache/llama-tools

setup-test: $(VENV)/.installed-test $(VENV)/.libm $(MODEL) $(VOCAB) llama-tools
	$(call apt_install,$(APT_TEST))

run: setup
	$(VENV)/bin/ggml-lens serve --host $(HOST) --port $(PORT)

# The tests whose results must not depend on the CPU (op conformance, quantization, the model
# comparisons, golden traces, libm, the C loops' twins), run a second time in pure-numpy mode
# (every C loop of engine._lanes replaced by its numpy twin) with numpy's SIMD dispatch lowered
# to its baseline: the engine's bits depend neither on its C loops nor on which SIMD path numpy
# picks (README: "How it is checked"). The first run covers the C loops at numpy's own dispatch.
# The second leaves out the tests marked `decoding` (24 tokens greedy, seeded sampling, the CLI:
# the decoding around the logits, minutes of numpy twins); its logits tests hold the bits. It
# leaves out the tiny models in every weight type (each type's C loop is its twin's bits in
# test_twins) and the model walkthrough's golden trace (the bundled Gemma through the builder:
# gemma3's golden trace runs the same kernels on the same model).
EXACT_TESTS := tests/conformance/test_ops_math.py tests/conformance/test_ops_nn.py \
	tests/conformance/test_compute_core.py tests/conformance/test_compute_quant.py \
	tests/conformance/test_quants.py tests/conformance/test_quants_matmul.py \
	tests/conformance/test_types.py tests/conformance/test_models.py tests/conformance/test_gemma.py \
	tests/conformance/test_evaldump.py tests/conformance/test_autodiff.py \
	tests/conformance/test_sched.py tests/conformance/test_graph_copy.py \
	tests/unit/engine/test_trace.py::test_golden_trace tests/unit/engine/test_libm.py \
	tests/unit/engine/test_twins.py

# Two pytest workers, one per core (an idle one takes tests from the other's queue): the browser
# tier runs beside CPU-bound tests, then its navigation tests once more with both cores kept
# busy by stress-ng (test-load).
PYTEST_PAR := -n 2 --dist worksteal
LOAD_TESTS := tests/browser/test_keys_browser.py tests/browser/test_navigation_browser.py \
	tests/browser/test_moe_browser.py tests/browser/test_walkthrough_browser.py

# (the pure-numpy pass, the two package checks and the classroom run side by side: the checks
# are mostly pip and a server waiting on its pages, the classroom mostly processes waiting on
# each other, which the pass's workers leave room for)
# (the sandbox's resource tests read the host's kernel memory, which a browser test beside them
# moves by hundreds of MB: they run first, alone)
QUIET_TESTS := tests/unit/app/test_sandbox_resources.py
# (the bundled model on llama.cpp's default path, prompts of up to 600 tokens, in fresh workers of
# their own: a worker keeps every buffer a test left unfreed, as a ggml program would, and by the
# end of the main run the two hold GBs)
MODEL_TESTS := tests/conformance/test_default_path.py tests/conformance/test_flash_attn_models.py \
	tests/conformance/test_gemma_sweep.py tests/conformance/test_perplexity.py tests/conformance/test_plan.py \
	tests/api/routes/test_compare.py tests/api/routes/test_perplexity_page.py tests/api/routes/test_big_files.py
test: setup-test
	$(VENV)/bin/ruff check --no-cache app engine tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider $(QUIET_TESTS)
	$(PY) -m pytest -q $(PYTEST_PAR) --ignore=tests/classroom $(addprefix --ignore=,$(QUIET_TESTS) $(MODEL_TESTS)) tests
	$(PY) -m pytest -q $(PYTEST_PAR) -p no:cacheprovider $(MODEL_TESTS)
	@$(MAKE) --no-print-directory -j4 test-numpy package-check package-check-nocc test-classroom
	@$(MAKE) --no-print-directory test-load

test-numpy:
	@echo "== the exact tests again in pure-numpy mode, numpy's SIMD dispatch lowered to its baseline"
	GGML_LENS_PURE_NUMPY=1 NPY_DISABLE_CPU_FEATURES="$$($(PY) -m tests.support.npy_dispatch)" \
		$(PY) -m pytest -q $(PYTEST_PAR) -p no:cacheprovider -m "not decoding" \
		-k "not each_weight_type and not (golden_trace and model)" $(EXACT_TESTS)

# The browser's step navigation while another process keeps both cores busy
test-load: setup-test
	@echo "== the browser's navigation with both cores busy (stress-ng)"
	stress-ng --cpu $$(nproc) --timeout 600 --quiet & pid=$$!; \
	$(PY) -m pytest -q -p no:cacheprovider $(LOAD_TESTS); status=$$?; kill $$pid; wait $$pid 2>/dev/null; exit $$status

# A classroom on this machine: a real Redis (Debian's redis-server), a local S3 server (moto), two
# web processes and two workers sharing only those (tests/support/classroom.py); its own processes
# serve all its tests, so it runs on its own, not among the pytest workers (its load test prints
# the step pages' p95 but asserts none: `make load` is the measurement, on a machine at rest)
test-classroom: setup-test
	@echo "== a classroom: Redis, an S3 server, two web processes, two workers"
	$(PY) -m pytest -q -p no:cacheprovider tests/classroom

# The classroom's load test, printing the step pages' p95 (100 learners, 20 of them with programs)
load: setup-test
	$(PY) -m tests.support.load

# A plain (non-editable) install into a fresh virtualenv, with the bundled model joined into its
# data directory, serves every page with its templates and static files (package data):
# tests/package/check_install.py fetches them (about a minute).
PKG_VENV ?= /tmp/venv-pkgtest
package-check:
	rm -rf $(PKG_VENV) && python3 -m venv $(PKG_VENV)
	$(PKG_VENV)/bin/pip install --quiet '.[model]'
	cd $(PKG_VENV) && $(PKG_VENV)/bin/python \
		$(CURDIR)/tests/package/check_install.py

# The same install where no C compiler works (CC names none): the extensions are skipped, and the
# app serves every walkthrough computed by the numpy twins (no bundled model: it checks the rest).
package-check-nocc:
	rm -rf $(PKG_VENV)-nocc $(PKG_VENV)-src && python3 -m venv $(PKG_VENV)-nocc && mkdir $(PKG_VENV)-src
	git ls-files -co --exclude-standard -z | tar --null --ignore-failed-read -c -T - | tar -x -C $(PKG_VENV)-src
	CC=/nonexistent/cc $(PKG_VENV)-nocc/bin/pip install --quiet $(PKG_VENV)-src
	cd $(PKG_VENV)-nocc && $(PKG_VENV)-nocc/bin/python \
		$(CURDIR)/tests/package/check_install.py --no-compiler

# The README's screenshots, refreshed on purpose (a plain test run writes them to a temporary
# folder): the browser tests write them into docs/screenshots.
screenshots: setup-test
	GGML_LENS_SCREENSHOTS=$(CURDIR)/docs/screenshots $(PY) -m pytest -q tests/browser

# The Chinese catalogue brought in step with the code: new strings join it untranslated (the
# i18n tests fail until they are translated), strings gone from the code leave it.
messages: setup
	$(PY) -m app.messages

# The bundled Gemma against llama.cpp on all 50 prompts of the sweep (make test runs three)
test-sweep: setup-test
	GGML_LENS_SWEEP=all $(PY) -m pytest -q -p no:cacheprovider tests/conformance/test_gemma_sweep.py

# Only the comparisons with real llama.cpp (the `llamacpp` marker).
test-models: setup-test
	$(PY) -m pytest -q -m llamacpp tests

bench: setup-test
	$(PY) -m bench

size:
	@python3 -m bench.size

clean:
	rm -rf $(VENV) .pytest_cache
