import pytest

from train import batch_size_at, lr_at


def test_triangle_learning_rate():
    peak = 1e-3
    assert lr_at(0.0, peak) == pytest.approx(0.25e-3)
    assert lr_at(0.5, peak) == pytest.approx(0.75e-3)
    assert lr_at(0.75, peak) == pytest.approx(1e-3)
    assert lr_at(0.875, peak) == pytest.approx(0.5e-3)
    assert lr_at(1.0, peak) == pytest.approx(0.0)
    assert lr_at(1.2, peak) == 0.0


def test_warmup_linear_learning_rate():
    peak = 1e-4
    assert lr_at(0.0, peak, "warmup_linear", 0.1) == 0.0
    assert lr_at(0.05, peak, "warmup_linear", 0.1) == pytest.approx(0.5e-4)
    assert lr_at(0.1, peak, "warmup_linear", 0.1) == pytest.approx(1e-4)
    assert lr_at(0.55, peak, "warmup_linear", 0.1) == pytest.approx(0.5e-4)
    assert lr_at(1.0, peak, "warmup_linear", 0.1) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        lr_at(0.5, peak, "cosine")


def test_batch_size_ramp():
    micro, final = 128, 8192
    assert batch_size_at(0.0, micro, final, 0.6) == 128
    assert batch_size_at(0.3, micro, final, 0.6) == 4096 + 64 - 64  # 128 + 8064/2 = 4160 -> 4096
    assert batch_size_at(0.6, micro, final, 0.6) == 8192
    assert batch_size_at(0.9, micro, final, 0.6) == 8192
    assert batch_size_at(0.5, micro, final, 0.0) == 8192
    sizes = [batch_size_at(i / 100, micro, final, 0.6) for i in range(101)]
    assert all(s % micro == 0 for s in sizes) and sizes == sorted(sizes)
