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

"""pytest plugin that `beampq test` loads (`-p beampq.gates.pytest_plugin`) to run Beam's tests on the tree.

The sdist has no root conftest.py, so this plugin does the parts of Beam's
that the unit tests rely on: the --test-pipeline-options option read by
TestPipeline, the markers Beam registers, and the extra type checks Beam's
conftest enables. With --beampq-select it runs only the tests a selection
file names (beampq.gates.selection) and deselects the others, and with
--beampq-serial-flag it tells whether any test to run is marked no_xdist,
so that the serial run can be left out when none is. It also
refuses to run when apache_beam is imported from anywhere but the patched
tree (BEAMPQ_TREE), and prints where it came from.
"""

import json
import os

import pytest

from beampq.gates import selection

MARKERS = (
    'it_postcommit',
    'it_validatesrunner',
    'it_validatescontainer',
    'examples_postcommit',
    'no_xdist',
    'sickbay_direct',
    'sickbay_dataflow',
    'sickbay_flink',
    'sickbay_spark',
    'uses_dill',
    'uses_pytorch',
    'uses_tf',
    'uses_transformers',
    'uses_testcontainer',
    'uses_vllm',
)


def pytest_addoption(parser):
  parser.addoption(
      '--test-pipeline-options',
      default=None,
      help='pipeline options for TestPipeline, as in Beam\'s conftest.py')
  parser.addoption(
      '--beampq-select',
      default=None,
      metavar='FILE',
      help='run only the tests this selection (JSON) names')
  parser.addoption(
      '--beampq-serial-flag',
      default=None,
      metavar='FILE',
      help='create FILE when a test to run is marked no_xdist')


def _imported_beam():
  import apache_beam
  return os.path.realpath(apache_beam.__file__)


def pytest_configure(config):
  tree = os.path.realpath(os.environ['BEAMPQ_TREE'])
  imported = _imported_beam()
  if not imported.startswith(tree + os.sep):
    raise pytest.UsageError(
        f'apache_beam was imported from {imported}, not from the patched '
        f'tree {tree}')
  for marker in MARKERS:
    config.addinivalue_line('markers', marker)
  from apache_beam.options import pipeline_options
  from apache_beam.testing.test_pipeline import TestPipeline
  pipeline_options.enable_all_additional_type_checks()
  TestPipeline.pytest_test_pipeline_options = config.getoption(
      'test_pipeline_options')


def pytest_report_header(config):
  return f'apache_beam.__file__: {_imported_beam()}'


# First, so that the no_xdist tests are still among the items when -m
# leaves them out of this run.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  _select(config, items)
  flag = config.getoption('beampq_serial_flag')
  if flag and any(item.get_closest_marker('no_xdist') for item in items):
    with open(flag, 'w'):
      pass


def _select(config, items):
  path = config.getoption('beampq_select')
  if path is None:
    return
  with open(path) as f:
    chosen = json.load(f)
  tree = os.path.realpath(os.environ['BEAMPQ_TREE'])
  kept, dropped = [], []
  for item in items:
    module = os.path.relpath(os.path.realpath(item.path), tree)
    cls = getattr(item, 'cls', None)
    class_name = cls.__name__ if cls is not None else ''
    if selection.is_selected(chosen, module, class_name, item.name):
      kept.append(item)
    else:
      dropped.append(item)
  if dropped:
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept
