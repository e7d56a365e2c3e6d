"""Installs the folders at the repository root under one import name, `encoder_zoo`: `models/` becomes
`encoder_zoo.models`, `training/` `encoder_zoo.training`, and so on, so no generic top-level name (`models`,
`training`) lands in site-packages. Everything else is declared in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = ("models", "training", "glue", "qa", "hub_cards", "repro")

setup(
    packages=[f"encoder_zoo.{name}" for name in find_packages(include=[f"{root}*" for root in ROOTS])],
    package_dir={f"encoder_zoo.{root}": root for root in ROOTS},
)
