"""TEAMS: ELECTRA with multi-word selection, attention task heads and partial layer sharing."""
