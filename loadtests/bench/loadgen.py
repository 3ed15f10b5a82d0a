"""The load generators: wrk for raw throughput ceilings, k6 for the scenarios.

Each run is bounded in time (wrk -d, k6 maxDuration, and a hard subprocess
timeout on top) and reports the proxy's CPU time over the run, read from
/proc before and after.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from procs import BenchError, CpuMeter, Registry

HERE = Path(__file__).resolve().parent
WRK_LUA = HERE / "wrk" / "report.lua"
WRK_SWEEP_LUA = HERE / "wrk" / "sweep.lua"
K6_DIR = HERE.parent / "k6"


class LoadGen:
    """Runs wrk and k6, records their commands in the registry."""

    def __init__(self, reg: Registry, wrk: str, k6: str, h2load: str = "h2load", openssl: str = "openssl"):
        self.reg = reg
        self.wrk = wrk
        self.k6 = k6
        self.h2load = h2load
        self.openssl = openssl
        self._k6_runs = 0

    def wrk_run(
        self,
        url: str,
        *,
        duration: float,
        connections: int = 64,
        threads: int = 2,
        pids: Callable[[], list[int]] = lambda: [],
        env: dict[str, str] | None = None,
        headers: list[str] | None = None,
    ) -> dict:
        """One wrk run; returns req/s, bytes/s, latency (ms), errors, CPU µs per request.
        `headers` are extra request header lines (`wrk -H`)."""
        argv = [
            self.wrk, f"-t{threads}", f"-c{connections}", f"-d{duration:g}s",
            "--timeout", "5s", "-s", str(WRK_LUA),
        ]
        for h in headers or []:
            argv += ["-H", h]
        argv.append(url)
        self.reg.note_command(argv, env)
        cpu = CpuMeter(pids()).start()
        t0 = time.monotonic()
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=duration + 30,
            env=dict(os.environ, **(env or {})),
        )
        wall = time.monotonic() - t0
        cpu_s = cpu.stop()
        m = re.search(r"^WRK_JSON (\{.*\})$", proc.stdout, re.M)
        if proc.returncode != 0 or not m:
            raise BenchError(f"wrk failed ({proc.returncode}): {proc.stderr.strip()[-500:]} {proc.stdout[-500:]}")
        r = json.loads(m.group(1))
        secs = r["duration_us"] / 1e6
        errors = sum(r["errors"].values())
        lat = {k: v / 1000.0 for k, v in r["latency_us"].items()}
        return {
            "requests": r["requests"],
            "seconds": secs,
            "wall_seconds": wall,
            "rps": r["requests"] / secs,
            "bytes_per_s": r["bytes"] / secs,
            "errors": errors,
            "error_detail": r["errors"],
            "latency_ms": {"mean": lat["mean"], "p50": lat["p50"], "p90": lat["p90"],
                           "p99": lat["p99"], "p99.9": lat["p999"], "max": lat["max"]},
            "cpu_s": cpu_s,
            "cpu_us_per_req": cpu_s * 1e6 / max(r["requests"], 1),
        }

    def wrk_sweep(
        self,
        base: str,
        count: int,
        prefix: str,
        *,
        suffix: str = "",
        connections: int = 64,
        threads: int = 2,
        timeout: float = 600,
    ) -> dict:
        """GET base+prefix+id+suffix once for every id in [0, count) with wrk
        (`wrk/sweep.lua`); returns requests, seconds and answers that were not 200."""
        if count < threads:
            raise BenchError(f"a sweep of {count} ids needs at least {threads}, one per wrk thread")
        env = {"WRK_PATHS_COUNT": str(count), "WRK_PATHS_PREFIX": prefix, "WRK_SWEEP_THREADS": str(threads)}
        if suffix:
            env["WRK_PATHS_SUFFIX"] = suffix
        # -d is only a bound: the script stops each thread when its ids are answered,
        # and SIGINT (below) ends wrk's wait for -d.
        argv = [self.wrk, f"-t{threads}", f"-c{max(connections, threads)}", f"-d{int(timeout)}s",
                "--timeout", "30s", "-s", str(WRK_SWEEP_LUA), base + "/"]
        self.reg.note_command(argv, env)
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ, **env))
        out = b""
        err = b""
        try:
            # Raw reads, not readline(): a buffered reader could hold a line select() cannot see.
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ)
                deadline = t0 + timeout
                while out.count(b"WRK_SWEEP_DONE ") < threads and time.monotonic() < deadline:
                    if not sel.select(timeout=max(deadline - time.monotonic(), 0)):
                        continue
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:  # wrk exited
                        break
                    out += chunk
            seconds = time.monotonic() - t0
            proc.send_signal(signal.SIGINT)
            rest, err = proc.communicate(timeout=30)
            out += rest
        except subprocess.TimeoutExpired:
            raise BenchError(f"wrk sweep on {base}: wrk did not exit after SIGINT") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        text = out.decode(errors="replace")
        lines = [[int(x) for x in m.split()] for m in re.findall(r"^WRK_SWEEP_DONE ([\d ]+)$", text, re.M)]
        if len(lines) < threads:
            stderr = err.decode(errors="replace").strip()[-300:]
            raise BenchError(f"wrk sweep of {count} URLs on {base} did not finish within {timeout:g}s "
                             f"({len(lines)} of {threads} threads done): {stderr} {text[-300:]}")
        sent = sum(line[1] for line in lines)
        if sent != count:
            raise BenchError(f"wrk sweep on {base}: {sent} URLs requested, expected {count}")
        return {
            "requests": sum(line[3] for line in lines),
            "seconds": seconds,
            "not_ok": sum(line[4] for line in lines),
        }

    def k6_run(
        self,
        script: str,
        env: dict[str, str],
        *,
        timeout: float,
        pids: Callable[[], list[int]] = lambda: [],
    ) -> dict:
        """One k6 run of loadtests/k6/SCRIPT; returns the summary's metrics, flattened."""
        self._k6_runs += 1
        summary = self.reg.workdir / f"k6-{self._k6_runs}-{Path(script).stem}.json"
        argv = [self.k6, "run", "-q", "--no-color"]
        for k, v in env.items():
            argv += ["-e", f"{k}={v}"]
        argv += ["-e", f"SUMMARY={summary}", str(K6_DIR / script)]
        # Recorded with a fixed summary name, so repeated runs read as one command.
        self.reg.note_command(argv[:-2] + [f"SUMMARY={self.reg.workdir}/summary.json", argv[-1]],
                              {"K6_NO_USAGE_REPORT": "true"})
        cpu = CpuMeter(pids()).start()
        t0 = time.monotonic()
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout,
            env=dict(os.environ, K6_NO_USAGE_REPORT="true"),
        )
        wall = time.monotonic() - t0
        cpu_s = cpu.stop()
        # 99: thresholds crossed (a finding, reported); anything else is a failure.
        if proc.returncode not in (0, 99) or not summary.exists():
            raise BenchError(f"k6 {script} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
        data = json.loads(summary.read_text())
        summary.unlink()
        return flatten_k6(data, wall, cpu_s, proc.returncode)


    def h2load_run(
        self,
        url: str,
        *,
        duration: float,
        clients: int = 4,
        streams: int = 100,
        threads: int = 2,
        uri_file: Path | None = None,
        pids: Callable[[], list[int]] = lambda: [],
    ) -> dict:
        """One timed h2load run (HTTP/2, over TLS for an https URL): `clients` connections
        with `streams` concurrent streams each, for `duration` seconds (the few handshakes
        are in the run). With `uri_file`, the URIs of that file in turn (`h2load -i`)
        instead of `url`."""
        argv = [self.h2load, f"-t{threads}", f"-c{clients}", f"-m{streams}", f"-D{duration:g}"]
        argv += ["-i", str(uri_file)] if uri_file is not None else [url]
        self.reg.note_command(argv)
        cpu = CpuMeter(pids()).start()
        t0 = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
        wall = time.monotonic() - t0
        cpu_s = cpu.stop()
        if proc.returncode != 0:
            raise BenchError(f"h2load failed ({proc.returncode}): {proc.stderr.strip()[-500:]} {proc.stdout[-500:]}")
        r = parse_h2load(proc.stdout)
        r["wall_seconds"] = wall
        r["cpu_s"] = cpu_s
        r["cpu_us_per_req"] = cpu_s * 1e6 / max(r["requests"], 1)
        return r

    def s_time_run(
        self,
        host_port: str,
        path: str,
        *,
        duration: float,
        procs: int = 4,
        ca: Path | None = None,
        pids: Callable[[], list[int]] = lambda: [],
    ) -> dict:
        """Full TLS handshakes: `procs` parallel `openssl s_time -new` (no session reuse)
        for `duration` seconds, each connection a handshake, `GET PATH HTTP/1.0` and the
        whole response, then close. The rate is the connections of all processes over the
        wall time (s_time's own "real seconds" are whole seconds)."""
        argv = [self.openssl, "s_time", "-connect", host_port, "-new", "-time", f"{max(1, round(duration))}",
                "-www", path]
        if ca is not None:
            argv += ["-CAfile", str(ca)]
        self.reg.commands.append(f"for i in $(seq {procs}); do {shlex.join(argv)} & done; wait")
        cpu = CpuMeter(pids()).start()
        t0 = time.monotonic()
        ps = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(procs)]
        outs = []
        try:
            for p in ps:
                out, err = p.communicate(timeout=duration + 60)
                outs.append((p.returncode, out, err))
        finally:
            for p in ps:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        wall = time.monotonic() - t0
        cpu_s = cpu.stop()
        conns = 0
        bytes_per_conn = []
        for rc, out, err in outs:
            r = parse_s_time(out)
            if rc != 0 or r is None:
                raise BenchError(f"openssl s_time failed ({rc}): {err.strip()[-400:]} {out[-400:]}")
            conns += r["connections"]
            bytes_per_conn.append(r["bytes_per_connection"])
        return {
            "requests": conns,
            "seconds": wall,
            "rps": conns / wall,
            "bytes_per_connection": min(bytes_per_conn),
            "cpu_s": cpu_s,
            "cpu_us_per_req": cpu_s * 1e6 / max(conns, 1),
        }


_SIZE = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_TIME_MS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def parse_h2load(text: str) -> dict:
    """The figures of h2load's summary: requests (succeeded), req/s, bytes/s, failures,
    status classes, and the request-time distribution (mean, max, in ms).

    `finished in 4.00s, 81234.50 req/s, 1.26GB/s` / `requests: N total, N started, N done,
    N succeeded, N failed, N errored, N timeout` / `status codes: N 2xx, N 3xx, N 4xx, N 5xx` /
    `time for request:  MIN  MAX  MEAN  SD  +/-SD`."""
    fin = re.search(r"^finished in ([\d.]+)(s|ms), ([\d.]+) req/s, ([\d.]+)([KMG]?)B/s", text, re.M)
    reqs = re.search(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                     r"(\d+) errored, (\d+) timeout", text, re.M)
    codes = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text, re.M)
    if not (fin and reqs and codes):
        raise BenchError(f"h2load output not understood: {text.strip()[-600:]}")
    seconds = float(fin.group(1)) / (1000 if fin.group(2) == "ms" else 1)
    total, _, done, ok, failed, errored, timeout = (int(x) for x in reqs.groups())
    out = {
        "seconds": seconds,
        "requests": ok,
        "done": done,
        "rps": float(fin.group(3)),
        "bytes_per_s": float(fin.group(4)) * _SIZE[fin.group(5)],
        "errors": failed + errored + timeout,
        "status": dict(zip(("2xx", "3xx", "4xx", "5xx"), (int(x) for x in codes.groups()))),
        "latency_ms": {},
    }
    lat = re.search(r"^time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", text, re.M)
    if lat:
        v = lat.groups()
        out["latency_ms"] = {"min": float(v[0]) * _TIME_MS[v[1]], "max": float(v[2]) * _TIME_MS[v[3]],
                             "mean": float(v[4]) * _TIME_MS[v[5]]}
    return out


def parse_s_time(text: str) -> dict | None:
    """`openssl s_time`'s result line for its -new pass:
    `2192 connections in 3 real seconds, 331 bytes read per connection` (None when absent)."""
    m = re.search(r"^(\d+) connections in (\d+) real seconds, (\d+) bytes read per connection", text, re.M)
    if not m:
        return None
    return {"connections": int(m.group(1)), "real_seconds": int(m.group(2)), "bytes_per_connection": int(m.group(3))}


# The k6 metrics the report uses (the rest would only bloat report.json).
KEPT_METRICS = {
    "http_req_duration", "http_req_waiting", "http_req_connecting", "ttfb", "http_reqs",
    "data_received", "cache_hit", "checks", "http_req_failed",
}


def flatten_k6(data: dict, wall: float, cpu_s: float, rc: int) -> dict:
    """The parts of a k6 summary the report uses: trends (ms), counters, rates, thresholds."""
    out: dict = {
        "wall_seconds": wall,
        "run_seconds": data["state"]["testRunDurationMs"] / 1000.0,
        "cpu_s": cpu_s,
        "thresholds_ok": rc == 0,
        "failed_thresholds": [],
    }
    for name, m in data["metrics"].items():
        if name not in KEPT_METRICS:
            continue
        v = m["values"]
        if m["type"] == "trend":
            # "p(99.9)" -> "p99.9"; "med" duplicates p(50).
            out[name] = {k.replace("p(", "p").replace(")", ""): x for k, x in v.items() if k != "med"}
        elif m["type"] == "rate":
            out[name] = v["rate"]
        elif m["type"] == "counter":
            out[name] = {"count": v["count"], "rate": v["rate"]}
        for th, res in (m.get("thresholds") or {}).items():
            if not res.get("ok", True):
                out["failed_thresholds"].append(f"{name}: {th}")
    reqs = out.get("http_reqs", {}).get("count", 0)
    out["requests"] = reqs
    out["cpu_us_per_req"] = cpu_s * 1e6 / reqs if reqs else None
    return out
