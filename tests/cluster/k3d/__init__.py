"""Tests against a real k3d cluster (`cluster`, with SIMRUN_K3D=1): see test_k3d.py."""
