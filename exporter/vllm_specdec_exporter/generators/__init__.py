"""Build tools: the generators of the Prometheus rules (rules.py) and the Grafana dashboards
(boards.py, from grafana.py, overview.py and exporter_board.py). They are run by `make generate`
(`python -m vllm_specdec_exporter.generators.<tool>`), never by the sidecar; they read the same
config module as the sidecar, which is why they live in the package."""
