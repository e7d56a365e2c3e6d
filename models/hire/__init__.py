"""HIRE (self-contained: travels with every checkpoint)."""
