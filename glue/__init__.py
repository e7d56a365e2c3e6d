"""GLUE fine-tuning harness for every zoo model and any transformers encoder."""
