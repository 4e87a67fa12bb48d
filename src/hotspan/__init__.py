"""hotspan: continuous profiling for Python services, linked to their traces."""

__version__ = "0.1.0"
