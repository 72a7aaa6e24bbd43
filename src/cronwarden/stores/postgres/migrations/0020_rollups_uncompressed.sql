-- Version 20: a rollups row (about 3 KB with a full window) stays whole in
-- its page. Over PostgreSQL's default 2 KB target its largest columns were
-- compressed at every write and decompressed at every read of all rows
-- (Store.rollups), more so since migration 19 made the row wider. A row
-- that outgrows a page is still compressed and moved out as before.
ALTER TABLE {s}.rollups SET (toast_tuple_target = 8160);
