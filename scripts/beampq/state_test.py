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

"""Tests of beampq.state: whether build/beam is current."""

import shutil

from beampq import state
from beampq import testing
from beampq.project import Project
from beampq.testing import tree_git

SECOND = '0002-Python-Add-a-module.patch'


def test_tree_state_is_the_one_answer_to_is_it_current(project):
  now = state.tree_state(project)
  assert now.current and not now.local_work
  (project.tree / 'sdks/python/apache_beam/util.py').write_text('dirty\n')
  now = state.tree_state(project)
  assert not now.current
  assert now.local_work == [
      '1 uncommitted change (M sdks/python/apache_beam/util.py)'
  ]
  tree_git(project, 'checkout', '--', '.')
  assert state.tree_state(project).current
  (project.root / 'sdks/python/apache_beam/new_mod.py').write_text('X = 2\n')
  now = state.tree_state(project)
  assert not now.current and not now.local_work, 'patches/ moved on'
  shutil.rmtree(project.tree)
  assert state.tree_state(project) == state.TreeState(None, [], False)


def test_a_new_pinned_release_makes_the_tree_stale(project):
  # The same sdist pinned as another version (a hand edit of base.cfg that
  # kept the hash) is not the tree that was built.
  config = project.root / 'patches' / 'base.cfg'
  config.write_text(config.read_text().replace('9.9.0', '9.9.1'))
  assert not state.tree_state(Project(project.root)).current


def test_pull_request_lines_do_not_make_the_tree_stale(project):
  testing.start_pull_request(project, 'extra', SECOND)
  project.series_file.write_text(
      project.series_file.read_text().replace('[feature]\n', ''))
  assert state.tree_state(project).current


def test_main_behind_a_detached_head_is_local_work(project):
  tree_git(project, 'commit', '-q', '--allow-empty', '-m', 'Unrefreshed')
  tree_git(project, 'checkout', '-q', '--detach', 'HEAD~1')
  now = state.tree_state(project)
  assert not now.current
  main = tree_git(project, 'rev-parse', 'main')
  assert now.local_work == [f'main moved to {main[:12]}']
  # Detached where main is, nothing is lost.
  tree_git(project, 'checkout', '-q', '--detach', 'main')
  assert state.tree_state(project).local_work == [f'HEAD moved to {main[:12]}']


def test_a_moved_or_deleted_base_tag_is_local_work(project):
  tree_git(project, 'tag', '-f', 'base', 'HEAD~1')
  moved = tree_git(project, 'rev-parse', 'HEAD~1')
  now = state.tree_state(project)
  assert not now.current
  assert now.local_work == [f'tag base moved to {moved[:12]}']
  tree_git(project, 'tag', '-d', 'base')
  assert state.tree_state(project).local_work == ['tag base deleted']
