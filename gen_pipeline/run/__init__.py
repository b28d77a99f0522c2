"""The run: one orchestrator (a job of one or more datasets) and its parts."""
