"""The dashboard page in a real browser: headless Chromium loads ``/dasknn/comm`` from the
scheduler of a LocalCluster while a model trains, takes a screenshot, and the figures the page
shows after the run equal ``comm_report()``."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from html import unescape

import numpy as np
import pytest

import graph
from dasknn.model import SparseMLP
from dasknn.model_parallel import DistributedSparseMLP
from dasknn.runtime.dashboard_feed import DashboardFeed


def _browser(chromium: str, url: str, *mode: str) -> str:
    done = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--window-size=1500,1000",
            "--virtual-time-budget=3000",
            *mode,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _data(feed, part: str) -> str:
    """The page's data route for ``part`` of the feed's run."""
    return feed.url.replace("/comm?", "/comm.json?") + f"&part={part}"


def _table(dom: str, table_id: str) -> list[list[str]]:
    body = dom.split(f'id="{table_id}"', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [
        [unescape(cell) for cell in re.findall(r"<td>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body)
    ]


@pytest.mark.slow
def test_page_shows_the_live_report_and_ends_equal_to_comm_report(chromium, dask_client, tmp_path):
    from PIL import Image

    model = SparseMLP.radixnet(64, 3, seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.uniform(0, 1, (256, 64)), rng.uniform(0, 1, (256, 64))
    stop = threading.Event()
    with DistributedSparseMLP(
        model, dask_client, partition=graph.partition_network(model.weights, 2)
    ) as dist:

        def train():  # epochs until the browser is done, so the page loads during the run
            epoch = 0
            while not stop.is_set():
                dist.partial_fit(x, y, batch_size=16, seed=epoch)
                epoch += 1

        with DashboardFeed(dist, interval=0.2) as feed:
            trainer = threading.Thread(target=train)
            trainer.start()
            try:
                while not _get(_data(feed, "report")).get("batches"):
                    stop.wait(0.1)
                live = _get(_data(feed, "report"))
                shot = tmp_path / "page.png"
                _browser(chromium, feed.url, f"--screenshot={shot}")
                during = len(dist.loss_curve_), trainer.is_alive()
            finally:
                stop.set()
                trainer.join()
        assert live["token"] == dist.token and live["batches"] > 0
        assert during[1], "the training ended before the browser loaded the page"
        image = Image.open(shot).convert("RGB")
        assert image.size == (1500, 1000) and len(image.getcolors(1 << 20)) > 50

        # after the run: the page's figures are comm_report()'s
        report = dist.comm_report()
        dom = _browser(chromium, feed.url, "--dump-dom")
        assert "bokeh" in dom.lower()
        shown = {
            name: re.search(rf'id="dasknn-{name}">(.*?)<', dom)[1]
            for name in ("token", "batches", "payload", "predicted", "other")
        }
        forward_backward = ("forward", "backward")
        assert shown == {
            "token": dist.token,
            "batches": str(report.steps),
            "payload": str(sum(report.total(phase=p) for p in forward_backward)),
            "predicted": str(sum(report.total("predicted", p) for p in forward_backward)),
            "other": str(report.total(phase="other")),
        }
        assert report.exact and report.total() > 0
        by_layer: dict = {}
        for row in report.records():
            cell = by_layer.setdefault((row["what"], row["phase"]), [0, 0, 0])
            cell[0] += row["measured_bytes"]
            cell[1] += row["predicted_bytes"]
            cell[2] += row["measured_messages"]
        layers = {
            (int(k), phase): [int(m), int(p), int(n)]
            for k, phase, m, p, n in _table(dom, "dasknn-layers")
        }
        assert layers == by_layer
        by_pair: dict = {}
        for (_, _, sender, receiver), (nbytes, messages) in report.measured.items():
            cell = by_pair.setdefault((sender, receiver), [0, 0])
            cell[0] += nbytes
            cell[1] += messages
        pairs = {(s, r): [int(b), int(n)] for s, r, b, n in _table(dom, "dasknn-pairs")}
        assert pairs == by_pair
        # the plots' sources: the heatmap cells and the bars are the same figures
        heat = _get(_data(feed, "pairs"))
        cells = zip(zip(heat["sender"], heat["receiver"], strict=True), heat["bytes"], strict=True)
        assert dict(cells) == {key: row[0] for key, row in by_pair.items()}
        bars = _get(_data(feed, "layers"))
        for i, k in enumerate(bars["layer"]):
            for phase in forward_backward:
                row = by_layer.get((k, phase), [0, 0, 0])
                assert bars[f"{phase}_measured"][i] == row[0]
                assert bars[f"{phase}_predicted"][i] == row[1]
        times = _get(_data(feed, "times"))
        assert sorted(times["worker"]) == sorted(dist.timings())
        assert min(times["products"]) > 0


def test_the_dashboard_itself_is_served(dask_client):
    """bokeh comes with the package, so the cluster's dashboard works (not the 'needs bokeh'
    notice)."""
    with urllib.request.urlopen(dask_client.dashboard_link, timeout=10) as response:
        page = response.read().decode()
    assert response.status == 200 and "Dask" in page and "Dask needs bokeh" not in page


def test_a_token_that_is_not_a_run_name_is_refused(dask_client):
    """The token goes into the page; anything but letters, digits, - and _ is a 400."""
    from dasknn.runtime.dashboard import install_dashboard_page

    url = install_dashboard_page(dask_client) + "?token=%3Cscript%3E"
    with pytest.raises(urllib.error.HTTPError, match="400"):
        urllib.request.urlopen(url, timeout=10)
