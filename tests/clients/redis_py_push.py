"""Pushes JSON jobs through the qbridge RESP proxy with redis-py, the way a
Python producer (RQ, Celery, hand-rolled) would: single LPUSHes, a pipelined
batch, and a MULTI/EXEC transaction.

Usage: redis_py_push.py <port> <key> <id-prefix> <count>
Prints one line "pushed <n>" and exits 0; exits 3 if redis-py is missing
(the test runs it with .venv's python, where scripts/test-deps.sh installs it).
"""

import json
import sys

try:
    import redis
except ImportError:
    print("redis-py is not installed", file=sys.stderr)
    sys.exit(3)


def main():
    port, key, prefix, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = redis.Redis(host="127.0.0.1", port=int(port), socket_timeout=10)
    items = [json.dumps({"id": f"{prefix}-{i}", "args": [i, "\u00e9"]}) for i in range(count)]
    third = count // 3
    pushed = 0
    for item in items[:third]:
        pushed += 1 if client.lpush(key, item) > 0 else 0
    pipe = client.pipeline(transaction=False)
    for item in items[third : 2 * third]:
        pipe.rpush(key, item)
    pushed += sum(1 for n in pipe.execute() if n > 0)
    tx = client.pipeline(transaction=True)
    for item in items[2 * third :]:
        tx.lpush(key, item)
    pushed += sum(1 for n in tx.execute() if n > 0)
    print(f"pushed {pushed}")


if __name__ == "__main__":
    main()
