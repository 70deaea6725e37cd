"""What pyproject.toml cannot say: the repository's root is the package `daskprobe` (probes/ is
daskprobe.probes, and so on), with every package below it, those added later too; and the wheel's tag.
The wheel holds no extension module, only executables (setuptools-rust's bins): any Python 3 takes it,
only the platform matters (py3-none-linux_x86_64, as py-spy's wheels)."""

from setuptools import find_packages, setup

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's, there when a wheel is built
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # no wheel to build (an sdist)
        bdist_wheel = None

cmdclass = {}
if bdist_wheel:
    class any_python_wheel(bdist_wheel):
        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])
    cmdclass["bdist_wheel"] = any_python_wheel

setup(packages=["daskprobe", *(f"daskprobe.{p}" for p in find_packages(exclude=["tests", "tests.*", "build", "build.*"]))],
      cmdclass=cmdclass)
