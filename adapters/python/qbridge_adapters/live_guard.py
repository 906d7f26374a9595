"""The Redis side does not run a job Postgres owns.

After a rollback below ``postgres_only``, or a lowered flipped share, a
producer's retry of a job qbridge already stored live in Postgres reaches
Redis again, and the fleet would run it a second time. qbridge copies the
keys it holds live into the route's ``qbridge:live:<route>`` sorted set;
the workers ask it (one ``ZSCORE``) before a job runs, and a job found
there is reported as ``skipped`` and not run (Celery: revoked, so it is
acknowledged; RQ: canceled).

When the guard's Redis cannot answer, the job runs as it would without
qbridge, and a warning says so: the guard lives in the broker's own Redis,
so a worker that just received the job from it and cannot ask it is rare,
and failing the job there would lose it (RQ has already popped it).
"""

import logging

log = logging.getLogger("qbridge_adapters")


class LiveGuard:
    """Asks the route's live-key guard; one per process."""

    def __init__(self, settings, reporter, timeout=5.0):
        self.settings = settings
        self.reporter = reporter
        self.timeout = timeout
        self.skipped = 0
        self._redis = None

    def owned(self, key):
        """True when Postgres holds job key ``key`` live; None when the
        guard's Redis did not answer (not evidence either way)."""
        try:
            import redis

            if self._redis is None:
                if not self.settings.redis_url:
                    raise RuntimeError("no Redis URL (QBRIDGE_REDIS_URL)")
                self._redis = redis.Redis.from_url(self.settings.redis_url, socket_timeout=self.timeout)
            return self._redis.zscore(self.settings.live_key, str(key)) is not None
        except Exception as error:  # noqa: BLE001 - reported below, the job runs
            log.warning("qbridge: cannot ask the live-key guard (%s); the job runs", type(error).__name__)
            return None

    def skip(self, key):
        """Reports ``key`` as skipped (the caller does not run it)."""
        self.skipped += 1
        self.reporter.report(key, "skipped")
        log.info("qbridge: skipped a re-push of a job Postgres runs live (%d so far)", self.skipped)
