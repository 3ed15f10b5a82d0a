"""The SDK and the Python ports, natively with the in-memory host.

Run (``policies/build-lang.sh py --test`` does, with the bindings):
``PYTHONPATH=<bindings>:guest-sdk/python python -m unittest discover -s guest-sdk/python/tests``
"""

import importlib.util
import pathlib
import unittest

from inlay_policy import Action, CacheSettings, HostError, builtin, cookie, export, Policy, remove_cookie
from inlay_policy.testing import Host, Request, Response

POLICIES = pathlib.Path(__file__).resolve().parents[3] / "policies"


def load(folder: str):
    """A policy's ``app`` module under a unique name."""
    spec = importlib.util.spec_from_file_location(folder.replace("-", "_"), POLICIES / folder / "app.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


headers = load("headers-py")
ab_test = load("ab-test-py")


class SdkTest(unittest.TestCase):
    def setUp(self):
        self.host = Host.install()

    def test_builtin_recv(self):
        self.assertEqual(builtin.recv(Request()), Action.LOOKUP)
        self.assertEqual(builtin.recv(Request(method="POST")), Action.PASS)
        self.assertEqual(builtin.recv(Request(headers=[("Cookie", "a=1")])), Action.PASS)

    def test_cookies_like_the_rust_sdk(self):
        req = Request(headers=[("cookie", "a=1; inlay_ab=b"), ("cookie", "c=3")])
        self.assertEqual(cookie(req, "inlay_ab"), "b")
        self.assertIsNone(cookie(req, "zz"))
        self.assertTrue(remove_cookie(req, "inlay_ab"))
        self.assertEqual(req.header_all("cookie"), ["a=1; c=3"])
        self.assertFalse(remove_cookie(req, "inlay_ab"))
        self.assertTrue(remove_cookie(req, "a") and remove_cookie(req, "c"))
        self.assertIsNone(req.header("cookie"))

    def test_synthetic_actions(self):
        action = Action.synthetic(403, {"Content-Type": "text/plain"}, "no")
        self.assertEqual(action.value.status, 403)
        self.assertEqual(action.value.headers, [("content-type", "text/plain")])
        self.assertEqual(action.value.body, b"no")
        self.assertEqual(Action.redirect(301, "/n").value.headers, [("location", "/n")])

    def test_export_defaults_and_logs_exceptions(self):
        class Boom(Policy):
            def on_deliver(self, req, resp):
                raise ValueError("bad")

        handler = export(Boom)()
        self.assertEqual(handler.on_request(Request(method="PUT")), Action.PASS)
        settings = CacheSettings(True, 60, 0, 0, ["k"], False)
        self.assertIs(handler.on_backend_response(Request(), Response(), settings), settings)
        with self.assertRaises(ValueError):
            handler.on_deliver(Request(), Response())
        self.assertEqual(self.host.logs, [("error", "policy on_deliver raised ValueError: bad")])

    def test_only_hooks_left_to_their_default_tell_the_host(self):
        class Recv(Policy):
            # Written by the policy, even though it ends in the default.
            def on_request(self, req):
                return super().on_request(req)

        handler = export(Recv)()
        handler.on_request(Request())
        self.assertEqual(self.host.default_hooks, [])
        handler.on_deliver(Request(), Response())
        handler.on_backend_response(Request(), Response(), CacheSettings(True, 60, 0, 0, [], False))
        self.assertEqual(self.host.default_hooks, ["on-deliver", "on-backend-response"])

    def test_host_errors_raise(self):
        with self.assertRaises(HostError):
            Request().set_url("no-slash")


class HeadersTest(unittest.TestCase):
    def setUp(self):
        self.host = Host.install()
        self.policy = headers.Handler()

    def test_tracking_params_are_removed_and_others_keep_order(self):
        strip = headers.strip_tracking_params
        self.assertEqual(strip("/p?b=2&utm_source=x&a=1&fbclid=y&UTM_Medium=z&gclid=q&c"), "/p?b=2&a=1&c")
        self.assertEqual(strip("/p?utm_source=x&gclid=1"), "/p")
        for url in ["/", "/p?", "/p?a=1&&b=2", "/p?utm=1&fbclidx=2&xgclid=3"]:
            self.assertIsNone(strip(url), url)

    def test_on_request_rewrites_then_applies_builtin_rules(self):
        req = Request(url="/a?utm_source=news&id=3")
        self.assertEqual(self.policy.on_request(req), Action.LOOKUP)
        self.assertEqual(req.url(), "/a?id=3")
        post = Request(method="POST", url="/a?fbclid=1")
        self.assertEqual(self.policy.on_request(post), Action.PASS)
        self.assertEqual(post.url(), "/a")

    def test_on_deliver_hides_server_details(self):
        resp = Response(headers=[("Server", "nginx"), ("X-Powered-By", "PHP"), ("Content-Type", "text/html")])
        self.policy.on_deliver(Request(), resp)
        self.assertEqual(resp.headers(), [("content-type", "text/html"), ("x-inlay-policy", "headers")])


class AbTestTest(unittest.TestCase):
    def setUp(self):
        self.host = Host.install()
        self.policy = ab_test.Handler()

    def test_cookie_bucket_is_kept_and_cached(self):
        for bucket in "ab":
            req = Request(headers=[("cookie", f"inlay_ab={bucket}")])
            self.assertEqual(self.policy.on_request(req), Action.LOOKUP)
            self.assertEqual(req.header("x-ab-bucket"), bucket)
            self.assertEqual(req.cache_key_data, [f"ab={bucket}"])
            self.assertIsNone(req.header("cookie"))
            resp = Response()
            self.policy.on_deliver(req, resp)
            self.assertIsNone(resp.header("set-cookie"))

    def test_new_client_gets_a_stable_bucket_and_a_cookie(self):
        req = Request(client_ip="198.51.100.7", headers=[("user-agent", "Firefox")])
        self.policy.on_request(req)
        bucket = ab_test.assign_bucket("198.51.100.7", "Firefox")
        self.assertEqual(req.header("x-ab-bucket"), bucket)
        resp = Response()
        self.policy.on_deliver(req, resp)
        self.assertEqual(resp.header("set-cookie"), f"inlay_ab={bucket}; Path=/; Max-Age=2592000; SameSite=Lax")

    def test_client_cannot_fake_the_marker(self):
        req = Request(headers=[("cookie", "inlay_ab=a"), ("x-ab-new", "1")])
        self.policy.on_request(req)
        resp = Response()
        self.policy.on_deliver(req, resp)
        self.assertIsNone(resp.header("set-cookie"))

    def test_assignment_spreads_over_both_buckets(self):
        a = sum(ab_test.assign_bucket(f"10.0.0.{i}", "ua") == "a" for i in range(200))
        self.assertTrue(60 <= a <= 140, a)


if __name__ == "__main__":
    unittest.main()
