import os

from setuptools import Extension, setup

greeting = os.environ.get("CEXT_GREETING", "hello")
setup(
    ext_modules=[
        Extension(
            "fixture_cext._hello",
            ["src/fixture_cext/_hello.c"],
            define_macros=[("CEXT_GREETING", '"' + greeting + '"')],
        )
    ]
)
