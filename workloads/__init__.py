"""Model descriptions and the work they imply: specs, config import, catalog, operator graphs.

This layer imports nothing else of the project.
"""
