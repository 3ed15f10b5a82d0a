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

    def __init__(self, reg: Registry, wrk: str, k6: str):
        self.reg = reg
        self.wrk = wrk
        self.k6 = k6
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
    ) -> dict:
        """One wrk run; returns req/s, bytes/s, latency (ms), errors, CPU µs per request."""
        argv = [
            self.wrk, f"-t{threads}", f"-c{connections}", f"-d{duration:g}s",
            "--timeout", "5s", "-s", str(WRK_LUA), url,
        ]
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
