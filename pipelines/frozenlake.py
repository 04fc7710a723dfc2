"""FrozenLake (gymnasium), a new 4x4 map every episode: walk from the start to the goal around the holes
in at most 8 moves, reading the map each turn. Through the gymnasium adapter (rose/envs/gym.py).

Run:  rose run pipelines/frozenlake.py --json
A tiny Llama is built and warm-started on play that takes a shortest-path move 60 % of the time and
a random one otherwise (cached), then GRPO teaches it to reach the goal more often
(`reward_first5`, `reward_last5` in the summary).
"""
import rose
from rose.graph import Graph, rl_step

# ---- settings
ENV = "frozenlake"  # environment (rose/envs/frozenlake.py)
NUM_GROUPS = 16  # maps per step (GRPO groups)
GROUP_SIZE = 8  # samples per map
STEPS = 20  # ~3 min of steps here; the reward is near its plateau by then
SEED = 0
# A map is 20 tokens, re-read each turn: up to 8 turns fit in 256 tokens of context.
MODEL = rose.ModelConfig(max_model_len=256, warmstart_batch=64)
# float32 engines for the tiny model, as in pipelines/guess.py: they sample from exactly the trainer's weights.
ENGINE = rose.EngineConfig(dtype="float32", temperature=1.0, kv_cache_gib=0.5)
GRPO = rose.GRPOConfig(lr=3e-4, inner_epochs=4, clip=0.2)
CLUSTER = rose.ClusterConfig(num_dedicated=1)


def step_graph(step: int) -> Graph:
    return rl_step(ENV, ENV, NUM_GROUPS, GROUP_SIZE, grpo=GRPO)


PIPELINE = rose.Pipeline(name="frozenlake", env=ENV, build=step_graph, steps=STEPS, seed=SEED, model=MODEL,
                         engine=ENGINE, cluster=CLUSTER)
