"""One path for every outcome a fleet reports: batched, bounded, and never
in the way of the job.

``Reporter.report`` only appends to a bounded buffer (no I/O in the job's
thread); a background thread sends the buffer in batches, over HTTP
(``POST /v1/outcomes``, one transaction per batch) or SQL
(``qbridge.report_outcome``), retrying a few times. What cannot be delivered
— qbridge down, the buffer full — is not dropped silently: the keys of jobs
that finished (ok or dead) are added to the route's ``qbridge:ran:<route>``
set in Redis, the set qbridge's
own consumer keeps, so the diff counts those jobs as run with an unknown
outcome and repair never pushes them back. Only when Redis refuses that too
is a report lost, and then it is counted and logged (counts, never keys or
payloads); with an outside fleet qbridge reads silence as "unknown", never
as "lost", so even then no job runs twice.
"""

import atexit
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections import deque

log = logging.getLogger("qbridge_adapters")

OUTCOMES = ("ok", "failed", "dead", "skipped")

# The outcomes that say a job ran to its end: only these go to the ran set
# when they cannot be delivered (a failed attempt runs again; a skipped job
# never ran).
FINAL = ("ok", "dead")

# A detail longer than this is not sent (the outcome is, without it): one
# large result must not push a batch past the listener's body limit.
MAX_DETAIL = 64 * 1024

# Mirrors qbridge's RAN_RETENTION_MS: how long the ran set remembers a job.
RAN_RETENTION_MS = 7 * 24 * 3600 * 1000


def canonical(value):
    """The text both sides' digests compare: a task's return value as
    compact JSON with sorted keys (``str`` for what JSON cannot hold), or
    None when it cannot be written as JSON at all (keys of mixed types):
    then there is nothing to compare, and reporting still never fails."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError):
        return None


class Reporter:
    """Sends outcomes of one route. Thread-safe; one per process."""

    def __init__(self, settings, capacity=10000, batch=200, interval=0.1, retries=3, timeout=5.0):
        self.settings = settings
        self.capacity = capacity
        self.batch = batch
        self.interval = interval
        self.retries = retries
        self.timeout = timeout
        self.delivered = 0
        self.recorded_unknown = 0
        self.lost = 0
        self._start()
        # A forked child (Celery's prefork pool, RQ's work horse) has a copy
        # of the buffer but not the thread: it starts its own, empty.
        os.register_at_fork(after_in_child=self._start)
        # What is buffered at exit is still sent (or recorded as unknown).
        atexit.register(self.close, 3.0)

    def _start(self):
        self._buffer = deque()
        self._spilled = deque()  # keys only: outcomes that did not fit
        self._in_flight = []  # the batch being sent
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._redis = None
        self._sql = None
        self._thread = threading.Thread(target=self._run, name="qbridge-reporter", daemon=True)
        self._thread.start()

    def report(self, key, outcome, detail=None):
        """Queues one outcome; returns at once. Never raises."""
        try:
            self._queue(key, outcome, detail)
        except Exception as error:  # noqa: BLE001 - a report never fails its job
            log.warning("qbridge: could not queue an outcome (%s)", type(error).__name__)

    def _queue(self, key, outcome, detail):
        if outcome not in OUTCOMES or not key:
            log.warning("qbridge: ignored an outcome that is not ok, failed, dead or skipped")
            return
        entry = {"queue": self.settings.queue, "key": str(key), "outcome": outcome}
        if detail is not None and len(detail) <= MAX_DETAIL:
            entry["detail"] = detail
        with self._lock:
            if len(self._buffer) < self.capacity:
                self._buffer.append(entry)
            elif outcome not in FINAL:
                self.lost += 1  # failed runs again; skipped never ran
            elif len(self._spilled) < self.capacity * 10:
                self._spilled.append(entry["key"])
            else:
                self.lost += 1
        if len(self._buffer) >= self.batch:
            self._wake.set()

    def pending(self):
        with self._lock:
            return bool(self._buffer or self._spilled or self._in_flight)

    def flush(self, deadline=5.0):
        """Sends what is buffered and waits for it, for up to ``deadline``
        seconds. What is still unsent then — qbridge unreachable — is
        recorded in the ran set at once (the finished jobs' keys), so a
        process about to exit (RQ's work horse, a pool child) loses none of
        it silently. True when everything was delivered or recorded."""
        until = time.monotonic() + deadline
        while time.monotonic() < until and self.pending():
            self._wake.set()
            time.sleep(0.02)
        if not self.pending():
            return True
        with self._lock:
            entries = list(self._buffer) + list(self._in_flight)
            spilled = list(self._spilled)
            self._buffer.clear()
            self._spilled.clear()
        final = [e["key"] for e in entries if e["outcome"] in FINAL] + spilled
        log.warning("qbridge: %d outcomes unsent at the deadline; recording them as unknown", len(final))
        return self._record_unknown(final) if final else True

    def close(self, deadline=5.0):
        self.flush(deadline)
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    # The background thread.

    def _run(self):
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            self._drain()
        self._drain()

    def _drain(self):
        while True:
            with self._lock:
                batch = [self._buffer.popleft() for _ in range(min(self.batch, len(self._buffer)))]
                spilled = [self._spilled.popleft() for _ in range(min(self.batch * 10, len(self._spilled)))]
                self._in_flight = batch + [{"key": k, "outcome": "ok"} for k in spilled]
            try:
                self._send(batch, spilled)
            finally:
                with self._lock:
                    self._in_flight = []
            if not batch and not spilled:
                return

    def _send(self, batch, spilled):
        if spilled:
            self._record_unknown(spilled)
        if batch:
            if self._deliver(batch):
                self.delivered += len(batch)
            else:
                # Only a final outcome says the job is done with; a failed
                # attempt runs again and its final outcome is reported then.
                final = [e["key"] for e in batch if e["outcome"] in FINAL]
                self.lost += len(batch) - len(final)
                if final:
                    self._record_unknown(final)

    def _deliver(self, batch):
        for attempt in range(self.retries):
            try:
                if self.settings.over_sql:
                    self._send_sql(batch)
                else:
                    self._send_http(batch)
                return True
            except Exception as error:  # noqa: BLE001 - any failure is retried, then recorded
                why = type(error).__name__
                if isinstance(error, urllib.error.HTTPError) and 400 <= error.code < 500 and error.code not in (408, 429):
                    log.warning("qbridge: outcomes refused (%s %s); recording them as unknown", error.code, why)
                    return False
                if attempt + 1 < self.retries:
                    time.sleep(0.2 * 2**attempt)
                else:
                    log.warning("qbridge: cannot deliver %d outcomes (%s); recording them as unknown", len(batch), why)
        return False

    def _send_http(self, batch):
        request = urllib.request.Request(
            self.settings.outcomes_url, data=json.dumps(batch).encode(), method="POST"
        )
        request.add_header("content-type", "application/json")
        if self.settings.token:
            request.add_header("authorization", f"Bearer {self.settings.token}")
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            response.read()

    def _send_sql(self, batch):
        import psycopg  # only for QBRIDGE_OUTCOMES=postgres://

        if self._sql is None or self._sql.closed:
            self._sql = psycopg.connect(self.settings.outcomes, connect_timeout=max(int(self.timeout), 1))
        try:
            with self._sql.transaction():
                with self._sql.cursor() as cur:
                    cur.executemany(
                        "SELECT qbridge.report_outcome(%s, %s, %s, %s)",
                        [(e["queue"], e["key"], e["outcome"], e.get("detail")) for e in batch],
                    )
        except Exception:
            self._sql.close()
            raise

    def _record_unknown(self, keys):
        """Marks ``keys`` as run in the route's ran set (their outcome is
        unknown to qbridge, but they ran: never pushed back)."""
        try:
            import redis

            if self._redis is None:
                if not self.settings.redis_url:
                    raise RuntimeError("no Redis URL (QBRIDGE_REDIS_URL)")
                self._redis = redis.Redis.from_url(self.settings.redis_url, socket_timeout=self.timeout)
            now = int(time.time() * 1000)
            pipe = self._redis.pipeline(transaction=False)
            pipe.zadd(self.settings.ran_key, {k: now for k in keys})
            pipe.zremrangebyscore(self.settings.ran_key, "-inf", now - RAN_RETENTION_MS)
            pipe.execute()
            self.recorded_unknown += len(keys)
            return True
        except Exception as error:  # noqa: BLE001 - the last resort: count it
            self.lost += len(keys)
            log.warning("qbridge: could not record %d undelivered outcomes in Redis either (%s)", len(keys), type(error).__name__)
            return False
