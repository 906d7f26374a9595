"""An RQ application moving to qbridge. One line is qbridge's (marked), and the
worker class on the command line; the job function is the team's code,
unchanged except its shadow declaration.

    fleet:   QBRIDGE_OUTCOMES=http://127.0.0.1:8080 QBRIDGE_ROUTE=thumbnails \\
             PYTHONPATH=adapters/python:examples/fleets \\
             rq worker -w qbridge_adapters.rq.ReportingWorker thumbnails
    runner:  PYTHONPATH=adapters/python:examples/fleets \\
             python -m qbridge_adapters.runner rq --import rq_app --listen 127.0.0.1:8093
    produce: REDIS_URL=redis://127.0.0.1:6380/0 PYTHONPATH=adapters/python:examples/fleets \\
             python examples/fleets/rq_app.py 10
"""

import os
import sys

from qbridge_adapters import shadow  # qbridge
from redis import Redis
from rq import Queue, Retry


def _size(image_id):
    return {"image": image_id, "size": [128, 128]}


@shadow(_size)  # in shadow, qbridge's runner calls _size: the same answer, no file
def make_thumbnail(image_id):
    # resize and store the image here (the side effect)
    return _size(image_id)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import rq_app

    queue = Queue("thumbnails", connection=Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")))
    for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
        print(queue.enqueue(rq_app.make_thumbnail, i, retry=Retry(max=3)).id)
