-- Which Redis server took a push (issue 13, the blind second before a quick
-- restart). qbridge observes each route's Redis once a second and Redis
-- reports its uptime in whole seconds, so a push acknowledged in the last
-- second before a restart had no evidence that the server which took it is
-- gone. The pushes qbridge makes or forwards now learn the server's run_id
-- with the push itself (the producer's push script reads it; the proxy reads
-- it once per upstream connection, before the splice), and record here the
-- latest push each server acknowledged. A server that took a push at T was
-- still up at T: when it is not the current server any more, every copy
-- pushed by T that Redis does not hold was lost with it.
--
-- Recorded in the transaction of the writes it is evidence for (a mirror
-- batch, an outbox payment), so concurrent writers must not queue on one
-- row: each write updates one of 32 slots per server, picked at random, and
-- readers take the latest over the slots.
CREATE TABLE qbridge.redis_run_acks (
    route    text        NOT NULL,
    run_id   text        NOT NULL,
    slot     smallint    NOT NULL,
    last_ack timestamptz NOT NULL,
    PRIMARY KEY (route, run_id, slot)
);

-- Copies of identical texts repair pushed back on a text's evidence (fresh
-- numbers, not holes), with when. A restart's evidence for a text is a count
-- — the copies pushed before it that no pop had taken by then — and each copy
-- pushed back after it uses one up; without this record every later repair
-- found the same count and pushed back the next missing copy as well, so
-- texts ran under more keys than they were pushed (oracle seeds 50674,
-- 50814). Pruned with the job keys, after the route's dedup window.
CREATE TABLE qbridge.text_repushes (
    queue text        NOT NULL,
    key   text        NOT NULL,
    at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX text_repushes_at_idx ON qbridge.text_repushes (queue, at);
