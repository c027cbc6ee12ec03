"""The pure domain of simrun: workflows, plugins, events and their fold, plans, the store layout."""

__version__ = "0.1.0"
