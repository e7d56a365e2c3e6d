"""Two-tower cloze language model (self-contained: travels with every checkpoint)."""
