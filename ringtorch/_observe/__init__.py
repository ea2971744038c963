"""Seeing inside a running job, at a cost nobody notices: the flight recorder (recorder.py)
that every rank keeps of its last operations, the running totals of the end-of-job summary
(totals.py, summary.py), the hang report (hang_ask.py asks the ranks, hang_report.py merges
their answers), and the timeline (trace.py, clock.py, trace_merge.py, trace_run.py). It knows
no tensors and imports no torch, so the launcher can merge what the ranks write; the layers
that run operations (collectives, RPC, DDP) feed it."""
