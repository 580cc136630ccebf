# `make test` is the one test command (README, .ci/run): own venv, all deps, whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml examples/digits-ddp/requirements.txt | cksum | cut -d' ' -f1)

.PHONY: test test-fast lint bench bench-slurm bench-scale bench-ssh clean

# SkyPilot's own task parser checks `treb render --on skypilot` (about 300 MB, so in a venv of
# its own and not in the `test` extra); uv builds it in seconds.
SKY_VENV := .venv-sky
SKYPILOT := skypilot==0.14.1

$(SKY_VENV)/.installed-0.14.1: $(STAMP)
	$(VENV)/bin/uv venv -q --allow-existing -p $(PY) $(SKY_VENV)
	$(VENV)/bin/uv pip install -q --python $(SKY_VENV)/bin/python '$(SKYPILOT)'
	touch $@

# A real `mlflow server` for tests/integration/test_tracking.py (trebuchet itself talks to
# MLflow over REST with the standard library and never imports mlflow); its own venv too.
MLFLOW_VENV := .venv-mlflow
MLFLOW := mlflow==3.17.2

$(MLFLOW_VENV)/.installed-3.17.2: $(STAMP)
	$(VENV)/bin/uv venv -q --allow-existing -p $(PY) $(MLFLOW_VENV)
	$(VENV)/bin/uv pip install -q --python $(MLFLOW_VENV)/bin/python '$(MLFLOW)'
	touch $@

# Lightning itself, for its SLURM auto-requeue on the test cluster
# (tests/integration/test_torchelastic.py): in the project's venv, torch pinned so that pip
# keeps the CPU torch there (Lightning alone would ask for a CUDA one).
LIGHTNING := lightning==2.6.6
LIGHTNING_STAMP := $(VENV)/.installed-lightning-2.6.6

$(LIGHTNING_STAMP): $(STAMP)
	$(PY) -m pip install -q '$(LIGHTNING)' torch==2.13.0
	touch $@

# The trainers users run, pinned (tests/integration/test_trainers.py): transformers 5 and
# Accelerate in the project's venv, torch pinned so pip keeps the CPU build; the last
# transformers 4.x in a venv of its own (TREB_HF4_PYTHON), as a user still on 4.x has it.
# pip, not uv, installs torch there: pip is what finds this machine's CPU wheel of it.
HF := transformers==5.25.0 accelerate==1.16.0
HF_STAMP := $(VENV)/.installed-transformers-5.25.0
HF4_VENV := .venv-hf4
HF4 := transformers==4.57.6

$(HF_STAMP): $(STAMP)
	$(PY) -m pip install -q $(HF) torch==2.13.0
	touch $@

$(HF4_VENV)/.installed-4.57.6: $(STAMP)
	$(VENV)/bin/uv venv -q --allow-existing --seed -p $(PY) $(HF4_VENV)
	$(HF4_VENV)/bin/python -m pip install -q '$(HF4)' accelerate==1.16.0 torch==2.13.0
	touch $@

# A real Horovod for `launcher: horovod` (tests/integration/test_horovod.py): 0.28.1 is
# source-only; scripts/horovod-wheel builds it once against the venv's torch (cached in
# ~/.cache/trebuchet/wheels by horovod, torch, python and MPI; 3-5 minutes) and installs it.
# A failed build fails `make test`. Needs libopenmpi-dev (scripts/system-deps).
HOROVOD := 0.28.1
HOROVOD_STAMP := $(VENV)/.installed-horovod-$(HOROVOD)

$(HOROVOD_STAMP): $(LIGHTNING_STAMP) scripts/horovod-wheel
	scripts/system-deps
	HOROVOD_VERSION=$(HOROVOD) scripts/horovod-wheel $(PY)
	touch $@

$(STAMP): pyproject.toml examples/digits-ddp/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,ui]' -r examples/digits-ddp/requirements.txt python-hostlist
	rm -f $(VENV)/.installed-*
	touch $@

# The Slurm test cluster and the two ssh test hosts are started for the suite and always
# taken down after it (scripts/with-slurm-cluster, scripts/with-ssh-hosts); in CI a service
# that cannot start fails the run. The tests not marked `integration` run first, in 2
# processes (pytest-xdist), before the cluster and hosts are up: a test that uses them, or
# anything shared between tests (a fixed port), is marked integration. The integration tests
# then run around the cluster and hosts in two pytest processes side by side, each one test
# at a time: those that use the cluster or the hosts (marked slurm or ssh by the fixture they
# ask for: tests/conftest.py) mostly wait on Slurm, the others run on this machine. All
# three always run; any fails it.
TEST_ENV = PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TREB_SKYPILOT_PYTHON="$(CURDIR)/$(SKY_VENV)/bin/python" \
	TREB_MLFLOW_PYTHON="$(CURDIR)/$(MLFLOW_VENV)/bin/python" \
	TREB_HF4_PYTHON="$(CURDIR)/$(HF4_VENV)/bin/python"

test: $(STAMP) $(SKY_VENV)/.installed-0.14.1 $(MLFLOW_VENV)/.installed-3.17.2 $(LIGHTNING_STAMP) \
		$(HOROVOD_STAMP) $(HF_STAMP) $(HF4_VENV)/.installed-4.57.6
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	scripts/system-deps
	$(TEST_ENV) $(PY) -m pytest -q -m "not integration" -n 2 --durations=10; fast=$$?; \
		$(TEST_ENV) scripts/with-slurm-cluster scripts/with-ssh-hosts scripts/integration-tests \
		$(PY) && exit $$fast

test-fast: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -q -m "not integration"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/launch_overhead.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/cli_startup.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/teardown.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/env_build.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/train_speed.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/launcher_cpu.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/agent_watch_cost.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/ui_runs_page.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/controller_latency.py

# Slurm figures on the test cluster (started and taken down around it).
bench-slurm: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/with-slurm-cluster $(PY) bench/slurm_submit.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/with-slurm-cluster $(PY) bench/slurm_scale.py
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/with-slurm-cluster $(PY) bench/controller_latency.py --on slurm --nodes 2

# treb at scale (issue 36, docs/scale.md): the controller's link against 4,096 simulated
# agents; the local engine at 16..128 simulated nodes x 4 ranks; the Slurm test cluster at
# 8..64 nodes x 8 ranks (one cluster of each size, brought up and taken down around it),
# each against `srun` starting the same tiny rank (bench/tiny_rank.sh) in the same shape.
SCALE_SLURM_NODES ?= 8 16 32 64
bench-scale: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/fleet_sim.py --agents 4096
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/agent_start.py --starts 25
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) bench/scale.py --on local --nodes 16,32,64,128 \
		--procs 4 --steady 60
	for n in $(SCALE_SLURM_NODES); do \
		PATH="$(CURDIR)/$(VENV)/bin:$$PATH" TREB_SLURM_NODES=$$n scripts/with-slurm-cluster \
			$(PY) bench/scale.py --on slurm --nodes $$n --procs 8 --steady 30 \
			--rounds 3 || exit 1; \
	done

# `treb run --on ssh` against a hand-written ssh loop, on the ssh test hosts.
bench-ssh: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/with-ssh-hosts $(PY) bench/ssh_launch.py

clean:
	rm -rf $(VENV) $(SKY_VENV) $(MLFLOW_VENV) $(HF4_VENV) .pytest_cache .mypy_cache
