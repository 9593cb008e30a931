"""Build of the optional compiled fast paths (docs/design.md, "The compiled decoders").

Everything else is in pyproject.toml. All five extensions are ``optional``: without a C
compiler and the Python headers the build goes on without them and cdc-relay decodes,
routes and takes delivery reports in pure Python, with the same results (the tests
compare the two paths).
"""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
# The headers the extensions share (one copy of the created_at parse, of the
# OutboxEvent construction, of the slots-dataclass check and of the hand-over of an
# exception to the Python code that words it): a change to one rebuilds its includers,
# and the sdist ships them.
_TIMESTAMP = ["cdc_relay/decoding/_ctimestamp.h"]
_SLOTS = ["cdc_relay/decoding/_cslots.h"]
_DECODER = [*_TIMESTAMP, *_SLOTS, "cdc_relay/decoding/_coutbox.h"]
_RAISE = ["cdc_relay/decoding/_craise.h"]

setup(
    ext_modules=[
        Extension("cdc_relay.decoding._cwal2json", ["cdc_relay/decoding/_cwal2json.c"],
                  depends=_DECODER, extra_compile_args=_FLAGS, optional=True),
        Extension("cdc_relay.decoding._cpgoutput", ["cdc_relay/decoding/_cpgoutput.c"],
                  depends=_DECODER, extra_compile_args=_FLAGS, optional=True),
        Extension("cdc_relay.decoding._croute", ["cdc_relay/decoding/_croute.c"],
                  depends=_SLOTS, extra_compile_args=_FLAGS, optional=True),
        Extension("cdc_relay.sink.kafka._creports", ["cdc_relay/sink/kafka/_creports.c"],
                  depends=[*_SLOTS, *_RAISE], extra_compile_args=_FLAGS, optional=True),
        Extension("cdc_relay.wal.stream._cstream", ["cdc_relay/wal/stream/_cstream.c"],
                  depends=_RAISE, extra_compile_args=_FLAGS, optional=True),
    ],
)
