"""The measurements of the harness, one function per report section.

wrk gives the raw throughput ceilings (hits, tiers, pass-through, policy,
cached ESI); k6 runs the four scenarios of loadtests/k6/ (ESI, TTFB, VOD,
dynamic origin). Every function starts the servers it needs, alternates the
targets (A B A B), and returns a Section.
"""

from __future__ import annotations

import gzip
import math
import os
import shutil
import time
from pathlib import Path

import svg
from context import (
    Context, Section, Table, gbps, med, ms, num, pair_ratios, ratio_detail, trend_median, xr, zipf_draws,
    zipf_head_share,
)
from procs import (
    NGINX_BROTLI_MODULE, BenchError, RssSampler, http_get, https_raw_get, is_hit, make_certificates,
)
from components import components

MiB = 1 << 20


# -- wrk ceilings -------------------------------------------------------------

def wrk_hits(ctx: Context) -> Section:
    sec = Section("hits", "Cache-hit throughput ceilings (wrk)")
    sec.about = (
        f"`wrk -t2 -c64 -d{ctx.mode.wrk_seconds:g}s` on one cached object (`/static/N`, "
        "`Cache-Control: public, max-age=3600`), warmed before the runs; Inlay "
        "(memory tier 256 MiB) vs Varnish (`hits.vcl`, `-s malloc,256m`). The origin "
        "counts requests during each run (should be 0). CPU is the proxy's user+system "
        "time over the run divided by the requests. Then the access log: two more Inlays alike "
        "but for `log.access_log`, `\"off\"` (as every other section runs it) or a file (combined "
        "format), on the 177 B object, alternated A B A B. *lines / requests* "
        "is the log file's lines over the requests wrk completed (plus the two warming ones): "
        "at least 1 when no line was dropped (the runs' last requests, cut by wrk, are logged too)."
    )
    inlay = ctx.inlay("hits")
    varnish = ctx.varnish("hits.vcl")
    targets = {"inlay": inlay, "varnish": varnish}
    cases = {"177 B": "/static/177", "16 KiB": "/static/16384", "1 MiB": "/static/1048576"}
    for path in cases.values():
        for t in targets.values():
            ctx.warm(t.url + path)
    res = ctx.alternate(list(cases), list(targets), lambda c, t: ctx.wrk(targets[t], cases[c]))
    sec.raw = res
    rows = []
    for case, by in res.items():
        key = "bytes_per_s" if case == "1 MiB" else "rps"
        rs = pair_ratios(by["inlay"], by["varnish"], lambda r: r[key])
        what = "bytes/s" if key == "bytes_per_s" else "req/s"
        target = 0.8 if case == "1 MiB" else 1.0
        sec.ratio(f"Cache hits {case}: Inlay / Varnish {what}", med(rs), target, detail=ratio_detail(rs))
        rows.append([
            case,
            num(med([r["rps"] for r in by["inlay"]])), num(med([r["rps"] for r in by["varnish"]])),
            gbps(med([r["bytes_per_s"] for r in by["inlay"]])), gbps(med([r["bytes_per_s"] for r in by["varnish"]])),
            xr(med(rs)),
            num(med([r["cpu_us_per_req"] for r in by["inlay"]])), num(med([r["cpu_us_per_req"] for r in by["varnish"]])),
            ms(med([r["latency_ms"]["p99"] for r in by["inlay"]])), ms(med([r["latency_ms"]["p99"] for r in by["varnish"]])),
            str(sum(r["origin_requests"] for r in by["inlay"] + by["varnish"])),
        ])
    sec.tables.append(Table("Medians over the pairs", [
        "object", "Inlay req/s", "Varnish req/s", "Inlay bytes/s", "Varnish bytes/s", "Inlay/Varnish",
        "Inlay CPU µs/req", "Varnish CPU µs/req", "Inlay p99 ms", "Varnish p99 ms", "origin requests",
    ], rows))
    sec.plots.append(("hits.svg", "Cache-hit requests/s", svg.bar_chart(
        "Cache hits: requests/s (wrk, median of pairs)", list(res),
        {"Inlay": [med([r["rps"] for r in res[c]["inlay"]]) for c in res],
         "Varnish": [med([r["rps"] for r in res[c]["varnish"]]) for c in res]},
        "requests/s", log=True)))
    access_log_on_off(ctx, sec, cases["177 B"])
    return sec


def access_log_on_off(ctx: Context, sec: Section, path: str) -> None:
    """Add to `sec` the cost of the access log on hits of `path`: two fresh Inlays alike
    but for `log.access_log` (a file vs "off"), alternated."""
    log_file = ctx.workdir / "hits-access.log"
    targets = {"access log off": ctx.inlay("hits-log-off"),
               "access log on": ctx.inlay("hits-log-on", access_log=log_file)}
    for t in targets.values():
        ctx.warm(t.url + path)
    by = ctx.alternate(["177 B"], list(targets), lambda c, t: ctx.wrk(targets[t], path))["177 B"]
    sec.raw["177 B, access log on / off"] = by
    rs = pair_ratios(by["access log on"], by["access log off"], lambda r: r["rps"])
    sec.ratio("Cache hits 177 B: access log on / off (req/s)", med(rs), 0.97, detail=ratio_detail(rs))
    # The writer takes the lines every 100 ms: let the last round pass before counting.
    time.sleep(0.5)
    with log_file.open("rb") as f:
        lines = sum(1 for _ in f)
    requests = sum(r["requests"] for r in by["access log on"]) + 2
    sec.tables.append(Table("Access log on vs off, 177 B: medians over the pairs", [
        "target", "req/s", "p50 ms", "p99 ms", "CPU µs/req", "lines / requests", "origin requests"],
        [[name, num(med([r["rps"] for r in runs])),
          ms(med([r["latency_ms"]["p50"] for r in runs])), ms(med([r["latency_ms"]["p99"] for r in runs])),
          num(med([r["cpu_us_per_req"] for r in runs])),
          f"{lines / requests:.3f}" if name == "access log on" else "-",
          str(sum(r["origin_requests"] for r in runs))]
         for name, runs in by.items()]))


def wrk_metrics(ctx: Context) -> Section:
    sec = Section("metrics", "The cost of counting: metrics on vs off (wrk, Inlay)")
    path = "/static/177"
    sec.about = (
        f"`wrk -t2 -c64 -d{ctx.mode.wrk_seconds:g}s` on one cached 177 B object (`{path}`), "
        "warmed before the runs, on two Inlay instances alike but for `[metrics] enabled` "
        "(true, the default, vs false), alternated A B A B. Every hit counts its request, "
        "cache status, protocol and response bytes."
    )
    targets = {"metrics on": ctx.inlay("metrics-on"), "metrics off": ctx.inlay("metrics-off", metrics=False)}
    for t in targets.values():
        ctx.warm(t.url + path)
    res = ctx.alternate(["177 B"], list(targets), lambda c, t: ctx.wrk(targets[t], path))
    sec.raw = res
    by = res["177 B"]
    rs = pair_ratios(by["metrics on"], by["metrics off"], lambda r: r["rps"])
    sec.ratio("Cache hits 177 B: metrics on / metrics off (req/s)", med(rs), 0.97, detail=ratio_detail(rs))
    sec.tables.append(Table("Medians over the pairs", [
        "target", "req/s", "p50 ms", "p99 ms", "CPU µs/req", "origin requests"],
        [[name, num(med([r["rps"] for r in runs])),
          ms(med([r["latency_ms"]["p50"] for r in runs])), ms(med([r["latency_ms"]["p99"] for r in runs])),
          num(med([r["cpu_us_per_req"] for r in runs])), str(sum(r["origin_requests"] for r in runs))]
         for name, runs in by.items()]))
    return sec


def wrk_tiers(ctx: Context) -> Section:
    n = 2000
    sec = Section("tiers", "Disk-tier hits vs memory-tier hits (wrk, Inlay)")
    sec.about = (
        f"{n} objects of 16 KiB (`/static/16384?id=N`, {n * 16 // 1024} MiB), all cached, requested at "
        "random by wrk (`wrk/report.lua` with `WRK_PATHS_COUNT`). Both instances use `--cache-dir`; "
        "the memory-tier one has `memory_size = 256MiB` (everything in memory), the disk-tier one "
        "`memory_size = 1MiB` (the minimum: almost every hit is read from sled)."
    )
    mem = ctx.inlay("tier-mem", cache_dir=ctx.workdir / "tier-mem", memory_size="256MiB")
    disk = ctx.inlay("tier-disk", cache_dir=ctx.workdir / "tier-disk", memory_size="1MiB")
    targets = {"memory tier": mem, "disk tier": disk}
    paths = [f"/static/16384?id={i}" for i in range(n)]
    for t in targets.values():
        ctx.fill(t.url, paths)
        ctx.warm(t.url + paths[0])
    env = {"WRK_PATHS_COUNT": str(n), "WRK_PATHS_PREFIX": "/static/16384?id="}
    res = ctx.alternate(["16 KiB random"], list(targets), lambda c, t: ctx.wrk(targets[t], "/static/16384", env=env))
    sec.raw = res
    by = res["16 KiB random"]
    rs = pair_ratios(by["disk tier"], by["memory tier"], lambda r: r["rps"])
    sec.ratio("Disk-tier hits / memory-tier hits (req/s)", med(rs), 0.5, detail=ratio_detail(rs))
    sec.tables.append(Table("Medians over the pairs", [
        "tier", "req/s", "bytes/s", "p50 ms", "p99 ms", "CPU µs/req", "origin requests"],
        [[name, num(med([r["rps"] for r in runs])), gbps(med([r["bytes_per_s"] for r in runs])),
          ms(med([r["latency_ms"]["p50"] for r in runs])), ms(med([r["latency_ms"]["p99"] for r in runs])),
          num(med([r["cpu_us_per_req"] for r in runs])), str(sum(r["origin_requests"] for r in runs))]
         for name, runs in by.items()]))
    return sec


# -- compression ---------------------------------------------------------------

COMPRESS_PAGE = "/html/65536"


def warm_coded(url: str, ae: str, timeout: float = 30) -> tuple[dict, bytes]:
    """GET with `Accept-Encoding: ae` until the answer is a hit in the client's first coding
    (Inlay: from the store, with its length; a request in the moment between a miss and the
    store joins the fill and is compressed as it streams): its headers and body."""
    want = ae.split(",")[0].strip()
    deadline = time.monotonic() + timeout
    while True:
        status, headers, body = http_get(url, timeout=30, headers={"Accept-Encoding": ae})
        stored = "cache-status" not in headers or "content-length" in headers
        if status == 200 and is_hit(headers) and headers.get("content-encoding") == want and stored:
            return headers, body
        if time.monotonic() > deadline:
            raise BenchError(f"{url} with Accept-Encoding {ae}: no {want} hit within {timeout:g}s ({status}, {headers})")
        time.sleep(0.05)


def wrk_compression(ctx: Context) -> Section:
    sec = Section("compression", "Compressed hits: Inlay (stored once) vs nginx (gzip and brotli on every hit)")
    sec.about = (
        f"`wrk -t2 -c64 -d{ctx.mode.wrk_seconds:g}s -H 'Accept-Encoding: ...' {COMPRESS_PAGE}`: 64 KiB of HTML "
        "that compresses as real pages do (the origin's `/html/N`, gzip about 5:1), which the origin sends "
        "uncompressed and cacheable for an hour. Inlay runs its defaults: the object is stored once with br "
        "(level 9) and gzip (level 6) beside identity, so a hit sends stored bytes. nginx (Debian's) has "
        "`proxy_cache` on, `gzip on` and the brotli filter (Debian's `libnginx-mod-http-brotli-filter`, "
        "`brotli on`) at their default levels (gzip 1, br 6), for the same types: it compresses the cached "
        "response again on every hit. Both are warmed until a hit in the asked coding; `worker_processes 2` "
        "as Inlay's two worker threads; access log off in both; plain HTTP/1.1. *bytes/response* is what wrk "
        "read over the requests (head and body); the body sizes are one response's. CPU is the server's "
        "user+system time over the run divided by its requests (nginx: master and workers). The origin counts "
        "requests during each run (0: every request was a hit)."
    )
    if ctx.nginx_bin is None or not NGINX_BROTLI_MODULE.exists():
        sec.skipped = ("nginx or its brotli filter is not installed "
                       "(`bash loadtests/scripts/ensure-deps.sh bench`).")
        return sec
    targets = {"inlay": ctx.inlay("compression"), "nginx": ctx.nginx(None, name="compression", compress=True)}
    cases = {"br, gzip": "br, gzip", "gzip": "gzip"}
    _, _, page = http_get(ctx.origin.url + COMPRESS_PAGE, timeout=30)
    bodies: dict = {}
    for tname, t in targets.items():
        for case, ae in cases.items():
            headers, body = warm_coded(t.url + COMPRESS_PAGE, ae)
            bodies[(case, tname)] = len(body)
            if ae == "gzip":
                if gzip.decompress(body) != page:
                    raise BenchError(f"{tname}: the gzip hit does not decode to the origin's page")
    res = ctx.alternate(list(cases), list(targets), lambda c, t: ctx.wrk(
        targets[t], COMPRESS_PAGE, headers=[f"Accept-Encoding: {cases[c]}"]))
    sec.raw = res
    rows = []
    for case, by in res.items():
        rs = pair_ratios(by["inlay"], by["nginx"], lambda r: r["rps"])
        sec.ratio(f"Compressed hits 64 KiB HTML, Accept-Encoding: {case}: Inlay / nginx req/s", med(rs), 3.0,
                  detail=ratio_detail(rs))
        cpu = pair_ratios(by["nginx"], by["inlay"], lambda r: r["cpu_us_per_req"])
        sec.ratio(f"Compressed hits, {case}: nginx / Inlay CPU per request", med(cpu), 3.0, detail=ratio_detail(cpu))
        wire = {t: med([r["bytes_per_s"] / r["rps"] for r in by[t] if r["rps"]]) for t in targets}
        rows.append([
            case,
            num(med([r["rps"] for r in by["inlay"]])), num(med([r["rps"] for r in by["nginx"]])), xr(med(rs)),
            num(med([r["cpu_us_per_req"] for r in by["inlay"]])), num(med([r["cpu_us_per_req"] for r in by["nginx"]])),
            num(wire["inlay"]), num(wire["nginx"]),
            num(bodies[(case, "inlay")]), num(bodies[(case, "nginx")]),
            ms(med([r["latency_ms"]["p99"] for r in by["inlay"]])), ms(med([r["latency_ms"]["p99"] for r in by["nginx"]])),
            str(sum(r["origin_requests"] for r in by["inlay"] + by["nginx"])),
        ])
    sec.tables.append(Table("Medians over the pairs", [
        "Accept-Encoding", "Inlay req/s", "nginx req/s", "Inlay/nginx", "Inlay CPU µs/req", "nginx CPU µs/req",
        "Inlay bytes/response", "nginx bytes/response", "Inlay body B", "nginx body B",
        "Inlay p99 ms", "nginx p99 ms", "origin requests",
    ], rows))
    return sec


def wrk_pass(ctx: Context) -> Section:
    sec = Section("pass", "Pass-through proxying vs the origin directly (wrk)")
    path = "/static/177?cc=no-store"
    sec.about = (
        f"`{path}`: the origin answers `Cache-Control: no-store`, so Inlay fetches every request "
        "from the origin (hit-for-miss); Varnish runs `pass.vcl` (`return (pass)` for everything). "
        "`origin` is wrk straight at the origin. The proxy and the origin share the two cores "
        "with wrk, so the ratio is the cost of the extra hop on this machine."
    )
    inlay = ctx.inlay("pass")
    varnish = ctx.varnish("pass.vcl")
    targets = {"origin": ctx.origin, "inlay": inlay, "varnish": varnish}
    for t in (inlay, varnish):
        status, headers, _ = http_get(t.url + path)
        if status != 200 or is_hit(headers):
            raise BenchError(f"pass-through check failed on {t.url}: {status} {headers}")
    res = ctx.alternate(["177 B"], list(targets), lambda c, t: ctx.wrk(targets[t], path))
    sec.raw = res
    by = res["177 B"]
    ri = pair_ratios(by["inlay"], by["origin"], lambda r: r["rps"])
    rv = pair_ratios(by["varnish"], by["origin"], lambda r: r["rps"])
    riv = pair_ratios(by["inlay"], by["varnish"], lambda r: r["rps"])
    sec.ratio("Pass-through: Inlay / origin direct (req/s)", med(ri), detail=ratio_detail(ri))
    sec.ratio("Pass-through: Inlay / Varnish (req/s)", med(riv), detail=ratio_detail(riv))
    sec.tables.append(Table("Medians over the pairs", [
        "target", "req/s", "vs origin", "p50 ms", "p99 ms", "proxy CPU µs/req", "origin requests / requests"],
        [[name, num(med([r["rps"] for r in runs])),
          {"origin": "1.00x", "inlay": xr(med(ri)), "varnish": xr(med(rv))}[name],
          ms(med([r["latency_ms"]["p50"] for r in runs])), ms(med([r["latency_ms"]["p99"] for r in runs])),
          "-" if name == "origin" else num(med([r["cpu_us_per_req"] for r in runs])),
          f"{sum(r['origin_requests'] for r in runs) / max(sum(r['requests'] for r in runs), 1):.2f}"]
         for name, runs in by.items()]))
    return sec


def swap_link(link: Path, target: Path) -> None:
    """Point the symlink `link` at `target` in one step (rename over it)."""
    tmp = link.with_name(link.name + ".new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    os.replace(tmp, link)


# The many-URL mix of the policy section: YCSB's Zipf exponent over cached 177 B objects.
ZIPF_S = 0.99
ZIPF_PREFIX = "/static/177?id="


def wrk_policy(ctx: Context) -> Section:
    m = ctx.mode
    n = m.policy_urls
    one_url, zipf = "one URL", f"Zipf over {n:,} URLs"
    sec = Section("policy", "`headers` policy vs no policy, on one cached URL and on a Zipf mix of many (wrk)")
    sec.about = (
        f"`wrk -t2 -c64 -d{m.wrk_seconds:g}s` on cached 177 B objects: Inlay without a policy vs Inlay with "
        "`target/policies/headers.wasm` (build it with `make policies`) and its C, Go, JavaScript and Python "
        "ports (`headers-c|-go|-js|-py.wasm`) where built. The policy runs on every request (on-request and "
        "on-deliver, which it implements; on-backend-response it leaves to the built-in rules, which the host "
        "runs itself) and adds `x-inlay-policy: headers`. Each port runs in three configurations: the default "
        "(a worker thread's requests reuse one instance, `[policy] requests_per_instance = 1000`; a request "
        "the policy has seen before is replayed from its recorded path, see docs/policies.md), *fresh* "
        "(`requests_per_instance = 1`: a fresh instance of the pre-warmed snapshot for every request that "
        "runs the policy; each worker thread keeps one made ahead, `pre_instantiate`, but under wrk's "
        "constant load that only moves the instantiation's CPU, it does not save it) and *replay off* "
        "(`memo_size = 0`, instances reused: every request runs the policy). *ran guest code* is the share "
        "of requests that ran at least one hook in an instance (not replayed, not left to the built-in "
        "rules), *instances* the instances made per 1,000 requests (both from the `policy instances used` "
        "log line of each run). Two request mixes, alternated within each A/B pair: *{one_url}*, `/static/177` over "
        f"and over (replay answers nearly every request), and *{zipf}*, `{ZIPF_PREFIX}K` with K drawn "
        f"from a Zipf distribution (s = {ZIPF_S:g}, as YCSB; `wrk/report.lua` with `WRK_PATHS_ZIPF`): "
        f"the top 1% of the URLs get {zipf_head_share(n, ZIPF_S, n // 100):.0%} of the requests, the top "
        f"10% {zipf_head_share(n, ZIPF_S, n // 10):.0%}. `headers` reads the URL (it strips tracking "
        "parameters), so every URL records a path of its own, and the replay trees "
        "(`[policy] memo_size`, 16 MiB) and the cache both see real variety: the figure users see. "
        f"Before the runs each Inlay gets all {n:,} objects (`wrk/sweep.lua`: each URL once; memory tier "
        "256 MiB, about 1 KiB charged per object), served by the built-in policy (`default.wasm`, swapped "
        "in through a symlink and `kill -HUP`; it caches the same objects), then the measured policy is "
        "reloaded. After every run a reload logs how the run's requests got their instances and how its "
        "hooks were answered (*hooks replayed*; *tree turns*: how often a replay tree filled up and the "
        "paths nobody walked since the last turn were dropped); the next run starts with no instances and "
        "on empty trees. The origin counts requests during the Zipf runs (should be 0). `vs no policy` is "
        "the median of the ratios within the pairs."
    )
    wasm = ctx.policy_dir / "headers.wasm"
    if not wasm.exists():
        sec.skipped = f"{wasm} is missing: run `make policies` first."
        return sec
    # Each policy inlay loads its policy through a link of its own, so that the fill below
    # can swap in a cheaper one (`kill -HUP` reloads the file the link names).
    links: dict[str, tuple[Path, Path]] = {}

    def linked(inst: str, wasm: Path) -> Path:
        link = ctx.workdir / inst / wasm.name
        link.parent.mkdir()
        link.symlink_to(wasm)
        links[inst] = (link, wasm)
        return link

    targets = {"no policy": ctx.inlay("policy-none")}
    ports = [("headers policy", "headers"), ("headers in C", "headers-c"), ("headers in Go", "headers-go"),
             ("headers in JavaScript", "headers-js"), ("headers in Python", "headers-py")]
    # What each port must keep of no policy's throughput, in the default configuration.
    goals = {"headers policy": 0.85, "headers in C": 0.85, "headers in Go": 0.7,
             "headers in JavaScript": 0.6, "headers in Python": 0.5}
    # To measure a subset while working on one language or one configuration:
    # `INLAY_BENCH_POLICY_PORTS=headers,headers-c` and
    # `INLAY_BENCH_POLICY_CONFIGS=default,fresh,replay-off,replay-always` (all but the last by
    # default; *replay always*: `replay_always = true`, every request walks the replay trees);
    # `INLAY_BENCH_POLICY_ZIPF_REPLAY_OFF=1` runs the replay-off targets on the Zipf mix in
    # quick mode too; `INLAY_BENCH_POLICY_MEMO_SIZES=64MiB,...` adds, for each port, the default
    # configuration with another `memo_size`.
    only_ports = [p for p in os.environ.get("INLAY_BENCH_POLICY_PORTS", "").split(",") if p]
    configs = [c for c in os.environ.get("INLAY_BENCH_POLICY_CONFIGS", "").split(",") if c] or [
        "default", "fresh", "replay-off"]
    zipf_replay_off = m.policy_zipf_replay_off or os.environ.get("INLAY_BENCH_POLICY_ZIPF_REPLAY_OFF") == "1"
    if only_ports:
        ports = [(label, name) for label, name in ports if name in only_ports]
    for label, name in ports:
        path = ctx.policy_dir / f"{name}.wasm"
        if not path.exists():
            continue
        try:
            pol = ctx.inlay(f"policy-{name}", policy=linked(f"policy-{name}", path))
        except BenchError as e:
            if name == "headers":
                sec.skipped = f"`inlay serve --policy {path.name}` did not start: {e}"
                return sec
            continue
        _, headers, _ = http_get(pol.url + "/static/177")
        if headers.get("x-inlay-policy") != "headers":
            sec.skipped = f"`--policy {path.name}`: responses carry no `x-inlay-policy: headers`."
            return sec
        targets[label] = pol
    labels = [label for label, _ in ports if label in targets]
    if "default" not in configs:
        for label in labels:
            del targets[label]
    # Every port again with a fresh instance per request, and with replay off (every request
    # runs the policy, in reused instances): what a request the policy has not seen costs in
    # each language, end to end.
    for label, name in ports:
        if label in labels and "fresh" in configs:
            targets[f"{label}, fresh"] = ctx.inlay(
                f"policy-{name}-fresh", policy=linked(f"policy-{name}-fresh", ctx.policy_dir / f"{name}.wasm"),
                requests_per_instance=1)
    for size in [s for s in os.environ.get("INLAY_BENCH_POLICY_MEMO_SIZES", "").split(",") if s]:
        for label, name in ports:
            if label in labels:
                targets[f"{label}, memo_size {size}"] = ctx.inlay(
                    f"policy-{name}-memo{size}",
                    policy=linked(f"policy-{name}-memo{size}", ctx.policy_dir / f"{name}.wasm"), memo_size=size)
    for label, name in ports:
        if label in labels and "replay-always" in configs:
            targets[f"{label}, replay always"] = ctx.inlay(
                f"policy-{name}-always", policy=linked(f"policy-{name}-always", ctx.policy_dir / f"{name}.wasm"),
                replay_always=True)
    for label, name in ports:
        if label in labels and "replay-off" in configs:
            targets[f"{label}, replay off"] = ctx.inlay(
                f"policy-{name}-live", policy=linked(f"policy-{name}-live", ctx.policy_dir / f"{name}.wasm"),
                memo_size="0")
    zipf_targets = [t for t in targets if zipf_replay_off or not t.endswith(", replay off")]
    # The fill requests every URL once: each is new to the policy, which then runs live
    # (the Python port at about 2k requests/s here). The built-in policy (`default.wasm`)
    # caches the same objects (neither adds to the cache key nor changes the response
    # before it is stored), so it serves the fill; the measured policy is swapped back in.
    fill_policy = ctx.policy_dir / "default.wasm"
    sweeps = {}
    for tname, t in targets.items():
        if tname not in zipf_targets:
            continue
        swap = links.get(t.name) if fill_policy.exists() else None
        if swap is not None:
            ctx.reg.note_command(["ln", "-sfn", str(fill_policy), str(swap[0])])
            swap_link(swap[0], fill_policy)
            t.reload_policy()
        sweeps[tname] = ctx.sweep(t, ZIPF_PREFIX, n)
        if swap is not None:
            ctx.reg.note_command(["ln", "-sfn", str(swap[1]), str(swap[0])])
            swap_link(*swap)
            t.reload_policy()
    for tname, t in targets.items():
        ctx.warm(t.url + "/static/177")
        if tname != "no policy":
            _, headers, _ = http_get(t.url + "/static/177")
            if headers.get("x-inlay-policy") != "headers":
                raise BenchError(f"{tname}: the headers policy is not serving after the fill ({headers})")
    zipf_env = {"WRK_PATHS_COUNT": str(n), "WRK_PATHS_PREFIX": ZIPF_PREFIX, "WRK_PATHS_ZIPF": f"{ZIPF_S:g}"}

    def run(case: str, tname: str) -> dict | None:
        t = targets[tname]
        if case == one_url:
            r = ctx.wrk(t, "/static/177")
        elif tname in zipf_targets:
            r = ctx.wrk(t, "/static/177", env=zipf_env)
        else:
            return None
        if tname != "no policy":
            # A reload says how the run's requests got their instances and how its hooks were
            # answered; the next run starts with no instances and on empty replay trees.
            counts = t.reload_policy()
            r["instances"], r["replay"] = counts["instances"], counts["replay"]
        return r

    res = ctx.alternate([one_url, zipf], list(targets), run)
    sec.raw = {**res, "fill": sweeps}
    rps = lambda r: r["rps"]  # noqa: E731
    mix = {one_url: "one cached URL", zipf: f"Zipf over {n:,} cached URLs"}
    for label, _ in ports:
        for target, how, goal in ((label, "", goals[label]), (f"{label}, fresh", ", fresh", None)):
            if target not in targets:
                continue
            for case, what in mix.items():
                if res[case][target][0] is not None:
                    rs = pair_ratios(res[case][target], res[case]["no policy"], rps)
                    sec.ratio(f"`{label}`{how} / no policy (req/s, {what})", med(rs), goal,
                              detail=ratio_detail(rs))

    def cell(case: str, tname: str, f) -> str:
        runs = [r for r in res[case][tname] if r is not None]
        return "-" if not runs else f(runs)

    def vs_none(case: str, tname: str) -> str:
        if res[case][tname][0] is None:
            return "-"
        return xr(med(pair_ratios(res[case][tname], res[case]["no policy"], rps)))

    def both(tname: str, f) -> str:
        return f"{cell(one_url, tname, f)} / {cell(zipf, tname, f)}"

    def replayed(runs: list[dict]) -> str:
        counts = [r["replay"] for r in runs if r.get("replay")]
        hooks = sum(c["replayed"] + c["live"] for c in counts)
        return f"{sum(c['replayed'] for c in counts) / hooks:.0%}" if hooks else "-"

    def ran_guest(runs: list[dict]) -> str:
        counts = [r["instances"] for r in runs if r.get("instances")]
        requests = sum(c["requests"] for c in counts)
        return f"{sum(c['ran_guest'] for c in counts) / requests:.0%}" if requests else "-"

    def instances(runs: list[dict]) -> str:
        counts = [r["instances"] for r in runs if r.get("instances")]
        requests = sum(c["requests"] for c in counts)
        return f"{1000 * sum(c['instantiated'] for c in counts) / requests:.3g}" if requests else "-"

    def resets(runs: list[dict]) -> str:
        return "-" if not runs[0].get("replay") else num(med([r["replay"]["resets"] for r in runs]))

    rows = []
    for tname in targets:
        zipf_vs_one = "-" if res[zipf][tname][0] is None else xr(
            med(pair_ratios(res[zipf][tname], res[one_url][tname], rps)))
        rows.append([
            tname,
            cell(one_url, tname, lambda runs: num(med([r["rps"] for r in runs]))), vs_none(one_url, tname),
            cell(zipf, tname, lambda runs: num(med([r["rps"] for r in runs]))), vs_none(zipf, tname),
            zipf_vs_one,
            both(tname, lambda runs: num(med([r["cpu_us_per_req"] for r in runs]))),
            both(tname, lambda runs: ms(med([r["latency_ms"]["p99"] for r in runs]))),
            both(tname, replayed),
            both(tname, ran_guest),
            both(tname, instances),
            cell(zipf, tname, resets),
            cell(zipf, tname, lambda runs: str(sum(r["origin_requests"] for r in runs))),
        ])
    sec.tables.append(Table("Medians over the pairs", [
        "inlay", f"{one_url} req/s", "vs no policy", f"{zipf} req/s", "vs no policy", "Zipf / one URL",
        "CPU µs/req, one URL / Zipf", "p99 ms, one URL / Zipf", "hooks replayed, one URL / Zipf",
        "ran guest code, one URL / Zipf", "instances per 1,000 requests, one URL / Zipf",
        "tree turns per Zipf run", "origin requests, Zipf runs"], rows))
    for tname, t in targets.items():
        # A hook over its CPU time fails its request (5xx; wrk counts them, over 1% fails
        # the run), and may switch replay off for the rest of that run's generation.
        slow = t.log_count("exceeded its CPU time")
        unreplayed = t.log_count("did not repeat itself")
        if slow or unreplayed:
            sec.notes.append(f"{tname}: {slow} hook(s) over the policy CPU time limit; replay switched off "
                             f"{unreplayed} time(s) after a hook did not repeat its recorded calls (see its log).")
    if len(zipf_targets) < len(targets):
        sec.notes.append(f"{m.name} mode: the replay-off targets run on {one_url} only.")
    filler = "`default.wasm`" if fill_policy.exists() else "the measured policy itself (`default.wasm` is missing)"
    sec.notes.append(f"Filling the cache with the Zipf runs' URLs (wrk, each URL once, with {filler}): " + "; ".join(
        f"{name} {f['seconds']:.1f} s" for name, f in sweeps.items()) + ".")
    sec.plots.append(("policy.svg", "requests/s, one URL and Zipf", svg.bar_chart(
        f"headers policy: requests/s, one URL vs Zipf over {n:,} URLs (median of pairs)", list(targets),
        {case: [med([r["rps"] for r in res[case][t] if r is not None]) for t in targets] for case in (one_url, zipf)},
        "requests/s")))
    return sec


def wrk_esi_cached(ctx: Context) -> Section:
    sec = Section("esi-cached", "ESI page from 10 cached fragments (wrk)")
    path = "/esi/page?n=10"
    sec.about = (
        f"`{path}`: the template and its 10 fragments are cacheable (`max-age=60`), so every "
        "request is assembled from the cache: the cost of ESI processing itself. Inlay (default "
        "ESI settings) vs Varnish (`esi.vcl`)."
    )
    inlay = ctx.inlay("esi-cached")
    varnish = ctx.varnish("esi.vcl")
    targets = {"inlay": inlay, "varnish": varnish}
    for t in targets.values():
        ctx.warm(t.url + path, expect_hit=False)
        _, _, body = http_get(t.url + path)
        if body.count(b'class="fragment"') != 10 or b"<esi:" in body:
            raise BenchError(f"ESI not assembled by {t.url}: {body[:300]!r}")
    res = ctx.alternate(["10 fragments"], list(targets), lambda c, t: ctx.wrk(targets[t], path))
    sec.raw = res
    by = res["10 fragments"]
    rs = pair_ratios(by["inlay"], by["varnish"], lambda r: r["rps"])
    sec.ratio("ESI page from 10 cached fragments: Inlay / Varnish pages/s", med(rs), 1.0, detail=ratio_detail(rs))
    sec.tables.append(Table("Medians over the pairs", ["target", "pages/s", "p50 ms", "p99 ms", "CPU µs/page", "origin requests"],
        [[name, num(med([r["rps"] for r in runs])), ms(med([r["latency_ms"]["p50"] for r in runs])),
          ms(med([r["latency_ms"]["p99"] for r in runs])), num(med([r["cpu_us_per_req"] for r in runs])),
          str(sum(r["origin_requests"] for r in runs))]
         for name, runs in by.items()]))
    return sec


# -- k6 scenarios -------------------------------------------------------------

def fragment_delays(n: int, lo: int = 50, hi: int = 200) -> list[int]:
    """Delays spread evenly over [lo, hi] in a scrambled order; one include gets `hi`."""
    if n <= 1:
        return [hi]
    k = next(p for p in (7, 11, 13, 17, 19, 23, 29) if math.gcd(p, n) == 1)
    return [lo + round((hi - lo) * ((i * k) % n) / (n - 1)) for i in range(n)]


def k6_esi(ctx: Context) -> Section:
    m = ctx.mode
    sec = Section("esi", "Scenario 1: parallel vs serial ESI (k6 `esi.js`)")
    sec.about = (
        "An ESI page (`/esi/page`, uncacheable: `no-store, private`) with 1, 5, 10 or 20 includes of "
        "uncacheable fragments, each delayed 50-200 ms at the origin (spread evenly, scrambled so they "
        "finish out of order; the slowest is 200 ms), flat or nested one level (each fragment includes "
        "another with the same delay). "
        f"{m.esi_vus} virtual users share {m.esi_iterations} page requests per run. Before each pair every "
        "page is requested once, so pages and fragments are hit-for-miss (the steady state of a hot "
        "uncacheable page, in both). Time to last byte "
        "(k6 `http_req_duration`) p50/p90/p99 are medians over the runs; CPU ms/page is the proxy "
        "process's user+system time over the run (from /proc/PID/stat, varnishd's manager and child "
        "summed) divided by the pages (summed over the runs). Targets: Inlay parallel (`esi.max_concurrency = 64`, default), "
        "Varnish 7 (serial ESI, `esi.vcl`), Inlay serial (`esi.max_concurrency = 1`)."
    )
    targets = {
        "inlay parallel": ctx.inlay("esi-parallel"),
        "varnish": ctx.varnish("esi.vcl"),
        "inlay serial": ctx.inlay("esi-serial", esi_concurrency=1),
    }
    cases = [(n, 0) for n in m.esi_sizes] + [(n, 1) for n in m.esi_nested_sizes]

    def page(n: int, nested: int) -> str:
        # The URL esi.js builds (same delays, passed to it as DELAYS).
        return f"/esi/page?n={n}&nested={nested}&cacheable=0&delays={','.join(map(str, fragment_delays(n)))}"

    def warm() -> None:
        # One page per case and target, all at once: the page and its fragments become
        # hit-for-miss (120 s in both), so the runs measure the steady state rather than
        # the first wave of requests queueing behind one another's uncacheable fetch.
        ctx.get_all([t.url + page(n, k) for (n, k) in cases for t in targets.values()])

    def run(case, tname):
        n, nested = case
        delays = fragment_delays(n)
        chain = max(delays) * (nested + 1)
        serial_page_s = sum(delays) * (nested + 1) / 1000
        rounds = math.ceil(m.esi_iterations / m.esi_vus)
        env = {
            "INCLUDES": str(n), "NESTED": str(nested), "DELAYS": ",".join(map(str, delays)),
            "VUS": str(m.esi_vus), "ITERATIONS": str(m.esi_iterations),
            "MAX_DURATION": f"{int(rounds * serial_page_s * 3 + 30)}s",
        }
        if tname == "inlay parallel":
            env["P50_MAX_MS"] = str(int(chain * 1.2))
            env["TTFB_P50_MAX_MS"] = "10"
        r = ctx.k6("esi.js", targets[tname], env, timeout=rounds * serial_page_s * 3 + 90)
        r["slowest_chain_ms"] = chain
        return r

    res = ctx.alternate(cases, list(targets), run, before_pair=warm)
    sec.raw = {f"n={n} nested={k}": v for (n, k), v in res.items()}
    rows = []
    for (n, nested), by in res.items():
        chain = by["inlay parallel"][0]["slowest_chain_ms"]
        p = {t: trend_median(runs, "http_req_duration") for t, runs in by.items()}
        speed = pair_ratios(by["varnish"], by["inlay parallel"], lambda r: r["http_req_duration"]["p50"])
        # CPU summed over the runs, then divided: finer than a median of small per-run figures.
        cpu = {t: sum(r["cpu_s"] for r in runs) * 1e6 / max(sum(r["requests"] for r in runs), 1)
               for t, runs in by.items()}
        failed = sorted({f for runs in by.values() for r in runs for f in r["failed_thresholds"]})
        rows.append([
            str(n), "nested" if nested else "flat", f"{chain}",
            *[f"{ms(p[t].get('p50'))} / {ms(p[t].get('p90'))} / {ms(p[t].get('p99'))}" for t in targets],
            xr(med(speed)),
            " / ".join(ms(None if cpu[t] is None else cpu[t] / 1000) for t in targets),
            ms(med([r["http_req_waiting"]["p50"] for r in by["inlay parallel"]])),
        ])
        if failed:
            sec.notes.append(f"n={n} {'nested' if nested else 'flat'}: thresholds crossed: {'; '.join(failed)}")
    sec.tables.append(Table(
        "Time to last byte in ms, p50 / p90 / p99 (median over runs)",
        ["includes", "layout", "slowest include (chain) ms", "Inlay parallel", "Varnish (serial)",
         "Inlay serial", "Varnish p50 / Inlay parallel p50", "CPU ms/page: Inlay par / Varnish / Inlay ser",
         "Inlay parallel TTFB p50 ms"],
        rows))
    key = (10, 0) if (10, 0) in res else next(iter(res))
    by = res[key]
    chain = by["inlay parallel"][0]["slowest_chain_ms"]
    rel = [r["http_req_duration"]["p50"] / chain for r in by["inlay parallel"]]
    sec.ratio(f"ESI, {key[0]} uncacheable includes: Inlay p50 page time / slowest include", med(rel), 1.2,
              higher_is_better=False, detail=ratio_detail(rel))
    sp = pair_ratios(by["varnish"], by["inlay parallel"], lambda r: r["http_req_duration"]["p50"])
    sec.ratio(f"ESI, {key[0]} uncacheable includes: Varnish p50 / Inlay parallel p50 (speed-up)", med(sp),
              detail=ratio_detail(sp))
    sps = pair_ratios(by["inlay serial"], by["inlay parallel"], lambda r: r["http_req_duration"]["p50"])
    sec.ratio(f"ESI, {key[0]} uncacheable includes: Inlay serial p50 / Inlay parallel p50", med(sps),
              detail=ratio_detail(sps))
    ttfb = [r["http_req_waiting"]["p50"] for r in by["inlay parallel"]]
    sec.ratio(f"ESI, {key[0]} includes: Inlay parallel TTFB p50", med(ttfb), 10, higher_is_better=False,
              unit="ms", detail=ratio_detail(ttfb))
    for nested, fname in ((0, "esi_flat.svg"), (1, "esi_nested.svg")):
        sizes = [n for (n, k) in res if k == nested]
        if not sizes:
            continue
        sec.plots.append((fname, f"ESI p50 time to last byte, {'nested' if nested else 'flat'}", svg.bar_chart(
            f"ESI page, {'nested one level' if nested else 'flat'}: p50 time to last byte",
            [f"{n} include{'s' if n > 1 else ''}" for n in sizes],
            {t: [trend_median(res[(n, nested)][t], "http_req_duration").get("p50") for n in sizes] for t in targets},
            "ms", log=True)))
    sec.plots.append(("esi_distribution.svg", f"ESI latency distribution, {key[0]} includes", svg.quantile_chart(
        f"ESI page with {key[0]} includes ({'nested' if key[1] else 'flat'}): time to last byte by percentile",
        {t: trend_median(by[t], "http_req_duration") for t in targets})))
    return sec


def k6_ttfb(ctx: Context) -> Section:
    m = ctx.mode
    sec = Section("ttfb", "Scenario 2: time to first byte on a cache hit (k6 `ttfb.js`)")
    sec.about = (
        f"A 177-byte cached object (`/static/177`). {m.ttfb_runs} runs of {m.ttfb_conns} requests per "
        "target, alternating Inlay and Varnish (`hits.vcl`); one k6 virtual user, requests one after "
        "another. *new connection*: k6 `noConnectionReuse` (connect, GET, read the first byte, close), "
        "TTFB measured from the connect; *keep-alive*: one connection. Percentiles are medians over "
        "the runs; every request is checked to be a hit."
    )
    targets = {"inlay": ctx.inlay("ttfb"), "varnish": ctx.varnish("hits.vcl")}
    for t in targets.values():
        ctx.warm(t.url + "/static/177")
    variants = {"new connection": "0", "keep-alive": "1"}
    res = ctx.alternate(list(variants), list(targets), lambda v, t: ctx.k6(
        "ttfb.js", targets[t], {"CONNS": str(m.ttfb_conns), "REUSE": variants[v]}, timeout=60),
        pairs=m.ttfb_runs)
    sec.raw = res
    rows = []
    for v, by in res.items():
        p = {t: trend_median(runs, "ttfb") for t, runs in by.items()}
        rs = pair_ratios(by["inlay"], by["varnish"], lambda r: r["ttfb"]["p50"])
        sec.ratio(f"TTFB on a hit ({v}): Inlay p50 / Varnish p50", med(rs), higher_is_better=False,
                  detail=ratio_detail(rs))
        rows.append([v, *[f"{ms(p[t].get('p50'))} / {ms(p[t].get('p90'))} / {ms(p[t].get('p99'))}" for t in targets],
                     xr(med(rs)),
                     ", ".join(ms(r["ttfb"]["p50"]) for r in by["inlay"]),
                     ", ".join(ms(r["ttfb"]["p50"]) for r in by["varnish"])])
        failed = sorted({f for runs in by.values() for r in runs for f in r["failed_thresholds"]})
        if failed:
            sec.notes.append(f"{v}: thresholds crossed: {'; '.join(failed)}")
    sec.tables.append(Table("TTFB in ms, p50 / p90 / p99 (median over runs)",
                            ["variant", "Inlay", "Varnish", "Inlay/Varnish p50 (lower is better)",
                             "Inlay p50 per run", "Varnish p50 per run"], rows))
    sec.plots.append(("ttfb.svg", "TTFB distribution", svg.quantile_chart(
        "Time to first byte on a 177 B cache hit, by percentile",
        {f"{t} ({v})": trend_median(res[v][t], "ttfb") for v in variants for t in targets})))
    return sec


# The tls section: its request mixes.
TLS_H2_ZIPF_URLS = 10_000  # cached 16 KiB objects of the h2 Zipf mix (160 MiB: fits the 256 MiB tier)
TLS_H2_ZIPF_PREFIX = "/static/16384?id="
TLS_H2_URI_LINES = 100_000  # Zipf draws in h2load's URI list (`-i`), used in turn
S_TIME_PROCS = 4  # parallel `openssl s_time -new` clients
TLS_INLAY_MEMORY = "512MiB"  # holds both Zipf sets


def tls(ctx: Context) -> Section:
    m = ctx.mode
    n1, n16 = m.tls_urls, TLS_H2_ZIPF_URLS
    ka_one, ka_zipf = "HTTPS hits 177 B, keep-alive, one URL", f"HTTPS hits 177 B, keep-alive, Zipf over {n1:,} URLs"
    full_hs, full_rsa = "full handshakes, ECDSA P-256 certificate", "full handshakes, RSA 2048 certificate"
    resumed = "resumed handshakes (wrk, Connection: close)"
    h2_one, h2_zipf = "h2 hits 16 KiB, 100 streams, one URL", f"h2 hits 16 KiB, 100 streams, Zipf over {n16:,} URLs"
    sec = Section("tls", "HTTPS: Inlay (rustls) vs nginx (OpenSSL, `proxy_cache`), hits, handshakes, h2")
    sec.about = (
        "The harness makes a CA and a server certificate for 127.0.0.1 (ECDSA P-256, `openssl req`/`x509`, "
        "and a second pair with RSA 2048 keys for one handshake row); "
        "Inlay serves `https://127.0.0.1:PORT` with it (`[[server.tls]]`, rustls with the ring provider) "
        "and nginx (Debian's, OpenSSL 3) serves the same certificate with `proxy_cache` in front of the "
        "same origin (the generated `nginx.conf` is at the end of the report): TLS 1.2 and 1.3, "
        "`listen ... ssl http2` (ALPN h2), `ssl_session_cache shared:SSL:10m` and session tickets as a "
        "production server has them, `worker_processes 2` as Inlay's two worker threads, access log "
        "off in both, `keepalive_requests` raised so that no run reconnects. Both negotiate TLS 1.3 "
        "with X25519 and AES-256-GCM with these clients. Every object is warmed (or filled) before "
        f"the runs (Inlay's memory tier is {TLS_INLAY_MEMORY} here, to hold both Zipf sets; nginx's "
        "`proxy_cache_path` has `max_size=2g`); the origin counts requests during each run (0: every "
        "request was a hit). "
        f"*{ka_one}*: `wrk -t2 -c64 -d{m.wrk_seconds:g}s https://.../static/177` (Debian's wrk links "
        f"OpenSSL). *{ka_zipf}*: the same over `/static/177?id=K`, K drawn from Zipf (s = {ZIPF_S:g}) "
        f"by `wrk/report.lua` (`WRK_PATHS_ZIPF`) as in the policy section; all {n1:,} are cached first "
        "(`wrk/sweep.lua` over https). "
        f"*{full_hs}* and *{full_rsa}* (a second Inlay and nginx serving the RSA certificate): "
        f"{S_TIME_PROCS} `openssl s_time -new -www /static/177` in parallel for "
        f"{max(1, round(m.wrk_seconds))} s: each connection is a full handshake (`-new`: no session "
        "reuse), `GET /static/177 HTTP/1.0`, the response, close; the rate is all their connections over "
        "the wall time. wrk is not used for this: with `Connection: close` it reuses the TLS session of its "
        "previous connection (OpenSSL's `SSL_clear` keeps it; nginx's `$ssl_session_reused` said `r` for "
        f"all but the first connection of each), so *{resumed}* is that wrk run "
        "(`-H 'Connection: close'`), a figure of its own. "
        f"*{h2_one}*: `h2load -t2 -c4 -m100 -D{m.wrk_seconds:g} https://.../static/16384` "
        "(4 connections with 100 concurrent streams each). "
        f"*{h2_zipf}*: h2load with a URI list (`-i`) of {TLS_H2_URI_LINES:,} Zipf (s = {ZIPF_S:g}) draws "
        f"over `/static/16384?id=K`, K < {n16:,} ({n16 * 16 // 1024} MiB, all cached first), which each "
        "connection requests in turn. CPU is the server's user+system time over the run divided by "
        "its requests (nginx: master and workers)."
    )
    missing = [name for name, path in (("nginx", ctx.nginx_bin), ("h2load", ctx.gen.h2load),
                                       ("openssl", ctx.gen.openssl)) if not path]
    if missing:
        sec.skipped = f"{', '.join(missing)} not installed (`bash loadtests/scripts/ensure-deps.sh bench`)."
        return sec
    certs = make_certificates(ctx.reg, ctx.workdir / "tls", openssl=ctx.gen.openssl)
    ca = certs.ca
    rsa = make_certificates(ctx.reg, ctx.workdir / "tls-rsa", kind="RSA 2048", openssl=ctx.gen.openssl)
    # Both Zipf sets (about 100 MiB + 165 MiB charged) in one Inlay: a 256 MiB tier would evict
    # (nginx's cache may use 2 GiB), so every object stays a hit in both.
    targets = {"inlay": ctx.inlay("tls", tls=certs, memory_size=TLS_INLAY_MEMORY), "nginx": ctx.nginx(certs)}
    rsa_targets = {"inlay": ctx.inlay("tls-rsa", tls=rsa), "nginx": ctx.nginx(rsa, name="tls-rsa")}
    for t in targets.values():
        for path in ("/static/177", "/static/16384"):
            ctx.warm(t.url + path, ca=ca)
    for t, t_ca in [(t, ca) for t in targets.values()] + [(t, rsa.ca) for t in rsa_targets.values()]:
        # s_time's request has no Host field, which is a cache key of its own in both.
        https_raw_get(t.url + "/static/177", t_ca)
        status, headers, body = https_raw_get(t.url + "/static/177", t_ca)
        if status != 200 or len(body) != 177 or not is_hit(headers):
            raise BenchError(f"{t.url}: GET /static/177 HTTP/1.0 without Host: {status}, {len(body)} B, {headers}")
    fills = {name: {"177 B": ctx.sweep(t, ZIPF_PREFIX, n1, ca=ca), "16 KiB": ctx.sweep(t, TLS_H2_ZIPF_PREFIX, n16, ca=ca)}
             for name, t in targets.items()}
    draws = zipf_draws(n16, ZIPF_S, TLS_H2_URI_LINES, seed=1)
    uri_files = {}
    for name, t in targets.items():
        f = ctx.workdir / f"h2load-uris-{name}.txt"
        f.write_text("".join(f"{t.url}{TLS_H2_ZIPF_PREFIX}{i}\n" for i in draws))
        uri_files[name] = f
    zipf_env = {"WRK_PATHS_COUNT": str(n1), "WRK_PATHS_PREFIX": ZIPF_PREFIX, "WRK_PATHS_ZIPF": f"{ZIPF_S:g}"}

    def run(case: str, tname: str) -> dict:
        t = targets[tname]
        if case == ka_one:
            return ctx.wrk(t, "/static/177")
        if case == ka_zipf:
            return ctx.wrk(t, "/static/177", env=zipf_env)
        if case in (full_hs, full_rsa):
            if case == full_rsa:
                t = rsa_targets[tname]
            r = ctx.s_time(t, "/static/177", rsa.ca if case == full_rsa else ca, procs=S_TIME_PROCS)
            if r["bytes_per_connection"] < 177:
                raise BenchError(f"s_time on {t.url}: {r['bytes_per_connection']} bytes per connection, no body")
            return r
        if case == resumed:
            return ctx.wrk(t, "/static/177", headers=["Connection: close"])
        if case == h2_one:
            return ctx.h2load(t, "/static/16384")
        return ctx.h2load(t, uri_file=uri_files[tname])

    cases = [ka_one, ka_zipf, full_hs, full_rsa, resumed, h2_one, h2_zipf]
    res = ctx.alternate(cases, list(targets), run)
    sec.raw = {**res, "fill": fills}
    goals = {ka_one: 1.0, ka_zipf: 1.0, full_hs: 0.9, full_rsa: 0.9, resumed: None, h2_one: 1.0, h2_zipf: 1.0}
    rows = []
    for case in cases:
        by = res[case]
        rs = pair_ratios(by["inlay"], by["nginx"], lambda r: r["rps"])
        unit = "handshakes/s" if "handshakes" in case else "req/s"
        sec.ratio(f"{case}: Inlay / nginx {unit}", med(rs), goals[case], detail=ratio_detail(rs))

        def p99(runs: list[dict]) -> str:
            vals = [r.get("latency_ms", {}).get("p99") for r in runs]
            return ms(med(vals)) if any(v is not None for v in vals) else "-"

        rows.append([
            case, num(med([r["rps"] for r in by["inlay"]])), num(med([r["rps"] for r in by["nginx"]])),
            xr(med(rs)), "-" if goals[case] is None else f">= {goals[case]:g}x",
            num(med([r["cpu_us_per_req"] for r in by["inlay"]])), num(med([r["cpu_us_per_req"] for r in by["nginx"]])),
            f"{p99(by['inlay'])} / {p99(by['nginx'])}",
            " / ".join(str(sum(r["origin_requests"] for r in by[t])) for t in targets),
        ])
    sec.tables.append(Table("Medians over the pairs (p99: wrk's; s_time and h2load report none)", [
        "measure", "Inlay /s", "nginx /s", "Inlay/nginx", "target", "Inlay CPU µs/req", "nginx CPU µs/req",
        "p99 ms Inlay / nginx", "origin requests Inlay / nginx",
    ], rows))
    sec.tables.append(Table("Filling the Zipf sets over https (wrk/sweep.lua)", [
        "target", f"{n1:,} x 177 B s", f"{n16:,} x 16 KiB s", "origin requests"],
        [[name, f"{f['177 B']['seconds']:.1f}", f"{f['16 KiB']['seconds']:.1f}",
          str(f["177 B"]["origin_requests"] + f["16 KiB"]["origin_requests"])] for name, f in fills.items()]))
    sec.plots.append(("tls.svg", "HTTPS requests/s", svg.bar_chart(
        "HTTPS: Inlay vs nginx (median of pairs)", cases,
        {t: [med([r["rps"] for r in res[c][t]]) for c in cases] for t in targets}, "per second", log=True)))
    return sec


def drop_page_cache() -> str:
    """Drop the kernel page cache (needs root); returns what happened, for the report."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "dropped (`echo 3 > /proc/sys/vm/drop_caches`)"
    except OSError as e:
        return f"not dropped ({e.strerror}): the restart read from a warm page cache"


def k6_vod(ctx: Context) -> Section:
    m = ctx.mode
    n, reqs = m.vod_objects, m.vod_requests
    per_pair = math.ceil(reqs / m.pairs)
    sec = Section("vod", "Scenario 3: persistent vs memory storage, video on demand (k6 `vod.js`)")
    mem_size = n + 64
    pers_mem = max(32, n // 4)
    sec.about = (
        f"{n} objects of 1 MiB (`/bytes/1048576?id=N&cc=max-age%3D3600&delay_ms={m.vod_origin_delay_ms}`: "
        f"the origin waits {m.vod_origin_delay_ms} ms per object, like a remote object store), "
        f"{reqs} random requests per configuration from {m.vod_vus} k6 virtual users, in {m.pairs} "
        f"slice(s) of {per_pair}, one per A/B pair (each configuration serves the same sequence). "
        f"*memory-only*: Inlay with `memory_size = {mem_size}MiB` (meant to hold everything), warmed with "
        f"one request per object, then the run. *persistent*: `--cache-dir`, `memory_size = {pers_mem}MiB` "
        f"(a quarter of the set: most hits come from sled), `disk_size = {2 * n + 256}MiB`; a *cold* run "
        "on an empty cache (each object fetched from the origin once: the refetch baseline), a *warm* "
        "run, then `kill -9`, page cache dropped, restart (on the same port: Host is in the cache key), "
        "and the run again. Varnish (`vod.vcl`, "
        f"`-s malloc,{n + 128}m`) warmed like memory-only; its storages are not persistent, so after a "
        "restart it is cold (the persistent *cold* row is what that costs). Resident memory of inlay "
        "is sampled every 100 ms; the limit is the memory tier + 100 MiB."
    )
    delay = m.vod_origin_delay_ms
    paths = [f"/bytes/1048576?id={i}&cc=max-age%3D3600&delay_ms={delay}" for i in range(n)]
    runs: dict[str, list[dict]] = {k: [] for k in (
        "inlay memory-only", "varnish malloc", "inlay persistent cold", "inlay persistent warm",
        "inlay persistent after kill -9")}
    restarts: list[dict] = []
    rss_series: dict[str, list[tuple[float, float]]] = {}
    k6_env: dict[str, str] = {}

    def measured(label: str, target, limit_mib: int | None) -> dict:
        if limit_mib is not None:
            with RssSampler(target.proc.pid) as s:
                r = ctx.k6("vod.js", target, k6_env, timeout=400)
            r["rss_max_mib"] = s.max / MiB
            r["rss_limit_mib"] = limit_mib
            if label not in rss_series:
                rss_series[label] = [(t, b / MiB) for t, b in s.samples]
        else:
            r = ctx.k6("vod.js", target, k6_env, timeout=400)
        runs[label].append(r)
        return r

    for pair in range(m.pairs):
        k6_env = {"OBJECTS": str(n), "REQUESTS": str(per_pair), "FIRST": str(pair * per_pair),
                  "VUS": str(m.vod_vus), "ORIGIN_DELAY_MS": str(delay), "SEED": "1", "MAX_DURATION": "300s"}
        # memory-only
        inl = ctx.inlay(f"vod-mem-{pair}", memory_size=f"{mem_size}MiB")
        ctx.fill(inl.url, paths)
        measured("inlay memory-only", inl, mem_size + 100)
        ctx.release()
        # varnish, memory
        var = ctx.varnish("vod.vcl", storage=f"malloc,{n + 128}m")
        ctx.fill(var.url, paths)
        measured("varnish malloc", var, None)
        ctx.release()
        # persistent: cold, warm, kill -9, restart
        cdir = ctx.workdir / f"vod-cache-{pair}"
        inl = ctx.inlay(f"vod-pers-{pair}", cache_dir=cdir, memory_size=f"{pers_mem}MiB", disk_size=f"{2 * n + 256}MiB")
        measured("inlay persistent cold", inl, pers_mem + 100)
        measured("inlay persistent warm", inl, pers_mem + 100)
        ctx.warm(inl.url + paths[0])  # object 0 is cached: the probe after the restart
        time.sleep(1.0)  # let sled's periodic flush (500 ms) pass, as a quiet production box would
        ctx.reg.note_command(["kill", "-KILL", str(inl.proc.pid)])
        inl.kill9()
        ctx.reg.note_command(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"])
        page_cache = drop_page_cache()
        t0 = time.monotonic()
        to_listen = inl.start()
        first = None
        first_status = None
        while time.monotonic() - t0 < 30:
            try:
                status, headers, body = http_get(inl.url + paths[0], timeout=30)
            except OSError:
                time.sleep(0.005)
                continue
            first = time.monotonic() - t0
            first_status = f"{status} {'hit' if is_hit(headers) else 'MISS'} {len(body)} B"
            break
        restarts.append({"to_listening_s": to_listen, "to_first_response_s": first, "first_response": first_status,
                         "page_cache": page_cache})
        measured("inlay persistent after kill -9", inl, pers_mem + 100)
        ctx.release()
        du = sum(f.stat().st_size for f in cdir.rglob("*") if f.is_file())
        restarts[-1]["cache_dir_bytes"] = du
        shutil.rmtree(cdir, ignore_errors=True)

    sec.raw = {"runs": runs, "restarts": restarts}
    rows = []
    for label, rs in runs.items():
        if not rs:
            continue
        rows.append([
            label, f"{sum(r['run_seconds'] for r in rs):.1f}", ", ".join(f"{r['run_seconds']:.1f}" for r in rs),
            gbps(med([r["data_received"]["rate"] for r in rs])),
            f"{med([r.get('cache_hit', 0) for r in rs]):.3f}",
            ms(med([r["http_req_duration"]["p50"] for r in rs])), ms(med([r["http_req_duration"]["p99"] for r in rs])),
            str(int(med([r["origin_requests"] for r in rs]))),
            "-" if "rss_max_mib" not in rs[0] else f"{max(r['rss_max_mib'] for r in rs):.0f} / {rs[0]['rss_limit_mib']}",
        ])
    sec.tables.append(Table(f"{reqs} requests over {n} objects of 1 MiB, {m.pairs} slice(s) of {per_pair}", [
        "configuration", f"run time s, all {reqs}", "per slice s", "throughput (median)", "hit rate",
        "p50 ms", "p99 ms", "origin requests per slice", "inlay max RSS / limit MiB"], rows))
    sec.tables.append(Table("Restart after kill -9", [
        "pair", "to listening ms", "to first response ms", "first response", "page cache", "cache dir size"],
        [[str(i + 1), ms(r["to_listening_s"] * 1000), ms(None if r["to_first_response_s"] is None else r["to_first_response_s"] * 1000),
          str(r["first_response"]), r["page_cache"], f"{r['cache_dir_bytes'] / MiB:.0f} MiB"] for i, r in enumerate(restarts)]))
    t = lambda label: [r["run_seconds"] for r in runs[label]]  # noqa: E731
    pm = [a / b for a, b in zip(t("inlay persistent warm"), t("inlay memory-only"))]
    sec.ratio("VOD: persistent / memory-only run time", med(pm), 1.2, higher_is_better=False, detail=ratio_detail(pm))
    rc = [a / b for a, b in zip(t("inlay persistent after kill -9"), t("inlay persistent cold"))]
    sec.ratio("VOD: after kill -9 restart / cold refetch run time", med(rc), 1.0, higher_is_better=False,
              detail=ratio_detail(rc))
    firsts = [r["to_first_response_s"] * 1000 for r in restarts if r["to_first_response_s"] is not None]
    sec.ratio("VOD: restart to first cached response", max(firsts) if firsts else None, 1000,
              higher_is_better=False, unit="ms", detail=", ".join(str(r["first_response"]) for r in restarts))
    iv = [b / a for a, b in zip(t("inlay memory-only"), t("varnish malloc"))]
    sec.ratio("VOD warm, memory: Inlay / Varnish throughput", med(iv), detail=ratio_detail(iv))
    over = [r["rss_max_mib"] - r["rss_limit_mib"] + 100 for rs in runs.values() for r in rs if "rss_max_mib" in r]
    sec.ratio("VOD: inlay max RSS above the memory tier size", max(over) if over else None, 100,
              higher_is_better=False, unit="MiB")
    if any("not dropped" in r["page_cache"] for r in restarts):
        sec.notes.append("The page cache could not be dropped: the restart runs read from a warm page cache.")
    if any(r["first_response"] and "MISS" in r["first_response"] for r in restarts):
        sec.notes.append("After the restart the probe object was a MISS: the persisted cache was not used.")
    sec.plots.append(("vod_runtime.svg", "VOD run times", svg.bar_chart(
        f"VOD: {reqs} random 1 MiB requests, total run time", [k.replace("inlay ", "") for k in runs],
        {"run time (s)": [sum(r["run_seconds"] for r in rs) or None for rs in runs.values()]}, "seconds")))
    sec.plots.append(("vod_rss.svg", "inlay resident memory during the VOD runs", svg.line_chart(
        "inlay resident memory during the VOD runs (first slice)", rss_series, "seconds", "MiB",
        hlines={f"memory-only limit {mem_size + 100} MiB": mem_size + 100,
                f"persistent limit {pers_mem + 100} MiB": pers_mem + 100})))
    return sec


def k6_dynamic(ctx: Context) -> Section:
    m = ctx.mode
    sec = Section("dynamic", "Scenario 4: cache vs no cache in front of a slow dynamic origin (k6 `dynamic.js`)")
    sec.about = (
        "`/dynamic?delay_ms=150&size=8192`: the origin renders an 8 KiB page in 150 ms. *no cache*: as "
        "the origin sends it (`no-store`: every request waits for the origin); *cache*: the same page "
        f"with `cc=public, max-age=3600` (warmed: all hits). Concurrency {', '.join(map(str, m.dyn_concurrency))} "
        f"k6 virtual users for {m.dyn_seconds:g} s each. `origin` is k6 straight at the origin (no cache "
        "only, first pair). Requests/s and latency are medians over the pairs."
    )
    targets = {"inlay": ctx.inlay("dynamic"), "varnish": ctx.varnish("dynamic.vcl")}
    cache_path = "/dynamic?delay_ms=150&size=8192&cc=public%2C%20max-age%3D3600"
    for t in targets.values():
        ctx.warm(t.url + cache_path)
    cases = [(mode, c) for mode in ("cache", "nocache") for c in m.dyn_concurrency]

    def run(case, tname):
        mode, c = case
        env = {"MODE": mode, "VUS": str(c), "DURATION": f"{m.dyn_seconds:g}s",
               "MAX_REQUESTS": str(int(m.dyn_seconds * 200000))}
        return ctx.k6("dynamic.js", targets[tname], env, timeout=m.dyn_seconds + 60)

    res = ctx.alternate(cases, list(targets), run)
    origin_runs = {c: ctx.k6("dynamic.js", ctx.origin, {
        "MODE": "nocache", "VUS": str(c), "DURATION": f"{m.dyn_seconds:g}s",
        "MAX_REQUESTS": str(int(m.dyn_seconds * 200000))}, timeout=m.dyn_seconds + 60) for c in m.dyn_concurrency}
    sec.raw = {f"{mode} c={c}": v for (mode, c), v in res.items()} | {f"origin c={c}": v for c, v in origin_runs.items()}
    rps = lambda r: r["http_reqs"]["count"] / r["run_seconds"]  # noqa: E731
    rows = []
    for (mode, c), by in res.items():
        p = {t: trend_median(runs, "http_req_duration") for t, runs in by.items()}
        rs = pair_ratios(by["inlay"], by["varnish"], rps)
        rows.append([mode, str(c), num(med([rps(r) for r in by["inlay"]])), num(med([rps(r) for r in by["varnish"]])),
                     num(rps(origin_runs[c])) if mode == "nocache" else "-", xr(med(rs)),
                     *[f"{ms(p[t].get('p50'))} / {ms(p[t].get('p90'))} / {ms(p[t].get('p99'))}" for t in targets],
                     f"{med([r.get('cache_hit', 0) for r in by['inlay']]):.2f} / {med([r.get('cache_hit', 0) for r in by['varnish']]):.2f}"])
    sec.tables.append(Table("Requests/s and latency in ms (p50 / p90 / p99), medians over the pairs", [
        "mode", "concurrency", "Inlay req/s", "Varnish req/s", "origin req/s", "Inlay/Varnish req/s",
        "Inlay latency", "Varnish latency", "hit rate Inlay / Varnish"], rows))
    c_mid = 50 if 50 in m.dyn_concurrency else m.dyn_concurrency[-1]
    for t in targets:
        sp = [rps(a) / rps(b) for a, b in zip(res[("cache", c_mid)][t], res[("nocache", c_mid)][t])]
        sec.ratio(f"Slow origin, {c_mid} users: {t} cache / no cache req/s", med(sp), detail=ratio_detail(sp))
    rs = pair_ratios(res[("cache", c_mid)]["inlay"], res[("cache", c_mid)]["varnish"], rps)
    sec.ratio(f"Slow origin, cached, {c_mid} users: Inlay / Varnish req/s", med(rs), detail=ratio_detail(rs))
    sec.plots.append(("dynamic_rps.svg", "requests/s by concurrency", svg.bar_chart(
        "Slow dynamic origin: requests/s (median of pairs)", [f"{mode} c={c}" for mode, c in cases],
        {t: [med([rps(r) for r in res[cs][t]]) for cs in cases] for t in targets}
        | {"origin": [rps(origin_runs[c]) if mode == "nocache" else None for mode, c in cases]},
        "requests/s", log=True)))
    sec.plots.append(("dynamic_latency.svg", f"latency distribution at {c_mid} users", svg.quantile_chart(
        f"Slow dynamic origin, {c_mid} users: latency by percentile",
        {f"{t} {mode}": trend_median(res[(mode, c_mid)][t], "http_req_duration") for mode in ("cache", "nocache") for t in targets})))
    return sec


# In run order; the longest and most variable (vod) last, so that a spent
# time budget costs the fewest sections.
SECTIONS = {
    "hits": wrk_hits,
    "metrics": wrk_metrics,
    "tiers": wrk_tiers,
    "pass": wrk_pass,
    "policy": wrk_policy,
    "esi-cached": wrk_esi_cached,
    "esi": k6_esi,
    "ttfb": k6_ttfb,
    "dynamic": k6_dynamic,
    "tls": tls,
    "vod": k6_vod,
    "compression": wrk_compression,
    "components": components,
}
