"""A ROSE worker's side: the worker plugin (`plugin.py`), the host it holds for its role (`host.py`,
`rollout.py`, `trainer.py`; serving workers' in `rose.runtime.coserve.host`) and the process tweaks
it makes when it starts (`process.py`). The preload `rose.worker` installs the plugin."""
