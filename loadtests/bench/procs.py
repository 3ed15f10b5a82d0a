"""The processes of a benchmark run: the test origin, inlay and varnishd.

Every process is started in its own session (process group), registered,
and written to a pid file, so the harness (and run.sh's EXIT trap, should
the harness itself die) can stop exactly what it started. CPU time and
resident memory are read from /proc.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"


class BenchError(RuntimeError):
    """A process did not start or a precondition of a measurement failed."""


class Registry:
    """The processes this harness started, and the commands it ran."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.pidfile = workdir / "pids"
        self.procs: list[subprocess.Popen] = []
        self.commands: list[str] = []
        self.configs: dict[str, str] = {}  # generated inlay configs, for the report

    def note_command(self, argv: list[str], env: dict[str, str] | None = None) -> str:
        """Record a command line (with the env vars that matter) for the report."""
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        cmd = (prefix + " " if prefix else "") + shlex.join(argv)
        self.commands.append(cmd)
        return cmd

    def spawn(self, argv: list[str], log: Path) -> subprocess.Popen:
        """Start a long-running server in its own process group, output appended to `log`."""
        self.note_command(argv)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        with self.pidfile.open("a") as f:
            f.write(f"{proc.pid}\n")
        return proc

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 10.0) -> None:
        """Stop one process group: `sig`, then SIGKILL after `wait` seconds."""
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=5)
        # The group may outlive its leader (varnishd's child): end it too.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        """Stop everything still running (on exit, error or signal)."""
        for proc in list(reversed(self.procs)):
            self.stop(proc, wait=5.0)
        try:
            self.pidfile.unlink()
        except FileNotFoundError:
            pass


def free_port() -> int:
    """A TCP port free on loopback right now (for varnishd, which cannot report one)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (varnishd's manager forks the cache child)."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        parent_of[int(entry)] = int(fields[1])
    found = [pid]
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent_of.items() if pp == p]
        found.extend(kids)
        frontier.extend(kids)
    return found


def _stat_cpu(pid: int) -> float:
    """utime + stime of a whole process (live and exited threads), in clock ticks' precision."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()
    # Fields 14 and 15 of stat(5) (utime, stime); index 0 here is field 3.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _schedstat_cpu(pid: int) -> float:
    """Run time of the live threads of a process, in nanoseconds' precision."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


class CpuMeter:
    """CPU seconds used by some processes between start() and stop().

    Per-thread schedstat is precise (ns) but forgets threads that exit;
    /proc/PID/stat counts every thread but in 10 ms ticks. The precise figure
    is used unless it falls short of the coarse one by more than two ticks
    (a thread went away during the run).
    """

    def __init__(self, pids: list[int]):
        self.pids = pids
        self._stat0 = self._sched0 = 0.0

    def start(self) -> "CpuMeter":
        self._stat0 = sum(_stat_cpu(p) for p in self.pids)
        self._sched0 = sum(_schedstat_cpu(p) for p in self.pids)
        return self

    def stop(self) -> float:
        stat = sum(_stat_cpu(p) for p in self.pids) - self._stat0
        sched = sum(_schedstat_cpu(p) for p in self.pids) - self._sched0
        return stat if sched < stat - 2 / CLK_TCK else sched


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RssSampler:
    """Samples a process's resident memory every `interval` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = 0.0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self._t0, rss_bytes(self.pid)))
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssSampler":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def max(self) -> int:
        return max((r for _, r in self.samples), default=0)


def http_get(url: str, timeout: float = 10.0, headers: dict | None = None, ca: Path | None = None):
    """One GET over a fresh connection: (status, headers dict lower-cased, body).

    An https:// URL needs `ca`, the CA file its certificate must verify against."""
    m = re.match(r"(https?)://([^/:]+):(\d+)(/.*)?$", url)
    if not m:
        raise BenchError(f"not a loopback http(s) URL: {url}")
    if m.group(1) == "https":
        if ca is None:
            raise BenchError(f"{url}: an https URL needs the CA of its certificate")
        conn = http.client.HTTPSConnection(m.group(2), int(m.group(3)), timeout=timeout,
                                           context=ssl.create_default_context(cafile=str(ca)))
    else:
        conn = http.client.HTTPConnection(m.group(2), int(m.group(3)), timeout=timeout)
    try:
        conn.request("GET", m.group(4) or "/", headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
    finally:
        conn.close()


def https_raw_get(url: str, ca: Path, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    """`GET PATH HTTP/1.0` with no Host field over a fresh TLS connection, as
    `openssl s_time -www PATH` sends it: (status, headers lower-cased, body)."""
    m = re.match(r"https://([^/:]+):(\d+)(/.*)?$", url)
    if not m:
        raise BenchError(f"not a loopback https URL: {url}")
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((m.group(1), int(m.group(2))), timeout=timeout) as raw:
        with ctx.wrap_socket(raw, server_hostname=m.group(1)) as s:
            s.sendall(f"GET {m.group(3) or '/'} HTTP/1.0\r\n\r\n".encode())
            data = b""
            while len(data) < (1 << 20):
                try:
                    chunk = s.recv(65536)
                except ssl.SSLEOFError:  # closed without close_notify
                    break
                if not chunk:
                    break
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    sm = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    if not sm:
        raise BenchError(f"{url}: not an HTTP response: {lines[0][:100]!r}")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(sm.group(1)), headers, body


def is_hit(headers: dict) -> bool:
    """Inlay's Cache-Status `hit`, Varnish's two ids in X-Varnish, or the bench nginx's
    `X-Cache-Status: HIT` (`$upstream_cache_status`)."""
    if "cache-status" in headers:
        return re.search(r";\s*hit\b", headers["cache-status"], re.I) is not None
    if "x-cache-status" in headers:
        return headers["x-cache-status"].strip().upper() == "HIT"
    return len(headers.get("x-varnish", "").split()) == 2


def wait_log_line(log: Path, proc: subprocess.Popen, pattern: str, timeout: float, since: int = 0) -> re.Match:
    """Wait for a line matching `pattern` in a log file, after byte `since`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = ""
        if log.exists():
            with log.open("rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
        m = re.search(pattern, text)
        if m:
            return m
        if proc.poll() is not None:
            raise BenchError(f"{log.name}: exited with {proc.returncode}: {text.strip()[-800:]}")
        time.sleep(0.005)
    raise BenchError(f"{log.name}: no line matching {pattern!r} within {timeout}s: {tail(log)}")


def wait_listening_line(log: Path, proc: subprocess.Popen, timeout: float, since: int = 0,
                        scheme: str = "http") -> str:
    """Wait for `listening on SCHEME://ADDR` in a log file, after byte `since`; return the URL.

    A restarted inlay appends to the same log, so its old port must not be read.
    """
    return wait_log_line(log, proc, rf"listening on ({scheme}://[0-9.]+:\d+)", timeout, since).group(1)


INSTANCE_COUNTS = ("requests", "ran_guest", "instantiated", "reused")


def instance_counts(line: str) -> dict[str, int]:
    """The counts in inlay's `policy instances used` log line: requests, those that ran guest
    code, instances made and times one was reused."""
    counts = {k: int(v) for k, v in re.findall(r"\b(requests|ran_guest|instantiated|reused)=(\d+)\b", line)}
    if set(counts) != set(INSTANCE_COUNTS):
        raise BenchError(f"unexpected instances log line: {line.strip()[:300]}")
    return counts


def replay_counts(line: str) -> dict[str, int]:
    """The counts in inlay's `policy hooks replayed from recorded paths` log line."""
    counts = {k: int(v) for k, v in re.findall(r"\b(replayed|live|resets|bytes|unreplayed)=(\d+)\b", line)}
    # `unreplayed` (requests run live by choice) is missing from older builds' lines.
    if set(counts) - {"unreplayed"} != {"replayed", "live", "resets", "bytes"}:
        raise BenchError(f"unexpected replay log line: {line.strip()[:300]}")
    return counts


def tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Origin:
    """The test origin (`inlay-origin`), shared by every scenario of a run."""

    def __init__(self, reg: Registry, binary: Path):
        self.log = reg.workdir / "origin.log"
        self.proc = reg.spawn([str(binary), "--listen", f"{LOOPBACK}:0"], self.log)
        self.url = wait_listening_line(self.log, self.proc, 10)
        self.port = int(self.url.rsplit(":", 1)[1])

    def reset(self) -> None:
        http_get(self.url + "/__reset")

    def count(self, path: str) -> int:
        """Requests seen for `path` (without query) since the last reset."""
        return int(http_get(f"{self.url}/__count?path={path}")[2].decode().strip() or 0)

    def total(self) -> int:
        """All requests seen since the last reset."""
        return sum(json.loads(http_get(self.url + "/__counts")[2]).values())

    def pids(self) -> list[int]:
        return [self.proc.pid]


def log_section(access_log: Path | None = None) -> list[str]:
    """The `[log]` lines of a generated inlay config: the access log off, or
    written to the file `access_log` (combined format)."""
    return [
        "[log]",
        # info: the "listening on" line is an info event; no per-request lines.
        'level = "info"',
        f"access_log = {json.dumps('off' if access_log is None else str(access_log))}",
    ]


class Inlay:
    """One `inlay serve` with a generated TOML config."""

    def __init__(
        self,
        reg: Registry,
        binary: Path,
        origin: Origin,
        name: str,
        *,
        memory_size: str = "256MiB",
        cache_dir: Path | None = None,
        disk_size: str = "1GiB",
        esi_concurrency: int | None = None,
        policy: Path | None = None,
        memo_size: str | None = None,
        requests_per_instance: int | None = None,
        replay_always: bool | None = None,
        metrics: bool = True,
        tls: "TlsFiles | None" = None,
        access_log: Path | None = None,
        component: Path | None = None,
    ):
        self.reg = reg
        self.binary = binary
        self.name = name
        self.config = reg.workdir / f"inlay-{name}.toml"
        self.policy = policy
        self.replay = policy is not None and memo_size != "0"  # replay trees kept (memo_size)
        self.cache_dir = cache_dir
        self.log = reg.workdir / f"inlay-{name}.log"
        # With `tls`, one https:// listener only (self.url is https://...).
        self.scheme = "https" if tls is not None else "http"
        self._listen0 = f"https://{LOOPBACK}:0" if tls is not None else f"{LOOPBACK}:0"
        lines = [
            "# Generated by loadtests/bench/harness.py",
            "[server]",
            f'listen = ["{self._listen0}"]',
            "[backends.default]",
            # A wasi:http component served in-process instead of the origin.
            f'component = "{component}"' if component is not None else f'address = "{origin.url}"',
            # A 0.3 component's instance reuse (`requests_per_instance`).
            *([f"requests_per_instance = {requests_per_instance}"]
              if component is not None and requests_per_instance is not None else []),
            *log_section(access_log),
            "[cache]",
            f'memory_size = "{memory_size}"',
        ]
        if cache_dir is not None:
            lines += [f'dir = "{cache_dir}"', f'disk_size = "{disk_size}"']
        if esi_concurrency is not None:
            lines += ["[esi]", f"max_concurrency = {esi_concurrency}"]
        if not metrics:
            lines += ["[metrics]", "enabled = false"]
        if policy is not None and (memo_size is not None or requests_per_instance is not None
                                   or replay_always is not None):
            # Policy settings need the policy in the config, not `--policy`.
            lines += ["[policy]", f'path = "{policy}"']
            if memo_size is not None:
                lines.append(f'memo_size = "{memo_size}"')
            if requests_per_instance is not None:
                lines.append(f"requests_per_instance = {requests_per_instance}")
            if replay_always is not None:
                lines.append(f"replay_always = {str(replay_always).lower()}")
            self.policy = None
        if tls is not None:
            lines += ["[[server.tls]]", f'cert = "{tls.cert}"', f'key = "{tls.key}"']
        self.config.write_text("\n".join(lines) + "\n")
        reg.configs[self.config.name] = self.config.read_text()
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.start()

    def argv(self) -> list[str]:
        argv = [str(self.binary), "serve", "--config", str(self.config)]
        if self.policy is not None:
            argv += ["--policy", str(self.policy)]
        return argv

    def start(self) -> float:
        """Start (or restart, on the same config and cache dir); returns seconds to listening."""
        log = self.log
        if self.url:
            # A restart listens where the first start did: clients send Host with the
            # port, and Host is part of the cache key.
            addr = self.url if self.scheme == "https" else self.url.removeprefix("http://")
            self.config.write_text(self.config.read_text().replace(f'"{self._listen0}"', f'"{addr}"'))
        since = log.stat().st_size if log.exists() else 0
        t0 = time.monotonic()
        self.proc = self.reg.spawn(self.argv(), log)
        self.url = wait_listening_line(log, self.proc, 30, since, self.scheme)
        return time.monotonic() - t0

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc else []

    def reload_policy(self, timeout: float = 120) -> dict:
        """SIGHUP: inlay loads its policy file again. Returns once the new policy serves,
        with the outgoing generation's counts: `instances` (requests, ran_guest, instantiated,
        reused) and, when replay is on, `replay` (replayed, live, resets, bytes)."""
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"inlay {self.name} is not running")
        since = self.log.stat().st_size
        self.reg.note_command(["kill", "-HUP", str(self.proc.pid)])
        self.proc.send_signal(signal.SIGHUP)
        m = wait_log_line(self.log, self.proc, r"policy reloaded|policy reload refused[^\n]*", timeout, since)
        if m.group(0) != "policy reloaded":
            raise BenchError(f"inlay {self.name}: {m.group(0)}")
        # Both logged right after "policy reloaded" (the second unless there are no replay trees).
        m = wait_log_line(self.log, self.proc, r"policy instances used.*", 5, since)
        counts: dict = {"instances": instance_counts(m.group(0)), "replay": None}
        if self.replay:
            try:
                m = wait_log_line(self.log, self.proc, r"policy hooks replayed from recorded paths.*", 5, since)
                counts["replay"] = replay_counts(m.group(0))
            except BenchError:
                pass
        return counts

    def log_count(self, text: str) -> int:
        """How many lines of this inlay's log contain `text`."""
        try:
            with self.log.open(errors="replace") as f:
                return sum(text in line for line in f)
        except OSError:
            return 0

    def stop(self) -> None:
        if self.proc is not None:
            self.reg.stop(self.proc)
            self.proc = None

    def kill9(self) -> None:
        """SIGKILL, as a crash: no shutdown path runs."""
        if self.proc is not None:
            self.reg.stop(self.proc, sig=signal.SIGKILL)
            self.proc = None


class Varnish:
    """One foreground varnishd with a scenario VCL from loadtests/varnish/."""

    def __init__(self, reg: Registry, varnishd: str, vcl_dir: Path, origin: Origin, vcl: str, storage: str = "malloc,256m"):
        self.reg = reg
        self.dir = reg.workdir / f"varnish-{vcl.removesuffix('.vcl')}-{len(reg.commands)}"
        self.dir.mkdir(mode=0o755)
        # The VCLs include "backend.vcl", written here for this run's origin port.
        (self.dir / "backend.vcl").write_text(
            f'backend default {{ .host = "{LOOPBACK}"; .port = "{origin.port}"; }}\n'
        )
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        argv = [
            varnishd, "-F",
            "-a", f"{LOOPBACK}:{self.port}",
            "-f", str(vcl_dir / vcl),
            "-n", str(self.dir / "n"),
            "-p", f"vcl_path={self.dir}:{vcl_dir}",
            "-s", storage,
        ]
        self.log = self.dir / "varnishd.log"
        self.proc = reg.spawn(argv, self.log)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"varnishd exited with {self.proc.returncode}: {tail(self.log, 15)}")
            try:
                http_get(self.url + "/resp?cc=no-store", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise BenchError(f"varnishd did not answer within 30s: {tail(self.log)}")
                time.sleep(0.05)

    def pids(self) -> list[int]:
        return descendants(self.proc.pid) if self.proc.poll() is None else []

    def stop(self) -> None:
        self.reg.stop(self.proc)


@dataclass(frozen=True)
class TlsFiles:
    """A test CA and a server certificate for 127.0.0.1 it signed (PEM files)."""

    ca: Path
    cert: Path  # the server certificate, then the CA (the chain a server sends)
    key: Path
    kind: str  # e.g. "ECDSA P-256"


# openssl arguments of the key kinds the harness can make.
KEY_KINDS = {
    "ECDSA P-256": ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    "RSA 2048": ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
}


def make_certificates(reg: Registry, directory: Path, kind: str = "ECDSA P-256", openssl: str = "openssl") -> TlsFiles:
    """Make a CA and a server certificate for IP 127.0.0.1 and `localhost` with the
    openssl CLI; every key of kind `kind`. Files are world-readable (nginx's workers
    and varnishd run unprivileged; the keys are throwaway test keys)."""
    if kind not in KEY_KINDS:
        raise BenchError(f"unknown key kind {kind!r}: {', '.join(KEY_KINDS)}")
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    ca_key, ca, key, csr, leaf, chain, ext = (directory / n for n in (
        "ca.key", "ca.pem", "server.key", "server.csr", "server-only.pem", "server.pem", "server.ext"))
    ext.write_text("basicConstraints = critical, CA:FALSE\n"
                   "keyUsage = critical, digitalSignature, keyEncipherment\n"
                   "extendedKeyUsage = serverAuth\n"
                   "subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    steps = [
        [openssl, "genpkey", *KEY_KINDS[kind], "-out", str(ca_key)],
        [openssl, "req", "-x509", "-new", "-key", str(ca_key), "-sha256", "-days", "30",
         "-subj", "/CN=Inlay bench CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", str(ca)],
        [openssl, "genpkey", *KEY_KINDS[kind], "-out", str(key)],
        [openssl, "req", "-new", "-key", str(key), "-subj", "/CN=127.0.0.1", "-out", str(csr)],
        [openssl, "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
         "-sha256", "-days", "30", "-extfile", str(ext), "-out", str(leaf)],
    ]
    for argv in steps:
        reg.note_command(argv)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise BenchError(f"{shlex.join(argv[:3])} failed ({p.returncode}): {p.stderr.strip()[-400:]}")
    chain.write_text(leaf.read_text() + ca.read_text())
    for f in (ca, chain, key):
        os.chmod(f, 0o644)
    return TlsFiles(ca=ca, cert=chain, key=key, kind=kind)


# Debian's libnginx-mod-http-brotli-filter (ensure-deps.sh bench installs it).
NGINX_BROTLI_MODULE = Path("/usr/lib/nginx/modules/ngx_http_brotli_filter_module.so")
# What the compressing nginx compresses: the types of Inlay's default `compression.types`.
NGINX_COMPRESS_TYPES = ("text/html text/css text/plain text/xml text/javascript application/javascript "
                        "application/json application/xml image/svg+xml application/wasm")


def nginx_compression() -> str:
    """`gzip on` and the brotli filter, both at their default levels (gzip 1, br 6), for the
    compression section: nginx compresses each response as it sends it, hits included."""
    return f"""    gzip on;
    gzip_types {NGINX_COMPRESS_TYPES};
    gzip_vary on;
    gzip_proxied any;
    brotli on;
    brotli_types {NGINX_COMPRESS_TYPES};
"""


def nginx_config(*, prefix: Path, port: int, origin_port: int, tls: TlsFiles | None, workers: int = 2,
                 compress: bool = False) -> str:
    """The bench nginx: TLS (1.2 and 1.3, h2 by ALPN) with a session cache and tickets as a
    production server has them, `proxy_cache` in front of the origin, no access log. Without
    `tls`, plain HTTP/1.1; with `compress`, gzip and the brotli filter (`nginx_compression`).

    nginx 1.22 (Debian 12) takes `listen ... ssl http2` (`http2 on` is 1.25.1+).
    `keepalive_requests` is raised from its default of 1000 (which also bounds the
    requests of an h2 connection) so that neither load generator reconnects in a run:
    Inlay has no such limit, and a reconnect would measure a handshake."""
    load = f"load_module {NGINX_BROTLI_MODULE};\n" if compress else ""
    listen = (f"""        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {tls.cert};
        ssl_certificate_key {tls.key};""" if tls is not None else f"        listen 127.0.0.1:{port};")
    return f"""# Generated by loadtests/bench/harness.py
{load}worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{
    worker_connections 16384;
}}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    default_type application/octet-stream;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy_temp;
    fastcgi_temp_path {prefix}/fastcgi_temp;
    uwsgi_temp_path {prefix}/uwsgi_temp;
    scgi_temp_path {prefix}/scgi_temp;
    proxy_cache_path {prefix}/cache levels=1:2 keys_zone=bench:64m max_size=2g inactive=1h use_temp_path=off;
    upstream origin {{
        server 127.0.0.1:{origin_port};
        keepalive 64;
    }}
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_prefer_server_ciphers off;
    ssl_session_cache shared:SSL:10m;
    ssl_session_timeout 1h;
    ssl_session_tickets on;
{nginx_compression() if compress else ""}    server {{
{listen}
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_cache bench;
            proxy_cache_lock on;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
    }}
}}
"""


class Nginx:
    """One foreground nginx (master and `workers` workers) with `nginx_config`."""

    def __init__(self, reg: Registry, nginx: str, origin: Origin, tls: TlsFiles | None, name: str = "tls",
                 workers: int = 2, compress: bool = False):
        self.reg = reg
        self.dir = reg.workdir / f"nginx-{name}"
        self.dir.mkdir(mode=0o755)
        self.tls = tls
        self.port = free_port()
        self.url = f"{'https' if tls is not None else 'http'}://{LOOPBACK}:{self.port}"
        self.config = self.dir / "nginx.conf"
        self.config.write_text(nginx_config(prefix=self.dir, port=self.port, origin_port=origin.port,
                                            tls=tls, workers=workers, compress=compress))
        reg.configs[f"nginx-{name}/nginx.conf"] = self.config.read_text()
        self.log = self.dir / "nginx.log"
        argv = [nginx, "-p", str(self.dir), "-c", str(self.config), "-e", str(self.dir / "error.log"),
                "-g", "daemon off;"]
        self.proc = reg.spawn(argv, self.log)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"nginx exited with {self.proc.returncode}: {tail(self.log, 15)} "
                                 f"{tail(self.dir / 'error.log', 15)}")
            try:
                http_get(self.url + "/resp?cc=no-store", timeout=2, ca=tls.ca if tls is not None else None)
                break
            except (OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise BenchError(f"nginx did not answer within 30s: {tail(self.dir / 'error.log')}")
                time.sleep(0.05)

    def pids(self) -> list[int]:
        return descendants(self.proc.pid) if self.proc.poll() is None else []

    def stop(self) -> None:
        self.reg.stop(self.proc)


def ensure_world_readable_dirs(path: Path) -> None:
    """varnishd's compiler and child run as an unprivileged user: let them in."""
    for p in [path, *path.parents]:
        if str(p) in ("/", "/tmp"):
            break
        os.chmod(p, os.stat(p).st_mode | 0o755)
