"""The node agent (one per GPU host). It lands with the agent issue; only the package exists yet."""
