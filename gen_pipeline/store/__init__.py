"""A dataset folder on disk: shards, manifest, lock, rank parts, telemetry; exactly-once resume."""
