-- Which side numbered a write (issue 13): a mirrored push or a pop. Repair
-- counts, per text, the copies pushed before a Redis restart that no pop had
-- taken by then: the copies the restart can have lost. Identical copies are
-- interchangeable, so that count — not any one key's push time — is the
-- evidence for a content-hash route (pops after the restart take the lost
-- copies' numbers by count).
ALTER TABLE qbridge.numbered_writes
    ADD COLUMN side text CHECK (side IN ('push', 'pop'));
-- Push writes carry the mirror request's id and the item's index
-- (`<id>.<n>`); pops carry a bare id.
UPDATE qbridge.numbered_writes
   SET side = CASE WHEN position('.' IN write_id) > 0 THEN 'push' ELSE 'pop' END;
