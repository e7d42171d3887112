"""Nodus: run GPU work to completion. The customer CLI and the program-side helpers live here."""
