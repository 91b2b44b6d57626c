-- Back to version 14: flow-control changes are announced by NOTIFY only.
DROP TABLE flow_changes;
DROP TABLE flow_epoch;
