"""The scheduler side of rollout placement: the Dask-free placement book (`book`), the Dask scheduler
plugin that feeds it hooks and acts on its records (`plugin`), and the dashboard page (`dashboard`).

Nothing is imported here, so that `rose.runtime.scheduler.book` loads without Dask.
"""
