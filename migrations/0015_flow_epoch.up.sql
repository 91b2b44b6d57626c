-- Flow-control changes carry an epoch (version 15).
--
-- SetLimit (when the new limits may hold back jobs the old ones allowed)
-- and Pause (for types not paused yet) add one to the single row of
-- flow_epoch and record the new epoch against each type they changed in
-- flow_changes, in their own transaction. The row lock on flow_epoch
-- orders epochs by commit: a reader that saw epoch E and later sees E' > E
-- finds every type changed in between as flow_changes.epoch > E, none
-- missed. Working processes read it every second while they hold jobs
-- claimed ahead (prefetched) and give back those of the changed types, so
-- a lowered limit or a pause binds them within a second even when the
-- NOTIFY that says so is lost (poll-only mode, a listener reconnecting).
--
-- Rolling upgrade: processes of version 14 keep working against this
-- schema; their SetLimit and Pause do not record an epoch, so processes of
-- version 15 hear of those changes by NOTIFY only, as before.
CREATE TABLE flow_epoch (
    one   boolean PRIMARY KEY DEFAULT true CHECK (one),
    epoch bigint  NOT NULL
);
INSERT INTO flow_epoch (epoch) VALUES (0);

CREATE TABLE flow_changes (
    type  text   PRIMARY KEY,
    epoch bigint NOT NULL
);
