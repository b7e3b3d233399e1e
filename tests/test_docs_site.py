"""The documentation site as a user opens it: built with mkdocs (warnings as errors), every
internal link and anchor of every page resolves, and headless Chromium renders the front page
and its navigation from a server on 127.0.0.1."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]


class _Links(HTMLParser):
    """The ``href``/``src`` targets and the element ids of one page."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.targets.append(value)
            elif name == "id" and value:
                self.ids.add(value)


def _parse(page: Path) -> _Links:
    links = _Links()
    links.feed(page.read_text(encoding="utf-8"))
    return links


def _resolve(site: Path, page: Path, target: str) -> tuple[Path, str] | None:
    """The file and anchor an internal link of ``page`` points at; ``None`` for an external
    link."""
    parsed = urlparse(target)
    if parsed.scheme or parsed.netloc or target.startswith(("mailto:", "data:", "javascript:")):
        return None
    base = "/" + page.relative_to(site).as_posix()
    path = urlparse(urljoin(base, target)).path
    file = site / unquote(path).lstrip("/")
    if path.endswith("/") or file.is_dir():
        file = file / "index.html"
    return file, parsed.fragment


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install .[docs])")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_every_internal_link_and_anchor_resolves(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    parsed = {page: _parse(page) for page in pages}
    broken = []
    for page, links in parsed.items():
        for target in links.targets:
            resolved = _resolve(site, page, target)
            if resolved is None:
                continue
            file, anchor = resolved
            if not file.exists():
                broken.append(f"{page.relative_to(site)}: {target} (no file)")
            elif anchor and file.suffix == ".html":
                ids = parsed[file].ids if file in parsed else _parse(file).ids
                if anchor not in ids:
                    broken.append(f"{page.relative_to(site)}: {target} (no anchor)")
    assert broken == []


@pytest.mark.slow
def test_chromium_renders_the_front_page_and_its_navigation(site, chromium):
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        dom = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--virtual-time-budget=3000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        assert "<title>" in html and "dasknn" in html
        nav = set(re.findall(r'class="md-nav__link[^"]*"[^>]*href="([^"]+)"', html))
        nav |= set(re.findall(r'href="([^"]+)"[^>]*class="md-nav__link', html))
        for wanted in ("getting-started/", "which-mode/", "benchmarks/"):
            assert any(link.rstrip("/").endswith(wanted.rstrip("/")) for link in nav), wanted
        for link in nav:
            resolved = _resolve(site, site / "index.html", link)
            assert resolved is None or resolved[0].exists(), link
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
