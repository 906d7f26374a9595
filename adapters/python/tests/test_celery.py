"""The Celery adapter: the runner's answers for Celery tasks, as qbridge's
http (and command) handler — done, retry, failed for good, each shadow
declaration — and the reporter on a real Celery worker consuming a real
Redis, with the signals of the Celery release installed."""

import json
import os
import subprocess
import sys
import unittest
import uuid

import celery_tasks as tasks
import redis
from qbridge_adapters import celery as celery_adapter
from qbridge_adapters import runner
from qbridge_adapters.answer import Outcome
from support import REDIS_URL, Listener, sent, settings, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


def celery_payload(name, args=(), kwargs=None, task_id="t-1"):
    """A Celery message as qbridge stores it: the envelope and its body."""
    return {"envelope": {"headers": {"task": name, "id": task_id, "retries": 0}},
            "body": [list(args), kwargs or {}, {}]}


def answer(fn, *args):
    try:
        return fn(*args)
    except Outcome as outcome:
        return outcome.status, outcome.body


class CeleryRunnerTest(unittest.TestCase):
    def run_task(self, payload, mode="live", attempt=1):
        return answer(celery_adapter.run_job, tasks.app, payload, mode, attempt, "t-1")

    def test_a_task_runs_with_its_id_and_args_and_answers_its_result(self):
        tasks.CALLS.clear()
        self.assertEqual(self.run_task(celery_payload("t.add", (2, 3))), (200, "5"))
        self.assertEqual(tasks.CALLS, [("add", "t-1", 0)])
        self.assertEqual(self.run_task(celery_payload("t.add", (2, 3)), attempt=3), (200, "5"))
        self.assertEqual(tasks.CALLS[-1], ("add", "t-1", 2), "request.retries counts qbridge's earlier attempts")

    def test_retries_follow_celerys_rules_then_fail_for_good(self):
        self.assertEqual(self.run_task(celery_payload("t.retrying"), attempt=1), (503, "Flaky"))
        self.assertEqual(self.run_task(celery_payload("t.retrying"), attempt=2), (503, "Flaky"))
        self.assertEqual(self.run_task(celery_payload("t.retrying"), attempt=3), (422, "Flaky"))
        self.assertEqual(self.run_task(celery_payload("t.auto"), attempt=1), (503, "Flaky"))
        self.assertEqual(self.run_task(celery_payload("t.auto"), attempt=2), (422, "Flaky"))
        self.assertEqual(self.run_task(celery_payload("t.broken")), (422, "ValueError"))
        self.assertEqual(self.run_task(celery_payload("t.custom_base"), attempt=1), (503, "Flaky"))
        self.assertEqual(self.run_task(celery_payload("t.custom_base"), attempt=2), (422, "Flaky"))
        self.assertEqual(self.run_task(celery_payload("t.ignored")), (204, ""))

    def test_bad_jobs_fail_for_good_with_a_short_reason(self):
        self.assertEqual(self.run_task(celery_payload("t.nope")), (422, "unknown task 't.nope'"))
        payload = celery_payload("t.add")
        payload["body"] = None  # a pickled body qbridge could not read
        self.assertEqual(self.run_task(payload)[0], 422)

    def test_shadow_runs_only_what_the_task_declares(self):
        tasks.CALLS.clear()
        self.assertEqual(self.run_task(celery_payload("t.add", (2, 3)), "shadow"), (200, "5"))
        self.assertEqual(self.run_task(celery_payload("t.skip"), "shadow"), (204, ""))
        status, body = self.run_task(celery_payload("t.plain"), "shadow")
        self.assertEqual(status, 422)
        self.assertIn("refuses shadow", body)
        self.assertEqual(tasks.CALLS, [], "no task ran in shadow")

    def test_the_command_form_answers_with_its_exit_code(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)]))

        def command(payload, mode="live", attempt=1):
            env.update(QBRIDGE_MODE=mode, QBRIDGE_ATTEMPT=str(attempt), QBRIDGE_JOB_KEY="t-1")
            done = subprocess.run(
                [sys.executable, "-m", "qbridge_adapters.runner", "celery", "--app", "celery_tasks:app", "--command"],
                input=json.dumps(payload).encode(), capture_output=True, env=env, cwd=HERE, timeout=60,
            )
            return done.returncode, done.stdout.decode()

        self.assertEqual(command(celery_payload("t.add", (1, 1))), (0, "2"))
        self.assertEqual(command(celery_payload("t.retrying"))[0], runner.EXIT_RETRY)
        self.assertEqual(command(celery_payload("t.broken"))[0], runner.EXIT_DEAD)


class CeleryReporterTest(unittest.TestCase):
    """``report_outcomes`` on a real worker (Celery's own test worker, solo
    pool) consuming a real Redis: each outcome as the signals of this
    Celery release deliver it."""

    def test_a_worker_reports_ok_retried_and_dead_by_task_id(self):
        from celery.contrib.testing.worker import start_worker

        from qbridge_adapters import Reporter

        listener = Listener()
        reporter = Reporter(settings(listener.url), interval=0.02)
        celery_adapter.report_outcomes(tasks.app, reporter=reporter)
        queue = "qbt_" + uuid.uuid4().hex[:10]
        with start_worker(tasks.app, pool="solo", perform_ping_check=False, queues=[queue], logfile=os.devnull):
            ok = tasks.add.apply_async((2, 3), queue=queue)
            retried = tasks.retrying.apply_async(queue=queue)
            broken = tasks.broken.apply_async(queue=queue)
            ids = {ok.id, retried.id, broken.id}
            final = lambda: {e["key"] for e in sent(listener) if e["outcome"] != "failed"}  # noqa: E731
            wait_until("three final outcomes", lambda: reporter.flush(1) and final() == ids, timeout=60)
        listener.close()
        by_key = {}
        for entry in sent(listener):
            by_key.setdefault(entry["key"], []).append((entry["outcome"], entry.get("detail")))
        self.assertEqual(by_key[ok.id], [("ok", "5")])
        self.assertEqual(by_key[retried.id], [("failed", "Retry"), ("failed", "Retry"), ("dead", "Flaky")])
        self.assertEqual(by_key[broken.id], [("dead", "ValueError")])


class CeleryLiveGuardTest(unittest.TestCase):
    """A task whose id Postgres holds live is revoked before it runs and
    reported as skipped; the task beside it runs."""

    def test_a_task_postgres_owns_is_skipped_and_reported(self):
        from celery.contrib.testing.worker import start_worker

        from qbridge_adapters import Reporter

        listener = Listener()
        s = settings(listener.url)
        reporter = Reporter(s, interval=0.02)
        celery_adapter.report_outcomes(tasks.app, reporter=reporter)
        queue = "qbt_" + uuid.uuid4().hex[:10]
        owned_id = "owned-" + uuid.uuid4().hex
        conn = redis.Redis.from_url(REDIS_URL)
        conn.zadd(s.live_key, {owned_id: 1})
        self.addCleanup(conn.delete, s.live_key)
        with start_worker(tasks.app, pool="solo", perform_ping_check=False, queues=[queue], logfile=os.devnull):
            owned = tasks.add.apply_async((1, 1), queue=queue, task_id=owned_id)
            fresh = tasks.add.apply_async((2, 2), queue=queue)
            keys = lambda: {e["key"] for e in sent(listener)}  # noqa: E731
            wait_until("both tasks handled", lambda: reporter.flush(1) and keys() >= {owned.id, fresh.id}, timeout=60)
        listener.close()
        by_key = {}
        for entry in sent(listener):
            by_key.setdefault(entry["key"], []).append((entry["outcome"], entry.get("detail")))
        self.assertEqual(by_key[owned.id], [("skipped", None)])
        self.assertEqual(by_key[fresh.id], [("ok", "4")])


class CeleryReporterSettingsTest(unittest.TestCase):
    """``report_outcomes(app)`` where the app is created: the producers and
    qbridge's runner import that module too and need no reporter settings;
    a worker does, and stops at once without them."""

    APP = (
        "from celery import Celery\n"
        "from qbridge_adapters.celery import report_outcomes\n"
        "app = Celery('reporting_app', broker={broker!r})\n"
        "report_outcomes(app)\n"
        "@app.task\n"
        "def add(a, b):\n"
        "    return a + b\n"
    )

    def run_with_app(self, args, timeout=60):
        import tempfile

        from support import REDIS_URL

        with tempfile.TemporaryDirectory() as where:
            with open(os.path.join(where, "reporting_app.py"), "w") as f:
                f.write(self.APP.format(broker=REDIS_URL))
            env = {k: v for k, v in os.environ.items() if not k.startswith("QBRIDGE_")}
            env["PYTHONPATH"] = os.pathsep.join([where, os.path.dirname(HERE)])
            return subprocess.run([sys.executable, *args], cwd=where, env=env, capture_output=True, timeout=timeout)

    def test_a_producer_imports_the_app_without_reporter_settings(self):
        done = self.run_with_app(["-c", "import reporting_app; print(reporting_app.add.name)"])
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        self.assertEqual(done.stdout.decode().strip(), "reporting_app.add")

    def test_a_worker_without_reporter_settings_stops_with_the_reason(self):
        queue = "qbt_" + uuid.uuid4().hex[:10]
        done = self.run_with_app(["-m", "celery", "-A", "reporting_app", "worker", "--pool", "solo", "-Q", queue])
        output = (done.stdout + done.stderr).decode()
        self.assertNotEqual(done.returncode, 0, output)
        self.assertIn("qbridge reporter: QBRIDGE_OUTCOMES is not set", output)


if __name__ == "__main__":
    unittest.main()
