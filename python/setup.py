"""pip install ./python (no package index needed: pip install --no-index
--no-build-isolation ./python with Debian's python3-setuptools, pybind11-dev, cmake and
g++). CMake builds the extension from python/CMakeLists.txt, which takes the library
from the checkout this folder is in."""
import os
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        build = os.path.abspath(self.build_temp)
        os.makedirs(build, exist_ok=True)
        subprocess.run(["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                        "-DPython3_EXECUTABLE=" + sys.executable], check=True)
        subprocess.run(["cmake", "--build", build, "--target", "_sluice", "-j%d" % (os.cpu_count() or 1)],
                       check=True)
        built = os.path.join(build, "sluice", os.path.basename(self.get_ext_fullpath(ext.name)))
        if not os.path.exists(built):
            sys.exit("sluice: CMake did not build the extension (python3-dev, pybind11-dev and the image "
                     "libraries are needed: scripts/deps.sh)")
        os.makedirs(out, exist_ok=True)
        self.copy_file(built, self.get_ext_fullpath(ext.name))


setup(
    name="sluice",
    version="0.1.0",
    description="Pipelines that keep GPUs fed: the Python module of the sluice C++ toolkit",
    packages=["sluice"],
    ext_modules=[CMakeExtension("sluice._sluice")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
)
