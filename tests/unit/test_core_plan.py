"""LocalRoseCluster's core plan: which cores each trainer rank and each rollout worker is bound to."""
from hypothesis import given, settings
from hypothesis import strategies as st

from rose.config import ClusterConfig, ElasticConfig
from rose.runtime.cluster import _core_plan


def test_two_cores_one_rollout_worker_keep_the_trainer_on_the_last_core():
    ranks, rollout = _core_plan(ClusterConfig(num_dedicated=1, cores=(0, 1)))
    assert ranks == [(1,)] and rollout == [(0,)]


def test_the_trainer_takes_every_core_no_rollout_worker_is_bound_to():
    ranks, rollout = _core_plan(ClusterConfig(num_dedicated=2, cores=tuple(range(8))))
    assert rollout == [(0,), (1,)]
    assert ranks == [(2, 3, 4, 5, 6, 7)]


def test_cores_an_elastic_worker_would_take_are_left_to_it():
    cfg = ClusterConfig(num_dedicated=1, cores=tuple(range(4)), policy="elastic", elastic=ElasticConfig(max_extra=2))
    ranks, _ = _core_plan(cfg)
    assert ranks == [(3,)]  # cores 1 and 2 are the on-demand workers'


def test_every_core_taken_by_rollouts_leaves_the_trainer_the_last():
    ranks, rollout = _core_plan(ClusterConfig(num_dedicated=3, cores=(0, 1)))
    assert ranks == [(1,)] and rollout == [(0,), (1,), (0,)]


def test_explicit_trainer_cores_are_split_between_ranks():
    ranks, _ = _core_plan(ClusterConfig(num_dedicated=1, num_trainers=2, cores=(0, 1, 2, 3), trainer_cores=(1, 2, 3)))
    assert ranks == [(1, 3), (2,)]
    ranks, _ = _core_plan(ClusterConfig(num_dedicated=1, num_trainers=3, cores=(0, 1), trainer_cores=(1,)))
    assert ranks == [(1,), (1,), (1,)]  # more ranks than cores: they share


@settings(max_examples=200, deadline=None)
@given(ncores=st.integers(1, 16), dedicated=st.integers(1, 6), trainers=st.integers(1, 4))
def test_the_plan_stays_on_the_host_and_apart_where_cores_allow(ncores, dedicated, trainers):
    cores = tuple(range(ncores))
    ranks, rollout = _core_plan(ClusterConfig(num_dedicated=dedicated, num_trainers=trainers, cores=cores))
    assert len(ranks) == trainers and len(rollout) == dedicated
    assert all(r and set(r) <= set(cores) for r in ranks + rollout)
    held = {c for r in rollout for c in r}
    trainer = [c for r in ranks for c in r]
    if ncores > dedicated:  # a core is left: the trainer never shares one with a rollout worker
        assert not held & set(trainer)
        assert held | set(trainer) == set(cores)  # and no core idles
    if ncores - dedicated >= trainers:  # enough left for a core per rank: no two ranks share one
        assert len(trainer) == len(set(trainer))


def test_a_synchronous_run_gives_the_trainer_every_core_but_the_serving_workers():
    from rose.runtime.cluster import synchronous_cores

    ranks, rollout = _core_plan(synchronous_cores(ClusterConfig(num_dedicated=1, cores=(0, 1))))
    assert ranks == [(0, 1)] and rollout == [(0,)]  # the dedicated worker yields to each train step
    cfg = synchronous_cores(ClusterConfig(num_dedicated=1, num_serving=1, serving_model="m", cores=(0, 1, 2)))
    assert cfg.trainer_cores == (0, 2)  # serving-0 keeps core 1 to itself: it has latency objectives
    assert synchronous_cores(ClusterConfig(cores=(0, 1), trainer_cores=(1,))).trainer_cores == (1,)  # chosen: kept
    # the default pipeline's layout: a dedicated worker on each core, both yielding to the trainer's step
    ranks, rollout = _core_plan(synchronous_cores(ClusterConfig(num_dedicated=2, cores=(0, 1))))
    assert ranks == [(0, 1)] and rollout == [(0,), (1,)]


def test_rose_run_starts_its_cluster_with_the_plan_for_the_run_s_mode():
    import rose
    from rose.runner import local_cluster_config

    cluster = ClusterConfig(num_dedicated=1, cores=(0, 1))
    p = rose.Pipeline(name="p", env="guess", build=lambda step: None, cluster=cluster)
    assert local_cluster_config(p).trainer_cores == (0, 1)
    async_p = rose.Pipeline(name="p", env="guess", build=lambda step: None, staleness=1, cluster=p.cluster)
    assert local_cluster_config(async_p).trainer_cores is None  # rollouts overlap training: cores apart
