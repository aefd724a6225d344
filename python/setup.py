"""The attention_steps package: the ctypes layer, the PyTorch layer and, where torch imports,
the operator torch.ops.attention_steps.attention built against that torch.

    cmake -B build && cmake --build build -j --target attention_steps
    pip install --no-build-isolation ./python

The kernels are not compiled here: the package links libattention_steps.so as CMake built it
(ATTENTION_STEPS_BUILD_DIR, default <checkout>/build; a relative path is taken from the
checkout's root) and installs a copy of it beside the operator, so the installed package needs
no checkout. Building the operator compiles one C++ file against torch's headers (about a
minute).
"""
import os
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

# pip builds a wheel first. setuptools 70.1 and newer has the bdist_wheel command; older ones (65
# on Debian 12) need the wheel package, which --no-build-isolation does not install: say so
# here rather than fail with "invalid command 'bdist_wheel'".
try:
    from setuptools.command.bdist_wheel import bdist_wheel  # noqa: F401
except ImportError:
    try:
        import wheel  # noqa: F401
    except ImportError:
        raise SystemExit("attention_steps: building needs the wheel package or setuptools 70.1 "
                         "or newer: python3 -m pip install --upgrade setuptools wheel "
                         "(python/README.md)")

HERE = pathlib.Path(__file__).resolve().parent
# A relative ATTENTION_STEPS_BUILD_DIR is taken from the checkout's root (pip runs this file from
# python/, wherever it was started).
BUILD = (HERE.parent / os.environ.get("ATTENTION_STEPS_BUILD_DIR", "build")).resolve()
LIBRARY = BUILD / "libattention_steps.so"
if not LIBRARY.is_file():
    raise SystemExit(f"attention_steps: {LIBRARY} not found. Build it first: cmake -B build && "
                     "cmake --build build -j --target attention_steps (or set "
                     "ATTENTION_STEPS_BUILD_DIR to the build folder that holds it)")


class BuildPyWithLibrary(build_py):
    """Puts libattention_steps.so into the package, where _capi and the operator find it."""

    def run(self):
        super().run()
        target = pathlib.Path(self.build_lib) / "attention_steps"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(LIBRARY, target / LIBRARY.name)


command_classes = {"build_py": BuildPyWithLibrary}
extensions = []
try:
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension
except ImportError as error:
    print(f"attention_steps: torch does not import ({error}); installing the ctypes layer only")
else:
    extensions.append(CUDAExtension(
        "attention_steps._operator", ["attention_steps/csrc/operator.cpp"],
        include_dirs=[str(HERE.parent / "capi")],
        library_dirs=[str(BUILD)], libraries=["attention_steps"],
        # The copy beside the operator when installed; the build folder when built in place.
        extra_link_args=["-Wl,-rpath,$ORIGIN", f"-Wl,-rpath,{BUILD}"],
        extra_compile_args={"cxx": ["-O2"]}))
    command_classes["build_ext"] = BuildExtension

setup(
    name="attention_steps",
    version="0.4.0",
    description="Self-attention for Vision Transformers in CUDA, step by step: the steps from Python",
    packages=["attention_steps"],
    package_data={"attention_steps": ["csrc/*.cpp", "data/*.npz", "data/README.md"]},
    ext_modules=extensions,
    cmdclass=command_classes,
    python_requires=">=3.8",
)
