"""Pretraining spine: data, masking collators, the `--model` recipe registry and the export step."""
