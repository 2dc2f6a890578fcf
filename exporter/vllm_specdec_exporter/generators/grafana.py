"""The one small module between grafanalib and the JSON we commit.

grafanalib 0.7.1 writes dated dashboards (schemaVersion 12, string data sources,
nulls, ``maxDataPoints: 100`` on every panel). Rather than patch each panel,
panels are built through the helpers here and ``finalize`` fixes the whole
dashboard once: data sources as ``{"type": "prometheus", "uid": "${datasource}"}``
objects, no nulls, no forced maxDataPoints, schemaVersion 39, unique panel ids,
and a grid layout without overlaps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grafanalib.core as g

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
GRID_WIDTH = 24
Json = dict[str, Any]  # a JSON object of the dashboard model


def target(expr: str, legend: str = "", instant: bool = False, ref: str = "A") -> g.Target:
    return g.Target(expr=expr, legendFormat=legend, refId=ref, instant=instant, datasource=DATASOURCE)


def targets(*pairs: tuple[str, str], instant: bool = False) -> list[g.Target]:
    return [target(expr, legend, instant, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def timeseries(
    title: str,
    description: str,
    queries: list[g.Target],
    unit: str,
    *,
    min_: float | None = None,
    max_: float | None = None,
    thresholds: list[Json] | None = None,
    overrides: list[Json] | None = None,
    legend_calcs: Sequence[str] = ("lastNotNull", "min", "max"),
) -> g.TimeSeries:
    return g.TimeSeries(
        title=title,
        description=description,
        targets=queries,
        dataSource=DATASOURCE,
        unit=unit,
        valueMin=min_,
        valueMax=max_,
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=list(legend_calcs),
        tooltipMode="multi",
        lineWidth=2,
        fillOpacity=10,
        spanNulls=True,
        thresholds=thresholds or [],
        thresholdsStyleMode="line" if thresholds else "off",
        overrides=overrides or [],
    )


def stat(
    title: str,
    description: str,
    queries: list[g.Target],
    unit: str,
    thresholds: list[Json],
    *,
    text_mode: str = "value",
    decimals: int | None = None,
    mappings: list[Json] | None = None,
) -> g.Stat:
    return g.Stat(
        title=title,
        description=description,
        targets=queries,
        dataSource=DATASOURCE,
        format=unit,
        thresholds=thresholds,
        reduceCalc="lastNotNull",
        textMode=text_mode,
        graphMode="area",
        colorMode="background",
        decimals=decimals,
        mappings=mappings or [],
    )


def bars(
    title: str, description: str, queries: list[g.Target], unit: str, thresholds: list[Json], *, max_: float = 1.0
) -> g.BarGauge:
    return g.BarGauge(
        title=title,
        description=description,
        targets=queries,
        dataSource=DATASOURCE,
        format=unit,
        min=0,
        max=max_,
        thresholds=thresholds,
        calc="lastNotNull",
        displayMode="gradient",
        orientation="horizontal",
    )


def steps(*pairs: tuple[float | None, str]) -> list[Json]:
    """Threshold steps: (from, colour); the first has from=None (the base)."""
    return [{"color": color, "value": value} for value, color in pairs]


@dataclass
class Layout:
    """Places panels left to right, wrapping at 24 columns, rows as tall as their tallest panel."""

    panels: list[Any] = field(default_factory=list)  # grafanalib panels
    x: int = 0
    y: int = 0
    row_height: int = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(g.RowPanel(title=title, gridPos=g.GridPos(h=1, w=GRID_WIDTH, x=0, y=self.y)))
        self.y += 1

    def add(self, panel: Any, w: int, h: int) -> None:
        if self.x + w > GRID_WIDTH:
            self._newline()
        panel.gridPos = g.GridPos(h=h, w=w, x=self.x, y=self.y)
        self.panels.append(panel)
        self.x += w
        self.row_height = max(self.row_height, h)

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_height
        self.x, self.row_height = 0, 0


def _strip(value: Any) -> Any:
    """Drop grafanalib's nulls (and keys holding them) everywhere. The one null
    Grafana's schema asks for is the base threshold step's value (-Infinity in
    Grafana, which JSON cannot spell): it is kept."""
    if isinstance(value, dict):
        if set(value) == {"color", "value"} and value["value"] is None:
            return value
        return {k: _strip(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip(v) for v in value if v is not None]
    return value


_LEFTOVERS = (
    "span",
    "minSpan",
    "height",
    "cacheTimeout",
    "error",
    "editable",
    "hideTimeOverride",
    "timeFrom",
    "timeShift",
    "interval",
    "repeat",
    "transparent",
    "links",
)


def _fix_panel(panel: Json, next_id: Callable[[], int]) -> Json:
    panel["id"] = next_id()
    if panel.get("type") != "row":
        panel["datasource"] = DATASOURCE
        panel.setdefault("fieldConfig", {}).setdefault("overrides", [])
        panel.pop("maxDataPoints", None)
        for t in panel.get("targets", []):
            t["datasource"] = DATASOURCE
            # grafanalib's Graphite-era leftovers
            for key in ("intervalFactor", "step", "metric", "target", "hide", "query"):
                t.pop(key, None)
        assert panel.get("description"), f"panel {panel.get('title')!r} has no description"
    if panel.get("type") == "bargauge":
        _modern_bargauge(panel)
    for key in _LEFTOVERS:  # grafanalib's defaults that only add noise
        if not panel.get(key):
            panel.pop(key, None)
    return panel


def _modern_bargauge(panel: Json) -> None:
    """grafanalib writes Grafana 6's ``options.fieldOptions``; move it to fieldConfig/reduceOptions."""
    old = panel["options"].pop("fieldOptions")
    defaults = panel["fieldConfig"].setdefault("defaults", {})
    defaults.update({k: v for k, v in old["defaults"].items() if k in ("unit", "min", "max")})
    defaults["thresholds"] = {"mode": "absolute", "steps": old["thresholds"]}
    panel["options"].update(
        {
            "reduceOptions": {"calcs": old["calcs"], "fields": "", "values": False},
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
        }
    )
    for key in ("showThresholdLabels", "showThresholdMarkers"):
        panel["options"].pop(key, None)


def _fix_variable(var: Json) -> None:
    if var.get("type") == "query":
        var["datasource"] = DATASOURCE
    for key in ("auto", "auto_count", "auto_min", "useTags"):  # interval-variable and tag leftovers
        var.pop(key, None)
    if var.get("includeAll") and var.get("current", {}).get("value") == "$__all":
        var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}


def finalize(dashboard: g.Dashboard) -> Json:
    data: Json = _strip(_json(dashboard.to_json_data()))
    counter = iter(range(1, 10_000))
    data["panels"] = [_fix_panel(p, lambda: next(counter)) for p in data.get("panels", [])]
    data.pop("rows", None)
    data.pop("id", None)
    data.pop("gnetId", None)
    data.pop("hideControls", None)
    data.pop("sharedCrosshair", None)
    data.pop("style", None)
    data["schemaVersion"] = SCHEMA_VERSION
    for var in data.get("templating", {}).get("list", []):
        _fix_variable(var)
    for ann in data.get("annotations", {}).get("list", []):
        ann.setdefault("datasource", DATASOURCE)
    return data


def _json(value: Any) -> Any:
    """grafanalib objects -> plain JSON types, recursively."""
    if hasattr(value, "to_json_data"):
        return _json(value.to_json_data())
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    return value


def multi_select(name: str, label: str, query: str) -> g.Template:
    """A variable that selects several of its values, all of them by default."""
    return g.Template(
        name=name,
        label=label,
        dataSource="${datasource}",
        includeAll=True,
        multi=True,
        allValue=".*",
        default="$__all",
        query=query,
    )


def fleet_selects(series: str, cluster: str, namespace: str) -> list[g.Template]:
    """The variables every board opens with: the cluster (when the fleet has one) and the
    namespace within it, read from ``series``."""
    within = f'{{{cluster}=~"${cluster}"}}' if cluster else ""
    out = [multi_select(cluster, "Cluster", f"label_values({series}, {cluster})")] if cluster else []
    return [*out, multi_select(namespace, "Namespace", f"label_values({series}{within}, {namespace})")]


def variables(*templates: g.Template) -> g.Templating:
    return g.Templating(
        list=[
            g.Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus"),
            *templates,
        ]
    )
