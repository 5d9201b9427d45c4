# pagedserve: `make run` serves the default model, `make test` runs every test. Both set up what they need.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL_DIR ?= models/SmolLM2-135M-Instruct
STAMP := $(VENV)/.installed

.PHONY: setup hooks check-commits model run protos test test-unit lint typecheck bench-engine bench bench-peers bench-llama bench-peers-build bench-spec bench-latency bench-routing bench-structured bench-overload \
	bench-batch-invariant bench-tenants \
	redis-server deploy-tools lm-eval-tools prometheus-rule compose-check gpu-check clean

setup: $(STAMP) hooks

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,deploy]'
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m pagedserve.shared.default_model --out $(MODEL_DIR)

# Commit subjects of at most 72 characters: a commit-msg hook for this clone (all its worktrees), and a check of
# every commit since the rule began (tools/check_commit_subjects.py; `make test` runs it).
hooks:
	@hooks="$$(git rev-parse --git-path hooks 2>/dev/null)" || { echo "not a git checkout: no hook installed"; exit 0; }; \
	if [ -e "$$hooks/commit-msg" ] && ! cmp -s tools/commit-msg "$$hooks/commit-msg"; then \
	  echo "make hooks: $$hooks/commit-msg exists and is not ours; left alone (see tools/commit-msg)"; \
	else mkdir -p "$$hooks" && install -m 755 tools/commit-msg "$$hooks/commit-msg"; fi

check-commits:
	$(PYTHON) tools/check_commit_subjects.py

# Redis for the integration tests and `make run`: installed from Debian's packages when missing (needs root).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else echo "redis-server is missing: run 'sudo apt-get install -y redis-server'" >&2; exit 1; fi; }

# The tools the deploy tests run besides the pip extra `deploy`: Prometheus and promtool (Debian's prometheus; the
# package's own service is not started here). Needs root when they are missing.
deploy-tools: $(STAMP)
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      prometheus >/dev/null; \
	  else echo "promtool/prometheus are missing: run 'sudo apt-get install -y prometheus'" >&2; exit 1; fi; }

# lm-evaluation-harness in its own venv (LM_EVAL_VENV; its dependencies stay out of the project's), for
# tests/integration/test_lm_eval.py: local-completions against `pagedserve serve` (docs/api.md, prompt logprobs).
# `[api]` brings its HTTP client; transformers its huggingface tokenizer backend (no torch needed for that).
LM_EVAL_VENV := .lmeval-venv
LM_EVAL_STAMP := $(LM_EVAL_VENV)/.installed
lm-eval-tools: $(LM_EVAL_STAMP)

$(LM_EVAL_STAMP):
	test -x $(LM_EVAL_VENV)/bin/python || $(PYTHON) -m venv $(LM_EVAL_VENV)
	$(LM_EVAL_VENV)/bin/python -m pip install --quiet 'lm-eval[api]>=0.4.9,<0.5' 'transformers>=5.0'
	touch $@

# The Prometheus Operator's PrometheusRule (deploy/k8s/components/monitoring) from the one rule file compose loads.
prometheus-rule:
	$(PY) deploy/scripts/prometheus_rule.py

# `make run`: serve MODEL_DIR in the foreground (gateway on PORT); Ctrl-C stops everything. The scheduler's Redis
# state copy is optional: an already running Redis on REDIS_PORT is used, else redis-server is started if installed.
PORT ?= 8000
REDIS_PORT ?= 6379
SERVE := $(VENV)/bin/pagedserve serve $(MODEL_DIR) --port $(PORT)
REDIS_URL := redis://127.0.0.1:$(REDIS_PORT)/0

run: model
	@if command -v redis-cli >/dev/null 2>&1 && redis-cli -p $(REDIS_PORT) ping >/dev/null 2>&1; then \
	  echo "make run: using the Redis already listening on port $(REDIS_PORT)"; \
	  $(SERVE) --redis-url $(REDIS_URL); \
	elif command -v redis-server >/dev/null 2>&1; then \
	  redis-server --port $(REDIS_PORT) --bind 127.0.0.1 --save '' --appendonly no --loglevel warning & \
	  redis_pid=$$!; trap 'kill $$redis_pid 2>/dev/null' EXIT; \
	  $(SERVE) --redis-url $(REDIS_URL); \
	else \
	  echo "make run: redis-server is not installed, serving without the Redis state copy."; \
	  echo "  To get one: sudo apt-get install -y redis-server  (or 'make redis-server' as root), then 'make run'."; \
	  $(SERVE); \
	fi

# The compose stack really started (docs/deployment.md): the CPU image built on a debootstrap Debian base, `docker
# compose up` with local Redis / Prometheus stand-ins, the README's request, `pagedserve bench`, then again with
# deploy/compose.mtls.yml (mutual TLS inside), then torn down. COMPOSE_CHECK_PROJECT names the compose project.
# Needs root and Debian's docker.io + debootstrap (installed here when missing); exit 3: no daemon could be started.
compose-check: $(STAMP)
	bash deploy/compose-check/run.sh $(PY)

# Regenerate services/proto_gen/ from proto/ (the generated code is committed; a unit test checks it is current).
protos: $(STAMP)
	$(PY) tools/gen_protos.py

test: model redis-server deploy-tools lm-eval-tools check-commits
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:cacheprovider
	@bash deploy/compose-check/run.sh $(PY); rc=$$?; \
	if [ $$rc = 3 ]; then echo "*** make test: compose-check NOT RUN: no Docker daemon could be started ***" >&2; \
	elif [ $$rc != 0 ]; then exit $$rc; fi

lint: $(STAMP)
	$(PY) -m ruff check .

# mypy over services/, shared/, kernels/ and benchmarks/ ([tool.mypy] in pyproject.toml; strict on shared/ and
# services/proto_convert/). `make test` runs it too.
typecheck: $(STAMP)
	$(PY) -m mypy

# Engine benchmarks (in-process, no services): decode tok/s vs transformers; what batching and prefix caching buy.
bench-engine: model
	$(PY) -m pagedserve.benchmarks.engine.bench_decode --model $(MODEL_DIR)
	$(PY) -m pagedserve.benchmarks.engine.bench_scheduler --model $(MODEL_DIR)

# Serving benchmarks against live servers on free local ports; results, plots and summaries go to BENCH_OUT.
# `make bench`: pagedserve with the standard suite (random and shared-prefix, EOS suppressed) at BENCH_CONCURRENCIES.
# Prompts per point: BENCH_NUM_PROMPTS if > 0, else max(min prompts, BENCH_PROMPTS_PER_CONCURRENCY x concurrency).
# `make bench-peers`: the same on pagedserve, llama.cpp's llama-server (built once under .peers/: ~15-25 min on 2
# cores) and `transformers serve --continuous-batching`, then a pagedserve/peer table in BENCH_OUT/peers-summary.txt;
# peers at BENCH_PEER_CONCURRENCIES, pagedserve also at BENCH_PEER_OWN_CONCURRENCIES (64: the issue's target there).
BENCH_OUT ?= bench-results
BENCH_CONCURRENCIES ?= 1,4,16,64
BENCH_NUM_PROMPTS ?= 0
BENCH_MIN_PROMPTS ?= 8
BENCH_PROMPTS_PER_CONCURRENCY ?= 1
BENCH_PEERS ?= pagedserve,llama.cpp,transformers
BENCH_PEER_CONCURRENCIES ?= 1,4,16
BENCH_PEER_OWN_CONCURRENCIES ?= 64
BENCH_PEER_MIN_PROMPTS ?= 4
BENCH_ARGS ?=
BENCH_RUN := $(PY) -m pagedserve.benchmarks.peers --model-dir $(MODEL_DIR) --out-dir $(BENCH_OUT) \
	--num-prompts $(BENCH_NUM_PROMPTS) --prompts-per-concurrency $(BENCH_PROMPTS_PER_CONCURRENCY)

bench: model
	$(BENCH_RUN) --servers pagedserve --concurrencies $(BENCH_CONCURRENCIES) --min-prompts $(BENCH_MIN_PROMPTS) \
	  $(BENCH_ARGS)

bench-peers: model
	$(BENCH_RUN) --servers $(BENCH_PEERS) --concurrencies $(BENCH_PEER_CONCURRENCIES) \
	  --pagedserve-concurrencies $(BENCH_PEER_OWN_CONCURRENCIES) --min-prompts $(BENCH_PEER_MIN_PROMPTS) $(BENCH_ARGS)

# pagedserve against llama-server at its best thread count: llama.cpp once per count in BENCH_LLAMA_THREADS, each
# point compared with the better one (one stream: lower ITL; under load: more tok/s), all at 1, 16 and 64 streams.
BENCH_LLAMA_THREADS ?= 1,2
bench-llama: model
	$(BENCH_RUN) --servers pagedserve,llama.cpp --threads $(BENCH_LLAMA_THREADS) --concurrencies 1,16,64 \
	  --min-prompts $(BENCH_PEER_MIN_PROMPTS) $(BENCH_ARGS)

# Speculative decoding against llama-server (issue 42): pagedserve with BENCH_SPEC_CONFIG against itself without it
# (pagedserve-plain), llama-server plain and with its own n-gram speculation (llama.cpp-spec), -t 2, on the
# copy-heavy and random workloads at 1 and 16 streams (64: pagedserve with and without only), in alternating rounds.
# Table: BENCH_OUT/peers-summary.txt.
BENCH_SPEC_CONFIG ?= {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
bench-spec: model
	$(BENCH_RUN) --servers pagedserve,pagedserve-plain,llama.cpp,llama.cpp-spec --threads 2 \
	  --speculative-config '$(BENCH_SPEC_CONFIG)' --workloads copy-heavy,random --concurrencies 1,16 --pagedserve-concurrencies 64 \
	  --min-prompts $(BENCH_PEER_MIN_PROMPTS) --rounds 2 $(BENCH_ARGS)

# Where one stream's per-token time goes (forward pass, sampling, the worker's wait between steps, CPU of each
# process): `pagedserve serve` on free ports, one stream at a time; LATENCY_ARGS e.g. --serve-args "--async-scheduling false".
LATENCY_ARGS ?=
bench-latency: model
	$(PY) -m pagedserve.benchmarks.latency --model-dir $(MODEL_DIR) --out $(BENCH_OUT)/latency.json $(LATENCY_ARGS)

# Structured outputs: output tok/s at 16 streams with every second request under a JSON schema vs none, rounds
# alternating on one `pagedserve serve` (docs/structured-outputs.md); exits 1 below 0.85x. STRUCTURED_ARGS: e.g.
# --rounds 3 --num-prompts 48.
STRUCTURED_ARGS ?=
bench-structured: model
	$(PY) -m pagedserve.benchmarks.structured --model-dir $(MODEL_DIR) --out $(BENCH_OUT)/structured.json $(STRUCTURED_ARGS)

# The price of --batch-invariant: default vs batch-invariant servers at 1, 16 and 64 streams, rounds alternating
# (64-token outputs, 2 rounds: minutes on 2 cores); table in BENCH_OUT/batch-invariant.md
# (docs/batch-invariance.md). BATCH_INVARIANT_ARGS: e.g. --rounds 3 --output-len 300.
BATCH_INVARIANT_ARGS ?=
bench-batch-invariant: model
	$(PY) -m pagedserve.benchmarks.batch_invariant --model-dir $(MODEL_DIR) --out $(BENCH_OUT)/batch-invariant.json \
		--log-dir $(BENCH_OUT)/logs $(BATCH_INVARIANT_ARGS)

# Routing over replicas: the router's own cost in process (p99 target 1 ms at 8 replicas, 1,000-token prompts),
# then prefix vs round-robin vs least-load on 2 local replicas with a shared-prefix workload (docs/replicas.md);
# results in BENCH_OUT/routing. ROUTING_ARGS: e.g. --replicas 3 --num-prompts 128. A missed router target fails
# the target only after the comparison has run (on a busy machine the wall-clock p99 counts time off the CPU).
ROUTING_ARGS ?=
bench-routing: model redis-server
	$(PY) -m pagedserve.benchmarks.routing.bench_router; rc=$$?; \
	$(PY) -m pagedserve.benchmarks.routing.compare --model-dir $(MODEL_DIR) --out-dir $(BENCH_OUT)/routing $(ROUTING_ARGS) \
		&& exit $$rc

# Overload (docs/faults.md): short streamed requests at 4x the measured capacity for 60 s on `pagedserve serve`;
# every request must end 200 or 429 with Retry-After (exit 1 otherwise), and the report gives accepted vs unloaded
# TTFT, the scheduler's split of it, RSS and each process's CPU. OVERLOAD_ARGS: the serve flags (by default a
# latency-first admission for a 2-core box: short queue bound, small batch) and any benchmark flag, e.g.
# --duration-s 30.
OVERLOAD_ARGS ?= --serve-arg=--max-queue-wait-s=0.05 --serve-arg=--max-num-seqs=4
bench-overload: model
	mkdir -p $(BENCH_OUT)
	$(PY) -m pagedserve.benchmarks.overload --serve $(MODEL_DIR) --duration-s 60 --multiple 4 --out $(BENCH_OUT)/overload.json \
		$(OVERLOAD_ARGS)

# Tenants (docs/tenants.md): on one `pagedserve serve` with a keys file, two tenants of equal weight, A with ten
# times B's closed-loop streams on a saturated engine (--max-num-seqs 4, no queue-time bound, one worker thread):
# B's share of the generated tokens while both are backlogged (>= 45%), A's rate once B stopped (>= 0.9x); then a
# priority-0 tenant's TTFT p50 during a flood of priority-10 requests against unloaded (<= 2x), in alternating
# rounds. About 5 minutes on 2 cores; table in BENCH_OUT/tenants.md, exit 1 when a target is missed. TENANTS_ARGS:
# e.g. --both-s 120 --rounds 4.
TENANTS_ARGS ?=
bench-tenants: model
	$(PY) -m pagedserve.benchmarks.tenants --model-dir $(MODEL_DIR) --out $(BENCH_OUT)/tenants.json \
		--log-dir $(BENCH_OUT)/logs $(TENANTS_ARGS)

# Only build llama-server and fetch the GGUF into .peers/ (bench-peers does it when they are missing).
bench-peers-build: $(STAMP)
	$(PY) -m pagedserve.benchmarks.peers.llama_build --peers-dir .peers

# On a CUDA machine (< 5 min): tests/kernels compiled natively, the engine's triton check, decode/prefill vs SDPA.
# The one device script (docs/gpu.md), at most 8 minutes; results in $$OUT/results.json (else ./gpu-check-results.json).
# Uses the machine's own python (the local venv's torch is CPU-only): `make gpu-check PYTHON=/path/to/python`.
gpu-check:
	$(PYTHON) -m pagedserve.benchmarks.device

clean:
	rm -rf $(VENV) $(LM_EVAL_VENV) models bench-results
