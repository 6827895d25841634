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

"""The README's pipeline example runs on the patched tree and prints what
the README says it prints: every prompt once, in lists of one prefix.

The example is taken from README.md as it stands (repository_test's
readme_example) and run as a script in a Python process of its own, as a
reader would run it: as written (`beam.Pipeline()`, the DirectRunner), and
on the FnApiRunner. Needs the patched tree (tox -e bench-tree); the harness
env has no Beam and skips it.
"""

import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from repository_test import ROOT
from repository_test import readme_example

# Runs the example as __main__, then prints its prompts after a tag.
RUN = '''\
import json, runpy, sys
runner = sys.argv[2]
init = {}
if runner == 'fn_api':
  from apache_beam.runners.portability.fn_api_runner import FnApiRunner
  init['FnApiRunner'] = FnApiRunner
names = runpy.run_path(sys.argv[1], init_globals=init, run_name='__main__')
print('PROMPTS ' + json.dumps(names['prompts']))
'''


def patched_tree():
  util = pytest.importorskip('apache_beam.transforms.util')
  if not hasattr(util, 'AdaptiveNumShards'):
    pytest.skip('needs the patched tree (build/beam/sdks/python) on the path')


def run(code: str, runner: str, tmp_path: Path):
  """The batches the example printed, and its prompts."""
  script = tmp_path / 'example.py'
  script.write_text(code)
  done = subprocess.run([sys.executable, '-c', RUN, str(script), runner],
                        capture_output=True,
                        text=True,
                        timeout=300,
                        check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  *printed, last = done.stdout.splitlines()
  assert last.startswith('PROMPTS '), done.stdout
  return [ast.literal_eval(line) for line in printed], json.loads(last[8:])


def prefix(prompt: str) -> str:
  """What the README calls a prompt's prefix: the text before its blank
  line."""
  return prompt.split('\n\n', 1)[0]


def check_output(batches, prompts):
  assert all(isinstance(batch, list) and batch for batch in batches), batches
  # Every prompt once.
  assert Counter(p for batch in batches for p in batch) == Counter(prompts)
  # In lists of one prefix, and more than one prefix to tell apart.
  prefixes = [{prefix(p) for p in batch} for batch in batches]
  assert all(len(found) == 1 for found in prefixes), batches
  assert len({prefix(p) for p in prompts}) > 1, prompts
  assert len(prompts) > len({prefix(p) for p in prompts}), prompts


@pytest.mark.parametrize('runner', ['as_written', 'fn_api'])
def test_the_readme_example_prints_every_prompt_once_in_lists_of_one_prefix(
    runner, tmp_path):
  patched_tree()
  code = readme_example((ROOT / 'README.md').read_text())
  if runner == 'fn_api':
    assert code.count('beam.Pipeline()') == 1, code
    code = code.replace(
        'beam.Pipeline()', 'beam.Pipeline(runner=FnApiRunner())')
  batches, prompts = run(code, runner, tmp_path)
  check_output(batches, prompts)


def test_an_example_that_mixes_prefixes_or_loses_prompts_fails():
  prompts = ['a\n\n1', 'a\n\n2', 'b\n\n1']
  check_output([['a\n\n1', 'a\n\n2'], ['b\n\n1']], prompts)
  mixed = [['a\n\n1', 'b\n\n1'], ['a\n\n2']]
  lost = [['a\n\n1', 'a\n\n2']]
  twice = [['a\n\n1'], ['a\n\n1', 'a\n\n2'], ['b\n\n1']]
  for batches in (mixed, lost, twice):
    with pytest.raises(AssertionError):
      check_output(batches, prompts)
