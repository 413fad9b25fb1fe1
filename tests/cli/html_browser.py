#!/usr/bin/env python3
"""Opens a report page in headless Chromium and checks what a person would see
(tests/cli/test_html_report.sh):

  console   the page as written (its Content-Security-Policy on) logs nothing to the console:
            no script error, no request refused or blocked by the policy, no failed load;
  charts    a copy of the page with the policy dropped and a small script added prints each
            chart's box (getBoundingClientRect of every `figure.chart svg`) through --dump-dom;
            the screenshot of the page at that size must show, inside every box, many colored
            pixels (not the background, not the grey of axis text) of at least two colors (a
            chart that did not render is blank);
  colors    with --expect-colors, each color is drawn (in some chart) on enough pixels;
  size      with --max-bytes, the file is under that size; with --max-cells N, no chart's svg
            has more than N cells (<rect> or <use> with a <title>).

Exit 0 when every check passes, 1 otherwise (each failure one line), so that the shell test
can also expect a failure on a page made broken on purpose.

--shot NAME[:K[:H]] writes the screenshot to $DYNEMB_SCREENSHOT_DIR/NAME.png (when that is
set): the top of the page, or from chart K's caption down H pixels (default 900), with a
palette of 256 colors to keep it small, trimmed to what is drawn.
"""
import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from PIL import Image, ImageChops

WIDTH = 1280
# Console lines Chromium writes with --enable-logging=stderr: console messages (a script error,
# a policy violation) and refused or failed loads.
BAD = re.compile(r":CONSOLE|Uncaught|Refused|violates|blocked|net::ERR_", re.I)


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def run_browser(args, timeout=120):
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--force-device-scale-factor=1", "--enable-logging=stderr", "--v=0",
           "--disable-dev-shm-usage", "--no-first-run"] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def console_errors(page):
    p = run_browser([f"--window-size={WIDTH},1000", "--dump-dom", "file://" + os.path.abspath(page)])
    return [line for line in p.stderr.splitlines() if BAD.search(line)]


PROBE = """<script>
const boxes = [...document.querySelectorAll('figure.chart svg')].map(s => {
  const b = s.getBoundingClientRect();
  return [b.left + scrollX, b.top + scrollY, b.width, b.height];
});
const caps = [...document.querySelectorAll('figure.chart')].map(f => f.getBoundingClientRect().top + scrollY);
document.body.setAttribute('data-probe', JSON.stringify({boxes, caps,
  w: document.documentElement.scrollWidth, h: document.documentElement.scrollHeight}));
</script>"""


def chart_boxes(page, work):
    text = open(page, encoding="utf-8").read()
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", text)
    text = text.replace("</body>", PROBE + "</body>")
    probe = os.path.join(work, "probe.html")
    open(probe, "w", encoding="utf-8").write(text)
    p = run_browser([f"--window-size={WIDTH},1000", "--dump-dom", "file://" + probe])
    m = re.search(r'data-probe="([^"]*)"', p.stdout)
    if not m:
        raise RuntimeError("the probe printed no boxes: " + p.stderr[-500:])
    return json.loads(html.unescape(m.group(1)))


def screenshot(page, height, out):
    run_browser([f"--window-size={WIDTH},{height}", f"--screenshot={out}",
                 "file://" + os.path.abspath(page)])
    if not os.path.exists(out):
        raise RuntimeError("no screenshot")
    return Image.open(out).convert("RGB")


def box_stats(img, box):
    x, y, w, h = (int(round(v)) for v in box)
    crop = img.crop((max(0, x), max(0, y), min(img.width, x + w), min(img.height, y + h)))
    n = crop.width * crop.height
    if n == 0:
        return 0, 0, 0, crop
    # Drawn: colored (not grey: axis text and labels alone do not make a chart) and not the
    # white background.
    drawn = 0
    colors = {}
    for r, g, b in crop.getdata():
        if max(r, g, b) - min(r, g, b) > 24 and 765 - (r + g + b) > 40:
            drawn += 1
            key = (r >> 4, g >> 4, b >> 4)
            colors[key] = colors.get(key, 0) + 1
    return n, drawn, sum(1 for c in colors.values() if c >= 20), crop


def has_color(img, boxes, hex_color, min_pixels=20):
    want = tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    for box in boxes:
        _, _, _, crop = box_stats(img, box)
        n = sum(1 for p in crop.getdata() if max(abs(a - b) for a, b in zip(p, want)) <= 12)
        if n >= min_pixels:
            return True
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("page")
    ap.add_argument("--charts", type=int, help="exactly this many charts")
    ap.add_argument("--expect-colors", default="")
    ap.add_argument("--max-bytes", type=int)
    ap.add_argument("--max-cells", type=int)
    ap.add_argument("--shot", action="append", default=[])
    a = ap.parse_args()
    fails = []
    size = os.path.getsize(a.page)
    if a.max_bytes and size >= a.max_bytes:
        fails.append(f"{a.page}: {size} bytes, want under {a.max_bytes}")
    text = open(a.page, encoding="utf-8").read()
    if a.max_cells:
        for i, svg in enumerate(re.findall(r"<svg.*?</svg>", text, re.S)):
            cells = len(re.findall(r"</title></(?:rect|use)>", svg))
            if cells > a.max_cells:
                fails.append(f"{a.page}: chart {i} draws {cells} cells, want at most {a.max_cells}")
    for line in console_errors(a.page):
        fails.append(f"{a.page}: console: {line.strip()[:300]}")
    with tempfile.TemporaryDirectory() as work:
        probe = chart_boxes(a.page, work)
        boxes = probe["boxes"]
        if not boxes:
            fails.append(f"{a.page}: no chart")
        if a.charts is not None and len(boxes) != a.charts:
            fails.append(f"{a.page}: {len(boxes)} charts, want {a.charts}")
        height = min(int(probe["h"]) + 8, 30000)
        img = screenshot(a.page, height, os.path.join(work, "shot.png"))
        for i, box in enumerate(boxes):
            if box[1] + box[3] > img.height:
                fails.append(f"{a.page}: chart {i} lies below the screenshot ({img.height} px)")
                continue
            n, drawn, colors, _ = box_stats(img, box)
            if n == 0 or drawn < 300 or colors < 2:
                fails.append(f"{a.page}: chart {i} at {[round(v) for v in box]} looks blank: "
                             f"{drawn} of {n} pixels drawn, {colors} colors")
        for c in filter(None, a.expect_colors.split(",")):
            if not has_color(img, boxes, c):
                fails.append(f"{a.page}: no chart shows the color {c}")
        shots = os.environ.get("DYNEMB_SCREENSHOT_DIR")
        for spec in a.shot if shots else []:
            parts = spec.split(":")
            name = parts[0]
            top, right = 0, int(probe["w"])
            if len(parts) > 1 and parts[1] != "":
                k = int(parts[1])
                top = max(0, int(probe["caps"][k]) - 8)  # from the chart's caption
                right = int(max(boxes[k][0] + boxes[k][2], 640)) + 24
            h = int(parts[2]) if len(parts) > 2 else 900
            crop = img.crop((0, top, min(img.width, right), min(img.height, top + h)))
            # Trimmed to what is drawn (and a margin), so that a narrow chart is not a wide
            # white picture.
            drawn = ImageChops.difference(crop, Image.new("RGB", crop.size, "white")).getbbox()
            if drawn:
                crop = crop.crop((max(0, drawn[0] - 16), max(0, drawn[1] - 16),
                                  min(crop.width, drawn[2] + 16), min(crop.height, drawn[3] + 16)))
            crop = crop.quantize(colors=256)
            os.makedirs(shots, exist_ok=True)
            crop.save(os.path.join(shots, name + ".png"), optimize=True)
    for f in fails:
        print("FAIL:", f)
    if not fails:
        print(f"ok: {a.page}: {size} bytes, {len(boxes)} charts rendered, console clean")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
