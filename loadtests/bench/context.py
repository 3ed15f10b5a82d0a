"""What every scenario of the harness shares: the run mode, the running
origin, starting inlay/varnishd instances, warming and filling caches, A/B
alternation, and the result types (Section, Ratio) the report is built from.
"""

from __future__ import annotations

import bisect
import http.client
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable

from loadgen import LoadGen
from procs import BenchError, Inlay, Nginx, Origin, Registry, TlsFiles, Varnish, http_get, is_hit


@dataclass(frozen=True)
class Mode:
    """How long and how often: `quick` for everyday checks, `full` for the figures docs/performance.md quotes."""

    name: str
    pairs: int  # A/B pairs per measurement
    budget_s: int  # no new section starts after this many seconds
    wrk_seconds: float
    esi_sizes: tuple[int, ...]
    esi_nested_sizes: tuple[int, ...]
    esi_vus: int
    esi_iterations: int
    ttfb_runs: int
    ttfb_conns: int
    vod_objects: int
    vod_requests: int  # per configuration, split into one slice per pair
    vod_vus: int
    vod_origin_delay_ms: int
    dyn_seconds: float
    dyn_concurrency: tuple[int, ...]
    policy_urls: int  # distinct cached URLs of the policy section's Zipf mix
    policy_zipf_replay_off: bool  # whether the replay-off targets run the Zipf mix too
    tls_urls: int  # distinct cached 177 B URLs of the tls section's keep-alive Zipf mix


QUICK = Mode(
    name="quick", pairs=1, budget_s=240, wrk_seconds=2,  # 185 s before the tls section (about 45 s)
    esi_sizes=(1, 5, 10, 20), esi_nested_sizes=(5,), esi_vus=10, esi_iterations=20,
    ttfb_runs=2, ttfb_conns=100,
    vod_objects=200, vod_requests=5000, vod_vus=16, vod_origin_delay_ms=50,
    dyn_seconds=1.5, dyn_concurrency=(1, 50, 100),
    policy_urls=100_000, policy_zipf_replay_off=False,
    tls_urls=20_000,  # filling 100,000 over https would take nginx 10-20 s more
)
FULL = Mode(
    name="full", pairs=3, budget_s=1020, wrk_seconds=4,
    esi_sizes=(1, 5, 10, 20), esi_nested_sizes=(1, 5, 10, 20), esi_vus=20, esi_iterations=40,
    ttfb_runs=5, ttfb_conns=100,
    vod_objects=1000, vod_requests=50000, vod_vus=16, vod_origin_delay_ms=50,
    dyn_seconds=2.5, dyn_concurrency=(1, 50, 100),
    policy_urls=100_000, policy_zipf_replay_off=True,
    tls_urls=100_000,
)
MODES = {m.name: m for m in (QUICK, FULL)}


@dataclass
class Ratio:
    """One headline figure: usually a ratio, sometimes an absolute check (unit)."""

    label: str
    value: float | None
    target: float | None = None
    higher_is_better: bool = True
    unit: str = "x"
    detail: str = ""  # e.g. the per-pair values
    source: str = ""  # the section id

    @property
    def ok(self) -> bool | None:
        if self.value is None or self.target is None:
            return None
        return self.value >= self.target if self.higher_is_better else self.value <= self.target


@dataclass
class Table:
    caption: str
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Section:
    """One scenario's results, as the report shows them."""

    id: str
    title: str
    about: str = ""  # markdown: what is measured and how
    tables: list[Table] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    plots: list[tuple[str, str, str]] = field(default_factory=list)  # (file, caption, svg)
    notes: list[str] = field(default_factory=list)
    raw: dict = field(default_factory=dict)
    seconds: float = 0.0
    skipped: str = ""

    def ratio(self, *args, **kw) -> Ratio:
        r = Ratio(*args, source=self.id, **kw)
        self.ratios.append(r)
        return r


Target = Inlay | Varnish | Origin | Nginx


class Context:
    """The state shared by the scenarios of one harness run."""

    def __init__(self, mode: Mode, reg: Registry, gen: LoadGen, origin: Origin, *,
                 inlay_bin: Path, varnishd: str, vcl_dir: Path, policy_dir: Path, nginx: str | None = None):
        self.mode = mode
        self.reg = reg
        self.gen = gen
        self.origin = origin
        self.inlay_bin = inlay_bin
        self.varnishd = varnishd
        self.vcl_dir = vcl_dir
        self.policy_dir = policy_dir
        self.nginx_bin = nginx  # None: not installed (the tls section is then skipped)
        self.workdir = reg.workdir
        self._servers: list[Target] = []

    # -- servers ---------------------------------------------------------

    def inlay(self, name: str, **kw) -> Inlay:
        """Start an inlay in front of the origin; stopped by release()."""
        inst = Inlay(self.reg, self.inlay_bin, self.origin, name, **kw)
        self._servers.append(inst)
        return inst

    def varnish(self, vcl: str, storage: str = "malloc,256m") -> Varnish:
        """Start varnishd with loadtests/varnish/VCL; stopped by release()."""
        inst = Varnish(self.reg, self.varnishd, self.vcl_dir, self.origin, vcl, storage)
        self._servers.append(inst)
        return inst

    def nginx(self, tls: TlsFiles | None, name: str = "tls", compress: bool = False) -> Nginx:
        """Start nginx (TLS unless `tls` is None, `proxy_cache`; gzip and brotli with
        `compress`) in front of the origin; stopped by release()."""
        if self.nginx_bin is None:
            raise BenchError("nginx is not installed (`bash loadtests/scripts/ensure-deps.sh bench`)")
        inst = Nginx(self.reg, self.nginx_bin, self.origin, tls, name, compress=compress)
        self._servers.append(inst)
        return inst

    def release(self) -> None:
        """Stop every server the current section started."""
        for s in reversed(self._servers):
            s.stop()
        self._servers.clear()

    # -- requests --------------------------------------------------------

    def warm(self, url: str, *, expect_hit: bool = True, ca: Path | None = None) -> None:
        """Fetch twice; with expect_hit the second answer must come from the cache.
        An https URL needs `ca`."""
        status, _, _ = http_get(url, timeout=30, ca=ca)
        if status != 200:
            raise BenchError(f"warming {url}: status {status}")
        status, headers, _ = http_get(url, timeout=30, ca=ca)
        if expect_hit and not is_hit(headers):
            raise BenchError(f"warming {url}: second request was not a cache hit ({headers})")

    def fill(self, base: str, paths: list[str], threads: int = 16) -> float:
        """GET every path once (keep-alive, `threads` at a time); returns seconds."""
        host, port = base.removeprefix("http://").split(":")
        queue = list(reversed(paths))
        lock = threading.Lock()
        errors: list[str] = []

        def worker() -> None:
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            while True:
                with lock:
                    if not queue or errors:
                        break
                    path = queue.pop()
                try:
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        errors.append(f"{path}: {resp.status}")
                except (OSError, http.client.HTTPException) as e:
                    errors.append(f"{path}: {e}")
            conn.close()

        t0 = time.monotonic()
        ts = [threading.Thread(target=worker) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise BenchError(f"filling {base}: {errors[:3]}")
        return time.monotonic() - t0

    def sweep(self, target: Target, prefix: str, count: int, ca: Path | None = None) -> dict:
        """Cache prefix+id for every id in [0, count): one wrk pass requesting each once,
        then a check that the first, middle and last ids are hits (an https target needs `ca`)."""
        self.origin.reset()
        r = self.gen.wrk_sweep(target.url, count, prefix)
        r["origin_requests"] = self.origin.total()
        if r["not_ok"]:
            raise BenchError(f"filling {target.url}{prefix}N: {r['not_ok']} of {r['requests']} answers were not 200")
        for i in (0, count // 2, count - 1):
            _, headers, _ = http_get(f"{target.url}{prefix}{i}", timeout=30, ca=ca)
            if not is_hit(headers):
                raise BenchError(f"after filling {target.url}{prefix}N, id {i} is not a cache hit ({headers})")
        return r

    def wrk(self, target: Target, path: str, *, env: dict[str, str] | None = None,
            connections: int = 64, headers: list[str] | None = None) -> dict:
        """One wrk run against target+path; also counts the origin requests it caused."""
        self.origin.reset()
        r = self.gen.wrk_run(target.url + path, duration=self.mode.wrk_seconds, connections=connections,
                             pids=target.pids, env=env, headers=headers)
        r["origin_requests"] = self.origin.total()
        if r["errors"] > 0.01 * max(r["requests"], 1):
            raise BenchError(f"wrk {target.url}{path}: {r['errors']} errors in {r['requests']} requests: {r['error_detail']}")
        return r

    def h2load(self, target: Target, path: str = "", *, uri_file: Path | None = None,
               clients: int = 4, streams: int = 100) -> dict:
        """One timed h2load run against target+path (or the URIs of `uri_file`); also counts
        the origin requests it caused. Fails on errors or answers other than 2xx."""
        self.origin.reset()
        r = self.gen.h2load_run(target.url + path, duration=self.mode.wrk_seconds, clients=clients,
                                streams=streams, uri_file=uri_file, pids=target.pids)
        r["origin_requests"] = self.origin.total()
        bad = r["errors"] + sum(v for k, v in r["status"].items() if k != "2xx")
        if bad > 0.01 * max(r["done"], 1):
            raise BenchError(f"h2load {target.url}{path}: {bad} failed or not 2xx of {r['done']}: {r['status']}")
        return r

    def s_time(self, target: Target, path: str, ca: Path, procs: int = 4) -> dict:
        """Full handshakes (`openssl s_time -new`, `procs` in parallel), each fetching
        `path`; also counts the origin requests it caused."""
        self.origin.reset()
        r = self.gen.s_time_run(target.url.removeprefix("https://"), path, duration=self.mode.wrk_seconds,
                                procs=procs, ca=ca, pids=target.pids)
        r["origin_requests"] = self.origin.total()
        return r

    def k6(self, script: str, target: Target, env: dict[str, str], timeout: float) -> dict:
        """One k6 run of loadtests/k6/SCRIPT with TARGET set; also counts origin requests."""
        self.origin.reset()
        r = self.gen.k6_run(script, {"TARGET": target.url, **env}, timeout=timeout, pids=target.pids)
        r["origin_requests"] = self.origin.total()
        return r

    def get_all(self, urls: list[str]) -> None:
        """GET every URL at once (one thread each), e.g. to warm hit-for-miss state."""
        errors: list[str] = []

        def one(url: str) -> None:
            try:
                status, _, _ = http_get(url, timeout=120)
                if status != 200:
                    errors.append(f"{url}: {status}")
            except OSError as e:
                errors.append(f"{url}: {e}")

        ts = [threading.Thread(target=one, args=(u,)) for u in urls]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise BenchError(f"GET failed: {errors[:3]}")

    def alternate(self, cases: list[Hashable], targets: list[str], run: Callable[[Hashable, str], dict],
                  pairs: int | None = None, before_pair: Callable[[], None] | None = None) -> dict:
        """A B A B: for each pair, each case, each target in turn: results[case][target] = [runs]."""
        res: dict = {c: {t: [] for t in targets} for c in cases}
        for _ in range(pairs or self.mode.pairs):
            if before_pair is not None:
                before_pair()
            for c in cases:
                for t in targets:
                    res[c][t].append(run(c, t))
        return res


# -- statistics ------------------------------------------------------------

def med(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def pair_ratios(a: list[dict], b: list[dict], f: Callable[[dict], float]) -> list[float]:
    """a_i / b_i for each A/B pair (the alternation cancels slow drift of a shared machine)."""
    return [f(x) / f(y) for x, y in zip(a, b) if f(y)]


def ratio_detail(rs: list[float]) -> str:
    if len(rs) <= 1:
        return f"1 pair" if rs else "no data"
    return f"{len(rs)} pairs: " + ", ".join(f"{r:.2f}" for r in rs)


def zipf_head_share(n: int, s: float, k: int) -> float:
    """Under Zipf(s) over n ranks (as `wrk/report.lua` draws), the share of draws among the top k."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    weights = [r ** -s for r in range(1, n + 1)]
    return sum(weights[:k]) / sum(weights)


def zipf_draws(n: int, s: float, k: int, seed: int = 1) -> list[int]:
    """k ids in [0, n) drawn from Zipf(s) (id 0 the most frequent; P(id = r - 1) is
    proportional to 1 / r^s), as `wrk/report.lua` draws them; reproducible from `seed`."""
    if n < 1 or k < 0:
        raise ValueError(f"need n >= 1 and k >= 0, got n={n}, k={k}")
    cdf, total = [], 0.0
    for r in range(1, n + 1):
        total += r ** -s
        cdf.append(total)
    rng = random.Random(seed)
    return [min(bisect.bisect_right(cdf, rng.random() * total), n - 1) for _ in range(k)]


def trend_median(runs: list[dict], metric: str) -> dict:
    """Per percentile, the median over runs of a k6 trend (ms)."""
    keys = set()
    for r in runs:
        keys |= set(r.get(metric, {}))
    return {k: med([r.get(metric, {}).get(k) for r in runs]) for k in keys}


def ms(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def num(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} M"
    if v >= 1e4:
        return f"{v / 1e3:.1f} k"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def gbps(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e9:.2f} GB/s"


def xr(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"
