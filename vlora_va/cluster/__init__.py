"""Cluster mode on Ray: placement, actors, controller (issue 30)."""
