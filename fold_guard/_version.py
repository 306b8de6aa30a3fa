"""fold_guard's version: the one place it is written (``pyproject.toml`` reads it from here), a
leaf module with no imports, so the command's launcher reads it without importing the package."""

__version__ = "0.1.0"
