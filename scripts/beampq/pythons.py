#
# Licensed to the Apache Software Foundation (ASF) under one or more
# contributor license agreements.  See the NOTICE file distributed with
# this work for additional information regarding copyright ownership.
# The ASF licenses this file to You under the Apache License, Version 2.0
# (the "License"); you may not use this file except in compliance with
# the License.  You may obtain a copy of the License at
#
#    http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
#

"""The Pythons that tox should find besides those on PATH: pyenv's.

pyenv installs each Python under `$PYENV_ROOT/versions/<version>` (PYENV_ROOT
defaults to `~/.pyenv`) but puts only the selected ones on PATH, through its
shims. tox finds a pyXY env's interpreter on PATH, so on a machine whose
pyenv holds 3.10, 3.12 and 3.13 besides a global 3.11 it would run py311
alone and skip the others as missing. `toxfile.py`, tox's inline plugin at
the repository's root, hands the interpreters found here to tox's discovery
(`--discover`), so that `python3 -m tox` finds every one of Beam's Pythons
that the machine has, wherever it is run: the README's command and CI
(`.ci/run`) run the same envs.

This module is loaded by tox from its file, outside the package: it uses the
standard library only.
"""

import os
import re
from pathlib import Path
from typing import Mapping
from typing import Optional

# The Pythons Beam 2.77 supports: tox.ini's py310 to py313.
BEAM_PYTHONS = ('3.10', '3.11', '3.12', '3.13')


def pyenv_root(environ: Mapping[str, str]) -> Path:
  """Where pyenv keeps its Pythons, as `pyenv root` answers."""
  if environ.get('PYENV_ROOT'):
    return Path(environ['PYENV_ROOT'])
  home = environ.get('HOME')
  return (Path(home) if home else Path.home()) / '.pyenv'


def pyenv_pythons(
    environ: Optional[Mapping[str, str]] = None,
    minors: tuple[str, ...] = BEAM_PYTHONS) -> list[str]:
  """The interpreters pyenv installed for the given Python versions, each
  minor version's newest release first, in the order of minors.

  Only CPython releases count (`versions/3.12.7`, not `3.13.0t`, `3.14-dev`
  or `pypy3.10-7.3.17`), and not the names that point at one (an alias such
  as `versions/3.12`, or a pyenv-virtualenv environment), as `pyenv versions
  --bare --skip-aliases` lists them. No pyenv: none.
  """
  versions = pyenv_root(os.environ if environ is None else environ) / 'versions'
  if not versions.is_dir():
    return []
  found = []
  for entry in versions.iterdir():
    release = re.fullmatch(r'(\d+)\.(\d+)\.(\d+)', entry.name)
    if not release or entry.is_symlink():
      continue
    minor = f'{release[1]}.{release[2]}'
    python = entry / 'bin' / f'python{minor}'
    if minor in minors and python.is_file() and os.access(python, os.X_OK):
      found.append((minors.index(minor), -int(release[3]), str(python)))
  return [python for _, _, python in sorted(found)]
