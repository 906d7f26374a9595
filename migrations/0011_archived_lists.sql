-- Decommission stores every Redis list it archives exactly once. It first
-- renames each list to a name of its own (qbridge:archiving:<route>:<id>,
-- qbridge:archiving-gap:…, qbridge:archiving-dead:…); the row for that name
-- is inserted in the same transaction as the list's items, so a second run
-- — overlapping with the first, or after a failure between the commit and
-- the list's deletion — finds the row and stores nothing again. Job keys
-- alone cannot tell: items without an id are numbered by occurrence, and a
-- second store of the same bytes would be a new job. (0010 is reserved.)
CREATE TABLE qbridge.archived_lists (
    route       text        NOT NULL,
    list        text        NOT NULL,
    items       integer     NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, list)
);
