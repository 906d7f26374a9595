"""The RQ adapter: the runner's answers for RQ jobs — done, retry, failed
for good, each shadow declaration — and the reporting worker classes on a
real RQ worker. Jobs are real: enqueued with RQ into a real Redis and read
back as qbridge mirrors them (the rq:job hash in the payload)."""

import base64
import os
import unittest
import uuid
from unittest import mock

import redis
from rq import Queue, Retry

import rq_jobs as tasks
from qbridge_adapters import rq as rq_adapter
from qbridge_adapters.answer import Outcome
from support import REDIS_URL, Listener, sent, settings


def answer(fn, *args):
    try:
        return fn(*args)
    except Outcome as outcome:
        return outcome.status, outcome.body


class RqRunnerTest(unittest.TestCase):
    def setUp(self):
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.queue = Queue("qbt_" + uuid.uuid4().hex[:10], connection=self.redis)

    def mirrored(self, job):
        """The payload qbridge stores for an RQ item: the id and its hash."""
        fields = {}
        for field, value in self.redis.hgetall(f"rq:job:{job.id}").items():
            try:
                fields[field.decode()] = value.decode()
            except UnicodeDecodeError:
                fields[field.decode()] = {"base64": base64.b64encode(value).decode()}
        return {"rq_job_id": job.id, "rq_job": fields}

    def run_job(self, payload, mode="live", attempt=1):
        return answer(rq_adapter.run_job, self.redis, payload, mode, attempt, payload["rq_job_id"])

    def test_a_job_runs_its_function_with_its_args(self):
        job = self.queue.enqueue(tasks.rq_job, 7)
        tasks.CALLS.clear()
        self.assertEqual(self.run_job(self.mirrored(job)), (200, '{"n":7}'))
        self.assertEqual(tasks.CALLS, [("rq", job.id)], "get_current_job() is the job")
        self.assertEqual(self.run_job(self.mirrored(job), "shadow"), (200, '{"n":7}'))
        self.assertEqual(len(tasks.CALLS), 1, "the dry run ran instead")

    def test_retries_follow_the_jobs_retry_then_fail_for_good(self):
        job = self.queue.enqueue(tasks.rq_failing, retry=Retry(max=2))
        payload = self.mirrored(job)
        self.assertEqual(self.run_job(payload, attempt=1), (503, "Flaky"))
        self.assertEqual(self.run_job(payload, attempt=2), (503, "Flaky"))
        self.assertEqual(self.run_job(payload, attempt=3), (422, "Flaky"))
        plain = self.mirrored(self.queue.enqueue(tasks.rq_failing))
        self.assertEqual(self.run_job(plain), (422, "Flaky"))
        status, body = self.run_job(plain, "shadow")
        self.assertEqual(status, 422)
        self.assertIn("refuses shadow", body)

    def test_an_item_without_its_hash_fails_for_good(self):
        self.assertEqual(self.run_job({"rq_job_id": "x"})[0], 422)



class RqReporterTest(unittest.TestCase):
    """``ReportingSimpleWorker`` as a burst worker of the installed RQ:
    each outcome as this RQ release hands the job to its handlers."""

    def setUp(self):
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.queue = Queue("qbt_" + uuid.uuid4().hex[:10], connection=self.redis)
        self.listener = Listener()
        self.settings = settings(self.listener.url)
        rq_adapter._Reporting._qbridge = None
        self.addCleanup(setattr, rq_adapter._Reporting, "_qbridge", None)
        self.addCleanup(self.listener.close)

    def work(self):
        env = {"QBRIDGE_OUTCOMES": self.listener.url, "QBRIDGE_ROUTE": self.settings.route}
        with mock.patch.dict(os.environ, env):
            worker = rq_adapter.ReportingSimpleWorker([self.queue], connection=self.redis)
            worker.work(burst=True, logging_level="CRITICAL")
        self.assertTrue(rq_adapter._Reporting._qbridge.flush(10))
        by_key = {}
        for entry in sent(self.listener):
            by_key.setdefault(entry["key"], []).append((entry["outcome"], entry.get("detail")))
        return by_key

    def test_a_worker_reports_ok_retried_and_dead_by_job_id(self):
        ok = self.queue.enqueue(tasks.rq_ok, 3)
        retried = self.queue.enqueue(tasks.rq_failing, retry=Retry(max=1))
        dead = self.queue.enqueue(tasks.rq_failing)
        by_key = self.work()
        self.assertEqual(by_key[ok.id], [("ok", '{"n":3}')])
        self.assertEqual(by_key[retried.id], [("failed", "Flaky"), ("dead", "Flaky")])
        self.assertEqual(by_key[dead.id], [("dead", "Flaky")])

    def test_a_job_postgres_owns_is_skipped_canceled_and_reported(self):
        owned = self.queue.enqueue(tasks.rq_ok, 1)
        fresh = self.queue.enqueue(tasks.rq_ok, 2)
        self.redis.zadd(self.settings.live_key, {owned.id: 1})
        self.addCleanup(self.redis.delete, self.settings.live_key)
        by_key = self.work()
        self.assertEqual(by_key[owned.id], [("skipped", None)])
        self.assertEqual(by_key[fresh.id], [("ok", '{"n":2}')])
        owned.refresh()
        self.assertEqual(owned.get_status(), "canceled")
        self.assertEqual(rq_adapter._Reporting._guard.skipped, 1)

    def test_a_job_that_returns_retry_is_reported_as_rq_treats_it(self):
        job = self.queue.enqueue(tasks.rq_asks_retry)
        by_key = self.work()
        if hasattr(rq_adapter.Worker, "handle_job_retry"):
            # RQ 2+: a returned Retry runs the job again, up to its max.
            self.assertEqual(by_key[job.id], [("failed", "Retry"), ("dead", "Retry")])
        else:
            # RQ 1.x: a returned value is the job's result, whatever it is.
            self.assertEqual([outcome for outcome, _ in by_key[job.id]], ["ok"])


if __name__ == "__main__":
    unittest.main()
