"""Rendering a report in headless Chromium, offline, as a reader's browser would: what it drew,
and every request it made (``scripts/screenshot_report.py`` is the command)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

OFFLINE_FLAGS = [
    "--headless=new",
    "--no-sandbox",  # root in a container; the page is our own file
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--proxy-server=http://127.0.0.1:9",  # nothing answers there: any fetch would fail
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _chromium(browser: str, args: list[str], timeout_s: float = 120) -> str:
    with tempfile.TemporaryDirectory() as profile:
        process = subprocess.run(
            [browser, *OFFLINE_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    if process.returncode != 0:
        raise RuntimeError(f"{browser} exited {process.returncode}: {process.stderr[-500:]}")
    return process.stdout


def page_requests(net_log: Path) -> list[str]:
    """Every non-file URL the page asked for, from the browser's network log. Requests of the
    page carry its file:// isolation key; Chromium's own background calls (clock, sign-in) do
    not and are not the report's doing."""
    log = json.loads(net_log.read_text() or "{}")
    names = {code: name for name, code in log.get("constants", {}).get("logEventTypes", {}).items()}
    urls = set()
    for event in log.get("events", []):
        params = event.get("params") or {}
        if names.get(event.get("type")) != "URL_REQUEST_START_JOB":
            continue
        url, key = params.get("url", ""), params.get("network_isolation_key", "")
        if key.startswith("file://") and not url.startswith("file:"):
            urls.add(url)
    return sorted(urls)


def render(html_file: Path, png: Path, browser: str, width: int = 1100) -> dict[str, Any]:
    """Screenshot ``html_file`` into ``png``; return what the browser rendered and fetched."""
    url = html_file.resolve().as_uri()
    with tempfile.TemporaryDirectory() as tmp:
        net_log = Path(tmp) / "net.json"
        dom = _chromium(browser, ["--dump-dom", f"--log-net-log={net_log}", url])
        fetched = page_requests(net_log)
    height = 900 + 28 * dom.count("<tr")  # tall enough for the tables below the plots
    png.parent.mkdir(parents=True, exist_ok=True)
    _chromium(browser, [f"--window-size={width},{height}", f"--screenshot={png.resolve()}", url])
    plots = re.findall(r"<svg[^>]*aria-label=\"([^\"]+)\"", dom)
    return {
        "url": url,
        "browser": _chromium(browser, ["--version"]).strip() or browser,
        "plots": plots,
        "points": dom.count("<circle"),
        "table_rows": dom.count("<tr"),
        "fetched": fetched,
        "screenshot": str(png),
        "screenshot_bytes": png.stat().st_size if png.exists() else 0,
    }
