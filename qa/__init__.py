"""Extractive question answering harness for every zoo model and any transformers encoder."""
