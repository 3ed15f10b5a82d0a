"""Unit tests of the harness's pure parts (no servers, no load):

    python3 -m unittest discover -s loadtests/bench -p 'test_*.py'
"""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
import svg  # noqa: E402
from context import Ratio, Section, Table, med, pair_ratios, trend_median, zipf_draws, zipf_head_share  # noqa: E402
from loadgen import WRK_LUA, LoadGen, flatten_k6, parse_h2load, parse_s_time  # noqa: E402
from procs import (  # noqa: E402
    BenchError, CpuMeter, Registry, RssSampler, descendants, http_get, https_raw_get, instance_counts, is_hit,
    NGINX_BROTLI_MODULE, log_section, make_certificates, nginx_config, replay_counts,
)
from harness import build_kind  # noqa: E402
from scenarios import fragment_delays, swap_link  # noqa: E402


class FragmentDelays(unittest.TestCase):
    def test_spread_over_range_with_slowest_200(self):
        for n in (1, 5, 10, 20):
            d = fragment_delays(n)
            self.assertEqual(len(d), n)
            self.assertEqual(max(d), 200)
            self.assertTrue(all(50 <= x <= 200 for x in d))
        # a permutation of evenly spaced delays: every slot used once
        self.assertEqual(sorted(fragment_delays(5)), [50, 88, 125, 162, 200])

    def test_out_of_order(self):
        d = fragment_delays(10)
        self.assertNotEqual(d, sorted(d))


class Stats(unittest.TestCase):
    def test_pair_ratios_pairwise(self):
        a = [{"rps": 200.0}, {"rps": 90.0}]
        b = [{"rps": 100.0}, {"rps": 100.0}]
        self.assertEqual(pair_ratios(a, b, lambda r: r["rps"]), [2.0, 0.9])

    def test_med_ignores_none(self):
        self.assertEqual(med([3.0, None, 1.0, 2.0]), 2.0)
        self.assertIsNone(med([None]))

    def test_trend_median_per_key(self):
        runs = [{"t": {"p50": 1.0, "p99": 9.0}}, {"t": {"p50": 3.0, "p99": 5.0}}, {"t": {"p50": 2.0, "p99": 7.0}}]
        self.assertEqual(trend_median(runs, "t"), {"p50": 2.0, "p99": 7.0})

    def test_ratio_verdicts(self):
        self.assertTrue(Ratio("a", 1.1, 1.0).ok)
        self.assertFalse(Ratio("a", 0.9, 1.0).ok)
        self.assertTrue(Ratio("a", 1.1, 1.2, higher_is_better=False).ok)
        self.assertFalse(Ratio("a", 1.3, 1.2, higher_is_better=False).ok)
        self.assertIsNone(Ratio("a", 1.3).ok)
        self.assertIsNone(Ratio("a", None, 1.0).ok)


class ZipfShare(unittest.TestCase):
    def test_head_share(self):
        self.assertAlmostEqual(zipf_head_share(2, 1.0, 1), 2 / 3)
        self.assertAlmostEqual(zipf_head_share(10, 0.0, 3), 0.3)  # s = 0: uniform
        self.assertEqual(zipf_head_share(100_000, 0.99, 100_000), 1.0)
        # the YCSB-like mix of the policy section: the top 1 % of 100k URLs get over half the requests
        self.assertGreater(zipf_head_share(100_000, 0.99, 1000), 0.5)
        self.assertLess(zipf_head_share(100_000, 0.99, 1000), 0.7)

    def test_bad_arguments_are_refused(self):
        with self.assertRaises(ValueError):
            zipf_head_share(10, 1.0, 11)
        with self.assertRaises(ValueError):
            zipf_head_share(0, 1.0, 0)


class PathCounter:
    """A loopback HTTP/1.1 server answering 200 to every GET and recording
    the `id` query parameter per client connection."""

    def __init__(self):
        self.ids: dict[tuple, list[int]] = {}
        self.lock = threading.Lock()
        counter = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes

            def do_GET(self):  # noqa: N802 (http.server's name)
                m = re.search(r"[?&]id=(\d+)", self.path)
                if m:
                    with counter.lock:
                        counter.ids.setdefault(self.client_address, []).append(int(m.group(1)))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # wrk drops its connections when it stops

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "PathCounter":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def all_ids(self) -> list[int]:
        with self.lock:
            return [i for seq in self.ids.values() for i in seq]


@unittest.skipUnless(shutil.which("wrk"), "wrk is not installed")
class WrkScripts(unittest.TestCase):
    """The wrk scripts against a local counting server (a second or two each)."""

    def run_report_lua(self, url: str, env: dict[str, str]) -> str:
        p = subprocess.run(["wrk", "-t2", "-c2", "-d1s", "-s", str(WRK_LUA), url + "/"], capture_output=True,
                           text=True, timeout=30, env=dict(os.environ, **env))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("WRK_JSON {", p.stdout)
        return p.stdout

    def test_zipf_mix_follows_the_distribution_and_threads_differ(self):
        n, s = 1000, 0.99
        env = {"WRK_PATHS_COUNT": str(n), "WRK_PATHS_PREFIX": "/static/177?id=", "WRK_PATHS_ZIPF": str(s),
               "WRK_SEED": "42"}
        with PathCounter() as srv:
            self.run_report_lua(srv.url, env)
            ids = srv.all_ids()
            per_connection = [seq for seq in srv.ids.values() if len(seq) >= 20]
        self.assertGreater(len(ids), 300)
        self.assertTrue(all(0 <= i < n for i in ids))
        for k in (1, 10, 100):
            share = sum(1 for i in ids if i < k) / len(ids)
            self.assertAlmostEqual(share, zipf_head_share(n, s, k), delta=0.06, msg=f"top {k}")
        # one connection per thread: each thread draws its own sequence (not the same one
        # shifted by the request wrk draws on its first thread to check the script)
        self.assertEqual(len(per_connection), 2)
        a, b = per_connection
        for shift in (0, 1):
            self.assertNotEqual(a[shift:shift + 19], b[:19])
            self.assertNotEqual(b[shift:shift + 19], a[:19])

    def test_without_zipf_the_ids_are_uniform(self):
        env = {"WRK_PATHS_COUNT": "1000", "WRK_PATHS_PREFIX": "/static/177?id="}
        with PathCounter() as srv:
            self.run_report_lua(srv.url, env)
            ids = srv.all_ids()
        self.assertGreater(len(ids), 300)
        self.assertLess(sum(1 for i in ids if i < 100) / len(ids), 0.2)

    def test_sweep_requests_every_id_once(self):
        n = 3001  # odd: the two wrk threads get unequal shares
        with tempfile.TemporaryDirectory() as d, PathCounter() as srv:
            gen = LoadGen(Registry(Path(d)), "wrk", "k6")
            r = gen.wrk_sweep(srv.url, n, "/static/177?id=", connections=8, timeout=60)
            ids = srv.all_ids()
        self.assertEqual(r["not_ok"], 0)
        self.assertEqual(sorted(set(ids)), list(range(n)))
        # only the last id may be asked for again (a connection that lost the race for it)
        repeated = {i for i in ids if ids.count(i) > 1} if len(ids) != n else set()
        self.assertLessEqual(repeated, {n - 1})
        self.assertEqual(r["requests"], len(ids))
        self.assertLess(r["seconds"], 30)  # it ends when done, not at wrk's -d


class K6Summary(unittest.TestCase):
    def test_flatten_keeps_percentiles_and_failed_thresholds(self):
        data = {
            "state": {"testRunDurationMs": 2500.0},
            "metrics": {
                "http_req_duration": {"type": "trend", "values": {"med": 2, "p(50)": 2, "p(99.9)": 9, "count": 4},
                                      "thresholds": {"p(50)<=1": {"ok": False}}},
                "http_reqs": {"type": "counter", "values": {"count": 4, "rate": 1.6}},
                "checks": {"type": "rate", "values": {"rate": 1.0}},
                "vus": {"type": "gauge", "values": {"value": 1}},
            },
        }
        r = flatten_k6(data, wall=3.0, cpu_s=0.002, rc=99)
        self.assertEqual(r["http_req_duration"], {"p50": 2, "p99.9": 9, "count": 4})
        self.assertEqual(r["run_seconds"], 2.5)
        self.assertEqual(r["requests"], 4)
        self.assertAlmostEqual(r["cpu_us_per_req"], 500.0)
        self.assertFalse(r["thresholds_ok"])
        self.assertEqual(r["failed_thresholds"], ["http_req_duration: p(50)<=1"])
        self.assertNotIn("vus", r)


# h2load 1.52's summary of a timed run (-D), as the tls section reads it.
H2LOAD_OUT = """starting benchmark...
spawning thread #0: 2 total client(s). Timing-based test with 0s of warm-up time and 2s of main duration for measurements.
TLS Protocol: TLSv1.3
Cipher: TLS_AES_256_GCM_SHA384
Server Temp Key: X25519 253 bits
Application protocol: h2

finished in 2.00s, 46797.67 req/s, 734.25MB/s
requests: 93595 total, 93995 started, 93595 done, 93590 succeeded, 5 failed, 0 errored, 0 timeout
status codes: 93590 2xx, 0 3xx, 0 4xx, 5 5xx
traffic: 1.43GB (1539906315) total, 1.61MB (1685190) headers (space savings 94.12%), 1.43GB (1533460480) data
                     min         max         mean         sd        +/- sd
time for request:      410us     49.87ms     14.51ms      4.27ms    70.25%
time for connect:     1.23ms      2.24ms      1.67ms       422us    75.00%
time to 1st byte:     3.28ms      4.91ms      4.03ms       687us    75.00%
req/s           :   20307.17    20404.81    20357.52       38.04    75.00%
"""


class TlsTools(unittest.TestCase):
    def test_h2load_summary(self):
        r = parse_h2load(H2LOAD_OUT)
        self.assertEqual(r["requests"], 93590)  # succeeded only
        self.assertEqual(r["done"], 93595)
        self.assertEqual(r["errors"], 5)
        self.assertEqual(r["status"], {"2xx": 93590, "3xx": 0, "4xx": 0, "5xx": 5})
        self.assertAlmostEqual(r["rps"], 46797.67)
        self.assertAlmostEqual(r["bytes_per_s"], 734.25 * (1 << 20))
        self.assertEqual(r["seconds"], 2.0)
        self.assertAlmostEqual(r["latency_ms"]["min"], 0.41)
        self.assertAlmostEqual(r["latency_ms"]["max"], 49.87)
        self.assertAlmostEqual(r["latency_ms"]["mean"], 14.51)

    def test_h2load_output_without_a_summary_is_an_error(self):
        with self.assertRaises(BenchError):
            parse_h2load("starting benchmark...\nNo protocol negotiated. Aborted.\n")
        # a run cut short in its summary
        with self.assertRaises(BenchError):
            parse_h2load(H2LOAD_OUT.split("status codes")[0])

    def test_s_time_result_line(self):
        out = ("Collecting connection statistics for 4 seconds\n****\n\n"
               "2192 connections in 1.25s; 1753.60 connections/user sec, bytes read 725552\n"
               "2192 connections in 5 real seconds, 331 bytes read per connection\n")
        self.assertEqual(parse_s_time(out), {"connections": 2192, "real_seconds": 5, "bytes_per_connection": 331})
        self.assertIsNone(parse_s_time("ERROR\n40F7...:error:8000006F:system library:BIO_connect:Connection refused\n"))

    def test_zipf_draws_follow_the_distribution_and_are_reproducible(self):
        n, s = 1000, 0.99
        ids = zipf_draws(n, s, 20000, seed=7)
        self.assertEqual(ids, zipf_draws(n, s, 20000, seed=7))
        self.assertNotEqual(ids, zipf_draws(n, s, 20000, seed=8))
        self.assertTrue(all(0 <= i < n for i in ids))
        for k in (1, 10, 100):
            self.assertAlmostEqual(sum(1 for i in ids if i < k) / len(ids), zipf_head_share(n, s, k), delta=0.02)
        self.assertEqual(zipf_draws(1, s, 5), [0] * 5)
        with self.assertRaises(ValueError):
            zipf_draws(0, s, 1)

    def test_nginx_config_caches_and_terminates_tls_like_production(self):
        from procs import TlsFiles
        tls = TlsFiles(Path("/w/tls/ca.pem"), Path("/w/tls/server.pem"), Path("/w/tls/server.key"), "ECDSA P-256")
        conf = nginx_config(prefix=Path("/w/nginx"), port=8443, origin_port=8080, tls=tls)
        for line in ("worker_processes 2;", "access_log off;", "listen 127.0.0.1:8443 ssl http2;",
                     "ssl_certificate /w/tls/server.pem;", "ssl_certificate_key /w/tls/server.key;",
                     "ssl_session_cache shared:SSL:10m;", "ssl_session_tickets on;", "ssl_protocols TLSv1.2 TLSv1.3;",
                     "server 127.0.0.1:8080;", "proxy_cache bench;", "keepalive_requests 1000000;",
                     "add_header X-Cache-Status $upstream_cache_status always;"):
            self.assertIn(line, conf)
        # Nothing is written outside its prefix (the package's /var/lib/nginx, /run are not used).
        paths = re.findall(r"(?<![\w.:/])/[\w./-]+", conf)
        self.assertTrue(paths)
        self.assertEqual([p for p in paths if not p.startswith(("/w/nginx", "/w/tls"))], [])
        self.assertEqual(conf.count("{"), conf.count("}"))
        self.assertIn("worker_processes 4;", nginx_config(prefix=Path("/p"), port=1, origin_port=2, tls=tls, workers=4))

    def test_the_compressing_nginx_is_plain_http_with_gzip_and_brotli(self):
        conf = nginx_config(prefix=Path("/w/nginx"), port=8080, origin_port=8081, tls=None, compress=True)
        self.assertTrue(conf.splitlines()[1].startswith("load_module /usr/lib/nginx/modules/ngx_http_brotli"))
        for line in ("listen 127.0.0.1:8080;", "gzip on;", "brotli on;", "proxy_cache bench;"):
            self.assertIn(line, conf)
        self.assertNotIn("ssl_certificate ", conf)
        self.assertIn("text/html", conf.split("brotli_types")[1].splitlines()[0])
        self.assertNotIn("brotli", nginx_config(prefix=Path("/w"), port=1, origin_port=2, tls=None))

    @unittest.skipUnless((shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK))
                         and NGINX_BROTLI_MODULE.exists(), "nginx or its brotli filter is not installed")
    def test_nginx_accepts_the_compressing_config(self):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        with tempfile.TemporaryDirectory() as d:
            prefix = Path(d)
            conf = prefix / "nginx.conf"
            conf.write_text(nginx_config(prefix=prefix, port=1, origin_port=2, tls=None, compress=True))
            p = subprocess.run([nginx, "-t", "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stderr)

    def test_nginx_hits_marked_as_hits(self):
        self.assertTrue(is_hit({"x-cache-status": "HIT"}))
        self.assertFalse(is_hit({"x-cache-status": "MISS"}))
        self.assertFalse(is_hit({"x-cache-status": "EXPIRED"}))


@unittest.skipUnless(shutil.which("openssl"), "openssl is not installed")
class TlsCertificates(unittest.TestCase):
    """The harness's certificates, served by a local TLS server (Python's ssl)."""

    def test_unknown_key_kind_is_refused(self):
        with tempfile.TemporaryDirectory() as d, self.assertRaises(BenchError):
            make_certificates(Registry(Path(d)), Path(d) / "tls", kind="DSA 1024")

    def test_rsa_certificate_verifies(self):
        self.serve_and_fetch("RSA 2048")

    def test_certificate_verifies_for_127_0_0_1_and_serves_both_request_forms(self):
        self.serve_and_fetch("ECDSA P-256")

    def serve_and_fetch(self, kind: str):
        with tempfile.TemporaryDirectory() as d:
            tls = make_certificates(Registry(Path(d)), Path(d) / "tls", kind=kind)
            key_pem = tls.key.read_text()
            self.assertTrue("BEGIN PRIVATE KEY" in key_pem)
            self.assertIn("BEGIN CERTIFICATE", tls.cert.read_text())
            self.assertEqual(tls.cert.read_text().count("BEGIN CERTIFICATE"), 2)  # leaf, then the CA
            seen: list[str] = []

            class Handler(http.server.BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.0"

                def do_GET(self):  # noqa: N802 (http.server's name)
                    seen.append(f"{self.request_version} host={self.headers.get('Host')}")
                    self.send_response(200)
                    self.send_header("Cache-Status", "inlay; hit")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")

                def log_message(self, *_args):
                    pass

            import ssl
            srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            sctx.load_cert_chain(tls.cert, tls.key)
            srv.socket = sctx.wrap_socket(srv.socket, server_side=True)
            threading.Thread(target=srv.serve_forever, daemon=True).start()
            try:
                url = f"https://127.0.0.1:{srv.server_address[1]}/x"
                status, headers, body = http_get(url, ca=tls.ca)
                self.assertEqual((status, body), (200, b"ok"))
                status, headers, body = https_raw_get(url, tls.ca)
                self.assertEqual((status, body), (200, b"ok"))
                self.assertTrue(is_hit(headers))
                with self.assertRaises(BenchError):
                    http_get(url)  # an https URL without the CA
                # another CA's certificate does not verify
                other = make_certificates(Registry(Path(d)), Path(d) / "other")
                with self.assertRaises(ssl.SSLCertVerificationError):
                    http_get(url, ca=other.ca)
            finally:
                srv.shutdown()
                srv.server_close()
        self.assertEqual(seen, ["HTTP/1.1 host=127.0.0.1:" + url.split(":")[2].split("/")[0], "HTTP/1.0 host=None"])

    @unittest.skipUnless(shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK), "nginx is not installed")
    def test_nginx_accepts_the_rendered_config(self):
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        with tempfile.TemporaryDirectory() as d:
            tls = make_certificates(Registry(Path(d)), Path(d) / "tls")
            prefix = Path(d) / "nginx"
            prefix.mkdir()
            conf = prefix / "nginx.conf"
            conf.write_text(nginx_config(prefix=prefix, port=1, origin_port=2, tls=tls))
            p = subprocess.run([nginx, "-t", "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log")],
                               capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("syntax is ok", p.stderr)


class Hits(unittest.TestCase):
    def test_inlay_and_varnish_hits(self):
        self.assertTrue(is_hit({"cache-status": "inlay; hit; ttl=3599"}))
        self.assertFalse(is_hit({"cache-status": "inlay; fwd=miss; stored"}))
        self.assertTrue(is_hit({"x-varnish": "32770 3"}))
        self.assertFalse(is_hit({"x-varnish": "32770"}))
        self.assertFalse(is_hit({}))


class InlayLogs(unittest.TestCase):
    def test_instance_counts_from_the_reload_line(self):
        line = ("2026-11-28T02:08:21.223627Z  INFO policy instances used policy=headers generation=2 "
                "requests=1000 ran_guest=120 instantiated=3 reused=117")
        self.assertEqual(instance_counts(line),
                         {"requests": 1000, "ran_guest": 120, "instantiated": 3, "reused": 117})
        with self.assertRaises(BenchError):
            instance_counts("policy instances used policy=headers requests=1")

    def test_the_access_log_is_off_unless_a_file_is_given(self):
        import tomllib
        self.assertEqual(tomllib.loads("\n".join(log_section()))["log"], {"level": "info", "access_log": "off"})
        odd = Path('/w/hits "a\\b".log')
        self.assertEqual(tomllib.loads("\n".join(log_section(odd)))["log"]["access_log"], str(odd))

    def test_replay_counts_from_the_reload_line(self):
        line = ("2026-11-24T02:08:21.223627Z  INFO policy hooks replayed from recorded paths policy=headers "
                "generation=2 replayed=12 live=300000 resets=77 bytes=10138236")
        self.assertEqual(replay_counts(line), {"replayed": 12, "live": 300000, "resets": 77, "bytes": 10138236})
        with self.assertRaises(BenchError):
            replay_counts("policy hooks replayed from recorded paths policy=headers replayed=1 live=2")


class PolicyLink(unittest.TestCase):
    def test_swap_link_repoints_the_link(self):
        with tempfile.TemporaryDirectory() as d:
            a, b, link = Path(d) / "a.wasm", Path(d) / "b.wasm", Path(d) / "p" / "headers.wasm"
            a.write_text("a")
            b.write_text("b")
            link.parent.mkdir()
            link.symlink_to(a)
            swap_link(link, b)
            self.assertEqual(link.read_text(), "b")
            swap_link(link, a)
            self.assertEqual(link.read_text(), "a")
            self.assertEqual(sorted(p.name for p in link.parent.iterdir()), ["headers.wasm"])


class BuildKind(unittest.TestCase):
    def test_the_report_says_whether_the_binary_is_the_profile_guided_build(self):
        import hashlib
        with tempfile.TemporaryDirectory() as d:
            inlay, stamp = Path(d) / "inlay", Path(d) / "built-from"
            inlay.write_bytes(b"guided")
            self.assertIn("no profile-guided build recorded", build_kind(inlay, stamp))
            stamp.write_text(f"{'0' * 64} {hashlib.sha256(b'guided').hexdigest()} {'1' * 64}\n")
            self.assertTrue(build_kind(inlay, stamp).startswith("profile-guided"))
            # cargo linked its own build over it since.
            inlay.write_bytes(b"plain")
            self.assertTrue(build_kind(inlay, stamp).startswith("plain release build (`cargo"))
            stamp.write_text("truncated")
            self.assertIn("no profile-guided build recorded", build_kind(inlay, stamp))


class ProcFs(unittest.TestCase):
    def test_cpu_meter_sees_a_busy_child_and_rss_sampler_samples(self):
        # The child burns 0.3 s of its own CPU time (however loaded the machine), says so,
        # and stays alive so /proc can still be read.
        code = ("import sys, time\n"
                "while time.process_time() < 0.3: pass\n"
                "print('done', flush=True)\n"
                "sys.stdin.read()\n")
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            self.assertIn(child.pid, descendants(os.getpid()))
            meter = CpuMeter([child.pid]).start()
            with RssSampler(child.pid, interval=0.02) as s:
                self.assertEqual(child.stdout.readline().strip(), "done")
                time.sleep(0.1)
            used = meter.stop()
        finally:
            child.stdin.close()
            child.wait()
        self.assertGreater(used, 0.2)
        self.assertLess(used, 0.6)
        self.assertGreater(s.max, 1 << 20)
        self.assertGreaterEqual(len(s.samples), 3)

    def test_registry_stops_what_it_started(self):
        with tempfile.TemporaryDirectory() as d:
            reg = Registry(Path(d))
            p = reg.spawn(["sleep", "60"], Path(d) / "log")
            self.assertIn(str(p.pid), (Path(d) / "pids").read_text())
            reg.stop_all()
            self.assertIsNotNone(p.poll())
            self.assertFalse((Path(d) / "pids").exists())


class Svg(unittest.TestCase):
    def parse(self, text: str):
        root = ET.fromstring(text)
        self.assertTrue(root.tag.endswith("svg"))
        return root

    def test_charts_are_well_formed_xml(self):
        self.parse(svg.bar_chart("t <&>", ["a", "b"], {"x": [1.0, None], "y": [3.0, 4.0]}, "ms", log=True))
        self.parse(svg.bar_chart("empty", ["a"], {"x": [None]}, "ms"))
        self.parse(svg.quantile_chart("q", {"s": {"p50": 1.0, "p99": 5.0, "p99.9": 9.0}}))
        self.parse(svg.line_chart("l", {"s": [(0, 1), (1, 3)]}, "s", "MiB", hlines={"limit": 2}))
        root = self.parse(svg.ratio_chart("r", [("a", 1.2, 1.0, True), ("b", 54.0, None, True), ("c", None, 1.0, True),
                                               ("d", 1.5, 1.2, False)]))
        fills = [e.get("fill") for e in root.iter() if e.tag.endswith("rect")]
        self.assertIn("#d62728", fills)  # d misses its lower-is-better target


class Report(unittest.TestCase):
    def test_ratios_first_and_skips_shown(self):
        s1 = Section("a", "Section A", about="about A")
        s1.ratio("A / B", 1.5, 1.0, detail="1 pair")
        s1.tables.append(Table("cap", ["x", "y|z"], [["1", "2"]]))
        s1.plots.append(("a.svg", "plot", svg.bar_chart("p", ["c"], {"s": [1.0]}, "u")))
        s2 = Section("b", "Section B", skipped="no policy")
        meta = {"mode": "quick", "date": "d", "invocation": "i", "elapsed_s": 60, "pairs": 1, "caveat": "c",
                "machine": {"nproc": "2"}, "versions": {"k6": "v1"}, "root": "/r", "workdir": "/w"}
        with tempfile.TemporaryDirectory() as d:
            out = Path(d)
            report.write(out, meta, [s1, s2], ["/r/target/x --config /w/c.toml"], {"c.toml": "dir = \"/w/c\"\n"})
            md = (out / "report.md").read_text()
            self.assertLess(md.index("## Ratios"), md.index("## Section A"))
            self.assertIn("| A / B | 1.50x | >= 1x | met | 1 pair |", md)
            self.assertIn("y\\|z", md)
            self.assertIn("**Skipped:** no policy", md)
            self.assertIn("target/x --config $WORKDIR/c.toml", md)
            self.assertTrue((out / "a.svg").exists() and (out / "ratios.svg").exists())
            self.assertIn('"ratios"', (out / "report.json").read_text())


if __name__ == "__main__":
    unittest.main()
