"""One model sharded over several hosts (mx.distributed): rank 0 serves, the others replay its steps."""
