"""A page on the Dask dashboard, ``/dasknn/comm?token=T``, and its data route
``/dasknn/comm.json``: bytes between workers, measured against predicted bytes per layer and
phase, and the time per worker, updating live. See docs/dashboard.md."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

__all__ = [
    "PAGE_PATH",
    "CommDashboard",
    "install_dashboard_page",
    "page_url",
    "publish_report",
    "report_columns",
]

PLUGIN_NAME = "dasknn-dashboard"
TOPIC = "dasknn-dashboard"
PAGE_PATH = "dasknn/comm"
PHASES = ("forward", "backward")
TIME_PARTS = ("products", "update", "pack", "wait")
#: reports of this many runs (the most recent) are kept on the scheduler
KEPT_RUNS = 32
_TOKEN = re.compile(r"[A-Za-z0-9_-]*")


def report_columns(report: dict[str, Any]) -> dict[str, dict[str, list]]:
    """The Bokeh column data of a published report.

    Parameters
    ----------
    report : dict
        ``{"token", "batches", "workers": [address, ...], "pairs": [[sender, receiver, bytes,
        messages], ...], "layers": [[layer, phase, measured, predicted, messages], ...],
        "times": {worker: {"products", "update", "pack", "wait"}}, "payload", "predicted",
        "other"}``.

    Returns
    -------
    dict
        ``pairs`` (per sender and receiver: positions, bytes, share of the largest pair),
        ``layers`` (per layer: measured and predicted bytes by phase, bar positions) and
        ``times`` (per worker).
    """
    workers = list(report.get("workers", []))
    position = {worker: i for i, worker in enumerate(workers)}
    pairs: dict[str, list] = {
        key: [] for key in ("sender", "receiver", "x", "y", "bytes", "messages", "share")
    }
    largest = max([row[2] for row in report.get("pairs", [])], default=0) or 1
    for sender, receiver, nbytes, messages in report.get("pairs", []):
        pairs["sender"].append(sender)
        pairs["receiver"].append(receiver)
        pairs["x"].append(position.get(receiver, -1))
        pairs["y"].append(position.get(sender, -1))
        pairs["bytes"].append(nbytes)
        pairs["messages"].append(messages)
        pairs["share"].append(nbytes / largest)
    by_layer: dict[int, dict[str, int]] = {}
    for layer, phase, measured, predicted, _ in report.get("layers", []):
        if layer is not None and phase in PHASES:
            row = by_layer.setdefault(int(layer), {})
            row[f"{phase}_measured"] = measured
            row[f"{phase}_predicted"] = predicted
    layers: dict[str, list] = {"layer": sorted(by_layer)}
    for offset, phase in ((-0.3, "forward"), (0.1, "backward")):
        for shift, kind in ((0.0, "measured"), (0.2, "predicted")):
            name = f"{phase}_{kind}"
            layers[name] = [by_layer[k].get(name, 0) for k in layers["layer"]]
            layers[f"x_{name}"] = [k + offset + shift for k in layers["layer"]]
    times: dict[str, list] = {"worker": [], "index": []}
    times.update({part: [] for part in TIME_PARTS})
    for worker, seconds in sorted(report.get("times", {}).items()):
        times["worker"].append(worker)
        times["index"].append(position.get(worker, len(times["index"])))
        for part in TIME_PARTS:
            times[part].append(float(seconds.get(part, 0.0)))
    return {"pairs": pairs, "layers": layers, "times": times}


class CommDashboard(SchedulerPlugin):
    """Owns the dashboard page and the latest published reports.

    Attributes
    ----------
    reports : dict
        ``{token: the latest report of that run}``, the most recently published last.
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.reports: dict[str, dict[str, Any]] = {}

    def report(self, token: str | None) -> dict[str, Any]:
        """The latest report of run ``token`` (default the last to publish), or ``{}``."""
        if token is None:
            return next(reversed(self.reports.values()), {})
        return self.reports.get(token, {})

    async def start(self, scheduler) -> None:
        application = web.Application(
            [
                (f"/{PAGE_PATH}", _PageHandler, {"plugin": self}),
                (f"/{PAGE_PATH}.json", _DataHandler, {"plugin": self}),
            ]
        )
        scheduler.http_application.add_application(application)

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TOPIC:
            self.reports.pop(msg["token"], None)
            self.reports[msg["token"]] = msg
            while len(self.reports) > KEPT_RUNS:
                del self.reports[next(iter(self.reports))]


class _PageHandler(web.RequestHandler):
    def initialize(self, plugin: CommDashboard) -> None:
        self.plugin = plugin

    def get(self) -> None:
        token = self.get_argument("token", None) or self.plugin.report(None).get("token", "")
        if not _TOKEN.fullmatch(token):
            raise web.HTTPError(400, "a run token is letters, digits, - and _")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(_page_html(token))


class _DataHandler(web.RequestHandler):
    def initialize(self, plugin: CommDashboard) -> None:
        self.plugin = plugin

    def get(self) -> None:
        part = self.get_argument("part", "report")
        report = self.plugin.report(self.get_argument("token", None))
        if part == "report":
            body: Any = report
        elif part in ("pairs", "layers", "times"):
            body = report_columns(report)[part]
        else:
            raise web.HTTPError(400, f"unknown part {part!r}")
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(body))


_TABLE = """
<div id="dasknn-summary" style="font-family: sans-serif; margin: 1em;">
  <p>run <span id="dasknn-token">(no report yet)</span>, <span id="dasknn-batches">0</span>
  batches; payload measured <span id="dasknn-payload">0</span> B, predicted
  <span id="dasknn-predicted">0</span> B; other transfers <span id="dasknn-other">0</span> B</p>
  <table id="dasknn-layers" border="1" cellpadding="3">
    <thead><tr><th>layer</th><th>phase</th><th>measured B</th><th>predicted B</th>
    <th>messages</th></tr></thead><tbody></tbody></table>
  <table id="dasknn-pairs" border="1" cellpadding="3" style="margin-top: 1em;">
    <thead><tr><th>sender</th><th>receiver</th><th>bytes</th><th>messages</th></tr></thead>
    <tbody></tbody></table>
</div>
<script>
const DASKNN_DATA = "comm.json?token=" + encodeURIComponent("__TOKEN__");
function dasknnRows(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.innerHTML = "";
  for (const row of rows) {
    const tr = document.createElement("tr");
    for (const value of row) {
      const td = document.createElement("td");
      td.textContent = value === null ? "-" : String(value);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}
async function dasknnRefresh() {
  const response = await fetch(DASKNN_DATA + "&part=report", {cache: "no-store"});
  const report = await response.json();
  if (!report.token) return;
  for (const name of ["token", "batches", "payload", "predicted", "other"]) {
    document.getElementById("dasknn-" + name).textContent = String(report[name]);
  }
  dasknnRows("dasknn-layers", report.layers);
  dasknnRows("dasknn-pairs", report.pairs);
}
dasknnRefresh();
setInterval(dasknnRefresh, 1000);
</script>
"""


def _page_html(token: str) -> str:
    """The page of run ``token``: Bokeh plots of three polled sources, then the summary table."""
    from bokeh.embed import file_html
    from bokeh.layouts import column, row
    from bokeh.models import AjaxDataSource, HoverTool
    from bokeh.palettes import Category10, Viridis256
    from bokeh.plotting import figure
    from bokeh.resources import INLINE
    from bokeh.transform import linear_cmap

    empty = report_columns({})

    def source(part: str) -> AjaxDataSource:
        return AjaxDataSource(
            data_url=f"comm.json?{urlencode({'token': token, 'part': part})}",
            polling_interval=1000,
            method="GET",
            mode="replace",
            data=empty[part],
        )

    def plot(title: str, width: int, height: int, x_label: str, y_label: str):
        return figure(
            title=title,
            width=width,
            height=height,
            x_axis_label=x_label,
            y_axis_label=y_label,
            tools="",
        )

    pairs = plot(
        "bytes sent (row: sender, column: receiver)",
        420,
        380,
        "receiver (worker)",
        "sender (worker)",
    )
    pairs.rect(
        x="x",
        y="y",
        width=0.95,
        height=0.95,
        source=source("pairs"),
        fill_color=linear_cmap("share", Viridis256, 0, 1),
        line_color=None,
    )
    pairs.add_tools(
        HoverTool(tooltips=[("from", "@sender"), ("to", "@receiver"), ("bytes", "@bytes")])
    )
    layers = plot(
        "bytes per layer: measured and predicted", 620, 460, "layer", "bytes between workers"
    )
    layer_source = source("layers")
    colors = Category10[4]
    for color, name in zip(
        colors,
        ("forward_measured", "forward_predicted", "backward_measured", "backward_predicted"),
        strict=True,
    ):
        layers.vbar(
            x=f"x_{name}",
            top=name,
            width=0.18,
            source=layer_source,
            color=color,
            legend_label=name.replace("_", " "),
        )
    layers.add_layout(layers.legend[0], "below")
    times = plot("time per worker (s)", 420, 460, "worker", "seconds")
    times.vbar_stack(
        list(TIME_PARTS),
        x="index",
        width=0.8,
        source=source("times"),
        color=Category10[4],
        legend_label=list(TIME_PARTS),
    )
    times.add_layout(times.legend[0], "below")
    layout = column(row(pairs, layers, times))
    html = file_html(layout, INLINE, title="dasknn: communication")
    return html.replace("</body>", _TABLE.replace("__TOKEN__", token) + "</body>")


def install_dashboard_page(client, token: str | None = None) -> str:
    """Register :class:`CommDashboard` (kept if there); returns :func:`page_url`."""
    client.register_plugin(CommDashboard(), name=PLUGIN_NAME)
    return page_url(client, token)


def page_url(client, token: str | None = None) -> str:
    """``http://host:port/dasknn/comm[?token=T]`` on the scheduler's dashboard server.

    Raises
    ------
    ValueError
        If ``token`` holds other characters than letters, digits, ``-`` and ``_``.
    """
    link = client.dashboard_link.rsplit("/", 1)[0] + "/" + PAGE_PATH
    if token is None:
        return link
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"a run token is letters, digits, - and _, got {token!r}")
    return f"{link}?token={token}"


def publish_report(client, report: dict[str, Any]) -> None:
    """Hand ``report`` (see :func:`report_columns`) to the page's plugin on the scheduler."""
    client.log_event(TOPIC, report)
