"""The CPU/GPU decode split controller (fastload.loader.decode_split), driven
by simulated costs: it finds the split a brute-force search over the model
finds, follows a change of costs, and keeps both sides measured."""

import pytest

from fastload.loader.decode_split import DecodeSplit

N = 256


def simulate(split, cpu, prep, gpu, batches):
    """Feeds ``batches`` batches whose images cost ``cpu``, ``prep`` and
    ``gpu`` seconds each (functions of the batch number, or numbers)."""
    at = lambda cost, b: cost(b) if callable(cost) else cost  # noqa: E731
    for b in range(batches):
        g = split.gpu_images(N)
        split.observe(N - g, (N - g) * at(cpu, b), g, g * at(prep, b), g * at(gpu, b))
    return split


def best_rate(workers, cpu, prep, gpu):
    """The highest rate any whole-image split gives, by trying each."""
    return max(1.0 / max(((N - g) * cpu + g * prep) / workers, g * gpu) for g in range(N + 1))


@pytest.mark.parametrize("workers,cpu,prep,gpu", [
    (4, 0.9e-3, 0.05e-3, 0.12e-3),   # few cores: the GPU should take most
    (16, 0.9e-3, 0.05e-3, 0.12e-3),  # many cores: about half each
    (64, 0.9e-3, 0.05e-3, 0.12e-3),  # the CPU alone is faster than the GPU
    (4, 0.9e-3, 0.05e-3, 0.001e-3),  # a GPU far faster than anything: all of it
])
def test_the_split_reaches_the_best_rate_of_the_model(workers, cpu, prep, gpu):
    split = simulate(DecodeSplit("auto", workers), cpu, prep, gpu, batches=40)
    assert split.rate(N) >= 0.97 * best_rate(workers, cpu, prep, gpu)
    assert split.rate(N) >= 0.99 * best_rate(workers, cpu, prep, gpu) or workers == 4
    assert split.rate(N) >= 1.0 / (N * cpu / workers)  # never worse than the CPU alone


def test_more_workers_give_the_gpu_less():
    shares = [simulate(DecodeSplit("auto", w), 0.9e-3, 0.05e-3, 0.12e-3, 40).share
              for w in (2, 4, 8, 16, 32)]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0.7 > 0.2 > shares[-1]


def test_a_gpu_that_slows_down_gets_less_within_a_few_batches():
    # The GPU stage's cost triples at batch 30 (training took the GPU).
    gpu = lambda b: 0.1e-3 if b < 30 else 0.3e-3  # noqa: E731
    split = DecodeSplit("auto", 8)
    simulate(split, 0.9e-3, 0.05e-3, gpu, 30)
    before = split.share
    simulate(split, 0.9e-3, 0.05e-3, lambda b: 0.3e-3, 20)
    assert split.share < 0.6 * before
    assert split.rate(N) >= 0.97 * best_rate(8, 0.9e-3, 0.05e-3, 0.3e-3)


def test_both_sides_stay_measured_in_auto():
    split = simulate(DecodeSplit("auto", 4), 0.9e-3, 0.05e-3, 0.0, 10)
    assert split.share == 1.0
    counts = [split.gpu_images(N) for _ in range(32)]  # one CPU image every 16 batches
    assert sorted(counts) == [N - 1] * 2 + [N] * 30
    split = simulate(DecodeSplit("auto", 1000), 0.9e-3, 0.05e-3, 1.0, 10)
    counts = [split.gpu_images(N) for _ in range(32)]
    assert split.share < 0.01 and sorted(counts) == [0] * 30 + [1] * 2
    assert split.gpu_images(1) in (0, 1)
    # The costs are measured again from those batches: a GPU that became
    # fast is found.
    simulate(split, 0.9e-3, 0.05e-3, 1e-6, 16 * 3 + 5)
    assert split.share > 0.4


def test_fixed_modes_and_the_start():
    assert DecodeSplit("cuda", 4).gpu_images(N) == N
    assert DecodeSplit("cpu", 4).gpu_images(N) == 0
    split = DecodeSplit("auto", 4)
    assert split.gpu_images(N) == N // 2 and split.rate(N) is None
    split.observe(N, 1.0, 0, 0.0, 0.0)  # the GPU side not measured yet: no change
    assert split.share == 0.5
    assert split.as_dict()["mode"] == "auto"
    with pytest.raises(ValueError, match="decode_device must be one of"):
        DecodeSplit("gpu", 4)
