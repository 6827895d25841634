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

"""Tests of beampq.gates.workspace, on a small project's tree."""

from beampq import testing
from beampq.gates.workspace import Workspace
from beampq.gates.workspace import python_files


def test_python_files_are_relative_to_the_sdk():
  assert python_files(
      'sdks/python',
      ['sdks/python/a.py', 'sdks/python/b.txt', 'sdks/go/c.py', 'README.md'
       ]) == ['a.py']


def test_workspace_holds_what_the_queue_touches(project):
  ws = Workspace.open(project)
  assert ws.tree == project.tree
  assert ws.sdk == project.tree / 'sdks/python'
  assert ws.modified == ['apache_beam/util.py']
  assert ws.added == ['apache_beam/new_mod.py', 'apache_beam/new_mod_test.py']
  assert ws.files == ws.modified + ws.added
  assert ws.test_modules == ['apache_beam/new_mod_test.py']


def test_workspace_includes_local_work(project):
  testing.commit_in_tree(
      project, 'Local', {'sdks/python/apache_beam/__init__.py': '# edited\n'})
  (project.tree / 'sdks/python/apache_beam/draft_test.py').write_text('')
  ws = Workspace.open(project)
  assert ws.modified == ['apache_beam/__init__.py', 'apache_beam/util.py']
  assert 'apache_beam/draft_test.py' in ws.test_modules
  assert testing.tree_git(project, 'log', '-1', '--format=%s') == 'Local'


def test_base_sdk_is_the_base_extracted_once(project):
  ws = Workspace.open(project)
  assert ws.base_sdk == project.base_files / 'sdks/python'
  assert (ws.base_sdk / 'apache_beam/util.py').read_text() == testing.UTIL
  assert not (ws.base_sdk / 'apache_beam/new_mod.py').exists()
  (ws.base_sdk / 'kept').write_text('')
  assert (Workspace.open(project).base_sdk / 'kept').exists()
  (project.base_files / '.commit').write_text('another base')
  assert not (Workspace.open(project).base_sdk / 'kept').exists()
