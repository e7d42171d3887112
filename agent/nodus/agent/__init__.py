"""The node agent (one per GPU host): inventory, the Connect stream, attempts under supervisors.

Kept import-free: `python -m nodus.agent.supervisor` starts for every attempt and must stay cheap.
"""
