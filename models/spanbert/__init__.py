"""SpanBERT (self-contained: travels with every checkpoint)."""
