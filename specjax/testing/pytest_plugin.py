"""A pytest fixture for the lossless check. In a `conftest.py`:

    pytest_plugins = ["specjax.testing.pytest_plugin"]

and in a test:

    def test_my_decoder_is_lossless(lossless):
        lossless(my_sampler, sampling=SamplingParams(0.7, top_p=0.9))

`lossless` is `specjax.testing.assert_lossless`: it raises AssertionError with the verdict table
when the sampler's samples are inconsistent with the target's exact law, and returns the report.
"""

from __future__ import annotations

import pytest

from specjax.testing.check import assert_lossless

__all__ = ["lossless"]


@pytest.fixture
def lossless():
    return assert_lossless
