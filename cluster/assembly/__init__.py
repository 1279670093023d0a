"""The composition root above the worker: ``FarmAssembly`` (``farm_assembly``) joins or starts Ray, serves the
model, starts the backend and closes them in reverse; every entry point opens a farm through it."""

from cluster.assembly.farm_assembly import FarmAssembly

__all__ = ["FarmAssembly"]
