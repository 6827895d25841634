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

"""Tests of beampq.check: patches/, sdks/, the series, the pull request
descriptions, CHANGES.md and the tree agree."""

import shutil

import pytest

from beampq import Error
from beampq import check
from beampq import git
from beampq import testing
from beampq.project import Project
from beampq.testing import commit_in_tree
from beampq.testing import tree_git

FIRST = '0001-Python-Change-line-5.patch'


def test_check_passes_on_a_consistent_queue_without_a_tree(project, capsys):
  shutil.rmtree(project.tree)
  check.check(project)
  assert not project.tree.exists()
  assert '2 pull requests, 2 patches and 2 new files agree' in (
      capsys.readouterr().out)


def test_check_fails_on_a_hand_edited_patch(project, capsys):
  # The edited patch still applies, but its index line no longer matches
  # what the tree exports.
  patch = project.patches / FIRST
  patch.write_text(patch.read_text().replace('+five', '+FIVE'))
  with pytest.raises(Error, match='check found 2 problems'):
    check.check(project)
  assert f'{FIRST} is stale' in capsys.readouterr().err


def test_check_fails_on_stray_and_missing_files(project, capsys):
  (project.root / 'sdks/python/apache_beam/stray.py').write_text('')
  (project.patches / '0009-stray.patch').write_text('')
  with pytest.raises(Error, match='check found 2 problems'):
    check.check(project)
  err = capsys.readouterr().err
  assert 'stray.py is not listed in the series' in err
  assert '0009-stray.patch is not in the series' in err


def test_check_fails_on_local_work(project):
  commit_in_tree(project, 'More', {'sdks/python/apache_beam/util.py': 'x\n'})
  with pytest.raises(Error, match='check found 1 problem$'):
    check.check(project)


def test_check_asks_to_commit_uncommitted_work_first(project, capsys):
  # refresh refuses uncommitted changes: check's advice says so.
  (project.tree / 'sdks/python/apache_beam/util.py').write_text('dirty\n')
  with pytest.raises(Error, match='check found 1 problem$'):
    check.check(project)
  assert 'commit them, then run `python3 -m beampq refresh`' in capsys.readouterr(
  ).err


def test_check_during_a_rebase_says_to_finish_it_first(project, capsys):
  # refresh refuses while a rebase is stopped: check's advice says so.
  commit_in_tree(project, 'More', {'sdks/python/apache_beam/util.py': 'x\n'})
  tree_git(project, 'checkout', '-q', '-b', 'other', 'HEAD~1')
  commit_in_tree(project, 'Other', {'sdks/python/apache_beam/util.py': 'y\n'})
  assert git.attempt('rebase', 'main', cwd=project.tree).returncode != 0
  with pytest.raises(Error):
    check.check(project)
  assert 'finish or abort the rebase in progress, then run `python3 -m beampq refresh`' in (
      capsys.readouterr().err)


@pytest.mark.parametrize(
    'change, advice',
    [
        # A pull changed patches/ under a local commit: the carry-over
        # commands, since a refresh would refuse.
        ('pull', 'to carry its commits over a rebuild, run `git -C '),
        # A fixup commit: autosquash first, since a refresh would refuse.
        ('fixup', 'is not squashed into its commit yet: run `git -C '),
    ])
def test_check_advises_what_refresh_needs_first(
    project, capsys, change, advice):
  subject = 'fixup! [Python] Add a module' if change == 'fixup' else 'More'
  commit_in_tree(project, subject, {'sdks/python/apache_beam/util.py': 'x\n'})
  if change == 'pull':
    patch = project.patches / '0001-Python-Change-line-5.patch'
    patch.write_text(patch.read_text() + '\n')
  with pytest.raises(Error):
    check.check(project)
  assert advice in capsys.readouterr().err


def test_check_fails_on_a_bad_changes_entry(project):
  project.changes.write_text(
      testing.CHANGES.replace('([#2](https', '(see [#2](https'))
  with pytest.raises(Error, match='check found 1 problem$'):
    check.check(project)


def add_empty_pull_request(project):
  project.description_file('fix-2').write_text('# Fix 2\n\nMore.\n')
  project.series_file.write_text(project.series_file.read_text() + '[fix-2]\n')


@pytest.mark.parametrize(
    'edit, problem',
    [
        (
            lambda p: p.description_file('feature').unlink(),
            "'feature' has no description"),
        (
            lambda p: p.description_file('fix').write_text('no title\n'),
            'fix.md: the first line is not'),
        (
            lambda p: p.description_file('old').write_text('# Old\n\nOld.\n'),
            'old.md describes a pull request that is not in the series'),
        (add_empty_pull_request, 'pull request [fix-2] has no patches'),
        (
            lambda p: p.changes.write_text(
                testing.CHANGES.replace('request: fix', 'request: fux')),
            "belongs to pull request 'fux', which is not in the series"),
    ])
def test_check_fails_on_pull_request_problems(project, capsys, edit, problem):
  edit(project)
  with pytest.raises(Error, match='check found 1 problem$'):
    check.check(project)
  assert problem in capsys.readouterr().err


def test_real_queue_is_consistent():
  check.check(Project())
