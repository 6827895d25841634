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

"""tox's inline plugin for this repository (tox loads `toxfile.py` from
beside tox.ini): tox also finds the Pythons that pyenv installed besides
the one on PATH (scripts/beampq/pythons.py), so that `python3 -m tox` runs
the same pyXY envs on a developer's machine as in CI (.ci/run)."""

import importlib.util
from pathlib import Path

from tox.plugin import impl

PYTHONS = Path(__file__).resolve().parent / 'scripts' / 'beampq' / 'pythons.py'


def _pythons_module():
  spec = importlib.util.spec_from_file_location('beampq_pythons', PYTHONS)
  assert spec is not None and spec.loader is not None, PYTHONS
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@impl
def tox_add_core_config(core_conf, state):
  """Adds pyenv's Pythons to the executables tox's discovery tries first
  (`--discover`), after any given on the command line."""
  del core_conf  # tox passes it; the options are in state
  options = state.conf.options
  given = list(getattr(options, 'discover', None) or [])
  options.discover = given + [
      python
      for python in _pythons_module().pyenv_pythons() if python not in given
  ]
