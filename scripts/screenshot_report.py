"""Render an HTML report in headless Chromium, offline, and save a screenshot.

    python scripts/screenshot_report.py --storage sqlite:///autotune.db \
        [--png docs/report.png] [--out results/report_render.json]
    python scripts/screenshot_report.py --html report.html ...

Chromium (`apt install chromium`) opens the report as a local file with every network route
refused (a proxy that does not exist, background networking off) and writes a network log. The
script then checks what a reader would see: the rendered page holds both plots with their
points, and the browser requested nothing but the file itself. It prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from autotune.bench.browser import find_chromium, render
from autotune.bench.output import write_json


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--html", type=Path, help="a report written by `autotune report`")
    source.add_argument("--storage", help="a stored study: its report is written first")
    parser.add_argument("--study-name", default=None)
    parser.add_argument("--png", type=Path, default=Path("docs/report.png"))
    parser.add_argument("--out", type=Path, default=Path("results/report_render.json"))
    args = parser.parse_args()
    browser = find_chromium()
    if browser is None:
        print("no Chromium found: install it (apt install chromium) and run again")
        return 2
    html_file = args.html
    if args.storage:
        from autotune.html_report import write_report

        html_file = Path(tempfile.mkdtemp()) / "report.html"
        write_report(args.storage, args.study_name, str(html_file))
    result = render(html_file, args.png, browser)
    ok = len(result["plots"]) >= 2 and result["points"] > 0 and not result["fetched"]
    result["ok"] = ok
    rows = [
        ("browser", result["browser"]),
        ("plots rendered", ", ".join(result["plots"]) or "none"),
        ("plotted points", result["points"]),
        ("table rows", result["table_rows"]),
        ("network requests", ", ".join(result["fetched"]) or "none"),
        ("screenshot", f"{result['screenshot']} ({result['screenshot_bytes']:,} bytes)"),
        ("offline render", "ok" if ok else "FAILED"),
    ]
    for name, value in rows:
        print(f"{name:<18} {value}")
    write_json(args.out, result, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
