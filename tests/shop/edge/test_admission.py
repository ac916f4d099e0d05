"""The process's gate (shop/edge/admission.py): per product once full, bounded by the threads but one."""

from __future__ import annotations

import pytest

from shop.edge import admission


@pytest.fixture
def four_threads(settings):
    settings.SHOP = {**settings.SHOP, "MAX_WAITING": 2}
    admission.serve_with_threads(4)
    yield
    admission.serve_with_threads(None)


def test_a_full_gate_refuses_the_crowded_product_and_lets_another_in_up_to_the_spare_threads(four_threads):
    assert admission.enter([1]) and admission.enter([1])  # product 1's crowd fills the gate (2)
    try:
        assert admission.full() and admission.crowded([1]) and not admission.crowded([2])
        assert not admission.enter([1]) and not admission.enter([1, 2])  # its buyers: busy
        assert admission.enter([2])  # another product: as if nothing were going on
        try:
            assert admission.crowded([3]) and not admission.enter([3])  # the threads but one are taken
        finally:
            admission.leave([2])
        assert not admission.crowded([2])
    finally:
        admission.leave([1])
        admission.leave([1])
    assert admission.waiting() == 0 and not admission.crowded([1])
