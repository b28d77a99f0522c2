"""The run: one orchestrator (a job of one or more datasets) and its parts.

    setup.py        configs → options → checks → opened datasets (run_options, open_datasets)
    job.py          the job: the one task group (open_job, run_job, run_generate)
    dataset_run.py  one dataset's part: store, feed, dispatcher, writer, stats, telemetry
    connect.py      the job's side of the server: its model, start or attach, the load poller
    dispatch.py     Window + Dispatcher: exactly-target dispatch through the controller's window
    writer.py       results → the store, in batches, with periodic commits
    stats.py        throughput, failures by reason, the fatal streak, the load seen
    shutdown.py     SIGINT/SIGTERM/SIGHUP: drain, then cancel
    progress.py     the display of a RunSnapshot: a tqdm bar or log lines
    chat.py         the chat client: one conversation in, a Sample or Failure out
    options.py      RunOptions, RunSummary, JobSummary
"""

from gen_pipeline.run.job import Job, open_job, run_generate, run_job
from gen_pipeline.run.options import JobSummary, RunOptions, RunSummary
from gen_pipeline.run.progress import Progress
from gen_pipeline.run.setup import run_options

__all__ = ["Job", "JobSummary", "Progress", "RunOptions", "RunSummary", "open_job", "run_generate", "run_job",
           "run_options"]
