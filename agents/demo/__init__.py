"""The bundled demo: a course catalogue with tools, and the scripted policy that plays all demo tasks."""
