"""Masking collators, vectorised and seeded per example: subword, whole-word, span, named-entity and noun-phrase
masking with SBO targets (`spans`), and BERTAC's entity spans found with spaCy (`entity_spans`)."""
