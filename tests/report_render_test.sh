#!/usr/bin/env bash
# ReportRender.HtmlRendersInHeadlessChromium: railshard-report --html on the trace fixture,
# screenshotted by a headless Chromium, must render: a 1200x1600 PNG that is not blank and
# shows the plots' blue (#0072B2) lines and bars, i.e. the inline SVG was drawn.
# Usage: report_render_test.sh RAILSHARD_REPORT_BIN FIXTURE_DIR WORK_DIR
# Exit 77 (ctest SKIP_RETURN_CODE) when no Chromium is installed.
set -euo pipefail

report_bin=$1
fixtures=$2
work=$3

browser=""
for candidate in chromium chromium-browser google-chrome; do
  if command -v "$candidate" >/dev/null 2>&1; then
    browser=$(command -v "$candidate")
    break
  fi
done
if [[ -z $browser ]]; then
  echo "SKIP: no chromium / chromium-browser / google-chrome on PATH (apt-get install chromium)"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work/profile"
"$report_bin" "$fixtures" --html "$work/report.html" >"$work/report.txt"
grep -q "<svg" "$work/report.html"

# Chromium wants a writable home and profile; keep both inside the work directory.
HOME="$work" timeout 120 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
  --user-data-dir="$work/profile" --no-first-run --screenshot="$work/report.png" \
  --window-size=1200,1600 "file://$work/report.html" >"$work/chromium.log" 2>&1 || {
  echo "FAIL: chromium exited with $?"
  cat "$work/chromium.log"
  exit 1
}
if [[ ! -s $work/report.png ]]; then
  echo "FAIL: chromium wrote no screenshot"
  cat "$work/chromium.log"
  exit 1
fi

# Decode the PNG with the standard library only (zlib + the five scanline filters) and count
# pixels that are not white, and pixels of the plots' blue.
python3 - "$work/report.png" <<'PY'
import struct, sys, zlib

data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, header = 8, b"", None
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        header = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
width, height, depth, colour, _, _, interlace = header
assert depth == 8 and colour in (2, 6) and interlace == 0, f"unexpected PNG format {header}"
assert (width, height) == (1200, 1600), f"screenshot is {width}x{height}, not 1200x1600"
bpp = 3 if colour == 2 else 4
stride = width * bpp
raw = zlib.decompress(idat)
assert len(raw) == height * (stride + 1), "truncated image data"

previous = bytearray(stride)
non_white = blue = 0
for y in range(height):
    kind = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if kind == 1:
        for i in range(bpp, stride):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif kind == 2:
        line = bytearray((a + b) & 0xFF for a, b in zip(line, previous))
    elif kind == 3:
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
    elif kind == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[i] = (line[i] + pred) & 0xFF
    elif kind != 0:
        raise SystemExit(f"bad filter {kind} in row {y}")
    row = bytes(line)
    if row.count(255) != stride:
        for x in range(0, stride, bpp):
            r, g, b = row[x], row[x + 1], row[x + 2]
            if r < 240 or g < 240 or b < 240:
                non_white += 1
                if r < 60 and 80 < g < 150 and b > 140:
                    blue += 1
    previous = line
total = width * height
print(f"{width}x{height}: {non_white} non-white pixels ({100.0 * non_white / total:.1f}%), "
      f"{blue} plot-blue pixels")
if non_white < total // 100:
    raise SystemExit("FAIL: the page rendered (almost) blank")
if blue < 500:
    raise SystemExit("FAIL: no plot lines or bars visible: the SVG did not render")
PY
echo "PASS: $work/report.png"
