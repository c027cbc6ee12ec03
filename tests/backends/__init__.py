"""The backend contract suite (`contract.py`) and its subclass per backend."""
