"""Command line: ``report`` and ``diff`` (``serve`` and ``simulate`` come with the sidecar)."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from . import __version__, config, durations
from .adapters import PRODUCERS, extract
from .baselines import match_profile
from .derive import sum_counters
from .diagnosis import Earlier
from .diagnosis_state import position0_healthy
from .health import Verdict, judge
from .model import BaselineProfile, Counters, SeriesKey, Snapshot, series_name
from .parser import ParseError
from .redaction import credentials, redact_url, scrub
from .render import escape, render_text
from .restarts import DOWN_A_LITTLE, WENT_DOWN, delta_engines
from .sources import SourceError, read_source
from .summary import Judge, cost, profile_entry, summarize

PROG = "vllm-specdec-exporter"


class UsageError(Exception):
    pass


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


class _Once(argparse.Action):
    """A flag that takes one value: given twice is refused, as Prometheus's own flags are, not the
    last one silently kept (a second --poll.interval appended by a wrapper script)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"argument {option}: given more than once (only --vllm.url repeats)")
        setattr(namespace, self.dest, values)


def _duration(text: str) -> float:
    try:
        return durations.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


MAX_DIFF_INTERVAL = "1d"  # diff --url sleeps this long at most (300y overflowed time.sleep: a traceback)


def _diff_interval(text: str) -> float:
    seconds = _duration(text)
    if seconds > durations.parse_duration(MAX_DIFF_INTERVAL):
        raise argparse.ArgumentTypeError(f"{text!r} is over {MAX_DIFF_INTERVAL}")
    return seconds


def _port(text: str) -> int:
    from .settings.checks import port_number

    port = port_number(text)
    if port is None:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a port (1-65535, or 0: any free port)")
    return port


def _speed(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:20]!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):  # inf made every /metrics a 500 (an OverflowError)
        raise argparse.ArgumentTypeError(f"{text[:20]!r} must be a finite number above 0")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    p.add_argument(
        "--max-payload-bytes",
        type=_positive_int,
        default=config.DEFAULT_MAX_PAYLOAD_BYTES,
        help=f"refuse payloads larger than this (default: {config.DEFAULT_MAX_PAYLOAD_BYTES}; serve's key max_payload_bytes)",
    )
    p.add_argument(
        "--timeout",
        type=_duration,
        default=config.DEFAULT_HTTP_TIMEOUT_SECONDS,
        help=f"HTTP timeout per fetch (default: {config.DEFAULT_HTTP_TIMEOUT_SECONDS:g}s)",
    )
    p.add_argument("--producer", choices=PRODUCERS, help="read the payload as this producer's (default: detected)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Speculative-decoding acceptance (MTP, EAGLE, ...) from vLLM's /metrics."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    report = sub.add_parser("report", help="totals since the counters started, from one dump or URL")
    report.add_argument("source", help="http(s) URL of /metrics, a file, or - for stdin")
    _add_common(report)

    diff = sub.add_parser("diff", help="the same over the interval between two dumps or scrapes")
    diff.add_argument("sources", nargs="*", metavar="BEFORE AFTER", help="two dumps or URLs")
    diff.add_argument("--url", help="scrape this URL twice, --interval apart")
    diff.add_argument("--interval", type=_diff_interval, help="time between the two scrapes of --url (e.g. 60s)")
    _add_common(diff)

    serve = sub.add_parser("serve", help="the sidecar: poll vLLM, keep windows, export /metrics")
    from .settings import FLAGS  # the one table of serve's flags, their keys and environment variables

    for f in FLAGS:
        serve.add_argument(
            f.flag,
            dest=f.dest,
            metavar=f.metavar,
            action="append" if f.repeat else _Once,
            help=f"{f.help}; env {f.env}" + (f"; key {f.key}" if f.key else ""),
        )

    sim = sub.add_parser("simulate", help="serve a simulated vLLM V1 /metrics driven by a scenario")
    sim.add_argument("--scenario", default="healthy", help="a built-in scenario name or a YAML file (default: healthy)")
    sim.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:18000", metavar="HOST:PORT")
    sim.add_argument("--speed", type=_speed, default=1.0, help="scenario seconds per real second (default 1)")
    sim.add_argument("--list", action="store_true", help="list the built-in scenarios and exit")

    demo = sub.add_parser("demo", help="the live demo: simulator + exporter + a terminal view")
    demo.add_argument("--scenario", default="demo", help="built-in scenario or YAML file (default: demo)")
    demo.add_argument("--speed", type=_speed, default=1.0, help="scenario seconds per real second (default 1)")
    demo.add_argument("--duration", type=_duration, help="stop after this long (default: run until Ctrl-C)")
    demo.add_argument("--exporter-port", type=_port, default=9746)
    demo.add_argument("--simulator-port", type=_port, default=18000)
    return parser


def _load(source: str, args: argparse.Namespace) -> Snapshot:
    data = read_source(source, args.max_payload_bytes, args.timeout)
    try:
        return extract(data, args.max_payload_bytes, args.producer)
    except ParseError as e:
        name = "stdin" if source == "-" else redact_url(source)
        raise ParseError(scrub(f"{name}: {e}", credentials(source))) from None  # the payload may echo them


def _shown(source: str) -> str:
    """A source as the human output names it: no credentials, no control characters."""
    return "stdin" if source == "-" else escape(redact_url(source))


@functools.cache
def _default_profiles() -> tuple[BaselineProfile, ...]:
    from .settings import default_profiles

    return tuple(default_profiles())  # read once a run: the verdict and the summary both ask


def _profile(model: str, k: int) -> BaselineProfile | None:
    """The built-in profile a served name matches: the CLI has neither /v1/models nor the
    sidecar's aliases, so a name that is not the model's matches none (and says so)."""
    return match_profile(_default_profiles(), model, k, None)


def _with_profiles(summary: dict[str, Any]) -> dict[str, Any]:
    """Each model's baseline profile in the summary (None: no healthy reference), and what its
    head costs in decode steps against that profile (summary.cost, as the sidecar's
    /api/v1/summary: the CLI has no history to learn a healthy AL from, nor a span)."""
    for model, entry in summary["models"].items():
        p = _profile(model, entry["all"]["k"])
        entry["profile"] = profile_entry(p)
        s, healthy = entry["all"], None if p is None else p.mean_acceptance_length
        step_cost = config.DETECTION.draft_step_cost
        entry["cost"] = cost(
            s["k"], s["mean_acceptance_length"], s["num_drafts"], healthy, step_cost, config.DEFAULT_MIN_DRAFTS, None
        )
    return summary


def _report(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    snap = _load(args.source, args)
    summary = _with_profiles(summarize(snap.engines, None, snap.warnings, _verdict(None)))
    shown = _shown(args.source)
    return summary, f"{PROG} report: totals since the counters started ({shown}){_producer(summary, snap)}"


def _verdict(
    span: float | None, restarted: Sequence[SeriesKey] = (), before: Mapping[SeriesKey, Counters] | None = None
) -> Judge:
    """The sidecar's classifier on the CLI's interval: the built-in profiles, the restarts seen
    between the dumps and, across them, the model in the BEFORE dump ("before it", as the
    sidecar reads its health window before a restart); nothing earlier without a restart (no
    workload shift is claimed from one interval)."""

    def verdict(model: str, engines: Mapping[str, Counters]) -> Verdict:
        k = max((c.k for c in engines.values()), default=0)
        changes = [f"a restart of engine {e} between the dumps" for m, e in restarted if m == model]
        earlier = None
        prior = [c for (m, _), c in (before or {}).items() if m == model and c.drafts > 0 and c.k]
        if changes and prior:
            was = sum_counters(prior)
            earlier = Earlier("", None, position0_healthy(was, config.DETECTION, config.DEFAULT_MIN_DRAFTS), was)
        return judge(engines, span, _profile(model, k), config.DETECTION, config.DEFAULT_MIN_DRAFTS, changes, earlier)

    return verdict


def _producer(summary: dict[str, Any], snap: Snapshot) -> str:
    """Adds the producer to the JSON; returns the line for the text title."""
    summary["producer"] = snap.producer
    summary["approximate"] = list(snap.approximate)
    summary["request_acceptance_family"] = snap.request_acceptance_family
    approximate = f"; approximate: {', '.join(snap.approximate)} (see docs/producers.md)" if snap.approximate else ""
    family = f"; per-request histogram: {snap.request_acceptance_family}" if snap.request_acceptance_family else ""
    return f"\nproducer: {snap.producer}{approximate}{family}"


def _diff(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    if args.sources.count("-") > 1 or args.url == "-":
        raise UsageError("diff cannot read stdin ('-') twice: give BEFORE or AFTER (not both) as '-', the other as a file or URL")
    if args.url:
        if args.sources or args.interval is None:
            raise UsageError("diff --url URL needs --interval (e.g. --interval 60s) and no BEFORE/AFTER")
        before = _load(args.url, args)
        started = time.monotonic()
        print(f"scraped {_shown(args.url)}; scraping again in {args.interval:g} s ...", file=sys.stderr)
        time.sleep(args.interval)
        after = _load(args.url, args)
        interval: float | None = time.monotonic() - started
        shown = f"{_shown(args.url)} over {interval:.1f} s"
    else:
        if len(args.sources) != 2 or args.interval is not None:
            raise UsageError("diff needs BEFORE AFTER (two dumps or URLs), or --url URL --interval DURATION")
        before, after = (_load(s, args) for s in args.sources)
        interval = None
        shown = " -> ".join(map(_shown, args.sources))
    if before.producer != after.producer:
        raise UsageError(f"the two sources come from different producers ({before.producer}, {after.producer})")
    deltas = delta_engines(before.engines, after.engines, series_name, interval)
    shared = before.engines.keys() & after.engines.keys()
    if shared and len(deltas.refused) == len(shared):
        key, reason = deltas.refused[0]
        if all(why == DOWN_A_LITTLE for _, why in deltas.refused):
            raise ParseError(
                f"{shown}: every engine's counters ({len(shared)}) are a little lower in AFTER than in BEFORE, not near "
                "zero as after a restart: the two dumps look swapped (give the older first)"
            )
        # In vLLM k only changes with a restart: without _created (multiprocess mode) one whose
        # counters grew past the first dump's looks like this.
        hint = (
            "; vLLM changes k only across a restart: if the server restarted, its counters have grown past the "
            "first dump's (take the dumps closer together, or after the restart)"
            if reason.startswith("k changed")
            else ""
        )
        raise ParseError(
            f"{shown}: not an interval of the same engines ({series_name(key)}: {reason}"
            f"{f'; and {len(shared) - 1} more' if len(shared) > 1 else ''}){hint}"
        )
    warnings = [*before.warnings, *after.warnings, *deltas.warnings]
    # Only where the counters alone said it: a restart known from _created is one, never a swap.
    if shared and set(deltas.restarted) == shared and all(after.engines[k].started is None for k in shared):
        # Every engine went down at once: likelier the dumps in the wrong order than N restarts. One line.
        went_down = tuple(f"{series_name(key)}: {WENT_DOWN} (" for key in shared)
        warnings = [w for w in warnings if not w.startswith(went_down)]
        warnings.insert(
            0,
            f"every engine's counters ({len(shared)}) are lower in AFTER than in BEFORE: the two dumps "
            f"look swapped (give the older first), or the whole server restarted; counted from zero",
        )
    verdict = _verdict(interval, deltas.restarted, before.engines)
    summary = _with_profiles(summarize(deltas.counters, interval, warnings, verdict))
    return summary, f"{PROG} diff: counters accrued between two scrapes ({shown}){_producer(summary, after)}"


def _serve(args: argparse.Namespace) -> int:
    from .errors import ConfigError
    from .settings import load_settings, named_by_source

    # The settings first: a wrong flag or key exits 2 before aiohttp loads (~0.4 s of CPU).
    try:
        settings = load_settings(vars(args))
        web_config = None
        if settings.web_config_file:
            from .webconfig.reload import LiveWebConfig

            web_config = LiveWebConfig(settings.web_config_file)
    except ConfigError as e:
        print(f"{PROG}: error: {named_by_source(e, vars(args))}", file=sys.stderr)
        return 2
    import asyncio

    from . import logs
    from .web import serve

    logs.configure(settings.log_format, settings.log_level)
    try:
        asyncio.run(serve(settings, web_config=web_config))
    except OSError as e:  # e.g. the port is taken
        print(f"{PROG}: error: cannot listen on {settings.listen_address}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _simulate(args: argparse.Namespace) -> int:

    from aiohttp import web

    from .errors import ConfigError
    from .scenarios import builtin_scenarios, load_scenario
    from .settings import parse_listen_address
    from .simulate import Simulation, create_simulator_app

    if args.list:
        for name in builtin_scenarios():
            print(f"{name}: {load_scenario(name).description}")
        return 0
    try:
        scenario = load_scenario(args.scenario)
        host, port = parse_listen_address("--web.listen-address", args.listen_address)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    app = create_simulator_app(Simulation(scenario, speed=args.speed))
    print(
        f"simulating vLLM ({scenario.name}: {scenario.description}) on http://{host or '0.0.0.0'}:{port}/metrics", file=sys.stderr
    )
    try:
        web.run_app(app, host=host or None, port=port, print=None, access_log=None)
    except OSError as e:
        print(f"{PROG}: error: cannot listen on {args.listen_address}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    import asyncio

    from .demo import run_demo
    from .errors import ConfigError

    try:
        asyncio.run(run_demo(args.scenario, args.speed, args.duration, args.exporter_port, args.simulator_port))
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"{PROG}: error: {e.strerror or e} (is another demo running? try --exporter-port/--simulator-port)", file=sys.stderr
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command in ("serve", "simulate", "demo"):
        return {"serve": _serve, "simulate": _simulate, "demo": _demo}[args.command](args)
    try:
        summary, title = {"report": _report, "diff": _diff}[args.command](args)
        out = json.dumps(summary, indent=2, allow_nan=False) + "\n" if args.format == "json" else render_text(summary, title)
    except (SourceError, ParseError, UsageError) as e:  # may quote the input: escaped, one line
        print(f"{PROG}: error: {escape(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug, never a traceback: one line, exit 2
        print(f"{PROG}: error: internal error reading the input ({type(e).__name__}: {escape(str(e)[:200])})", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except BrokenPipeError:  # `report ... | head -1`: the reader left; end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
