"""Plots as standalone SVG, drawn by hand so the harness needs only the
Python standard library: grouped bars, latency-by-percentile curves (the
distribution), and lines over time.
"""

from __future__ import annotations

import math
from xml.sax.saxutils import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf", "#7f7f7f"]
W, H = 760, 380
ML, MR, MT, MB = 72, 20, 40, 70  # margins: left, right, top, bottom


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 0.5:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    e = math.floor(math.log10(lo))
    while 10**e <= hi * 10:
        for m in (1, 2, 5):
            v = m * 10**e
            if lo / 1.01 <= v <= hi * 1.01:
                ticks.append(v)
        e += 1
    return ticks or [lo, hi]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:.3g}G"
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    if a >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


class _Canvas:
    def __init__(self, title: str):
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
            f'<rect width="{W}" height="{H}" fill="white"/>',
            f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{escape(title)}</text>',
        ]

    def add(self, s: str) -> None:
        self.parts.append(s)

    def text(self, x, y, s, anchor="middle", size=12, rotate=None, color="#222"):
        tr = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" fill="{color}"{tr}>{escape(str(s))}</text>')

    def line(self, x1, y1, x2, y2, color="#999", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" stroke-width="{width}"{d}/>')

    def legend(self, names: list[str]) -> None:
        x = ML
        y = H - 18
        for i, name in enumerate(names):
            self.add(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{COLORS[i % len(COLORS)]}"/>')
            self.text(x + 16, y, name, anchor="start")
            x += 28 + 7 * len(name)

    def done(self) -> str:
        return "\n".join(self.parts + ["</svg>"]) + "\n"


class _YAxis:
    def __init__(self, c: _Canvas, lo: float, hi: float, label: str, log: bool = False):
        self.log = log and lo > 0
        self.top, self.bottom = MT, H - MB
        if self.log:
            self.lo, self.hi = lo, hi
            ticks = _log_ticks(lo, hi)
        else:
            ticks = _nice_ticks(0 if lo >= 0 else lo, hi)
            self.lo, self.hi = ticks[0], ticks[-1]
        for t in ticks:
            y = self.y(t)
            c.line(ML, y, W - MR, y, color="#e4e4e4")
            c.text(ML - 6, y + 4, _fmt(t), anchor="end", size=11)
        c.text(16, (self.top + self.bottom) / 2, label, rotate=-90)
        c.line(ML, self.top, ML, self.bottom, color="#444")
        c.line(ML, self.bottom, W - MR, self.bottom, color="#444")

    def y(self, v: float) -> float:
        if self.log:
            v = max(v, self.lo)
            f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo) or 1)
        else:
            f = (v - self.lo) / ((self.hi - self.lo) or 1)
        return self.bottom - f * (self.bottom - self.top)


def bar_chart(title: str, categories: list[str], series: dict[str, list[float | None]], ylabel: str,
              log: bool = False, hline: float | None = None, hline_label: str = "") -> str:
    """Grouped bars: one group per category, one bar per series, value on top."""
    c = _Canvas(title)
    vals = [v for vs in series.values() for v in vs if v is not None]
    if not vals:
        c.text(W / 2, H / 2, "no data")
        return c.done()
    hi = max(vals + ([hline] if hline else []))
    lo = min(vals) if log else 0
    ax = _YAxis(c, lo if not log else max(lo / 2, 1e-9), hi * 1.12, ylabel, log=log)
    n_s = len(series)
    group_w = (W - ML - MR) / max(len(categories), 1)
    bar_w = min(40, group_w * 0.8 / n_s)
    for gi, cat in enumerate(categories):
        gx = ML + gi * group_w + (group_w - bar_w * n_s) / 2
        for si, (name, vs) in enumerate(series.items()):
            v = vs[gi] if gi < len(vs) else None
            if v is None:
                continue
            x = gx + si * bar_w
            y = ax.y(v)
            c.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{ax.bottom - y:.1f}" '
                  f'fill="{COLORS[si % len(COLORS)]}"><title>{escape(name)} {escape(cat)}: {v:.4g}</title></rect>')
            c.text(x + (bar_w - 2) / 2, y - 3, _fmt(v), size=9)
        c.text(ML + gi * group_w + group_w / 2, ax.bottom + 16, cat, size=11)
    if hline is not None:
        y = ax.y(hline)
        c.line(ML, y, W - MR, y, color="#000", dash="5,4")
        c.text(W - MR - 4, y - 4, hline_label, anchor="end", size=10)
    c.legend(list(series))
    return c.done()


PERCENTILES = [10, 25, 50, 75, 90, 95, 99, 99.9]
DASHES = ["none", "9,4", "3,3", "12,3,3,3", "6,6", "2,6"]


def quantile_chart(title: str, series: dict[str, dict[str, float]], ylabel: str = "latency (ms)") -> str:
    """Latency by percentile (the distribution), log y axis; series are k6 trend dicts."""
    c = _Canvas(title)
    pts = {
        name: [(p, t[f"p{p:g}"]) for p in PERCENTILES if f"p{p:g}" in t and t[f"p{p:g}"] is not None]
        for name, t in series.items()
    }
    vals = [v for ps in pts.values() for _, v in ps if v > 0]
    if not vals:
        c.text(W / 2, H / 2, "no data")
        return c.done()
    ax = _YAxis(c, min(vals) / 1.3, max(vals) * 1.3, ylabel, log=True)
    # x: percentiles on a "nines" scale, so the tail gets room.
    def xpos(p: float) -> float:
        f = -math.log10(1 - p / 100.0)
        return ML + 20 + f / 3.0 * (W - ML - MR - 40)
    last_label = -1e9
    for p in PERCENTILES:
        x = xpos(p)
        c.line(x, ax.top, x, ax.bottom, color="#eeeeee")
        if x - last_label > 28:
            c.text(x, ax.bottom + 16, f"p{p:g}", size=11)
            last_label = x
    for si, (name, ps) in enumerate(pts.items()):
        color = COLORS[si % len(COLORS)]
        path = " ".join(f"{'M' if i == 0 else 'L'}{xpos(p):.1f},{ax.y(v):.1f}" for i, (p, v) in enumerate(ps) if v > 0)
        # Dashes differ per series, so equal curves stay visible on top of each other.
        c.add(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{DASHES[si % len(DASHES)]}"/>')
        for p, v in ps:
            if v > 0:
                c.add(f'<circle cx="{xpos(p):.1f}" cy="{ax.y(v):.1f}" r="3" fill="{color}"><title>{escape(name)} p{p:g}: {v:.4g}</title></circle>')
    c.text((ML + W - MR) / 2, ax.bottom + 34, "percentile")
    c.legend(list(pts))
    return c.done()


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str,
               hlines: dict[str, float] | None = None) -> str:
    """Lines over x (e.g. resident memory over time), with optional limit lines."""
    c = _Canvas(title)
    xs = [x for ps in series.values() for x, _ in ps]
    ys = [y for ps in series.values() for _, y in ps] + list((hlines or {}).values())
    if not xs:
        c.text(W / 2, H / 2, "no data")
        return c.done()
    ax = _YAxis(c, 0, max(ys) * 1.1, ylabel)
    xhi = max(xs) or 1
    xt = _nice_ticks(0, xhi)
    xhi = xt[-1]
    def xpos(x: float) -> float:
        return ML + x / xhi * (W - ML - MR)
    for t in xt:
        c.text(xpos(t), ax.bottom + 16, _fmt(t), size=11)
    c.text((ML + W - MR) / 2, ax.bottom + 34, xlabel)
    for si, (name, ps) in enumerate(series.items()):
        color = COLORS[si % len(COLORS)]
        path = " ".join(f"{'M' if i == 0 else 'L'}{xpos(x):.1f},{ax.y(y):.1f}" for i, (x, y) in enumerate(ps))
        c.add(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.8"/>')
    for i, (label, v) in enumerate((hlines or {}).items()):
        y = ax.y(v)
        c.line(ML, y, W - MR, y, color=COLORS[i % len(COLORS)], dash="5,4")
        c.text(W - MR - 4, y - 4, label, anchor="end", size=10)
    c.legend(list(series))
    return c.done()


def ratio_chart(title: str, rows: list[tuple[str, float | None, float | None, bool]], cap: float = 3.0) -> str:
    """Horizontal bars of ratios: (label, value, target, higher_is_better).

    Green when the target is met (or there is none), red when it is not; a
    black line at 1.0 and a tick at each target. The axis stops at `cap`;
    longer bars end in a break mark with their value.
    """
    w = 1000
    h = MT + 50 + 26 * len(rows)
    c = _Canvas(title)
    c.parts[0] = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
                  'font-family="sans-serif" font-size="12">')
    c.parts[1] = f'<rect width="{w}" height="{h}" fill="white"/>'
    c.parts[2] = c.parts[2].replace(f'x="{W / 2}"', f'x="{w / 2}"')
    left = 520
    vals = [v for _, v, _, _ in rows if v is not None] + [t for _, _, t, _ in rows if t is not None] + [1.0]
    hi = min(max(vals) * 1.1, cap)
    def xpos(v: float) -> float:
        return left + min(v, hi) / hi * (w - left - MR - 60)
    bottom = MT + 26 * len(rows)
    for t in _nice_ticks(0, hi):
        if t <= hi:
            c.line(xpos(t), MT, xpos(t), bottom, color="#eeeeee")
            c.text(xpos(t), bottom + 14, f"{t:g}x", size=10)
    for i, (label, v, target, higher) in enumerate(rows):
        y = MT + 26 * i
        c.text(left - 8, y + 16, label + ("" if higher else " (lower is better)"), anchor="end", size=11)
        if v is None:
            c.text(left + 4, y + 16, "skipped", anchor="start", size=11, color="#888")
            continue
        ok = target is None or (v >= target if higher else v <= target)
        color = "#2ca02c" if ok else "#d62728"
        c.add(f'<rect x="{left}" y="{y + 4}" width="{max(xpos(v) - left, 1):.1f}" height="16" fill="{color}" opacity="0.8"/>')
        if v > hi:
            bx = xpos(hi) - 12
            c.add(f'<path d="M{bx},{y + 2} l6,20 M{bx + 5},{y + 2} l6,20" stroke="white" stroke-width="3"/>')
        c.text(xpos(v) + 4, y + 16, f"{v:.2f}x", anchor="start", size=11)
        if target is not None:
            c.line(xpos(target), y + 1, xpos(target), y + 23, color="#000", width=2)
    c.line(xpos(1.0), MT, xpos(1.0), bottom, color="#000")
    c.text(left, bottom + 30, "green: target met or no target; red: target missed; black tick: the target", anchor="start", size=10)
    return c.done()
