#!/usr/bin/env python3
"""Inlay vs Varnish 7 on loopback: the benchmark harness behind `make bench`.

    python3 loadtests/bench/harness.py quick|full [--only hits,esi,...] [--out DIR]

Starts the test origin, then section by section the inlay and varnishd
instances it needs, runs wrk (throughput ceilings) and k6 (the scenarios of
loadtests/k6/) against them in alternation, and writes report.md,
report.json and SVG plots to loadtests/reports/latest/ (or --out). Every
process it starts is stopped on exit, error or signal. Python 3 standard
library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import report
from context import MODES, Context, Section
from loadgen import LoadGen
from procs import BenchError, Origin, Registry, ensure_world_readable_dirs
from scenarios import SECTIONS

ROOT = Path(__file__).resolve().parents[2]


def find_tool(name: str, extra: list[str]) -> str:
    found = shutil.which(name)
    if found:
        return found
    for p in extra:
        if os.access(p, os.X_OK):
            return p
    raise BenchError(f"{name} not found (run `bash loadtests/scripts/ensure-deps.sh bench`)")


def optional_tool(name: str, extra: list[str]) -> str | None:
    """A tool only some sections need: None when missing (those sections say so)."""
    try:
        return find_tool(name, extra)
    except BenchError:
        return None


def first_line(argv: list[str]) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        return ((p.stdout or "") + (p.stderr or "")).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "unknown"
    try:
        kb = int(next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")).split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "nproc": str(os.cpu_count()),
        "CPU": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def build_kind(inlay: Path, stamp: Path = ROOT / "target" / "pgo-data" / "built-from") -> str:
    """Whether `inlay` is the profile-guided build `make build` ships: the
    digest pgo-build.sh recorded in `stamp` (the instrumented binary's, then
    the one it copied to target/release/inlay)."""
    try:
        shipped = stamp.read_text().split()[1]
        digest = hashlib.sha256(inlay.read_bytes()).hexdigest()
    except (OSError, IndexError):
        return "plain release build (no profile-guided build recorded)"
    if digest == shipped:
        return "profile-guided (`make build`, loadtests/scripts/pgo-build.sh)"
    return "plain release build (`cargo build --release`, or `make build PGO=off`)"


def versions(inlay: Path, varnishd: str, k6: str, wrk: str, nginx: str | None, h2load: str | None,
             openssl: str | None) -> dict:
    rev = first_line(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "inlay": f"{first_line([str(inlay), '--version'])} (git {rev}{', working tree has uncommitted changes' if dirty else ''})",
        "inlay build": build_kind(inlay),
        "varnishd": first_line([varnishd, "-V"]),
        "k6": first_line([k6, "version"]),
        "wrk": first_line([wrk, "--version"]).split("Copyright")[0].strip(),
        "nginx": first_line([nginx, "-v"]) if nginx else "not installed",
        "h2load": first_line([h2load, "--version"]) if h2load else "not installed",
        "openssl": first_line([openssl, "version"]) if openssl else "not installed",
        "python": platform.python_version(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=sorted(MODES))
    ap.add_argument("--only", default="", help=f"comma-separated sections: {','.join(SECTIONS)}")
    ap.add_argument("--out", default=str(ROOT / "loadtests" / "reports" / "latest"))
    ap.add_argument("--keep-workdir", action="store_true", help="keep logs and configs for debugging")
    ap.add_argument("--pairs", type=int, default=0,
                    help="A/B pairs per measurement instead of the mode's (more pairs: a steadier median)")
    args = ap.parse_args()
    mode = MODES[args.mode]
    if args.pairs > 0:
        mode = dataclasses.replace(mode, pairs=args.pairs)
    only = [s for s in args.only.split(",") if s]
    for s in only:
        if s not in SECTIONS:
            ap.error(f"unknown section {s!r}; choose from {', '.join(SECTIONS)}")

    inlay_bin = ROOT / "target" / "release" / "inlay"
    origin_bin = ROOT / "target" / "release" / "inlay-origin"
    for b in (inlay_bin, origin_bin):
        if not os.access(b, os.X_OK):
            raise BenchError(f"{b} is missing: run `make build`")
    home = Path.home()
    wrk = find_tool("wrk", [])
    k6 = find_tool("k6", [str(home / "go" / "bin" / "k6")])
    varnishd = find_tool("varnishd", ["/usr/sbin/varnishd"])
    nginx = optional_tool("nginx", ["/usr/sbin/nginx"])
    h2load = optional_tool("h2load", [])
    openssl = optional_tool("openssl", [])

    workdir = Path(os.environ.get("INLAY_BENCH_WORKDIR") or tempfile.mkdtemp(prefix="inlay-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ensure_world_readable_dirs(workdir)  # varnishd's unprivileged child works in there
    reg = Registry(workdir)
    # Run a snapshot of the binaries: other builds may replace target/release/ mid-run,
    # and one report must measure one build.
    (workdir / "bin").mkdir(exist_ok=True)
    inlay_bin = Path(shutil.copy2(inlay_bin, workdir / "bin" / "inlay"))
    origin_bin = Path(shutil.copy2(origin_bin, workdir / "bin" / "inlay-origin"))

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    t_start = time.monotonic()
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    sections: list[Section] = []
    try:
        meta_machine = machine()
        meta_versions = versions(inlay_bin, varnishd, k6, wrk, nginx, h2load, openssl)
        origin = Origin(reg, origin_bin)
        ctx = Context(mode, reg, LoadGen(reg, wrk, k6, h2load, openssl), origin, inlay_bin=inlay_bin,
                      varnishd=varnishd, vcl_dir=ROOT / "loadtests" / "varnish", policy_dir=ROOT / "target" / "policies",
                      nginx=nginx)
        for sid, fn in SECTIONS.items():
            if only and sid not in only:
                continue
            elapsed = time.monotonic() - t_start
            if elapsed > mode.budget_s:
                s = Section(sid, sid, skipped=f"time budget of the {mode.name} mode ({mode.budget_s} s) used up")
                sections.append(s)
                print(f"[bench] {sid}: skipped (budget)", file=sys.stderr)
                continue
            print(f"[bench] {elapsed:6.1f}s  {sid} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                s = fn(ctx)
            except BenchError as e:
                s = Section(sid, sid, skipped=f"failed: {e}")
                traceback.print_exc()
            finally:
                ctx.release()
            s.seconds = time.monotonic() - t0
            for r in s.ratios:
                print(f"[bench]          {r.label}: {r.value if r.value is None else round(r.value, 3)}", file=sys.stderr)
            if s.skipped:
                print(f"[bench]          skipped: {s.skipped}", file=sys.stderr)
            sections.append(s)
    except KeyboardInterrupt:
        print("[bench] interrupted: stopping servers, no report written", file=sys.stderr)
        return 130
    finally:
        reg.stop_all()
        if args.keep_workdir:
            print(f"[bench] logs and configs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    elapsed = time.monotonic() - t_start
    meta_machine["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    meta = {
        "mode": mode.name,
        "date": date,
        "root": str(ROOT),
        "workdir": str(workdir),
        "invocation": f"make bench{'-quick' if mode.name == 'quick' else ''}"
                      f" (bash loadtests/bench/run.sh {mode.name})" + (f" --only {args.only}" if only else "")
                      + (f" --pairs {args.pairs}" if args.pairs > 0 else ""),
        "elapsed_s": elapsed,
        "pairs": mode.pairs,
        "mode_settings": mode.__dict__,
        "machine": meta_machine,
        "versions": meta_versions,
        "caveat": (
            "this machine is shared with other builds and tests (see the load averages below), and the "
            "load generator, proxy and origin share its cores. Absolute numbers move between runs; the "
            "ratios, taken within A/B pairs run back to back, are the figures to quote. wrk and k6 also "
            "compete with the proxy for CPU, which caps the ceilings."
        ),
    }
    out = Path(args.out)
    report.write(out, meta, sections, reg.commands, reg.configs)
    print(f"[bench] done in {elapsed:.0f}s: {out / 'report.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as e:
        print(f"[bench] error: {e}", file=sys.stderr)
        sys.exit(1)
