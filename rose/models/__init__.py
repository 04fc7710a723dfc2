"""Policy models: check a user's model directory, or build and warm-start the tiny local one."""
from rose.models.loading import check_model_dir, prepare_model

__all__ = ["check_model_dir", "prepare_model"]
