"""The `components` section: `wasi:http` components served by Inlay as
backends (docs/components.md) against `wasmtime serve` running the same
files (0.3 instances reused or fresh), and an ESI page whose fragments
come from a component against the same page from the loopback origin.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from context import Context, Section, Table, med, ms, num, pair_ratios, ratio_detail, xr
from procs import LOOPBACK, BenchError, Registry, free_port, http_get, is_hit, tail

# The examples of policies/components/, by the language they are written in.
LANGUAGES = [("Rust", "hello-rs"), ("JavaScript", "hello-js"), ("Python", "hello-py")]
# Connections of every run: the figure for `wasmtime serve` was at 8.
CONNECTIONS = 8
# Requests with a cookie pass (the built-in rules look up only cookieless
# GETs): every one runs the component, as `wasmtime serve` runs it.
UNCACHED = ["Cookie: session=bench"]


class WasmtimeServe:
    """`wasmtime serve -Scli` on a port of its own (the examples import more
    of WASI 0.2 than the proxy world, as most toolchains' output does)."""

    def __init__(self, reg: Registry, binary: str, wasm: Path, name: str):
        self.reg = reg
        self.name = name
        self.log = reg.workdir / f"wasmtime-{name}.log"
        port = free_port()
        self.url = f"http://{LOOPBACK}:{port}"
        self.proc = reg.spawn([binary, "serve", "-Scli", "--addr", f"{LOOPBACK}:{port}", str(wasm)], self.log)
        deadline = time.monotonic() + 300  # a cold compile of a 15 MB component
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"wasmtime serve {wasm.name} exited: {tail(self.log)}")
            try:
                status, _, _ = http_get(self.url + "/hello", timeout=30)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"wasmtime serve {wasm.name} did not answer: {tail(self.log)}")
            time.sleep(0.2)

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def stop(self) -> None:
        self.reg.stop(self.proc)


class WithOrigin:
    """An inlay whose CPU is counted with the origin's (the fragments it
    fetches cost the origin too; a component's cost the inlay itself)."""

    def __init__(self, inlay, origin_pids):
        self.url = inlay.url
        self._pids = lambda: inlay.pids() + origin_pids()

    def pids(self) -> list[int]:
        return self._pids()


def find_wasmtime() -> str | None:
    found = shutil.which("wasmtime")
    cargo = Path.home() / ".cargo" / "bin" / "wasmtime"
    return found or (str(cargo) if os.access(cargo, os.X_OK) else None)


def components(ctx: Context) -> Section:
    sec = Section("components", "wasi:http components: Inlay against `wasmtime serve`, and ESI fragments in-process (wrk)")
    sec.about = (
        f"The examples of `policies/components/` (`make components`) at `wrk -t2 -c{CONNECTIONS} "
        f"-d{ctx.mode.wrk_seconds:g}s`: `/hello` (28-34 B) and `/big?kb=16` (a 16 KiB page). *Inlay uncached* "
        "is `inlay serve --component FILE` with `Cookie: session=bench` on every request, which the "
        "built-in rules pass: every request runs the component in a fresh instance, as `wasmtime serve` "
        "(48.0.8, `wasmtime serve -Scli --addr ... FILE`, its defaults: a fresh instance per request of a "
        "0.2 component) runs it; each pair alternates the two. *Inlay cached* is the same `/hello` "
        "without the cookie: hits. *ESI*: a page of ten uncacheable fragments, all from the Rust component "
        "(`/esi?n=10`, in-process) against the test origin's `/esi/page?n=10&delay_ms=0&cacheable=0` "
        "(ten fragments over loopback sockets), both through Inlay. `vs wasmtime` is the median of the "
        "ratios within the pairs. *0.3*: the `wasi:http/service` 0.3 example's pages, uncached, from "
        "Inlay reusing instances (its defaults, as `wasmtime serve`'s: 128 requests per instance, 16 at "
        "once) against Inlay with `requests_per_instance = 1` (a fresh instance per request) and "
        "`wasmtime serve` with its 0.3 defaults, `/hello` and `/big?kb=16`."
    )
    comp_dir = ctx.policy_dir.parent / "components"
    built = [(lang, name) for lang, name in LANGUAGES if (comp_dir / f"{name}.wasm").exists()]
    if not built:
        sec.skipped = f"no component in {comp_dir}: run `make components` first."
        return sec
    wasmtime = find_wasmtime()
    if wasmtime is None:
        sec.notes.append("`wasmtime` is not installed (`cargo install wasmtime-cli --version 48.0.8 --locked`): "
                         "Inlay's figures only.")
    cases = ["hello", "16 KiB"]
    paths = {"hello": "/hello", "16 KiB": "/big?kb=16"}
    rows = []
    for lang, name in built:
        wasm = comp_dir / f"{name}.wasm"
        inlay = ctx.inlay(f"component-{name}", component=wasm)
        targets = {"inlay": inlay}
        if wasmtime is not None:
            targets["wasmtime serve"] = WasmtimeServe(ctx.reg, wasmtime, wasm, name)
        for path in paths.values():
            for t in targets.values():
                status, headers, _ = http_get(t.url + path, headers=dict(h.split(": ", 1) for h in UNCACHED))
                if status != 200 or is_hit(headers):
                    raise BenchError(f"{name}: {t.url}{path} answered {status} {headers}")
        ctx.warm(inlay.url + "/hello")

        def run(case: str, tname: str) -> dict:
            return ctx.wrk(targets[tname], paths[case], connections=CONNECTIONS, headers=UNCACHED)

        res = ctx.alternate(cases, list(targets), run)
        cached = [ctx.wrk(inlay, "/hello", connections=CONNECTIONS) for _ in range(ctx.mode.pairs)]
        sec.raw[name] = {"uncached": res, "cached": cached}
        if "wasmtime serve" in targets:
            targets["wasmtime serve"].stop()
        for case in cases:
            by = res[case]
            ratio = None
            if "wasmtime serve" in by:
                rs = pair_ratios(by["inlay"], by["wasmtime serve"], lambda r: r["rps"])
                ratio = med(rs)
                sec.ratio(f"{lang} component, {case}: Inlay uncached / wasmtime serve (req/s)", ratio,
                          target=1.0, detail=ratio_detail(rs))
            for tname, runs in by.items():
                rows.append([lang, case, "Inlay uncached" if tname == "inlay" else tname,
                             num(med([r["rps"] for r in runs])),
                             xr(ratio) if tname == "inlay" else ("1.00x" if ratio is not None else "-"),
                             ms(med([r["latency_ms"]["p50"] for r in runs])),
                             ms(med([r["latency_ms"]["p99"] for r in runs])),
                             num(med([r["cpu_us_per_req"] for r in runs]))])
        rows.append([lang, "hello", "Inlay cached", num(med([r["rps"] for r in cached])), "-",
                     ms(med([r["latency_ms"]["p50"] for r in cached])),
                     ms(med([r["latency_ms"]["p99"] for r in cached])),
                     num(med([r["cpu_us_per_req"] for r in cached]))])
    sec.tables.append(Table(f"Medians over the pairs, {CONNECTIONS} connections", [
        "component", "page", "server", "req/s", "vs wasmtime", "p50 ms", "p99 ms", "server CPU µs/req"], rows))

    # wasi:http/service 0.3: instances reused (the default, as `wasmtime
    # serve` does) against a fresh one per request.
    p3_wasm = comp_dir / "hello-p3-rs.wasm"
    if p3_wasm.exists():
        p3_reuse(ctx, sec, p3_wasm, wasmtime)

    # ESI: ten fragments in-process against ten over loopback.
    rs_wasm = comp_dir / "hello-rs.wasm"
    if rs_wasm.exists():
        esi_targets = {
            "component fragments": ctx.inlay("component-esi", component=rs_wasm),
            "origin fragments": WithOrigin(ctx.inlay("component-esi-origin"), ctx.origin.pids),
        }
        esi_paths = {"component fragments": "/esi?n=10",
                     "origin fragments": "/esi/page?n=10&delay_ms=0&cacheable=0"}
        for tname, t in esi_targets.items():
            status, _, body = http_get(t.url + esi_paths[tname])
            if status != 200 or b"<esi:" in body:
                raise BenchError(f"ESI page {t.url}{esi_paths[tname]} answered {status}: {body[:200]!r}")
        esi = ctx.alternate(["ESI, 10 fragments"], list(esi_targets),
                            lambda c, t: ctx.wrk(esi_targets[t], esi_paths[t], connections=CONNECTIONS))
        sec.raw["esi"] = esi
        by = esi["ESI, 10 fragments"]
        rs = pair_ratios(by["component fragments"], by["origin fragments"], lambda r: r["rps"])
        sec.ratio("ESI page of 10 uncached fragments: from a component / from the loopback origin (req/s)",
                  med(rs), detail=ratio_detail(rs))
        sec.tables.append(Table("ESI page of ten uncacheable fragments, through Inlay", [
            "fragments from", "req/s", "vs origin", "p50 ms", "p99 ms", "CPU µs/page (Inlay + origin)"],
            [[tname, num(med([r["rps"] for r in runs])),
              xr(med(rs)) if tname == "component fragments" else "1.00x",
              ms(med([r["latency_ms"]["p50"] for r in runs])), ms(med([r["latency_ms"]["p99"] for r in runs])),
              num(med([r["cpu_us_per_req"] for r in runs]))]
             for tname, runs in by.items()]))
    return sec


def p3_reuse(ctx: Context, sec: Section, wasm: Path, wasmtime: str | None) -> None:
    """The 0.3 example's `/hello` and 16 KiB page, uncached: Inlay reusing
    instances (128 requests each, 16 at once) against Inlay with
    `requests_per_instance = 1`, and `wasmtime serve` with its 0.3 defaults
    (the same reuse)."""
    targets = {
        "Inlay, reused": ctx.inlay("component-p3-reused", component=wasm),
        "Inlay, fresh": ctx.inlay("component-p3-fresh", component=wasm, requests_per_instance=1),
    }
    if wasmtime is not None:
        targets["wasmtime serve"] = WasmtimeServe(ctx.reg, wasmtime, wasm, "hello-p3-rs")
    paths = {"hello": "/hello", "16 KiB": "/big?kb=16"}
    for t in targets.values():
        for path in paths.values():
            status, headers, _ = http_get(t.url + path, headers=dict(h.split(": ", 1) for h in UNCACHED))
            if status != 200 or is_hit(headers):
                raise BenchError(f"hello-p3-rs: {t.url}{path} answered {status} {headers}")
    res = ctx.alternate(list(paths), list(targets),
                        lambda c, t: ctx.wrk(targets[t], paths[c], connections=CONNECTIONS, headers=UNCACHED))
    sec.raw["hello-p3-rs"] = res
    if "wasmtime serve" in targets:
        targets["wasmtime serve"].stop()
    rows = []
    for case, by in res.items():
        reuse = pair_ratios(by["Inlay, reused"], by["Inlay, fresh"], lambda r: r["rps"])
        sec.ratio(f"Rust 0.3 component, {case}: Inlay reusing instances / a fresh instance per request (req/s)",
                  med(reuse), detail=ratio_detail(reuse))
        vs = {}
        if "wasmtime serve" in by:
            rs = pair_ratios(by["Inlay, reused"], by["wasmtime serve"], lambda r: r["rps"])
            vs["Inlay, reused"] = med(rs)
            sec.ratio(f"Rust 0.3 component, {case}: Inlay reusing instances / wasmtime serve (req/s)", med(rs),
                      target=1.0, detail=ratio_detail(rs))
        rows += [[case, tname, num(med([r["rps"] for r in runs])),
                  xr(med(reuse)) if tname == "Inlay, reused" else ("1.00x" if tname == "Inlay, fresh" else "-"),
                  xr(vs[tname]) if tname in vs else ("1.00x" if tname == "wasmtime serve" else "-"),
                  ms(med([r["latency_ms"]["p50"] for r in runs])), ms(med([r["latency_ms"]["p99"] for r in runs])),
                  num(med([r["cpu_us_per_req"] for r in runs]))]
                 for tname, runs in by.items()]
    sec.tables.append(Table(f"wasi:http/service 0.3 (hello-p3-rs, uncached), {CONNECTIONS} connections", [
        "page", "server", "req/s", "vs fresh", "vs wasmtime", "p50 ms", "p99 ms", "server CPU µs/req"], rows))
