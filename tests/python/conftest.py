"""Shared setup of the Python package's tests (ctest label `python`; README "From Python").

Calls do not tune (DEUTERON_AUTOTUNE_EFFORT=none: the default config) unless a test asks, and
kernels compile into a cache of this test run's own unless DEUTERON_CACHE_DIR names one
(scripts/test.sh sets it to the build's test cache).
"""
import atexit
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

os.environ.setdefault("DEUTERON_AUTOTUNE_EFFORT", "none")
if "DEUTERON_CACHE_DIR" not in os.environ:  # a private cache, removed when the session ends
    os.environ["DEUTERON_CACHE_DIR"] = tempfile.mkdtemp(prefix="deuteron-pytest-cache-")
    atexit.register(shutil.rmtree, os.environ["DEUTERON_CACHE_DIR"], ignore_errors=True)

import deuteron  # noqa: E402  (after the environment it reads)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def softmax_ref(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rms_norm_ref(x, w, eps):
    x = np.asarray(x, dtype=np.float64)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1) + eps)
    return x * rstd[:, None] * np.asarray(w, dtype=np.float64), rstd


@pytest.fixture(scope="session")
def kernel_library(tmp_path_factory):
    """tests/python/kernel_library built as a user would: find_package(deuteron) against this
    build installed into a fresh prefix ($DEUTERON_BUILD_DIR, set by ctest), then loaded."""
    build_dir = os.environ.get("DEUTERON_BUILD_DIR")
    if not build_dir:
        pytest.fail("DEUTERON_BUILD_DIR is not set: run through ctest (-L python), or set it to a "
                    "configured and built Deuteron build folder")
    cmake = os.environ.get("DEUTERON_CMAKE", "cmake")
    work = tmp_path_factory.mktemp("kernel_library")
    prefix, build = work / "prefix", work / "build"

    def step(*cmd):
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"

    step(cmake, "--install", build_dir, "--prefix", prefix)
    step(cmake, "-S", os.path.join(HERE, "kernel_library"), "-B", build, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix}")
    step(cmake, "--build", build)
    return deuteron.load(build / "libmykernels.so")
