"""The cluster simulator: the runtime's placement policy, SLO controller, elastic scaler, DAPO driver
decision and sync planner, run over simulated GPUs, serving traces and links (`rose sim CONFIG.toml`)."""
from rose.sim.cluster import Simulation
from rose.sim.config import SIM_POLICIES, SimConfig, load_matrix

__all__ = ["SIM_POLICIES", "SimConfig", "Simulation", "load_matrix"]
