"""The reporter against a real HTTP listener, a real Redis and a real
qbridge schema: batches, the token, never blocking the job, undeliverable
outcomes recorded in the ran set (failed attempts not), the SQL path.

Run by the Rust suite (tests/it/fleet_adapters.rs), which gives
QBRIDGE_TEST_DATABASE_URL (a migrated database) and QBRIDGE_TEST_REDIS_URL.
"""

import time
import unittest

from qbridge_adapters import Reporter, Settings
from qbridge_adapters.settings import SettingsError

from support import DATABASE_URL, Listener, ran, settings


class ReporterTest(unittest.TestCase):
    def test_outcomes_go_in_batches_with_the_token(self):
        listener = Listener()
        s = settings(listener.url, token="s3cret")
        reporter = Reporter(s, batch=100, interval=0.05)
        for i in range(250):
            reporter.report(f"k{i}", "ok", '{"n":1}')
        self.assertTrue(reporter.flush(10))
        reporter.close()
        listener.close()
        sent = [entry for _, _, batch in listener.requests for entry in batch]
        self.assertEqual([e["key"] for e in sent], [f"k{i}" for i in range(250)])
        self.assertTrue(all(len(batch) <= 100 for _, _, batch in listener.requests))
        self.assertTrue(all(path == "/v1/outcomes" for path, _, _ in listener.requests))
        self.assertTrue(all(h.get("authorization") == "Bearer s3cret" for _, h, _ in listener.requests))
        self.assertEqual(sent[0], {"queue": s.queue, "key": "k0", "outcome": "ok", "detail": '{"n":1}'})
        self.assertEqual(reporter.delivered, 250)

    def test_reporting_never_waits_for_a_slow_listener(self):
        listener = Listener(delay=2.0)
        reporter = Reporter(settings(listener.url), batch=10, interval=0.01)
        started = time.monotonic()
        for i in range(1000):
            reporter.report(f"k{i}", "ok")
        self.assertLess(time.monotonic() - started, 0.5)
        listener.close()

    def test_flush_waits_for_the_batch_in_flight(self):
        listener = Listener(delay=0.5)
        reporter = Reporter(settings(listener.url), interval=0.01)
        reporter.report("k1", "ok")
        time.sleep(0.1)  # the batch is on its way, the buffer empty
        self.assertTrue(reporter.flush(5))
        self.assertEqual(reporter.delivered, 1, "flush returned only once it was delivered")
        listener.close()

    def test_what_is_unsent_at_the_deadline_is_recorded_at_once(self):
        listener = Listener(delay=3.0)  # qbridge hangs
        s = settings(listener.url)
        reporter = Reporter(s, interval=0.01)
        reporter.report("k1", "ok")
        reporter.report("k2", "failed")
        time.sleep(0.1)
        self.assertTrue(reporter.flush(0.3))
        self.assertEqual(ran(s), {"k1"})
        listener.close()

    def test_a_result_json_cannot_hold_is_reported_without_a_detail(self):
        from qbridge_adapters import canonical

        self.assertIsNone(canonical({1: "a", "b": 2}))
        listener = Listener()
        reporter = Reporter(settings(listener.url), interval=0.01)
        reporter.report("k1", "ok", canonical({1: "a", "b": 2}))
        self.assertTrue(reporter.flush(5))
        listener.close()
        self.assertEqual(listener.requests[0][2][0].get("detail"), None)

    def test_undeliverable_outcomes_are_recorded_as_run_but_failed_attempts_are_not(self):
        s = settings("http://127.0.0.1:9")  # nothing listens: qbridge is down
        reporter = Reporter(s, interval=0.01, retries=2)
        reporter.report("done-1", "ok", "{}")
        reporter.report("gave-up-1", "dead", "Boom")
        reporter.report("will-retry-1", "failed", "Boom")
        self.assertTrue(reporter.flush(10))
        reporter.close()
        self.assertEqual(ran(s), {"done-1", "gave-up-1"})
        self.assertEqual(reporter.recorded_unknown, 2)
        self.assertEqual(reporter.delivered, 0)

    def test_a_refused_batch_is_recorded_at_once_without_retries(self):
        listener = Listener(status=401)
        s = settings(listener.url)
        reporter = Reporter(s, interval=0.01, retries=5)
        reporter.report("k1", "ok")
        self.assertTrue(reporter.flush(5))
        reporter.close()
        listener.close()
        self.assertEqual(len(listener.requests), 1)
        self.assertEqual(ran(s), {"k1"})

    def test_outcomes_past_the_buffer_are_recorded_as_run_not_dropped(self):
        s = settings("http://127.0.0.1:9")
        reporter = Reporter(s, capacity=5, batch=5, interval=5.0, retries=1)
        for i in range(20):
            reporter.report(f"k{i}", "ok")
        self.assertTrue(reporter.flush(10))
        reporter.close()
        self.assertEqual(ran(s), {f"k{i}" for i in range(20)})
        self.assertEqual(reporter.lost, 0)

    def test_outcomes_over_sql_land_in_qbridges_table(self):
        import psycopg

        self.assertTrue(DATABASE_URL, "set QBRIDGE_TEST_DATABASE_URL to a database qbridge migrated")
        s = settings(DATABASE_URL)
        reporter = Reporter(s, interval=0.01)
        reporter.report("sql-1", "ok", '{"n":1}')
        reporter.report("sql-2", "dead", "Boom")
        self.assertTrue(reporter.flush(10))
        reporter.close()
        with psycopg.connect(DATABASE_URL) as conn:
            rows = conn.execute(
                "SELECT key, outcome, side, digest IS NOT NULL FROM qbridge.outcomes WHERE queue = %s ORDER BY key",
                (s.queue,),
            ).fetchall()
        self.assertEqual(rows, [("sql-1", "ok", "redis", True), ("sql-2", "dead", "redis", True)])
        self.assertEqual(reporter.delivered, 2)


class SettingsTest(unittest.TestCase):
    def test_missing_or_malformed_settings_name_the_variable(self):
        with self.assertRaisesRegex(SettingsError, "QBRIDGE_OUTCOMES is not set"):
            Settings.from_env(env={"QBRIDGE_ROUTE": "r"})
        with self.assertRaisesRegex(SettingsError, "QBRIDGE_OUTCOMES must start with"):
            Settings.from_env(env={"QBRIDGE_OUTCOMES": "qbridge:8080", "QBRIDGE_ROUTE": "r"})
        with self.assertRaisesRegex(SettingsError, "QBRIDGE_ROUTE is not set"):
            Settings.from_env(env={"QBRIDGE_OUTCOMES": "http://q:8080"})
        s = Settings.from_env(env={"QBRIDGE_OUTCOMES": "http://q:8080/", "QBRIDGE_ROUTE": "emails"})
        self.assertEqual((s.outcomes_url, s.queue, s.ran_key), ("http://q:8080/v1/outcomes", "emails", "qbridge:ran:emails"))


if __name__ == "__main__":
    unittest.main()
