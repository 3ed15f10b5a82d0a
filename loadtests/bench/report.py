"""The report: report.md (ratios first), report.json and the SVG plots."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import svg
from context import Ratio, Section


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(_cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out


def _value(r: Ratio) -> str:
    if r.value is None:
        return "skipped"
    return f"{r.value:.2f}x" if r.unit == "x" else f"{r.value:.0f} {r.unit}" if r.value >= 10 else f"{r.value:.2f} {r.unit}"


def _target(r: Ratio) -> str:
    if r.target is None:
        return "-"
    op = ">=" if r.higher_is_better else "<="
    return f"{op} {r.target:g}{'x' if r.unit == 'x' else ' ' + r.unit}"


def _verdict(r: Ratio) -> str:
    return {None: "-", True: "met", False: "**not met**"}[r.ok]


def write(out: Path, meta: dict, sections: list[Section], commands: list[str], configs: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.svg")) + list(out.glob("report.*")):
        old.unlink()
    ratios = [r for s in sections for r in s.ratios]
    lines = [
        f"# Inlay vs Varnish 7: benchmark report ({meta['mode']} mode)",
        "",
        f"Generated {meta['date']} by `{meta['invocation']}` in {meta['elapsed_s'] / 60:.1f} min "
        f"({meta['pairs']} A/B pair(s) per measurement). Everything runs on 127.0.0.1: load generator, "
        "proxy and origin share the machine below.",
        "",
        "> **Caveat.** " + meta["caveat"],
        "",
        "## Ratios",
        "",
        "Each ratio is the median, over the A/B pairs, of the ratio within a pair (Inlay and its peer "
        "were measured back to back, so slow drift of the shared machine cancels). Targets are those of "
        "the issues; *lower is better* where the target says `<=`.",
        "",
        *_table(["measure", "value", "target", "verdict", "pairs"],
                [[r.label, _value(r), _target(r), _verdict(r), r.detail] for r in ratios]),
        "",
        "![ratios](ratios.svg)",
        "",
        "## Machine and versions",
        "",
        *_table(["", ""], [[k, v] for k, v in meta["machine"].items()] + [[k, v] for k, v in meta["versions"].items()]),
        "",
    ]
    plots = {"ratios.svg": svg.ratio_chart(
        "Headline ratios (median of A/B pairs)",
        [(r.label, r.value, r.target, r.higher_is_better) for r in ratios if r.unit == "x"])}
    for s in sections:
        lines += [f"## {s.title}", ""]
        if s.about:
            lines += [s.about, ""]
        if s.skipped:
            lines += [f"**Skipped:** {s.skipped}", ""]
            continue
        for t in s.tables:
            lines += [f"{t.caption}:", "", *_table(t.headers, t.rows), ""]
        for n in s.notes:
            lines += [f"- Note: {n}"]
        if s.notes:
            lines.append("")
        for fname, caption, text in s.plots:
            plots[fname] = text
            lines += [f"![{caption}]({fname})", ""]
        lines += [f"_Section time: {s.seconds:.0f} s._", ""]
    lines += [
        "## Commands",
        "",
        "Every distinct command the harness ran, in order, from the repository root (servers are "
        "started in their own process group and stopped at the end; `$WORKDIR` is the run's temp "
        "dir, holding the generated inlay configs and Varnish work dirs; the harness runs a copy of "
        "`target/release/` taken at its start, so one report measures one build). `report.json` also "
        "says how many times each ran.",
        "",
        "```sh",
        *dict.fromkeys(c.replace(meta["root"] + "/", "").replace(meta["workdir"] + "/bin/", "target/release/")
                       .replace(meta["workdir"], "$WORKDIR") for c in commands),
        "```",
        "",
        "<details><summary>The generated inlay configs</summary>",
        "",
        *[line for name, text in configs.items()
          for line in (f"`$WORKDIR/{name}`:", "", "```toml", text.replace(meta["workdir"], "$WORKDIR").rstrip(), "```", "")],
        "</details>",
        "",
    ]
    (out / "report.md").write_text("\n".join(lines))
    for fname, text in plots.items():
        (out / fname).write_text(text)
    doc = {
        "meta": meta,
        "ratios": [dataclasses.asdict(r) | {"ok": r.ok} for r in ratios],
        "sections": [
            {"id": s.id, "title": s.title, "about": s.about, "skipped": s.skipped, "seconds": s.seconds,
             "notes": s.notes, "tables": [dataclasses.asdict(t) for t in s.tables], "raw": _jsonable(s.raw)}
            for s in sections
        ],
        # Distinct commands in first-run order, with how often each ran.
        "commands": [{"cmd": c, "runs": n} for c, n in Counter(commands).items()],
        "inlay_configs": configs,
    }
    (out / "report.json").write_text(dump_json(doc))


def dump_json(doc: dict) -> str:
    """Compact JSON, floats to 4 significant digits: the runs' figures are not more precise."""
    return json.dumps(_jsonable(doc), separators=(",", ":")) + "\n"


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return float(f"{x:.4g}")
    return x
