"""fold_guard's release number: a leaf module (no imports), so that the command's launcher can read
it without importing the package (whose import loads TVM)."""

__version__ = "0.1.0"
