from setuptools import Extension, setup

setup(ext_modules=[Extension("fixture_broken", ["broken.c"])])
