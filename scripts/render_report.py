"""Render a run's report.html to PNG with headless Chromium, to look at the page without a desktop.

The README's screenshot, docs/report.png, was made with it.

    python scripts/render_report.py RUN_DIR [--out report.png] [--width 1200] [--height 3000] [--split 1500]

It (re)builds RUN_DIR/report.html first and takes one screenshot of the top --height pixels; --split
cuts it into report-1.png, report-2.png, ... of that many pixels each (needs matplotlib), so a long
page can be looked at in parts. Needs Chromium (Debian: apt-get install chromium).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from report import html as report_html  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--out", type=Path, default=Path("report.png"))
    p.add_argument("--width", type=int, default=1200)
    p.add_argument("--height", type=int, default=3000)
    p.add_argument("--split", type=int, default=0, help="cut the screenshot into parts this tall")
    args = p.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("render_report.py: no Chromium found; install it (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    page = report_html.write(args.run_dir).resolve()
    url = page.as_uri()
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                               "--disable-background-networking", "--no-first-run", "--hide-scrollbars",
                               f"--user-data-dir={profile}", f"--screenshot={args.out.resolve()}",
                               f"--window-size={args.width},{args.height}", url],
                              capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not args.out.exists():
        print(f"render_report.py: chromium failed ({proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
        return 1
    print(args.out)
    if args.split:
        import matplotlib.image
        image = matplotlib.image.imread(args.out)
        for n, top in enumerate(range(0, image.shape[0], args.split), 1):
            part = args.out.with_name(f"{args.out.stem}-{n}{args.out.suffix}")
            matplotlib.image.imsave(part, image[top:top + args.split])
            print(part)
    return 0


if __name__ == "__main__":
    sys.exit(main())
