"""The backends a run's pods run on: one protocol, a local and (later) an Argo implementation."""
