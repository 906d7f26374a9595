#!/usr/bin/env python3
"""A plain redis-py producer pointed at qbridge's RESP proxy.

Nothing in it knows about qbridge: it LPUSHes JSON jobs {"id": ...} to a
list, exactly as it would against Redis. Moving it behind qbridge is only
a change of REDIS_URL (the proxy's [proxy] listen address); the proxy
forwards the push to Redis and, depending on the route's phase, mirrors it
into Postgres or writes it to Postgres only.

    REDIS_URL=redis://127.0.0.1:6380/0 QUEUE_KEY=queue:jobs COUNT=10 \\
        python3 examples/python/producer.py

Environment: REDIS_URL (default redis://127.0.0.1:6380/0), QUEUE_KEY
(default queue:jobs), COUNT (default 10), ID_PREFIX (default: random; job
ids are "<prefix>-<n>", and the id is the job key of a json:/id route).
"""

import json
import os
import sys
import uuid

import redis

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6380/0")
QUEUE_KEY = os.environ.get("QUEUE_KEY", "queue:jobs")
COUNT = int(os.environ.get("COUNT", "10"))
ID_PREFIX = os.environ.get("ID_PREFIX") or uuid.uuid4().hex[:8]


def main():
    client = redis.Redis.from_url(REDIS_URL)
    for n in range(COUNT):
        # Unique ids: a route's dedup window treats a repeated id as a
        # retry of the same job, not a new one.
        job = {"id": f"{ID_PREFIX}-{n}", "n": n, "task": "send_receipt"}
        client.lpush(QUEUE_KEY, json.dumps(job))
    print(f"pushed {COUNT} jobs to {QUEUE_KEY} (ids {ID_PREFIX}-0..{COUNT - 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
