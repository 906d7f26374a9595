"""The runner's answers for Celery tasks and RQ jobs, as qbridge's http
(and command) handler: done, retry, failed for good, and each shadow
declaration. RQ jobs are real: enqueued with RQ into a real Redis and read
back as qbridge mirrors them (the rq:job hash in the payload)."""

import base64
import json
import os
import subprocess
import sys
import unittest
import uuid

import redis
from rq import Queue, Retry

import tasks
from qbridge_adapters import celery as celery_adapter
from qbridge_adapters import runner
from qbridge_adapters import rq as rq_adapter
from qbridge_adapters.answer import Outcome

REDIS_URL = os.environ.get("QBRIDGE_TEST_REDIS_URL", "redis://127.0.0.1:6379")
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
                [sys.executable, "-m", "qbridge_adapters.runner", "celery", "--app", "tasks:app", "--command"],
                input=json.dumps(payload).encode(), capture_output=True, env=env, cwd=HERE, timeout=60,
            )
            return done.returncode, done.stdout.decode()

        self.assertEqual(command(celery_payload("t.add", (1, 1))), (0, "2"))
        self.assertEqual(command(celery_payload("t.retrying"))[0], runner.EXIT_RETRY)
        self.assertEqual(command(celery_payload("t.broken"))[0], runner.EXIT_DEAD)


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


if __name__ == "__main__":
    unittest.main()
