"""serve's flags, declared once (FLAGS): argparse (cli.build_parser), the environment
(overrides.pick_overrides), the config keys and the README's table all read this table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import config


@dataclass(frozen=True, slots=True)
class Flag:
    """One `serve` flag, declared once: argparse, the environment and the README's table read this.

    One rule maps a flag to its config key and environment variable: --web.listen-address is the
    key web.listen_address (each '.' a level of the YAML, '-' written '_') and the variable
    VLLM_SPECDEC_EXPORTER_WEB_LISTEN_ADDRESS ('.' and '-' written '_', upper case)."""

    flag: str
    dest: str  # the override (and argparse) name build_settings reads
    metavar: str
    help: str
    in_file: bool = True  # False: a flag with no key (the file's own name; --vllm.url, whose file form is targets:)
    repeat: bool = False
    target_key: str | None = None  # the key of every target this flag sets (--vllm.model: targets[].model)

    @property
    def key(self) -> str | None:
        return self.flag.removeprefix("--").replace("-", "_") if self.in_file else None

    @property
    def env(self) -> str:
        return config.ENV_PREFIX + self.flag.removeprefix("--").replace(".", "_").replace("-", "_").upper()


FLAGS = (
    Flag(
        "--vllm.url",
        "urls",
        "[NAME=]URL",
        "vLLM /metrics URL (repeatable; the variable takes a comma-separated list; the file's form is targets:)",
        in_file=False,
        repeat=True,
    ),
    # What the deployment runs, for every target: the Helm chart passes its vLLM's own arguments.
    Flag(
        "--vllm.model",
        "vllm_model",
        "MODEL",
        "vLLM's --model, an HF id or a weights path: profiles are matched by it where /v1/models names none "
        "(every target's; the file's form is targets[].model)",
        in_file=False,
        target_key="model",
    ),
    Flag(
        "--vllm.method",
        "vllm_method",
        "METHOD",
        "the speculative method: mtp, eagle3, ... (every target's; the file's form is targets[].method)",
        in_file=False,
        target_key="method",
    ),
    Flag(
        "--vllm.k",
        "vllm_k",
        "K",
        "num_speculative_tokens: a named profile must be for it (every target's; the file's form is targets[].k)",
        in_file=False,
        target_key="k",
    ),
    Flag(
        "--vllm.profile",
        "vllm_profile",
        "NAME",
        "the baseline profile, named outright instead of matched (every target's; the file's form is targets[].profile)",
        in_file=False,
        target_key="profile",
    ),
    Flag("--web.listen-address", "listen_address", "[HOST]:PORT", f"where to serve (default {config.DEFAULT_LISTEN_ADDRESS})"),
    Flag(
        "--web.config.file",
        "web_config_file",
        "FILE",
        "TLS and basic auth for /metrics, in the Prometheus exporter-toolkit web-config format",
    ),
    Flag("--poll.interval", "poll_interval", "DURATION", f"time between polls (default {config.DEFAULT_POLL_INTERVAL})"),
    Flag("--log.format", "log_format", "|".join(config.LOG_FORMATS), "default auto"),
    Flag("--log.level", "log_level", "|".join(config.LOG_LEVELS), "default info"),
    Flag("--config.file", "config_file", "FILE", "YAML config: everything the flags set and more", in_file=False),
)


def _flag_value(flag: Flag, value: Any) -> Any:
    """A flag's text as its key's type: --vllm.k 2 is the integer 2 (anything else is refused as not one)."""
    if flag.target_key == "k" and isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return value


def flags_markdown() -> str:
    """The README's table of serve's flags (tests/test_serve.py checks the README carries it)."""
    rows = ["| flag | config key | environment variable | meaning |", "|---|---|---|---|"]
    for f in FLAGS:
        key = f"`{f.key}`" if f.key else "none"
        metavar = f.metavar.replace("|", "\\|")  # a | inside a table cell
        rows.append(f"| `{f.flag} {metavar}` | {key} | `{f.env}` | {f.help} |")
    return "\n".join(rows)
