"""Build of the optional compiled decoders (docs/design.md, "The compiled decoders").

Everything else is in pyproject.toml. All three extensions are ``optional``: without a C
compiler and the Python headers the build goes on without them and cdc-relay decodes
in pure Python, with the same results (the tests compare the two paths).
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        Extension("cdc_relay.decoding._cwal2json", ["cdc_relay/decoding/_cwal2json.c"],
                  extra_compile_args=_FLAGS, optional=True),
        Extension("cdc_relay.decoding._cpgoutput", ["cdc_relay/decoding/_cpgoutput.c"],
                  extra_compile_args=_FLAGS, optional=True),
        Extension("cdc_relay.decoding._ctimestamp", ["cdc_relay/decoding/_ctimestamp.c"],
                  extra_compile_args=_FLAGS, optional=True),
    ],
)
