ALTER TABLE {s}.rollups SET (toast_tuple_target = 8160);
