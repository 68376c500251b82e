#!/usr/bin/env python3
"""pip_install.py SOURCE TARGET: installs the Python module as a user does on a machine
with no package index (pip install --no-index --no-build-isolation), into TARGET, then
imports it from there (PYTHONPATH=TARGET, set by the caller) and builds a chain."""
import os
import shutil
import subprocess
import sys

source, target = sys.argv[1:3]
shutil.rmtree(target, ignore_errors=True)
env = dict(os.environ, PIP_NO_INDEX="1")
subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation",
                "--target", target, source], check=True, env=env)
# pip builds in the source tree: leave it as it was.
shutil.rmtree(os.path.join(source, "build"), ignore_errors=True)
for name in os.listdir(source):
    if name.endswith(".egg-info"):
        shutil.rmtree(os.path.join(source, name), ignore_errors=True)
check = ("import sluice, os; p = sluice.__file__; assert p.startswith(%r), p; "
         "c = sluice.list('x') | sluice.plan(epochs=1) | sluice.read() | sluice.raw() | sluice.batch(size=2); "
         "print('imported from', os.path.dirname(p), 'chain', c)") % os.path.realpath(target)
subprocess.run([sys.executable, "-c", check], check=True, cwd=target)
