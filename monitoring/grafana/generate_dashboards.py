"""Generate the Kairos Grafana dashboards.

    python monitoring/grafana/generate_dashboards.py

writes monitoring/grafana/dashboards/*.json (provisioned by docker-compose) and the
identical copies in charts/kairos/files/dashboards/ (shipped by the Helm chart as
ConfigMaps for the Grafana sidecar). The JSON files are committed; tests/deploy checks that
they are what this script produces, so edit the script, not the JSON, and re-run it.

Only metric names from monitoring/METRICS.md may appear in expressions (tested).
Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT_DIRS = (
    ROOT / "monitoring" / "grafana" / "dashboards",
    ROOT / "charts" / "kairos" / "files" / "dashboards",
)

DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39
RI = "$__rate_interval"

Panel = dict[str, Any]


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping rows."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def place(self, panel: Panel, w: int, h: int) -> Panel:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel["id"] = self.next_id
        self.next_id += 1
        panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return panel

    def row(self, title: str) -> Panel:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel = {"type": "row", "title": title, "collapsed": False, "panels": []}
        self.place(panel, 24, 1)
        self.x, self.y, self.row_h = 0, self.y + 1, 0
        return panel


def target(expr: str, legend: str = "", ref: str = "A", **extra: Any) -> dict[str, Any]:
    t = {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend or "__auto"}
    t.update(extra)
    return t


def targets(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [target(e, leg, chr(ord("A") + i)) for i, (e, leg) in enumerate(pairs)]


def timeseries(
    title: str,
    tgts: list[dict[str, Any]],
    unit: str = "short",
    *,
    stack: bool = False,
    desc: str = "",
    minv: float | None = None,
    maxv: float | None = None,
) -> Panel:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if stack else 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
                "calcs": ["lastNotNull", "max"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(
    title: str,
    expr: str,
    unit: str = "short",
    *,
    desc: str = "",
    thresholds: list[tuple[float | None, str]] | None = None,
    legend: str = "",
) -> Panel:
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr, legend, instant=True)],
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "area",
            "textMode": "auto",
            "justifyMode": "auto",
            "orientation": "auto",
        },
    }


def bargauge(
    title: str,
    tgts: list[dict[str, Any]],
    unit: str = "short",
    *,
    maxv: float | None = None,
    desc: str = "",
) -> Panel:
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "thresholds": {
            "mode": "absolute",
            "steps": [
                {"color": "green", "value": None},
                {"color": "orange", "value": 0.8 * (maxv or 1)},
                {"color": "red", "value": 0.95 * (maxv or 1)},
            ],
        },
    }
    if maxv is not None:
        defaults["max"] = maxv
    for t in tgts:
        t["instant"] = True
    return {
        "type": "bargauge",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
        },
    }


def heatmap_buckets(title: str, metric: str, matcher: str = "", desc: str = "") -> Panel:
    """A distribution over time from a Prometheus histogram's buckets."""
    expr = f"sum by (le) (increase({metric}_bucket{matcher}[{RI}]))"
    return {
        "type": "heatmap",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr, "{{le}}", format="heatmap")],
        "fieldConfig": {
            "defaults": {"custom": {"scaleDistribution": {"type": "linear"}}},
            "overrides": [],
        },
        "options": {
            "calculate": False,
            "yAxis": {"unit": "s", "axisPlacement": "left"},
            "rowsFrame": {"layout": "auto"},
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "steps": 64,
                "exponent": 0.5,
                "fill": "dark-orange",
                "scale": "exponential",
                "reverse": False,
            },
            "cellGap": 1,
            "tooltip": {"mode": "single", "yHistogram": True},
            "legend": {"show": True},
        },
    }


def heatmap_series(
    title: str,
    expr: str,
    legend: str,
    unit: str,
    *,
    minv: float | None = None,
    maxv: float | None = None,
    scheme: str = "Turbo",
    desc: str = "",
) -> Panel:
    """One row per series (here: per GPU), coloured by value over time."""
    color: dict[str, Any] = {
        "mode": "scheme",
        "scheme": scheme,
        "steps": 64,
        "fill": "dark-orange",
        "scale": "linear",
        "reverse": False,
    }
    if minv is not None:
        color["min"] = minv
    if maxv is not None:
        color["max"] = maxv
    return {
        "type": "heatmap",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr, legend)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {
            "calculate": False,
            "yAxis": {"axisPlacement": "left"},
            "rowsFrame": {"layout": "unknown"},
            "color": color,
            "cellGap": 1,
            "cellValues": {"unit": unit},
            "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": True},
            "legend": {"show": True},
        },
    }


def table(title: str, tgts: list[dict[str, Any]], desc: str = "") -> Panel:
    for t in tgts:
        t["instant"] = True
        t["format"] = "table"
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True}, "renameByName": {"Value": "value"}},
            }
        ],
    }


def datasource_var() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "includeAll": False,
        "multi": False,
        "options": [],
    }


def query_var(name: str, label: str, metric: str, label_name: str) -> dict[str, Any]:
    query = f"label_values({metric}, {label_name})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": "PrometheusVariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "sort": 1,
        "hide": 0,
        "regex": "",
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[Panel],
    variables: list[dict[str, Any]] | None = None,
    tags: tuple[str, ...] = (),
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["kairos", *tags],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "links": [
            {
                "title": "Kairos dashboards",
                "type": "dashboards",
                "tags": ["kairos"],
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
            }
        ],
        "templating": {"list": [datasource_var(), *(variables or [])]},
        "panels": panels,
    }


# --- dashboards -------------------------------------------------------------------------


def cluster() -> dict[str, Any]:
    L = Layout()
    alloc_ratio = (
        'sum(kairos_cluster_gpus{state="allocated"}) / sum(kairos_cluster_gpus{state="total"})'
    )
    p: list[Panel] = [
        L.row("Now"),
        L.place(stat("GPUs", 'sum(kairos_cluster_gpus{state="total"})'), 4, 4),
        L.place(
            stat(
                "GPUs allocated",
                alloc_ratio,
                "percentunit",
                thresholds=[(None, "blue"), (0.8, "green")],
            ),
            4,
            4,
        ),
        L.place(stat("Shared GPUs", 'sum(kairos_cluster_gpus{state="shared"})'), 4, 4),
        L.place(
            stat(
                "Degraded GPUs",
                'sum(kairos_cluster_gpus{state="degraded"})',
                thresholds=[(None, "green"), (1, "red")],
            ),
            4,
            4,
        ),
        L.place(
            stat(
                "Nodes ready / lost",
                'sum by (state) (kairos_nodes{state=~"ready|lost"})',
                legend="{{state}}",
            ),
            4,
            4,
        ),
        L.place(
            stat(
                "Fragmentation",
                "max(kairos_cluster_fragmentation_ratio)",
                "percentunit",
                thresholds=[(None, "green"), (0.2, "orange"), (0.4, "red")],
            ),
            4,
            4,
        ),
        L.row("Over time"),
        L.place(
            timeseries(
                "GPU allocation",
                targets(
                    ('sum(kairos_cluster_gpus{state="total"})', "total"),
                    ('sum(kairos_cluster_gpus{state="allocated"})', "allocated"),
                    ('sum(kairos_cluster_gpus{state="shared"})', "shared"),
                    ('sum(kairos_cluster_gpus{state="degraded"})', "degraded"),
                ),
                desc="Allocated against installed GPUs; shared GPUs host fractional requests.",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Allocation and utilisation",
                targets(
                    (alloc_ratio, "allocated ÷ total"),
                    (
                        "avg(max by (node, gpu) (kairos_gpu_utilization_ratio))",
                        "mean SM utilisation",
                    ),
                ),
                "percentunit",
                minv=0,
                maxv=1,
                desc="Allocation is what the scheduler handed out; utilisation what the GPUs did "
                "with it. A wide gap means jobs hold GPUs they do not use.",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Fragmentation",
                targets(
                    ("max(kairos_cluster_fragmentation_ratio)", "stranded ÷ free"),
                ),
                "percentunit",
                minv=0,
                maxv=1,
                desc="Share of free capacity that pending request shapes cannot use.",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Nodes",
                targets(
                    ("sum by (state) (kairos_nodes)", "{{state}}"),
                    ("sum(increase(kairos_nodes_lost_total[$__rate_interval]))", "lost (events)"),
                ),
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Jobs by state",
                targets(
                    (
                        'sum by (state) (kairos_jobs{state=~"pending|admitted|bound|running"})',
                        "{{state}}",
                    ),
                ),
                stack=True,
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Placements and preemptions",
                targets(
                    (f"sum(rate(kairos_scheduler_placements_total[{RI}]))", "placements/s"),
                    (
                        f"sum by (reason) (rate(kairos_scheduler_preemptions_total[{RI}]))",
                        "preempted/s {{reason}}",
                    ),
                ),
                "ops",
            ),
            12,
            8,
        ),
    ]
    return dashboard(
        "kairos-cluster",
        "Kairos / Cluster overview",
        "GPU allocation, utilisation and fragmentation across the cluster.",
        p,
        tags=("cluster",),
    )


def queues() -> dict[str, Any]:
    L = Layout()
    sel = '{queue=~"$queue", tenant=~"$tenant"}'
    p: list[Panel] = [
        L.row("Demand"),
        L.place(
            timeseries(
                "Pending jobs",
                targets(
                    (
                        f"sum by (queue, tenant) (kairos_queue_pending_jobs{sel})",
                        "{{queue}} / {{tenant}}",
                    ),
                ),
                stack=True,
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Running jobs",
                targets(
                    (
                        f"sum by (queue, tenant) (kairos_queue_running_jobs{sel})",
                        "{{queue}} / {{tenant}}",
                    ),
                ),
                stack=True,
            ),
            12,
            8,
        ),
        L.row("Fair share and quota"),
        L.place(
            timeseries(
                "Dominant share (DRF)",
                targets(
                    (
                        f"max by (queue, tenant) (kairos_queue_dominant_share_ratio{sel})",
                        "{{queue}} / {{tenant}}",
                    ),
                ),
                "percentunit",
                minv=0,
                maxv=1,
                desc="Each tenant's largest share of any resource; DRF equalises these.",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Quota use ÷ guarantee",
                targets(
                    (
                        'sum by (queue, tenant) (kairos_queue_quota_gpus{kind="used", '
                        'queue=~"$queue", tenant=~"$tenant"}) / sum by (queue, tenant) '
                        '(kairos_queue_quota_gpus{kind="guaranteed", queue=~"$queue", '
                        'tenant=~"$tenant"} > 0)',
                        "{{queue}} / {{tenant}}",
                    ),
                ),
                "percentunit",
                minv=0,
                desc="Above 100% the tenant borrows idle capacity from its cohort.",
            ),
            12,
            8,
        ),
        L.place(
            table(
                "GPU quota by tenant",
                targets(
                    (
                        'sum by (queue, tenant) (kairos_queue_quota_gpus{kind="guaranteed", '
                        'queue=~"$queue", tenant=~"$tenant"})',
                        "guaranteed",
                    ),
                    (
                        'sum by (queue, tenant) (kairos_queue_quota_gpus{kind="used", '
                        'queue=~"$queue", tenant=~"$tenant"})',
                        "used",
                    ),
                    (
                        'sum by (queue, tenant) (kairos_queue_quota_gpus{kind="borrowed", '
                        'queue=~"$queue", tenant=~"$tenant"})',
                        "borrowed",
                    ),
                ),
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Borrowed GPUs",
                targets(
                    (
                        'sum by (queue, tenant) (kairos_queue_quota_gpus{kind="borrowed", '
                        'queue=~"$queue", tenant=~"$tenant"})',
                        "{{queue}} / {{tenant}}",
                    ),
                ),
                stack=True,
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "GPUs held by model",
                targets(
                    (
                        'sum by (queue, model) (kairos_queue_gpus_by_model{queue=~"$queue", '
                        'tenant=~"$tenant"})',
                        "{{queue}} / {{model}}",
                    ),
                ),
                stack=True,
                desc="GPUs its bound tasks hold, per GPU model (quota per model: kairos queues).",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Billed GPUs (billing weights per model)",
                targets(
                    (
                        'sum by (queue, tenant) (kairos_queue_billed_gpus{queue=~"$queue", '
                        'tenant=~"$tenant"})',
                        "{{queue}} / {{tenant}}",
                    ),
                ),
                stack=True,
                desc="GPUs held, each at its queue's billing weight for its model "
                "(an H100 at 4 counts 4); its integral is billed GPU-hours (kairos usage).",
            ),
            12,
            8,
        ),
        L.row("Waiting"),
        L.place(
            timeseries(
                "Queueing time p50 / p95 by queue",
                targets(
                    (
                        f"histogram_quantile(0.5, sum by (queue, le) "
                        f"(rate(kairos_job_queueing_seconds_bucket{sel}[{RI}])))",
                        "p50 {{queue}}",
                    ),
                    (
                        f"histogram_quantile(0.95, sum by (queue, le) "
                        f"(rate(kairos_job_queueing_seconds_bucket{sel}[{RI}])))",
                        "p95 {{queue}}",
                    ),
                ),
                "s",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Oldest waiting job vs starvation bound",
                targets(
                    (
                        f"max by (queue, tenant) (kairos_queue_oldest_pending_seconds{sel})",
                        "oldest {{queue}} / {{tenant}}",
                    ),
                    (
                        f"max by (queue, tenant) (kairos_queue_starvation_bound_seconds{sel})",
                        "bound {{queue}} / {{tenant}}",
                    ),
                ),
                "s",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Why jobs wait (scheduler pending reasons)",
                targets(
                    ("max by (reason) (kairos_scheduler_pending_jobs)", "{{reason}}"),
                ),
                stack=True,
            ),
            24,
            8,
        ),
    ]
    return dashboard(
        "kairos-queues",
        "Kairos / Queues and tenants",
        "Per-queue and per-tenant demand, fair share, quota and wait times.",
        p,
        [
            query_var("queue", "Queue", "kairos_queue_pending_jobs", "queue"),
            query_var("tenant", "Tenant", "kairos_queue_pending_jobs", "tenant"),
        ],
        tags=("queues",),
    )


def jobs() -> dict[str, Any]:
    L = Layout()
    sel = '{queue=~"$queue"}'
    p: list[Panel] = [
        L.row("States"),
        L.place(stat("Running", 'sum(kairos_jobs{state="running"})'), 4, 4),
        L.place(
            stat("Waiting", 'sum(sum(kairos_jobs{state=~"pending|admitted|bound"}))'),
            4,
            4,
        ),
        L.place(
            stat(
                "Failed",
                'sum(kairos_jobs{state="failed"})',
                thresholds=[(None, "green"), (1, "orange")],
            ),
            4,
            4,
        ),
        L.place(stat("Succeeded", 'sum(kairos_jobs{state="succeeded"})'), 4, 4),
        L.place(
            stat(
                "Stuck",
                "sum(kairos_jobs_stuck)",
                thresholds=[(None, "green"), (1, "red")],
            ),
            4,
            4,
        ),
        L.place(
            stat(
                "Median JCT",
                f"histogram_quantile(0.5, sum by (le) (rate(kairos_job_completion_seconds_bucket{sel}[1h])))",
                "s",
            ),
            4,
            4,
        ),
        L.place(
            timeseries(
                "Jobs by state",
                targets(
                    ("sum by (state) (kairos_jobs)", "{{state}}"),
                ),
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Transitions",
                targets(
                    (
                        f"sum by (state) (rate(kairos_job_transitions_total[{RI}]))",
                        "{{state}}",
                    ),
                ),
                "ops",
            ),
            12,
            8,
        ),
        L.row("Completion time (JCT)"),
        L.place(
            heatmap_buckets(
                "JCT distribution",
                "kairos_job_completion_seconds",
                sel,
                "Submission to terminal state, per completed job.",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "JCT quantiles",
                targets(
                    (
                        f"histogram_quantile(0.5, sum by (le) (rate(kairos_job_completion_seconds_bucket{sel}[{RI}])))",
                        "p50",
                    ),
                    (
                        f"histogram_quantile(0.9, sum by (le) (rate(kairos_job_completion_seconds_bucket{sel}[{RI}])))",
                        "p90",
                    ),
                    (
                        f"histogram_quantile(0.99, sum by (le) (rate(kairos_job_completion_seconds_bucket{sel}[{RI}])))",
                        "p99",
                    ),
                ),
                "s",
            ),
            12,
            8,
        ),
        L.row("Waiting time"),
        L.place(
            heatmap_buckets(
                "Queueing time distribution",
                "kairos_job_queueing_seconds",
                sel,
                "Submission to first running.",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Queueing time quantiles",
                targets(
                    (
                        f"histogram_quantile(0.5, sum by (le) (rate(kairos_job_queueing_seconds_bucket{sel}[{RI}])))",
                        "p50",
                    ),
                    (
                        f"histogram_quantile(0.9, sum by (le) (rate(kairos_job_queueing_seconds_bucket{sel}[{RI}])))",
                        "p90",
                    ),
                    (
                        f"histogram_quantile(0.99, sum by (le) (rate(kairos_job_queueing_seconds_bucket{sel}[{RI}])))",
                        "p99",
                    ),
                ),
                "s",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Throughput",
                targets(
                    (f"sum(rate(kairos_job_completion_seconds_count{sel}[{RI}]))", "completed/s"),
                    (f"sum(rate(kairos_job_queueing_seconds_count{sel}[{RI}]))", "started/s"),
                ),
                "ops",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Stuck jobs",
                targets(
                    ("sum by (reason) (kairos_jobs_stuck)", "{{reason}}"),
                ),
            ),
            12,
            8,
        ),
    ]
    return dashboard(
        "kairos-jobs",
        "Kairos / Jobs",
        "Job states, completion-time and waiting-time distributions.",
        p,
        [query_var("queue", "Queue", "kairos_job_queueing_seconds_count", "queue")],
        tags=("jobs",),
    )


def gpus() -> dict[str, Any]:
    L = Layout()
    sel = '{node=~"$node"}'
    p: list[Panel] = [
        L.row("Per GPU over time"),
        L.place(
            heatmap_series(
                "Utilisation per GPU",
                f"max by (node, gpu) (kairos_gpu_utilization_ratio{sel})",
                "{{node}}/{{gpu}}",
                "percentunit",
                minv=0,
                maxv=1,
                desc="One row per GPU; colour is SM utilisation.",
            ),
            24,
            10,
        ),
        L.place(
            heatmap_series(
                "Memory used per GPU",
                f"max by (node, gpu) (kairos_gpu_memory_used_bytes{sel}) / "
                f"max by (node, gpu) (kairos_gpu_memory_total_bytes{sel})",
                "{{node}}/{{gpu}}",
                "percentunit",
                minv=0,
                maxv=1,
                scheme="Blues",
            ),
            24,
            10,
        ),
        L.place(
            heatmap_series(
                "Temperature per GPU",
                f"max by (node, gpu) (kairos_gpu_temperature_celsius{sel})",
                "{{node}}/{{gpu}}",
                "celsius",
                minv=30,
                maxv=90,
                scheme="RdYlBu",
            ),
            24,
            10,
        ),
        L.row("Now"),
        L.place(
            bargauge(
                "Utilisation now",
                [
                    target(
                        f"max by (node, gpu) (kairos_gpu_utilization_ratio{sel})",
                        "{{node}}/{{gpu}}",
                    )
                ],
                "percentunit",
                maxv=1,
            ),
            8,
            10,
        ),
        L.place(
            bargauge(
                "Memory used now",
                [
                    target(
                        f"max by (node, gpu) (kairos_gpu_memory_used_bytes{sel})",
                        "{{node}}/{{gpu}}",
                    )
                ],
                "bytes",
            ),
            8,
            10,
        ),
        L.place(
            table(
                "Degraded GPUs",
                [target(f"max by (node, gpu) (kairos_gpu_degraded{sel}) > 0", "")],
                "GPUs the agents report as degraded (XID, ECC, thermal).",
            ),
            8,
            10,
        ),
        L.place(
            timeseries(
                "Power draw per node",
                targets(
                    (
                        f"sum by (node) (max by (node, gpu) (kairos_gpu_power_watts{sel}))",
                        "{{node}}",
                    ),
                ),
                "watt",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Seconds since last heartbeat",
                targets(
                    (
                        f"time() - max by (node) (kairos_node_last_heartbeat_timestamp_seconds{sel})",
                        "{{node}}",
                    ),
                    ("max(kairos_node_heartbeat_timeout_seconds)", "lost after"),
                ),
                "s",
            ),
            12,
            8,
        ),
    ]
    return dashboard(
        "kairos-gpus",
        "Kairos / GPUs",
        "Per-GPU utilisation, memory, temperature and power from node telemetry.",
        p,
        [query_var("node", "Node", "kairos_gpu_utilization_ratio", "node")],
        tags=("gpus",),
    )


def platform() -> dict[str, Any]:
    L = Layout()
    p: list[Panel] = [
        L.row("Scheduler"),
        L.place(
            stat(
                "Leader",
                "max(kairos_scheduler_is_leader)",
                thresholds=[(None, "red"), (1, "green")],
            ),
            4,
            4,
        ),
        L.place(stat("Epoch", "max(kairos_scheduler_epoch)"), 4, 4),
        L.place(
            stat(
                "Cycle p99",
                'histogram_quantile(0.99, sum by (le) (rate(kairos_scheduler_cycle_seconds_bucket{phase="total"}[5m])))',
                "s",
                thresholds=[(None, "green"), (1, "orange"), (5, "red")],
            ),
            4,
            4,
        ),
        L.place(
            stat(
                "Outbox pending",
                "max(kairos_outbox_pending)",
                thresholds=[(None, "green"), (100, "orange"), (1000, "red")],
            ),
            4,
            4,
        ),
        L.place(
            stat(
                "Targets down",
                'count(up{job=~".*kairos.*"} == 0) or vector(0)',
                thresholds=[(None, "green"), (1, "red")],
            ),
            4,
            4,
        ),
        L.place(
            stat(
                "Dead letters (1h)",
                "sum(increase(kairos_deadletters_total[1h])) or vector(0)",
                thresholds=[(None, "green"), (1, "orange")],
            ),
            4,
            4,
        ),
        L.place(
            timeseries(
                "Scheduling cycle p50 / p99 by phase",
                targets(
                    (
                        f"histogram_quantile(0.5, sum by (phase, le) (rate(kairos_scheduler_cycle_seconds_bucket[{RI}])))",
                        "p50 {{phase}}",
                    ),
                    (
                        f"histogram_quantile(0.99, sum by (phase, le) (rate(kairos_scheduler_cycle_seconds_bucket[{RI}])))",
                        "p99 {{phase}}",
                    ),
                ),
                "s",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Leadership",
                targets(
                    ("sum(kairos_scheduler_is_leader)", "replicas claiming leadership"),
                    ("max(kairos_scheduler_epoch)", "epoch"),
                ),
            ),
            12,
            8,
        ),
        L.row("Messaging"),
        L.place(
            timeseries(
                "Consumer lag by service and topic",
                targets(
                    (
                        "sum by (service, topic) (max by (service, topic, partition) (kairos_consumer_lag))",
                        "{{service}} {{topic}}",
                    ),
                ),
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Handler latency p99",
                targets(
                    (
                        f"histogram_quantile(0.99, sum by (service, topic, le) (rate(kairos_handler_seconds_bucket[{RI}])))",
                        "{{service}} {{topic}}",
                    ),
                ),
                "s",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Messages by outcome",
                targets(
                    (
                        f"sum by (service, outcome) (rate(kairos_messages_total[{RI}]))",
                        "{{service}} {{outcome}}",
                    ),
                ),
                "ops",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Errors and dead letters",
                targets(
                    (
                        f"sum by (service, topic, reason) (rate(kairos_deadletters_total[{RI}]))",
                        "dead-lettered {{service}} {{topic}} {{reason}}",
                    ),
                    (
                        f'sum by (service) (rate(kairos_messages_total{{outcome="retried"}}[{RI}]))'
                        f" or 0 * sum by (service) (rate(kairos_messages_total[{RI}]))",
                        "retried {{service}}",
                    ),
                    (
                        f'sum by (route) (rate(kairos_http_requests_total{{status=~"5.."}}[{RI}]))'
                        f" or 0 * sum by (route) (rate(kairos_http_requests_total[{RI}]))",
                        "HTTP 5xx {{route}}",
                    ),
                ),
                "ops",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Published",
                targets(
                    (
                        f"sum by (service, topic) (rate(kairos_published_total[{RI}]))",
                        "{{service}} → {{topic}}",
                    ),
                ),
                "ops",
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "Outbox pending",
                targets(
                    ("max(kairos_outbox_pending)", "rows"),
                ),
            ),
            12,
            8,
        ),
        L.row("API"),
        L.place(
            timeseries(
                "HTTP requests by status",
                targets(
                    (f"sum by (status) (rate(kairos_http_requests_total[{RI}]))", "{{status}}"),
                ),
                "reqps",
                stack=True,
            ),
            12,
            8,
        ),
        L.place(
            timeseries(
                "HTTP latency p99 by route",
                targets(
                    (
                        f"histogram_quantile(0.99, sum by (route, le) (rate(kairos_http_request_seconds_bucket[{RI}])))",
                        "{{route}}",
                    ),
                ),
                "s",
            ),
            12,
            8,
        ),
        L.place(
            table(
                "Targets",
                [target('up{job=~".*kairos.*"}', "")],
                "Every scraped Kairos process; 0 = scrape failing.",
            ),
            24,
            8,
        ),
    ]
    return dashboard(
        "kairos-platform",
        "Kairos / Platform",
        "Scheduler cycle latency, consumer lag, handler latency, errors and dead "
        "letters, API traffic.",
        p,
        tags=("platform",),
    )


DASHBOARDS = {
    "cluster-overview.json": cluster,
    "queues-tenants.json": queues,
    "jobs.json": jobs,
    "gpus.json": gpus,
    "platform.json": platform,
}


def render() -> dict[str, str]:
    return {
        name: json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
        for name, build in DASHBOARDS.items()
    }


def main() -> int:
    rendered = render()
    for out in OUT_DIRS:
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob("*.json"):
            if stale.name not in rendered:
                stale.unlink()
        for name, text in rendered.items():
            (out / name).write_text(text, encoding="utf-8")
    print(
        f"wrote {len(rendered)} dashboards to "
        + ", ".join(str(o.relative_to(ROOT)) for o in OUT_DIRS)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
