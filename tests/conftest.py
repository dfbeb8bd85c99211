"""Shared by every test file."""

import os

# The command line keeps compiled kernels on disk by default (jaxprice/_src/compile_cache.py).
# The tests run it in process and must not write to the user's cache folder nor depend on what
# an earlier run left there; tests/test_compile_cache.py turns it on where it is the subject.
os.environ["JAXPRICE_CACHE_DIR"] = "off"
