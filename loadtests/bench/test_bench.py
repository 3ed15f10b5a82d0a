"""Unit tests of the harness's pure parts (no servers, no load):

    python3 -m unittest discover -s loadtests/bench -p 'test_*.py'
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report  # noqa: E402
import svg  # noqa: E402
from context import Ratio, Section, Table, med, pair_ratios, trend_median  # noqa: E402
from loadgen import flatten_k6  # noqa: E402
from procs import CpuMeter, Registry, RssSampler, descendants, is_hit  # noqa: E402
from scenarios import fragment_delays  # noqa: E402


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


class Hits(unittest.TestCase):
    def test_inlay_and_varnish_hits(self):
        self.assertTrue(is_hit({"cache-status": "inlay; hit; ttl=3599"}))
        self.assertFalse(is_hit({"cache-status": "inlay; fwd=miss; stored"}))
        self.assertTrue(is_hit({"x-varnish": "32770 3"}))
        self.assertFalse(is_hit({"x-varnish": "32770"}))
        self.assertFalse(is_hit({}))


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
