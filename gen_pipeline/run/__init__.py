"""The run: one orchestrator (a job of one or more datasets) and its parts."""

from gen_pipeline.run.job import Job, open_job, run_generate, run_job
from gen_pipeline.run.options import JobSummary, RunOptions, RunSummary
from gen_pipeline.run.progress import Progress
from gen_pipeline.run.setup import run_options

__all__ = ["Job", "JobSummary", "Progress", "RunOptions", "RunSummary", "open_job", "run_generate", "run_job",
           "run_options"]
