"""EveryCycle host runtime: the serving API, its engine and the `everycycle` CLI."""

__version__ = "0.1.0"
