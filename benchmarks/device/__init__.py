"""The one device script (`make gpu-check`, `python -m pagedserve.benchmarks.device`): issue 38's checks on a GPU in one
run,
each section time-boxed and written to a results file as it finishes; `--cpu-dry-run` runs the same plumbing on
CPU at toy sizes."""
