"""Small-scale reproductions of each paper's key comparison (`python repro/run.py EXPERIMENT --budget ...`)."""
