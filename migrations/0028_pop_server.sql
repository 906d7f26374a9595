-- The Redis server (its `run_id`) that handed out the item a pop numbered:
-- the consumer's processing list holding the item lives on that server, so
-- once the server is gone, an item of that pop that never ran went with it.
-- That is the loss evidence for a popped content-hash number, whatever the
-- time the pop was numbered at (it may be numbered after the server died).
-- NULL for pushes, for pops older than this column, for the decommission
-- archive and where the consumer could not read INFO.
ALTER TABLE qbridge.numbered_writes ADD COLUMN server text;
