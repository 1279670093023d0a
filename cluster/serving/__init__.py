"""The model side on Ray Serve: a run config's ``serve`` section as a Serve application (scripted, vLLM, or an
external endpoint), session-sticky routing, and the RL controls (pause, resume, weights, prefix cache)."""
