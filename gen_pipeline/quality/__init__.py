"""The quality gate's pure checks (no I/O, no async library): a streaming loop detector and the
checks of a finished turn for leaked reasoning and empty or marker-only answers."""

from gen_pipeline.quality.leaks import (
    THINK_MARKERS,
    LeakFinding,
    LeakReason,
    check_turn,
    find_markers,
    is_marker_only,
    strip_markers,
)
from gen_pipeline.quality.repetition import LoopReason, LoopVerdict, RepetitionDetector, tail_loop
from gen_pipeline.quality.thresholds import DEFAULT_LOOP_THRESHOLDS, LoopThresholds

__all__ = [
    "DEFAULT_LOOP_THRESHOLDS", "THINK_MARKERS", "LeakFinding", "LeakReason", "LoopReason", "LoopThresholds",
    "LoopVerdict", "RepetitionDetector", "check_turn", "find_markers", "is_marker_only", "strip_markers", "tail_loop",
]
