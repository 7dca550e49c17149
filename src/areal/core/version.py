"""areal's version, in the kernel so that the plugin listing can name it without importing the
package's front door (``areal/__init__`` imports the adapters' entry point)."""

__version__ = "0.1.0"
